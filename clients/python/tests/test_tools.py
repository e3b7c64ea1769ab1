# test_tools.py - the tool bridge through conch_client (BRIDGE.md, issue 7): tools and
# agents registered by the client, called from commands with `tool_call`/`spawn_agent`,
# answered by the client's handlers; errors, schema checks, concurrency, $/cancel, trace.
# Skipped as a whole only while the daemon answers tools.register with method_not_found.
import asyncio
import json
import shutil
import tempfile
import threading
import time

import pytest

from conch_client import (AsyncSandbox, Client, MethodNotFound, Sandbox, ToolError)
from conftest import CONCH_BIN, arun, have_bin, serve_args


def _bridge_state():
    if not have_bin():
        return f"no conch binary at {CONCH_BIN}"
    d = tempfile.mkdtemp(prefix="cc-probe-")
    try:
        with Client.spawn(CONCH_BIN, state_dir=d, serve_args=serve_args(), timeout=60) as c:
            sid = c.sandbox_create()["id"]
            try:
                c.tools_register(sid, [{"name": "probe", "description": "probe",
                                        "input_schema": {"type": "object"}}])
            except MethodNotFound:
                return ("the daemon answers tools.register with method_not_found: the tool "
                        "bridge (issue 7) is not in this build; these tests run once it is")
            return None
    finally:
        shutil.rmtree(d, ignore_errors=True)


_why = _bridge_state()
if _why:
    pytest.skip(_why, allow_module_level=True)

ECHO_SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
TYPED_SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}},
                "required": ["x"], "additionalProperties": False}


@pytest.fixture
def sb(client):
    s = Sandbox(client, client.sandbox_create())
    yield s
    s.destroy()


def fail(inp):
    raise ValueError(f"cannot handle {inp.get('what', 'that')}")


def test_echo_and_failing_tools(sb):
    assert sb.register_tool("echo", lambda inp: inp, "Echo the input", ECHO_SCHEMA) == ["echo"]
    assert sb.register_tool("fail", fail, "Always fails") == ["fail"]
    r = sb.run("""tool_call echo '{"x":1}'""")
    assert r.exit_code == 0, r.text
    assert json.loads(r.stdout) == {"x": 1}
    assert len(r.tool_calls) == 1
    rec = r.tool_calls[0]
    assert (rec["kind"], rec["name"], rec["ok"], rec["input"], rec["result"]) == (
        "tool", "echo", True, {"x": 1}, {"x": 1})
    assert rec["origin"]["kind"] == "exec" and rec["duration_ms"] >= 0
    assert "[tools:" in r.text and r.text.rstrip().endswith("[exit code: 0]")

    r = sb.run("""tool_call fail '{"what":"cheese"}'""")
    assert r.exit_code == 1
    assert "cannot handle cheese" in r.stderr
    rec = r.tool_calls[0]
    assert rec["ok"] is False and rec["error"]["kind"] == "tool_error"
    assert "cannot handle cheese" in rec["error"]["message"]

    trace = sb.tool_trace()
    assert [(c["name"], c["ok"]) for c in trace][-2:] == [("echo", True), ("fail", False)]


def test_string_result_tool_error_and_context(sb):
    seen = {}

    def greet(inp, ctx):
        seen.update(sandbox=ctx.sandbox, call_id=ctx.call_id, origin=ctx.origin)
        return f"hello {inp['name']}"

    def refuse(inp):
        raise ToolError("not allowed today")
    sb.register_tool("greet", greet, "Greets")
    sb.register_tool("refuse", refuse, "Refuses")
    r = sb.run("""tool_call greet '{"name":"ada"}'; echo '{}' | tool_call refuse -""")
    assert r.stdout == "hello ada\n"
    assert "not allowed today" in r.stderr and r.exit_code == 1
    assert seen["sandbox"] == sb.id and seen["origin"]["kind"] == "exec"
    assert seen["call_id"] == r.tool_calls[0]["call_id"]


def test_schema_unknown_tool_and_unregister(sb):
    called = []
    sb.register_tool("typed", lambda inp: called.append(inp) or "ok", "Typed", TYPED_SCHEMA)
    r = sb.run("""tool_call typed '{"x":"not a number"}'""")
    assert r.exit_code == 2 and "input.x" in r.stderr
    assert called == []  # the daemon refused it before it reached the client
    assert sb.run("""tool_call typed '{"x":3}'""").stdout == "ok\n"
    assert sb.run("tool_call nosuchtool '{}'").exit_code == 2
    assert sb.unregister_tool("typed") == ["typed"]
    assert sb.run("""tool_call typed '{"x":3}'""").exit_code == 2


