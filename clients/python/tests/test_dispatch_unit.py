# test_dispatch_unit.py - conch_client without a daemon: a fake transport plays the daemon
# and checks request/response matching, notifications, errors, and the dispatch of
# daemon->client requests (tool.call, agent.spawn, $/cancel) in Client and AsyncClient.
import asyncio
import json
import queue
import threading
import time

import pytest

from conch_client import (AmbiguousMatch, AsyncClient, Client, ConchError, ConnectionLost,
                          FileNotFound, InvalidParams, LimitError, MethodNotFound,
                          RequestTimeout, SandboxNotFound, ToolError, error_class)
from conch_client._dispatch import wants_ctx
from conch_client.errors import from_error_object, from_file_error
from conftest import arun


class FakeTransport:
    """The daemon's side of a sync Client: feed() lines to the client, sent() what it wrote."""

    def __init__(self):
        self.inbound = queue.Queue()
        self.outbound = queue.Queue()
        self.closed = False

    def readline(self):
        return self.inbound.get()

    def write(self, data):
        if self.closed:
            raise OSError("closed")
        for line in data.decode().splitlines():
            self.outbound.put(json.loads(line))

    def close(self):
        self.closed = True
        self.inbound.put(b"")

    def feed(self, obj):
        self.inbound.put((json.dumps(obj) + "\n").encode())

    def sent(self, timeout=5):
        return self.outbound.get(timeout=timeout)

    def nothing_sent(self, wait=0.3):
        try:
            m = self.outbound.get(timeout=wait)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected message {m}")


@pytest.fixture
def fake():
    t = FakeTransport()
    c = Client(t, timeout=10)
    yield t, c
    c.close()


def in_thread(fn, *a, **kw):
    box = {}

    def run():
        try:
            box["result"] = fn(*a, **kw)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e
    th = threading.Thread(target=run)
    th.start()
    return th, box


# ---- requests and responses ----------------------------------------------------------

def test_responses_matched_by_id_out_of_order(fake):
    t, c = fake
    t1, b1 = in_thread(c.ping)
    m1 = t.sent()
    t2, b2 = in_thread(c.sandbox_get, "sb-x")
    m2 = t.sent()
    assert m1["method"] == "daemon.ping" and m1["params"] == {} and m1["jsonrpc"] == "2.0"
    assert m2["method"] == "sandbox.get" and m2["params"] == {"id": "sb-x"}
    assert m1["id"] != m2["id"]
    t.feed({"jsonrpc": "2.0", "id": m2["id"], "result": {"id": "sb-x"}})
    t.feed({"jsonrpc": "2.0", "id": m1["id"], "result": {"version": "9"}})
    t1.join(5), t2.join(5)
    assert b1["result"] == {"version": "9"} and b2["result"] == {"id": "sb-x"}


def test_params_left_at_none_are_not_sent(fake):
    t, c = fake
    th, box = in_thread(c.exec_run, "sb-1", "ls", cwd="src", timeout=5)
    m = t.sent()
    assert m["params"] == {"sandbox": "sb-1", "command": "ls", "cwd": "src", "timeout": 5}
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"exit_code": 0}})
    th.join(5)
    assert box["result"] == {"exit_code": 0}


@pytest.mark.parametrize("data_code,code,cls", [
    ("file_not_found", -32010, FileNotFound), ("sandbox_not_found", -32002, SandboxNotFound),
    ("limit", -32004, LimitError), ("invalid_params", -32602, InvalidParams),
    ("ambiguous_match", -32016, AmbiguousMatch), ("method_not_found", -32601, MethodNotFound)])
def test_errors_raise_their_class(fake, data_code, code, cls):
    t, c = fake
    th, box = in_thread(c.call, "x.y", {"a": 1})
    m = t.sent()
    t.feed({"jsonrpc": "2.0", "id": m["id"], "error": {
        "code": code, "message": "it failed", "data": {"code": data_code, "kind": "usage",
                                                       "param": "a", "occurrences": 2}}})
    th.join(5)
    e = box["error"]
    assert type(e) is cls and isinstance(e, ConchError)
    assert (e.code, e.data_code, e.kind, e.message, e.method) == (code, data_code, "usage",
                                                                  "it failed", "x.y")


