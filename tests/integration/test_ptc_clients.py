# test_ptc_clients.py - the in-sandbox tool-bridge clients (tool_call/spawn_agent, the Python
# module conch_tools, the Node package conch-tools) run on the host against a fake bridge: a
# unix-socket server in a thread that speaks the bridge protocol (docs/TOOLS.md, section B of
# the bridge spec) and answers echo, slow, failing, unknown, invalid-input and out-of-order
# calls, or closes the connection mid-call. What they prove: exit codes and output of the
# commands, stdin input, --list/--help, detached spawns; that threads, asyncio.gather and
# Promise.all calls run at once and each caller gets its own answer; that a bridge that goes
# away mid-call gives every caller an error and nothing hangs.
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_CONCH = os.environ.get("CONCH_BIN") or str(REPO / "build" / "conch")
PTC = Path(os.environ.get("CONCH_PTC_DIR") or Path(_CONCH).resolve().parent / "ptc")
TOOL_CALL = PTC / "bin" / "tool_call"
SPAWN_AGENT = PTC / "bin" / "spawn_agent"
NODE = shutil.which("node")
# The interpreter the Python-module tests run (PTC_TEST_PYTHON=python3.9 checks the oldest supported).
PYTHON = os.environ.get("PTC_TEST_PYTHON") or sys.executable

TOOLS = [
    {"name": "echo", "description": "Returns its input.\nSecond line.", "input_schema": {"type": "object"}},
    {
        "name": "web_search",
        "description": "Search the web.",
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look for"}},
            "required": ["query"],
        },
    },
    {"name": "getData", "description": "A tool whose name is camelCase.", "input_schema": {}},
    {"name": "get_data", "description": "Its snake_case twin.", "input_schema": {}},
]
AGENTS = [{"name": "analyst", "description": "Digs into data."}]


class FakeBridge:
    """A bridge socket answering per the protocol. Tools: echo (result = input), text (result
    = input["text"], a string), slow (answers after input["ms"] ms with input: out of order when
    calls overlap on one connection), meet (a barrier: answers once input["n"] calls of
    input["group"] are in flight, then after input["ms"] ms; a group that never fills fails
    them after 60 s: calls made one after the other never meet), failing (tool_error), strict (invalid_input unless
    input["n"] is an integer), timeout (kind timeout), big (a string of input["n"] bytes),
    web_search / getData / get_data (their own names), hang (never answers), close (closes the
    connection at once), close_later (closes it after input["ms"] ms); anything else:
    unknown_tool. Records every request."""

    def __init__(self, path):
        self.path = str(path)
        self.requests = []
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.spawns = 0
        self.connections = 0
        self.groups = {}  # meet: group -> [arrived, asyncio.Event]

    def start(self):
        self.thread.start()
        assert self.ready.wait(10), "fake bridge did not start"
        return self

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_unix_server(self._client, path=self.path, limit=16 << 20)
        )
        self.ready.set()
        self.loop.run_forever()
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def stop(self):
        def _stop():
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(_stop)
        self.thread.join(10)

    def requests_of(self, op=None):
        with self.lock:
            return [r for r in self.requests if op is None or r.get("op") == op]

    async def _client(self, reader, writer):
        self.connections += 1
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    req = json.loads(line)
                except ValueError:
                    writer.write(b'{"id":null,"ok":false,"error":{"kind":"invalid_request","message":"not JSON"}}\n')
                    continue
                with self.lock:
                    self.requests.append(req)
                if req.get("op") == "call" and req.get("name") == "close":
                    writer.close()
                    return
                asyncio.ensure_future(self._answer(req, writer))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            writer.close()

    async def _answer(self, req, writer):
        resp = await self._handle(req, writer)
        if resp is None:
            return
        resp["id"] = req.get("id")
        if not writer.is_closing():
            writer.write((json.dumps(resp) + "\n").encode())

    async def _handle(self, req, writer):
        ok = lambda r: {"ok": True, "result": r}  # noqa: E731
        err = lambda k, m: {"ok": False, "error": {"kind": k, "message": m}}  # noqa: E731
        op = req.get("op")
        if op == "list":
            return ok({"tools": TOOLS, "agents": AGENTS})
        if op == "spawn":
            self.spawns += 1
            if req.get("detach"):
                return ok({"request_id": f"req-{self.spawns}"})
            return ok(f"agent {req.get('type')} did: {req.get('task')}")
        if op != "call":
            return err("invalid_request", f"unknown op {op!r}")
        name, inp = req.get("name"), req.get("input")
        if name == "echo":
            return ok(inp)
        if name == "text":
            return ok(inp["text"])
        if name == "slow":
            await asyncio.sleep(inp.get("ms", 100) / 1000)
            return ok(inp)
        if name == "meet":
            g = self.groups.setdefault(inp["group"], [0, asyncio.Event()])
            g[0] += 1
            if g[0] >= inp["n"]:
                g[1].set()
            try:
                await asyncio.wait_for(g[1].wait(), 60)
            except asyncio.TimeoutError:
                return err("timeout", f"only {g[0]} of {inp['n']} calls of {inp['group']} met: serialised?")
            await asyncio.sleep(inp.get("ms", 0) / 1000)
            return ok(inp)
        if name == "failing":
            return err("tool_error", "it failed on purpose")
        if name == "strict":
            if not isinstance(inp.get("n"), int):
                return err("invalid_input", f"input.n: expected integer, got {type(inp.get('n')).__name__}")
            return ok(inp["n"] * 2)
        if name == "timeout":
            return err("timeout", "the tool did not answer within 30 s")
        if name == "big":
            return ok("x" * inp["n"])
        if name in ("web_search", "getData", "get_data"):
            return ok({"tool": name, "input": inp})
        if name == "hang":
            return None
        if name == "close_later":
            await asyncio.sleep(inp.get("ms", 100) / 1000)
            writer.close()
            return None
        return err("unknown_tool", f'unknown tool "{name}" (tool_call --list shows the tools)')