def test_run_result_keeps_the_bridge_record(sb):
    """The summary line, the call records and the detached spawns, as a harness reads them."""
    sb.register_tool("echo", lambda inp: inp, "Echo the input", ECHO_SCHEMA)
    sb.register_tool("fail", fail, "Always fails")
    sb.register_agent("analyst", "Analyses data", lambda task: "never run: detached")
    r = sb.run("""tool_call echo '{"x":1}' >/dev/null; tool_call fail 2>/dev/null; """
               """spawn_agent --detach 'watch the build' analyst >/dev/null; echo end""")
    assert r.exit_code == 0, r.text
    assert r.tools_summary is not None and r.tools_summary.startswith(
        "[tools: 3 calls (echo=1, fail=1, analyst=1), 2 ok, 1 failed, "), r.tools_summary
    assert r.text.splitlines()[-2:] == [r.tools_summary, "[exit code: 0]"]
    assert [(c["name"], c["ok"]) for c in r.tool_calls] == [
        ("echo", True), ("fail", False), ("analyst", True)]
    assert [(d["task"], d["type"]) for d in r.detached_agents] == [("watch the build", "analyst")]
    assert sb.run("echo plain").tools_summary is None


def test_list_and_prompt(sb):
    sb.register_tool("echo", lambda inp: inp, "Echo the input", ECHO_SCHEMA)
    sb.register_agent("analyst", "Analyses data", lambda task: "done")
    lst = sb.tools()
    tool = next(t for t in lst["tools"] if t["name"] == "echo")
    assert tool["description"] == "Echo the input" and tool["input_schema"] == ECHO_SCHEMA
    assert {"name": "analyst", "description": "Analyses data"} in lst["agents"]
    prompt = sb.tools_prompt()
    assert "echo" in prompt and "Echo the input" in prompt
    assert "tool_call" in sb.run("tool_call --list").stdout + prompt


def test_agent_spawn(sb):
    sb.register_agent("analyst", "Analyses data", lambda task, ctx: f"{ctx.name}: {task[::-1]}")
    r = sb.run("spawn_agent 'abc' analyst")
    assert r.exit_code == 0 and r.stdout == "analyst: cba\n"
    rec = r.tool_calls[0]
    assert rec["kind"] == "agent" and rec["ok"] is True


def test_twenty_concurrent_calls(sb):
    # Each call waits at a barrier until all 20 are in their handlers (60 s at most): calls
    # run one after the other never meet, and the first fails.
    barrier = threading.Barrier(20, timeout=60)

    def meet(inp):
        barrier.wait()
        return inp["i"] * 10
    sb.register_tool("meet", meet, "Meet")
    r = sb.run("""for i in $(seq 1 20); do tool_call meet "{\\"i\\":$i}" > out.$i & done; wait
                  cat $(for i in $(seq 1 20); do echo out.$i; done)""", timeout=100)
    assert r.exit_code == 0, r.text
    assert r.stdout.split() == [str(i * 10) for i in range(1, 21)]
    assert len(r.tool_calls) == 20 and all(c["ok"] for c in r.tool_calls), r.tool_calls


def test_cancel_when_the_command_ends(sb):
    started = threading.Event()
    box = {}

    def hang(inp, ctx):
        started.set()
        box["cancelled"] = ctx.cancelled.wait(20)
        box["reason"] = ctx.cancel_reason
        return "late"
    sb.register_tool("hang", hang, "Never answers in time")
    r = sb.run("tool_call hang '{}'", timeout=1)
    assert started.is_set() and r.timed_out
    deadline = time.time() + 20
    while "cancelled" not in box and time.time() < deadline:
        time.sleep(0.05)
    assert box.get("cancelled") is True and box.get("reason")


def test_tools_go_with_their_connection(socket_daemon):
    with Client.connect(socket_daemon.sock, timeout=60) as a:
        sb = Sandbox(a, a.sandbox_create())
        b = Client.connect(socket_daemon.sock, timeout=60)
        b.register_tool(sb.id, "bee", lambda inp: "from b", "B's tool")
        assert sb.run("tool_call bee '{}'").stdout == "from b\n"
        b.close()
        time.sleep(0.2)
        r = sb.run("tool_call bee '{}'")
        assert r.exit_code != 0 and r.stdout == ""
        sb.destroy()