def test_error_class_falls_back_to_code_then_base():
    assert error_class(-32010, None) is FileNotFound
    assert error_class(-32010, "something_new") is FileNotFound
    assert error_class(-31999, "something_new") is ConchError
    e = from_error_object({"code": -32004, "message": "m"})
    assert isinstance(e, LimitError) and e.data == {} and e.kind is None
    e = from_file_error({"code": "file_not_found", "message": "no"}, "p", "fs.download")
    assert isinstance(e, FileNotFound) and e.code == -32010 and e.data["path"] == "p"


def test_post_processing_of_results(fake):
    t, c = fake
    th, box = in_thread(c.sandbox_list)
    m = t.sent()
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"sandboxes": [{"id": "a"}]}})
    th.join(5)
    assert box["result"] == [{"id": "a"}]


def test_bytes_are_sent_base64(fake):
    t, c = fake
    th, box = in_thread(c.fs_write, "sb", "f", b"\x00\xff")
    m = t.sent()
    assert m["params"]["encoding"] == "base64" and m["params"]["content"] == "AP8="
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"bytes_written": 2}})
    th.join(5)


def test_request_timeout(fake):
    t, c = fake
    with pytest.raises(RequestTimeout):
        c.call("daemon.ping", timeout=0.2)
    # a late answer is ignored, and the client still works
    m = t.sent()
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {}})
    th, box = in_thread(c.ping)
    m = t.sent()
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"ok": 1}})
    th.join(5)
    assert box["result"] == {"ok": 1}


def test_connection_lost_fails_pending_and_later_calls(fake):
    t, c = fake
    th, box = in_thread(c.ping)
    t.sent()
    t.inbound.put(b"")  # the daemon hung up
    th.join(5)
    assert isinstance(box["error"], ConnectionLost)
    assert "closed the connection" in box["error"].message
    with pytest.raises(ConnectionLost):
        c.ping()


def test_garbage_lines_and_batches(fake):
    t, c = fake
    th, box = in_thread(c.ping)
    m = t.sent()
    t.inbound.put(b"not json\n")
    t.feed([{"jsonrpc": "2.0", "id": m["id"], "result": 7}])
    th.join(5)
    assert box["result"] == 7


# ---- notifications ---------------------------------------------------------------------

def test_streaming_output_arrives_before_result(fake):
    t, c = fake
    got = []

    def on_output(stream, data):
        time.sleep(0.05)  # a slow callback still sees everything before run() returns
        got.append((stream, data))
    th, box = in_thread(c.exec_run, "sb", "x", on_output=on_output)
    m = t.sent()
    assert m["params"]["stream"] is True
    for i in range(5):
        t.feed({"jsonrpc": "2.0", "method": "exec.output",
                "params": {"request_id": m["id"], "stream": "stdout", "data": f"{i}\n"}})
    t.feed({"jsonrpc": "2.0", "method": "exec.output",
            "params": {"request_id": 999, "stream": "stdout", "data": "other\n"}})
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"exit_code": 0}})
    th.join(5)
    assert box["result"] == {"exit_code": 0}
    assert got == [("stdout", f"{i}\n") for i in range(5)]


def test_subscriptions_callback_and_iterator(fake):
    t, c = fake
    seen = []
    s1 = c.subscribe("job.exited", seen.append)
    s2 = c.subscribe()
    t.feed({"jsonrpc": "2.0", "method": "job.exited", "params": {"job_id": "j1"}})
    t.feed({"jsonrpc": "2.0", "method": "other", "params": {"a": 1}})
    n1 = s2.get(timeout=5)
    n2 = s2.get(timeout=5)
    assert (n1.method, n1.params, n2.method) == ("job.exited", {"job_id": "j1"}, "other")
    deadline = time.time() + 5
    while not seen and time.time() < deadline:
        time.sleep(0.01)
    assert [n.params for n in seen] == [{"job_id": "j1"}]
    s1.close()
    t.feed({"jsonrpc": "2.0", "method": "job.exited", "params": {"job_id": "j2"}})
    assert s2.get(timeout=5).params == {"job_id": "j2"}
    time.sleep(0.1)
    assert len(seen) == 1
    c.close()
    assert list(s2) == []  # the iterator ends with the client


# ---- daemon -> client requests ---------------------------------------------------------

def tool_call(rid, name, inp, call_id="c1", sandbox="sb-1"):
    return {"jsonrpc": "2.0", "id": rid, "method": "tool.call", "params": {
        "sandbox": sandbox, "call_id": call_id, "name": name, "input": inp,
        "origin": {"kind": "exec", "id": "e1"}}}