@pytest.fixture
def bridge():
    d = tempfile.mkdtemp(prefix="ptc-", dir="/tmp")
    b = FakeBridge(Path(d) / "ptc.sock").start()
    yield b
    b.stop()
    shutil.rmtree(d, ignore_errors=True)


def env_for(bridge, **extra):
    env = dict(os.environ)
    env["CONCH_PTC_SOCK"] = bridge.path if bridge else "/tmp/no-such-dir-for-ptc/ptc.sock"
    env["PYTHONPATH"] = str(PTC / "python")
    env.update(extra)
    return env


def run(argv, bridge, input=None, timeout=20, argv0=None):
    t = time.monotonic()
    p = subprocess.run(
        argv, input=input, capture_output=True, env=env_for(bridge), timeout=timeout, executable=argv0
    )
    p.elapsed = time.monotonic() - t
    return p


@pytest.fixture(scope="module", autouse=True)
def built():
    if not TOOL_CALL.exists():
        pytest.fail(f"{TOOL_CALL} is missing: build conch first (ninja -C build)", pytrace=False)


# ---- the tree ------------------------------------------------------------------------------


def test_tree_is_self_contained():
    want = {
        "bin/tool_call",
        "bin/spawn_agent",
        "python/conch_tools.py",
        "node/conch-tools/package.json",
        "node/conch-tools/index.js",
        "node/conch-tools/index.mjs",
    }
    have = {str(p.relative_to(PTC)) for p in PTC.rglob("*") if not p.is_dir()}
    assert have == want
    for p in PTC.rglob("*"):
        assert not p.is_symlink(), f"{p} is a symlink: the tree is bind-mounted alone"
    for b in ("tool_call", "spawn_agent"):
        assert os.access(PTC / "bin" / b, os.X_OK)
    # Static: no interpreter, so it runs in any sandbox image (a sanitizer build cannot be).
    out = subprocess.run(["file", "-L", str(TOOL_CALL)], capture_output=True, text=True).stdout
    if "dynamically linked" in out:
        needed = subprocess.run(["readelf", "-d", str(TOOL_CALL)], capture_output=True, text=True).stdout
        assert "libasan" in needed, f"tool_call is dynamically linked and not a sanitizer build: {out}"
    else:
        assert "static" in out, out