def test_async_tools(aconnect):
    async def body():
        c = await aconnect()
        try:
            async with AsyncSandbox.create(c) as sb:
                async def double(inp):
                    await asyncio.sleep(0.01)
                    return {"y": inp["x"] * 2}

                def sync_tool(inp):
                    return "from a thread"

                async def afail(inp):
                    raise RuntimeError("async failure")
                await sb.register_tool("double", double, "Doubles", ECHO_SCHEMA)
                await sb.register_tool("sync", sync_tool, "Sync")
                await sb.register_tool("afail", afail, "Fails")
                await sb.register_agent("helper", "Helps", lambda task: "helped")
                r = await sb.run("""tool_call double '{"x":21}'; tool_call sync; """
                                 """tool_call afail '{}'; spawn_agent t helper""")
                lines = r.stdout.splitlines()
                assert json.loads(lines[0]) == {"y": 42}
                assert lines[1:] == ["from a thread", "helped"]
                assert "async failure" in r.stderr
                assert [x["ok"] for x in r.tool_calls] == [True, True, False, True]
                cancelled = asyncio.Event()

                async def hang(inp):
                    try:
                        await asyncio.sleep(60)
                    except asyncio.CancelledError:
                        cancelled.set()
                        raise
                await sb.register_tool("hang", hang, "Hangs")
                r = await sb.run("tool_call hang '{}'", timeout=1)
                assert r.timed_out
                await asyncio.wait_for(cancelled.wait(), 20)
                assert len(await sb.tool_trace()) >= 5
        finally:
            await c.close()
    arun(body())


def test_untyped_spawn_goes_to_the_first_agent_type(sb):
    sb.register_agent("first", "The first type", lambda task, ctx: f"first got {task} ({ctx.name})")
    sb.register_agent("second", "Another", lambda task: "second")
    r = sb.run("spawn_agent 'job one'")
    assert r.exit_code == 0 and r.stdout == "first got job one (None)\n"


def test_tool_timeout_and_tool_calls_of_jobs(client):
    sb = Sandbox(client, client.sandbox_create(tool_timeout=1))
    try:
        gate = threading.Event()
        sb.register_tool("stuck", lambda inp: gate.wait(10) and "never", "Hangs")
        sb.register_tool("quick", lambda inp: "q", "Quick", timeout=5)
        r = sb.run("tool_call stuck '{}'")
        gate.set()
        assert r.exit_code == 1 and r.tool_calls[0]["error"]["kind"] == "timeout"
        job = sb.start("tool_call quick '{}'")
        w = job.wait(20)
        assert w["exit_code"] == 0
        assert [c["name"] for c in w["tool_calls"]] == ["quick"]
        assert w["tool_calls"][0]["origin"]["kind"] == "job"
        assert job.output()["stdout"] == "q\n"
    finally:
        sb.destroy()


def test_python_in_the_sandbox_calls_python_tools(sb):
    sb.register_tool("add", lambda inp: inp["a"] + inp["b"], "Adds",
                     {"type": "object", "properties": {"a": {"type": "number"},
                                                       "b": {"type": "number"}},
                      "required": ["a", "b"]})
    code = ("import conch_tools, concurrent.futures as f\n"
            "with f.ThreadPoolExecutor(8) as ex:\n"
            "    print(sum(ex.map(lambda i: conch_tools.call('add', {'a': i, 'b': 1}), range(40))))\n")
    sb.write("t.py", code)
    r = sb.run("python3 t.py")
    assert r.exit_code == 0, r.text
    assert r.stdout == f"{sum(range(40)) + 40}\n" and len(r.tool_calls) == 40


def test_untyped_spawn_goes_to_the_default_handler(sb):
    assert sb.register_agent(None, "", lambda task: f"default: {task}") == []
    sb.register_agent("named", "A named type", lambda task: "named")
    r = sb.run("spawn_agent 'plain task'; spawn_agent 'typed task' named")
    assert r.stdout == "default: plain task\nnamed\n"


def test_js_eval_calls_the_clients_tools(sb):
    sb.register_tool("add_one", lambda inp: {"n": inp["n"] + 1}, "Adds one", ECHO_SCHEMA)
    sb.register_tool("fail", fail, "Always fails")
    r = sb.js_eval("const rs = await Promise.all([1, 2, 3].map(n => tools.addOne({n})));\n"
                   "let caught = '';\n"
                   "try { await tools.fail({what: 'js'}) } catch (e) { caught = e.message }\n"
                   "[rs.map(x => x.n), caught]", session="py")
    assert r["ok"], r
    assert r["value"] == [[2, 3, 4], "cannot handle js"], r
    assert [c["name"] for c in r["tool_calls"]].count("add_one") == 3
    assert r["session"] == "py" and "[tools: 4 calls" in r["text"], r
    assert sb.js_eval("rs.length", session="py")["value"] == 3
    # The session's tool set: only add_one; fail is left out, and saying so when called.
    r = sb.js_eval("[Object.keys(tools).join(), await tools.fail({}).catch(e => e.message)]",
                   session="only", tools={"include": ["add_one"]})
    assert r["value"][0] == "addOne,add_one" and "leaves it out" in r["value"][1], r
    sb.js_close("only")
    assert [s["session"] for s in sb.js_sessions()] == ["py"]
    assert sb.js_reset("py")["reset"] is True
    assert sb.js_eval("typeof rs", session="py")["value"] == "undefined"
    assert sb.js_close("py")["closed"] is True
    assert sb.js_sessions() == []