def test_tool_call_answered_with_result(fake):
    t, c = fake
    c._registry.add_tool("sb-1", "echo", lambda inp: {"echo": inp})
    t.feed(tool_call("d-1", "echo", {"x": 1}))
    assert t.sent() == {"jsonrpc": "2.0", "id": "d-1", "result": {"echo": {"x": 1}}}


def test_tool_handler_gets_context(fake):
    t, c = fake
    seen = {}

    def fn(inp, ctx):
        seen.update(sandbox=ctx.sandbox, call_id=ctx.call_id, name=ctx.name,
                    origin=ctx.origin, cancelled=ctx.cancelled.is_set())
        return "ok"
    c._registry.add_tool("sb-1", "t", fn)
    t.feed(tool_call(5, "t", {}, call_id="call-9"))
    assert t.sent()["result"] == "ok"
    assert seen == {"sandbox": "sb-1", "call_id": "call-9", "name": "t",
                    "origin": {"kind": "exec", "id": "e1"}, "cancelled": False}


def test_wants_ctx():
    assert not wants_ctx(lambda a: 0)
    assert wants_ctx(lambda a, b: 0)
    assert wants_ctx(lambda *a: 0)
    assert wants_ctx(lambda a, b=None: 0)  # any second positional parameter gets ctx

    class K:
        def m(self, a):
            return a
    assert not wants_ctx(K().m)


def test_tool_exception_is_an_error_answer(fake):
    t, c = fake

    def boom(inp):
        raise ValueError("bad input: x must be positive")

    def chosen(inp):
        raise ToolError("quota exceeded", code=-32050, data={"retry_after": 3})
    c._registry.add_tool("sb-1", "boom", boom)
    c._registry.add_tool("sb-1", "chosen", chosen)
    t.feed(tool_call(1, "boom", {}))
    m = t.sent()
    assert m["id"] == 1 and "result" not in m
    assert m["error"]["message"] == "bad input: x must be positive"
    assert m["error"]["code"] == -32000 and m["error"]["data"]["exception"] == "ValueError"
    t.feed(tool_call(2, "chosen", {}))
    m = t.sent()
    assert m["error"]["code"] == -32050 and m["error"]["message"] == "quota exceeded"
    assert m["error"]["data"]["retry_after"] == 3


def test_unknown_tool_and_method(fake):
    t, c = fake
    t.feed(tool_call(1, "nope", {}))
    m = t.sent()
    assert m["id"] == 1 and m["error"]["code"] == -32601 and "nope" in m["error"]["message"]
    c._registry.add_tool("sb-other", "t", lambda i: 1)  # another sandbox's tool
    t.feed(tool_call(2, "t", {}))
    assert t.sent()["error"]["code"] == -32601
    t.feed({"jsonrpc": "2.0", "id": 3, "method": "weird.thing", "params": {}})
    m = t.sent()
    assert m["id"] == 3 and m["error"]["data"]["code"] == "method_not_found"


def test_non_json_result_is_an_error(fake):
    t, c = fake
    c._registry.add_tool("sb-1", "t", lambda i: object())
    t.feed(tool_call(1, "t", {}))
    m = t.sent()
    assert "not JSON" in m["error"]["message"]


def test_async_tool_in_sync_client(fake):
    t, c = fake

    async def fn(inp):
        await asyncio.sleep(0.01)
        return inp["x"] * 2
    c._registry.add_tool("sb-1", "dbl", fn)
    t.feed(tool_call(1, "dbl", {"x": 21}))
    assert t.sent()["result"] == 42


def test_tool_calls_run_concurrently(fake):
    t, c = fake
    n = 20
    barrier = threading.Barrier(n, timeout=5)

    def fn(inp):
        barrier.wait()  # only passes when all n run at once
        return inp["i"]
    c._registry.add_tool("sb-1", "t", fn)
    for i in range(n):
        t.feed(tool_call(i, "t", {"i": i}, call_id=f"c{i}"))
    got = {}
    for _ in range(n):
        m = t.sent(timeout=10)
        got[m["id"]] = m.get("result")
    assert got == {i: i for i in range(n)}


def test_cancel_sets_event_and_suppresses_answer(fake):
    t, c = fake
    started = threading.Event()
    seen = {}

    def slow(inp, ctx):
        started.set()
        seen["stopped"] = ctx.cancelled.wait(5)
        seen["reason"] = ctx.cancel_reason
        return "too late"
    c._registry.add_tool("sb-1", "slow", slow)
    t.feed(tool_call(1, "slow", {}, call_id="call-1"))
    assert started.wait(5)
    t.feed({"jsonrpc": "2.0", "method": "$/cancel",
            "params": {"call_id": "call-1", "reason": "timeout"}})
    assert t.nothing_sent(0.5)
    assert seen == {"stopped": True, "reason": "timeout"}
    assert c._registry.active_calls() == 0