# ---- tool_call -------------------------------------------------------------------------------


def test_tool_call_prints_compact_json_and_sends_the_input(bridge):
    p = run([TOOL_CALL, "echo", '{"a": [1, 2], "b": "é"}'], bridge)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == '{"a":[1,2],"b":"é"}\n'
    assert p.stderr == b""
    (req,) = bridge.requests_of("call")
    assert req["name"] == "echo" and req["input"] == {"a": [1, 2], "b": "é"}


def test_tool_call_string_results_are_raw(bridge):
    p = run([TOOL_CALL, "text", '{"text": "hello\\tworld"}'], bridge)
    assert (p.returncode, p.stdout) == (0, b"hello\tworld\n")
    p = run([TOOL_CALL, "text", '{"text": "two\\nlines\\n"}'], bridge)
    assert (p.returncode, p.stdout) == (0, b"two\nlines\n")
    p = run([TOOL_CALL, "text", '{"text": ""}'], bridge)
    assert (p.returncode, p.stdout) == (0, b"\n")
    p = run([TOOL_CALL, "echo", "7"], bridge)
    assert (p.returncode, p.stdout) == (0, b"7\n")


def test_tool_call_default_and_stdin_input(bridge):
    p = run([TOOL_CALL, "echo"], bridge)
    assert (p.returncode, p.stdout) == (0, b"{}\n")
    big = {"rows": [{"id": i, "text": "ü" * 50} for i in range(2000)]}
    p = run([TOOL_CALL, "echo", "-"], bridge, input=json.dumps(big).encode())
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == big
    assert bridge.requests_of("call")[-1]["input"] == big
    p = run([TOOL_CALL, "echo", "-"], bridge, input=b"{nope")
    assert p.returncode == 2
    assert b"the input on stdin is not valid JSON" in p.stderr


def test_tool_call_invalid_json_argument_never_reaches_the_bridge(bridge):
    p = run([TOOL_CALL, "echo", "{'single': 'quotes'}"], bridge)
    assert p.returncode == 2
    assert b"echo: the input argument is not valid JSON" in p.stderr
    assert p.stdout == b""
    assert bridge.requests_of() == []


@pytest.mark.parametrize(
    "name,inp,code,msg",
    [
        ("failing", "{}", 1, b"tool_call: failing: it failed on purpose (tool_error)"),
        ("timeout", "{}", 1, b"the tool did not answer within 30 s (timeout)"),
        ("nosuch", "{}", 2, b'tool_call: nosuch: unknown tool "nosuch"'),
        ("strict", '{"n": "3"}', 2, b"tool_call: strict: input.n: expected integer, got str (invalid_input)"),
    ],
)
def test_tool_call_errors_and_exit_codes(bridge, name, inp, code, msg):
    p = run([TOOL_CALL, name, inp], bridge)
    assert p.returncode == code, p.stderr
    assert msg in p.stderr
    assert p.stdout == b""


def test_tool_call_big_result(bridge):
    n = 3 << 20
    p = run([TOOL_CALL, "big", json.dumps({"n": n})], bridge)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout) == n + 1 and p.stdout.strip(b"x") == b"\n"


def test_tool_call_list_and_help(bridge):
    p = run([TOOL_CALL, "--list"], bridge)
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert "tools:\n" in out
    assert "  echo        Returns its input.\n" in out  # first line of the description only
    assert "Second line" not in out
    assert "  web_search  Search the web.\n" in out
    assert "agent types (spawn_agent TASK TYPE):\n  analyst     Digs into data.\n" in out
    p = run([TOOL_CALL, "--list", "--json"], bridge)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"tools": TOOLS, "agents": AGENTS}
    p = run([TOOL_CALL, "--help", "web_search"], bridge)
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert out.startswith("web_search\n\nSearch the web.\n")
    schema_text = out.split("input schema:\n", 1)[1].split("\n\nusage:", 1)[0]
    assert json.loads(schema_text) == TOOLS[1]["input_schema"]
    assert '\n  "type": "object"' in schema_text  # pretty-printed
    p = run([TOOL_CALL, "--help", "nosuch"], bridge)
    assert p.returncode == 2 and b'unknown tool "nosuch"' in p.stderr
    p = run([TOOL_CALL, "--help"], bridge)
    assert p.returncode == 0 and p.stdout.startswith(b"usage: tool_call NAME")
    for bad in ([], ["--bogus"], ["echo", "{}", "extra"], ["--list", "--yaml"]):
        p = run([TOOL_CALL, *bad], bridge)
        assert p.returncode == 2, bad
        assert p.stderr, bad


def test_tool_call_without_a_bridge():
    p = run([TOOL_CALL, "echo", "{}"], None)
    assert p.returncode == 1
    assert b"no tool bridge in this sandbox: /tmp/no-such-dir-for-ptc/ptc.sock" in p.stderr
    p = run([SPAWN_AGENT, "task"], None)
    assert p.returncode == 1 and b"spawn_agent: no tool bridge in this sandbox" in p.stderr


def test_tool_call_bridge_closing_mid_call(bridge):
    p = run([TOOL_CALL, "close", "{}"], bridge, timeout=10)
    assert p.returncode == 1
    assert b"closed the connection before answering" in p.stderr
    p = run([TOOL_CALL, "close_later", '{"ms": 200}'], bridge, timeout=120)
    assert p.returncode == 1 and b"closed the connection before answering" in p.stderr, p.stderr


def test_tool_call_in_parallel_from_bash(bridge):
    script = textwrap.dedent(
        f"""
        for i in $(seq 1 40); do
          {TOOL_CALL} meet "{{\\"group\\": \\"bash\\", \\"n\\": 40, \\"i\\": $i}}" > "$OUT/$i" &
        done
        wait
        """
    )
    out = tempfile.mkdtemp(prefix="ptc-out-", dir="/tmp")
    try:
        # 40 calls meet at a barrier: run one after the other they fail (the first waits alone)
        p = subprocess.run(["bash", "-c", script], env=env_for(bridge, OUT=out), capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr
        for i in range(1, 41):
            assert json.loads(Path(out, str(i)).read_text()) == {"group": "bash", "n": 40, "i": i}
    finally:
        shutil.rmtree(out, ignore_errors=True)


# ---- spawn_agent -----------------------------------------------------------------------------


def test_spawn_agent_prints_the_answer(bridge):
    p = run([SPAWN_AGENT, "count the rows", "analyst"], bridge)
    assert (p.returncode, p.stdout) == (0, b"agent analyst did: count the rows\n"), p.stderr
    p = run([SPAWN_AGENT, "no type"], bridge)
    assert (p.returncode, p.stdout) == (0, b"agent None did: no type\n")
    p = run([SPAWN_AGENT, "-", "analyst"], bridge, input=b"a task\nfrom stdin")
    assert p.returncode == 0 and p.stdout == b"agent analyst did: a task\nfrom stdin\n"
    reqs = bridge.requests_of("spawn")
    assert reqs[0] == {"id": reqs[0]["id"], "op": "spawn", "task": "count the rows", "type": "analyst", "detach": False}
    assert reqs[1]["type"] is None


def test_spawn_agent_detach(bridge):
    p = run([SPAWN_AGENT, "--detach", "watch the logs", "analyst"], bridge)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"req-1\n"
    (req,) = bridge.requests_of("spawn")
    assert req["detach"] is True and req["task"] == "watch the logs"


def test_spawn_agent_usage(bridge):
    for argv in ([], ["--detach"], ["a", "b", "c"], ["--nope", "x"]):
        p = run([SPAWN_AGENT, *argv], bridge)
        assert p.returncode == 2, argv
    assert bridge.requests_of() == []
    p = run([SPAWN_AGENT, "--help"], bridge)
    assert p.returncode == 0 and p.stdout.startswith(b"usage: spawn_agent")


def test_behaviour_follows_argv0(bridge):
    p = run(["spawn_agent", "hi", "analyst"], bridge, argv0=str(TOOL_CALL))
    assert p.stdout == b"agent analyst did: hi\n"
    p = run(["/some/where/tool_call", "echo", "[1]"], bridge, argv0=str(SPAWN_AGENT))
    assert p.stdout == b"[1]\n"


# ---- Python ----------------------------------------------------------------------------------


def py(bridge, code, timeout=120):
    p = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)], capture_output=True, env=env_for(bridge), timeout=timeout
    )
    assert p.returncode == 0, f"stdout:\n{p.stdout.decode()}\nstderr:\n{p.stderr.decode()}"
    return p.stdout.decode()