def test_cancel_cancels_async_handler_in_sync_client(fake):
    t, c = fake
    seen = {}
    started = threading.Event()

    async def slow(inp):
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
    c._registry.add_tool("sb-1", "slow", slow)
    t.feed(tool_call(1, "slow", {}, call_id="k"))
    assert started.wait(5)
    t.feed({"jsonrpc": "2.0", "method": "$/cancel", "params": {"call_id": "k"}})
    assert t.nothing_sent(0.5)
    assert seen == {"cancelled": True}


def test_agent_spawn_routing(fake):
    t, c = fake
    c._registry.add_agent("sb-1", "analyst", lambda task: f"analysed: {task}")
    c._registry.add_agent("sb-1", None, lambda task, ctx: f"default({ctx.name}): {task}")

    def spawn(rid, typ):
        return {"jsonrpc": "2.0", "id": rid, "method": "agent.spawn", "params": {
            "sandbox": "sb-1", "call_id": f"a{rid}", "task": "count", "type": typ,
            "origin": {"kind": "exec", "id": "e"}}}
    t.feed(spawn(1, "analyst"))
    assert t.sent()["result"] == "analysed: count"
    t.feed(spawn(2, None))
    assert t.sent()["result"] == "default(None): count"
    t.feed(spawn(3, "writer"))
    assert t.sent()["error"]["code"] == -32601


def test_untyped_spawn_without_default_goes_to_first_agent(fake):
    t, c = fake
    c._registry.add_agent("sb-2", "other-sandbox", lambda task: "wrong")
    c._registry.add_agent("sb-1", "first", lambda task, ctx: f"first:{ctx.name}")
    c._registry.add_agent("sb-1", "second", lambda task: "second")
    t.feed({"jsonrpc": "2.0", "id": 1, "method": "agent.spawn", "params": {
        "sandbox": "sb-1", "call_id": "a", "task": "x", "type": None}})
    assert t.sent()["result"] == "first:None"
    t.feed({"jsonrpc": "2.0", "id": 2, "method": "agent.spawn", "params": {
        "sandbox": "sb-3", "call_id": "b", "task": "x", "type": None}})
    assert t.sent()["error"]["code"] == -32601


def test_generic_request_handler(fake):
    t, c = fake
    c.set_request_handler("custom.ask", lambda params, ctx: {"echo": params, "m": ctx.method})
    t.feed({"jsonrpc": "2.0", "id": 8, "method": "custom.ask", "params": {"q": 1}})
    assert t.sent()["result"] == {"echo": {"q": 1}, "m": "custom.ask"}


def test_register_tool_declares_and_handles(fake):
    t, c = fake
    th, box = in_thread(c.register_tool, "sb-1", "echo", lambda i: i, "Echo it",
                        {"type": "object", "properties": {"x": {"type": "integer"}}})
    m = t.sent()
    assert m["method"] == "tools.register"
    assert m["params"] == {"sandbox": "sb-1", "tools": [{
        "name": "echo", "description": "Echo it",
        "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}]}
    assert "timeout" not in m["params"]["tools"][0]
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"registered": ["echo"]}})
    th.join(5)
    assert box["result"] == ["echo"]
    t.feed(tool_call(77, "echo", {"x": 1}))
    assert t.sent() == {"jsonrpc": "2.0", "id": 77, "result": {"x": 1}}
    # unregistering drops the handler too
    th, box = in_thread(c.tools_unregister, "sb-1", ["echo"])
    m = t.sent()
    t.feed({"jsonrpc": "2.0", "id": m["id"], "result": {"removed": ["echo"]}})
    th.join(5)
    t.feed(tool_call(78, "echo", {}))
    assert t.sent()["error"]["code"] == -32601


# ---- the same for AsyncClient ----------------------------------------------------------

class AsyncFake:
    def __init__(self):
        self.inbound = asyncio.Queue()
        self.outbound = asyncio.Queue()
        self.closed = False

    async def readline(self):
        return await self.inbound.get()

    def write(self, data):
        for line in data.decode().splitlines():
            self.outbound.put_nowait(json.loads(line))

    async def drain(self):
        pass

    def close(self):
        self.closed = True
        self.inbound.put_nowait(b"")

    async def wait_closed(self):
        pass

    def feed(self, obj):
        self.inbound.put_nowait((json.dumps(obj) + "\n").encode())

    async def sent(self, timeout=5):
        return await asyncio.wait_for(self.outbound.get(), timeout)