def test_python_call_proxy_errors(bridge):
    out = py(
        bridge,
        """
        import conch_tools as ct
        assert ct.call("echo", {"x": 1}) == {"x": 1}
        assert ct.call("echo") == {}
        assert ct.tools.web_search(query="q") == {"tool": "web_search", "input": {"query": "q"}}
        assert ct.tools.echo({"y": [2]}) == {"y": [2]}
        assert ct.tools["get_data"]() == {"tool": "get_data", "input": {}}
        assert ct.call("text", {"text": "raw"}) == "raw"
        for name, inp, cls, kind in [("failing", {}, ct.ToolError, "tool_error"),
                                     ("nosuch", {}, ct.UnknownTool, "unknown_tool"),
                                     ("strict", {"n": "x"}, ct.InvalidInput, "invalid_input"),
                                     ("timeout", {}, ct.ToolError, "timeout")]:
            try:
                ct.call(name, inp)
            except cls as e:
                assert isinstance(e, ct.ToolError) and e.kind == kind, (name, e.kind)
                print(name, "->", e.message)
                import pickle
                e2 = pickle.loads(pickle.dumps(e))
                assert type(e2) is type(e) and (e2.kind, e2.message, str(e2)) == (e.kind, e.message, str(e))
            else:
                raise AssertionError(name + " did not raise")
        for bad in ({"s": {1, 2}}, {"f": float("nan")}, {"t": "\\udcff"}):
            try:
                ct.call("echo", bad)
            except ct.InvalidInput as e:
                assert e.message.startswith("the input cannot be sent as JSON"), e.message
            else:
                raise AssertionError(f"{bad!r} was sent")
        assert ct.spawn_agent("t", type="analyst") == "agent analyst did: t"
        assert ct.spawn_agent("t", detach=True) == "req-2"
        lt = ct.list_tools()
        assert [t["name"] for t in lt["tools"]][:2] == ["echo", "web_search"] and lt["agents"][0]["name"] == "analyst"
        assert "web_search" in dir(ct.tools)
        """,
    )
    assert "strict -> input.n: expected integer, got str\n" in out
    assert 'nosuch -> unknown tool "nosuch"' in out


def test_python_threads_each_get_their_own_answer(bridge):
    out = py(
        bridge,
        """
        import random, threading, time, conch_tools as ct
        results, errors = {}, []
        def worker(i):
            try:
                for j in range(3):
                    # all 50 threads meet in each round, then answer in a random order
                    r = ct.call("meet", {"group": f"round{j}", "n": 50, "ms": random.randint(0, 60), "who": i, "j": j})
                    assert r["who"] == i and r["j"] == j, (i, j, r)
                results[i] = ct.call("echo", {"who": i})
            except BaseException as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
        [x.start() for x in ts]; [x.join() for x in ts]
        # serialised, the first call of each round would wait alone and fail (ToolError)
        assert not errors, errors
        assert results == {i: {"who": i} for i in range(50)}
        print("ok")
        """,
    )
    assert out.startswith("ok")
    assert bridge.connections == 1, "the threads should share one connection"