def test_async_requests_errors_and_streaming():
    async def body():
        f = AsyncFake()
        c = AsyncClient(f, f, timeout=10)
        got = []

        async def on_output(stream, data):
            await asyncio.sleep(0.01)
            got.append(data)
        run = asyncio.ensure_future(c.exec_run("sb", "x", on_output=on_output))
        ping = asyncio.ensure_future(c.ping())
        m1, m2 = await f.sent(), await f.sent()
        for i in range(3):
            f.feed({"jsonrpc": "2.0", "method": "exec.output",
                    "params": {"request_id": m1["id"], "stream": "stdout", "data": str(i)}})
        f.feed({"jsonrpc": "2.0", "id": m2["id"], "error": {
            "code": -32002, "message": "no sandbox", "data": {"code": "sandbox_not_found"}}})
        f.feed({"jsonrpc": "2.0", "id": m1["id"], "result": {"exit_code": 3}})
        assert await run == {"exit_code": 3}
        assert got == ["0", "1", "2"]
        with pytest.raises(SandboxNotFound):
            await ping
        sub = c.subscribe("job.exited")
        f.feed({"jsonrpc": "2.0", "method": "job.exited", "params": {"job_id": "j"}})
        n = await sub.get(timeout=5)
        assert n.params == {"job_id": "j"}
        pending = asyncio.ensure_future(c.ping())
        await f.sent()
        f.inbound.put_nowait(b"")
        with pytest.raises(ConnectionLost):
            await pending
        assert [x async for x in sub] == []
        await c.close()
    arun(body())


def test_async_dispatch_result_error_concurrency_and_cancel():
    async def body():
        f = AsyncFake()
        c = AsyncClient(f, f, timeout=10)
        n = 20
        gate = asyncio.Event()
        arrived = []

        async def gated(inp):
            arrived.append(inp["i"])
            if len(arrived) == n:
                gate.set()
            await asyncio.wait_for(gate.wait(), 5)  # all n at once, or a timeout error
            return inp["i"]

        def sync_fn(inp, ctx):
            return {"thread_ok": True, "call": ctx.call_id}

        def failing(inp):
            raise RuntimeError("nope")

        cancelled = asyncio.Event()

        async def slow(inp, ctx):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                assert ctx.cancelled.is_set() and ctx.cancel_reason == "command ended"
                cancelled.set()
                raise
        c._registry.add_tool("sb-1", "gated", gated)
        c._registry.add_tool("sb-1", "sync", sync_fn)
        c._registry.add_tool("sb-1", "failing", failing)
        c._registry.add_tool("sb-1", "slow", slow)
        for i in range(n):
            f.feed(tool_call(i, "gated", {"i": i}, call_id=f"g{i}"))
        got = {}
        for _ in range(n):
            m = await f.sent(10)
            got[m["id"]] = m["result"]
        assert got == {i: i for i in range(n)}
        f.feed(tool_call("s", "sync", {}, call_id="cs"))
        assert (await f.sent())["result"] == {"thread_ok": True, "call": "cs"}
        f.feed(tool_call("f", "failing", {}))
        m = await f.sent()
        assert m["id"] == "f" and m["error"]["message"] == "nope"
        f.feed(tool_call("u", "unknown", {}))
        assert (await f.sent())["error"]["code"] == -32601
        f.feed(tool_call("w", "slow", {}, call_id="slow-1"))
        await asyncio.sleep(0.05)
        f.feed({"jsonrpc": "2.0", "method": "$/cancel",
                "params": {"call_id": "slow-1", "reason": "command ended"}})
        await asyncio.wait_for(cancelled.wait(), 5)
        with pytest.raises(asyncio.TimeoutError):
            await f.sent(0.3)  # no answer after a cancel
        await c.close()
    arun(body())


def test_async_handler_sees_register_agent():
    async def body():
        f = AsyncFake()
        c = AsyncClient(f, f, timeout=10)
        assert await c.register_agent("sb-1", None, "", lambda task: task.upper()) == []
        f.feed({"jsonrpc": "2.0", "id": 1, "method": "agent.spawn", "params": {
            "sandbox": "sb-1", "call_id": "a", "task": "hi", "type": None}})
        assert (await f.sent())["result"] == "HI"
        await c.close()
    arun(body())