def test_python_asyncio_gather_pairs_out_of_order_answers(bridge):
    out = py(
        bridge,
        """
        import asyncio, random, time, conch_tools as ct
        async def main():
            delays = [random.randint(0, 200) for _ in range(100)]
            # 100 calls meet at a barrier (serialised, the first fails), then answer out of order
            group = f"gather{next(ROUND)}"
            rs = await asyncio.gather(*(ct.acall("meet", {"group": group, "n": 100, "ms": d, "i": i})
                                        for i, d in enumerate(delays)))
            assert [r["i"] for r in rs] == list(range(100)), rs
            rs = await asyncio.gather(ct.acall("failing"), ct.acall("echo", {"k": 1}), ct.aspawn_agent("t", "analyst"),
                                      ct.aspawn_agent("d", detach=True), ct.tools.echo.acall(z=3), return_exceptions=True)
            assert isinstance(rs[0], ct.ToolError) and rs[0].kind == "tool_error"
            assert rs[1:3] == [{"k": 1}, "agent analyst did: t"] and rs[3].startswith("req-"), rs
            assert rs[4] == {"z": 3}, rs
            assert (await ct.alist_tools())["agents"][0]["name"] == "analyst"
            print("ok")
        ROUND = iter(range(2))
        asyncio.run(main())
        # A second event loop gets its own connection.
        asyncio.run(main())
        """,
    )
    assert out.count("ok") == 2
    # The asyncio calls of one loop shared one connection: ids are unique across them.
    ids = [r["id"] for r in bridge.requests_of("call")]
    assert len(ids) == len(set(ids))


def test_python_bridge_closing_mid_call(bridge):
    out = py(
        bridge,
        """
        import asyncio, threading, conch_tools as ct
        # threads: one call closes the connection under itself, the others carry on
        try:
            ct.call("close_later", {"ms": 100})
        except ct.ToolError as e:
            assert e.kind == "unavailable", e.kind
            print("thread:", e.message)
        assert ct.call("echo", {"after": 1}) == {"after": 1}
        # asyncio: every call pending on the shared connection fails, none hangs
        async def main():
            rs = await asyncio.gather(*[ct.acall("hang") for _ in range(10)], ct.acall("close_later", {"ms": 200}),
                                      return_exceptions=True)
            assert all(isinstance(r, ct.ToolError) and r.kind == "unavailable" for r in rs), rs
            print("asyncio:", rs[0].message)
            assert await ct.acall("echo", {"again": 1}) == {"again": 1}  # reconnects
        asyncio.run(asyncio.wait_for(main(), 10))
        """,
        timeout=30,
    )
    assert "thread: the tool bridge closed the connection before answering" in out
    assert "asyncio: the tool bridge closed the connection before answering" in out


def test_python_loop_ending_with_a_call_pending(bridge):
    p = subprocess.run(
        [PYTHON, "-X", "dev", "-c", textwrap.dedent(
            """
            import asyncio, conch_tools as ct
            async def main():
                t = asyncio.ensure_future(ct.acall("hang"))
                assert await ct.acall("echo", {"x": 1}) == {"x": 1}
                return "done"
            print(asyncio.run(main()))
            """
        )],
        capture_output=True, env=env_for(bridge), timeout=20,
    )
    assert p.returncode == 0 and p.stdout == b"done\n", p.stderr
    assert p.stderr == b"", p.stderr.decode()


def test_python_fork_gets_its_own_connection(bridge):
    out = py(
        bridge,
        """
        import os, conch_tools as ct
        assert ct.call("echo", {"parent": 1}) == {"parent": 1}  # leaves a pooled connection
        pid = os.fork()
        if pid == 0:
            ok = all(ct.call("slow", {"ms": 30, "child": i}) == {"ms": 30, "child": i} for i in range(5))
            os._exit(0 if ok else 1)
        res = [ct.call("slow", {"ms": 20, "parent": i}) for i in range(5)]
        _, status = os.waitpid(pid, 0)
        assert res == [{"ms": 20, "parent": i} for i in range(5)], res
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
        """,
    )
    assert out == "ok\n"


def test_python_without_a_bridge():
    out = py(
        None,
        """
        import asyncio, conch_tools as ct
        for f in (lambda: ct.call("echo"), lambda: asyncio.run(ct.acall("echo"))):
            try:
                f()
            except ct.ToolError as e:
                assert e.kind == "unavailable"
                print(e.message)
        """,
    )
    assert out.count("no tool bridge in this sandbox: /tmp/no-such-dir-for-ptc/ptc.sock") == 2


# ---- Node ------------------------------------------------------------------------------------

needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


@pytest.fixture
def node_dir():
    # A directory where require('conch-tools') and import 'conch-tools' resolve, as
    # /node_modules/conch-tools does in the sandbox.
    d = Path(tempfile.mkdtemp(prefix="ptc-node-", dir="/tmp"))
    (d / "node_modules").mkdir()
    shutil.copytree(PTC / "node" / "conch-tools", d / "node_modules" / "conch-tools")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def node(bridge, node_dir, code, ext="js", timeout=120):
    f = node_dir / f"t.{'mjs' if ext == 'mjs' else 'js'}"
    f.write_text(textwrap.dedent(code))
    t = time.monotonic()
    p = subprocess.run([NODE, str(f)], capture_output=True, env=env_for(bridge), timeout=timeout, cwd=node_dir)
    p.elapsed = time.monotonic() - t
    assert p.returncode == 0, f"stdout:\n{p.stdout.decode()}\nstderr:\n{p.stderr.decode()}"
    return p


NODE_100 = """
  // 100 calls meet at a barrier (one after the other, the first would fail), then answer
  // out of order
  const delays = Array.from({ length: 100 }, () => Math.floor(Math.random() * 200));
  const group = `node${process.hrtime.bigint()}`;
  const rs = await Promise.all(delays.map((ms, i) => call('meet', { group, n: 100, ms, i })));
  rs.forEach((r, i) => { if (r.i !== i) throw new Error(`call ${i} got ${JSON.stringify(r)}`); });
  console.log('ok');
"""


@needs_node
def test_node_require_promise_all(bridge, node_dir):
    p = node(bridge, node_dir, "const { call } = require('conch-tools');\n(async () => {" + NODE_100 + "})();\n")
    assert p.stdout.startswith(b"ok")
    # Every call went over one connection (ids unique, one process).
    ids = [r["id"] for r in bridge.requests_of("call")]
    assert len(ids) == 100 and len(set(ids)) == 100
    assert bridge.connections == 1


@needs_node
def test_node_import_promise_all(bridge, node_dir):
    p = node(
        bridge,
        node_dir,
        "import { call, tools, ToolError } from 'conch-tools';\nimport def from 'conch-tools';\n"
        "if (def.call !== call) throw new Error('default export');\n" + NODE_100,
        ext="mjs",
    )
    assert p.stdout.startswith(b"ok")


@needs_node
def test_node_tools_proxy_errors_and_spawn(bridge, node_dir):
    p = node(
        bridge,
        node_dir,
        """
        const assert = require('assert');
        const { tools, call, spawnAgent, listTools, ToolError, UnknownTool, InvalidInput } = require('conch-tools');
        (async () => {
          assert.deepStrictEqual(await tools.webSearch({ query: 'q' }), { tool: 'web_search', input: { query: 'q' } });
          assert.deepStrictEqual(await tools.web_search({ query: 'q' }), { tool: 'web_search', input: { query: 'q' } });
          // a tool named exactly getData exists: the proxy uses it, not get_data
          assert.deepStrictEqual(await tools.getData(), { tool: 'getData', input: {} });
          assert.deepStrictEqual(await tools.echo({ a: 1 }), { a: 1 });
          assert.strictEqual(await call('text', { text: 'raw' }), 'raw');
          for (const [name, input, cls, kind] of [['failing', {}, ToolError, 'tool_error'],
                                                  ['nosuch', {}, UnknownTool, 'unknown_tool'],
                                                  ['strict', { n: 'x' }, InvalidInput, 'invalid_input']]) {
            await assert.rejects(call(name, input), (e) => e instanceof cls && e instanceof ToolError && e.kind === kind);
          }
          const circular = {}; circular.self = circular;
          await assert.rejects(call('echo', circular), (e) => e instanceof InvalidInput && /cannot be sent as JSON/.test(e.message));
          await assert.rejects(call('echo', { n: 1n }), (e) => e instanceof InvalidInput);
          await assert.rejects(tools.noSuchTool({}), (e) => e.kind === 'unknown_tool' && /no_such_tool/.test(e.message));
          assert.strictEqual(await spawnAgent('t', 'analyst'), 'agent analyst did: t');
          assert.strictEqual(await spawnAgent('t'), 'agent None did: t');
          assert.strictEqual(await spawnAgent('t', 'analyst', { detach: true }), 'req-3');
          assert.strictEqual((await listTools()).agents[0].name, 'analyst');
          assert.strictEqual(await tools.then, undefined);
          console.log('ok');
        })().catch((e) => { console.error(e); process.exit(1); });
        """,
    )
    assert p.stdout == b"ok\n"
    names = [r["name"] for r in bridge.requests_of("call")]
    assert "get_data" not in names and "no_such_tool" in names
    spawns = bridge.requests_of("spawn")
    assert spawns[-1]["detach"] is True and spawns[0]["type"] == "analyst" and spawns[1]["type"] is None


@needs_node
def test_node_idle_connection_does_not_keep_the_process_alive(bridge, node_dir):
    p = node(
        bridge,
        node_dir,
        """
        const { call } = require('conch-tools');
        call('echo', { a: 1 }).then((r) => console.log('got', JSON.stringify(r)));
        setTimeout(() => call('echo', { b: 2 }).then((r) => console.log('got', JSON.stringify(r))), 50);
        """,
        timeout=120,
    )
    # it exited by itself (the 120 s limit catches a connection that kept it alive)
    assert p.stdout == b'got {"a":1}\ngot {"b":2}\n'


@needs_node
def test_node_bridge_closing_mid_call(bridge, node_dir):
    p = node(
        bridge,
        node_dir,
        """
        const { call } = require('conch-tools');
        (async () => {
          const rs = await Promise.allSettled([...Array(10)].map(() => call('hang')).concat([call('close_later', { ms: 200 })]));
          for (const r of rs) if (r.status !== 'rejected' || r.reason.kind !== 'unavailable') throw new Error(JSON.stringify(r));
          console.log(rs[0].reason.message);
          console.log(JSON.stringify(await call('echo', { again: 1 })));  // reconnects
        })().catch((e) => { console.error(e); process.exit(1); });
        """,
        timeout=20,
    )
    assert p.stdout == b"the tool bridge closed the connection before answering\n{\"again\":1}\n"


@needs_node
def test_node_without_a_bridge(node_dir):
    p = node(
        None,
        node_dir,
        """
        const { call, ToolError } = require('conch-tools');
        call('echo').then(() => process.exit(1), (e) => console.log(e instanceof ToolError, e.kind, e.message));
        """,
        timeout=10,
    )
    assert p.stdout.startswith(b"true unavailable no tool bridge in this sandbox: /tmp/no-such-dir-for-ptc/ptc.sock")
