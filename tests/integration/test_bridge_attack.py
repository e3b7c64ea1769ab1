# test_bridge_attack.py - an outside attack review of the tool bridge (issue 7). Every test
# here reproduces a finding: it FAILS on the build it was written against and is marked
# xfail(strict=True) so the suite stays green; the fix removes the mark.
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from conftest import ASAN, CONCH_BIN

# The daemon's memory bounds are checked on the plain build (conftest.ASAN).
not_under_asan = pytest.mark.plain_build  # memory bounds: see conftest.py
from rpcclient import Client, RpcError, wait_gone




def alive(daemon, timeout=10):
    """The daemon process runs and still answers a ping on a fresh connection. A daemon that
    died or hangs is marked as killed (the fixture's teardown then leaves the verdict to the
    test) and stopped."""
    ok = False
    if daemon.proc.poll() is None:
        try:
            c = Client.unix(daemon.sock, timeout=5)
            try:
                ok = c.call("daemon.ping", {}, timeout=timeout).get("pid") == daemon.pid
            finally:
                c.close()
        except Exception:
            ok = False
    if not ok:
        daemon.killed = True
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(10)
    return ok


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0])


# ---- F1: a harness client that disconnects while an unread caller has pending calls ----------

UNREAD_CALLER = r"""
import socket, json, time, sys
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
def send(o): s.sendall((json.dumps(o) + "\n").encode())
# two calls the harness holds, then answers we never read: over 16 MiB of them
send({"id": "n1", "op": "call", "name": "never", "input": {}})
send({"id": "n2", "op": "call", "name": "never", "input": {}})
for i in range(17):
    send({"id": i, "op": "call", "name": "echo", "input": {"pad": "x" * (1 << 20)}})
open("/tmp/ready", "w").close()
time.sleep(60)
"""


def test_client_gone_while_caller_unread_keeps_daemon_alive(daemon, ws):
    owner = daemon.client()
    owner.handlers["tool.call"] = lambda p: None if p["name"] == "never" else p["input"]
    orig = owner._answer
    owner._answer = lambda m: None if m["params"].get("name") == "never" else orig(m)
    other = daemon.client()
    sb = other.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    owner.call("tools.register", {"sandbox": sb, "tools": [
        {"name": "never", "input_schema": {"type": "object"}},
        {"name": "echo", "input_schema": {"type": "object"}}]})
    job = other.call("job.start", {"sandbox": sb, "command": "python3 -", "stdin": UNREAD_CALLER})["job_id"]
    deadline = time.time() + 30
    while time.time() < deadline:
        seen = [m for m in owner.incoming if m["method"] == "tool.call"]
        if sum(1 for m in seen if m["params"]["name"] == "echo") >= 17 and sum(1 for m in seen if m["params"]["name"] == "never") >= 2:
            break
        time.sleep(0.1)
    time.sleep(1.0)  # the echo answers are queued at the unread caller
    owner.close()
    time.sleep(1.0)
    assert alive(daemon), f"the daemon died or hangs after a client left\n{daemon.log()}"
    other.call("job.kill", {"job_id": job}, timeout=10)
    other.call("sandbox.destroy", {"id": sb}, timeout=30)


# ---- F2: the same double release from inside the sandbox alone --------------------------------

HOLDER = r"""
import socket, time, os
l = socket.socket(socket.AF_UNIX); l.bind("/tmp/hold.sock"); l.listen(1)
c, _ = l.accept()
msg, fds, flags, addr = socket.recv_fds(c, 16, 4)
print("holding", fds, flush=True)
time.sleep(60)
"""

PASSER = r"""
import socket, json, time
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
def send(o): s.sendall((json.dumps(o) + "\n").encode())
send({"id": "n1", "op": "call", "name": "never", "input": {}})
send({"id": "n2", "op": "call", "name": "never", "input": {}})
for i in range(17):
    send({"id": i, "op": "call", "name": "echo", "input": {"pad": "x" * (1 << 20)}})
time.sleep(3)  # the answers pile up unread in the daemon
h = socket.socket(socket.AF_UNIX); h.connect("/tmp/hold.sock")
socket.send_fds(h, [b"x"], [s.fileno()])
print("passed")
"""


def test_command_ending_with_handed_over_unread_connection(daemon, ws):
    c = daemon.client()
    c.handlers["tool.call"] = lambda p: p["input"]
    orig = c._answer
    c._answer = lambda m: None if m["params"].get("name") == "never" else orig(m)
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    c.call("tools.register", {"sandbox": sb, "tools": [
        {"name": "never", "input_schema": {"type": "object"}},
        {"name": "echo", "input_schema": {"type": "object"}}]})
    job = c.call("job.start", {"sandbox": sb, "command": "python3 -", "stdin": HOLDER})["job_id"]
    time.sleep(1.0)
    try:
        r = c.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": PASSER, "timeout": 60}, timeout=40)
    except Exception as e:
        r = e
    ok = alive(daemon)
    assert ok, f"the daemon died or hangs after a command ended ({r!r})\n{daemon.log()}"
    c.call("job.kill", {"job_id": job}, timeout=10)
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


# ---- F3: conch run --tools waits for whatever a cancelled host tool left running ---------------


def test_conch_run_tools_timeout_is_not_held_by_tool_grandchild(tmp_path):
    marker = f"attack2-{os.getpid()}-{time.monotonic_ns()}"
    # The host tool's grandchild sleeps far longer than the subprocess may take: conch run
    # returns (TimeoutExpired otherwise: it waited for the grandchild), and the tool's
    # processes are gone.
    tools = {"tools": [{"name": "slow", "input_schema": {"type": "object"},
                        "command": ["sh", "-c", f"sleep 1000; echo {marker}"]}]}
    f = tmp_path / "tools.json"
    f.write_text(json.dumps(tools))
    ws = tmp_path / "ws"
    ws.mkdir()
    p = subprocess.run([CONCH_BIN, "run", "--json", "--workspace", str(ws), "--tools", str(f), "--timeout", "2",
                        "--", "bash", "-c", "tool_call slow; echo rc=$?"], capture_output=True, text=True, timeout=120, cwd=ws)
    res = json.loads(p.stdout)
    assert res["timed_out"] is True
    assert marker not in res["stdout"], res
    assert wait_gone(marker) == [], "the host tool outlived conch run"


# ---- F4: exponential schema validation blocks the daemon's loop -------------------------------


def test_schema_validation_cannot_freeze_the_daemon(daemon, ws):
    c = daemon.client()
    c.handlers["tool.call"] = lambda p: "ok"
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    # an ordinary tagged-union tree, as a harness would register for an expression tool
    schema = {"oneOf": [{"type": "object", "properties": {"child": {"$ref": "#"}, "kind": {"const": f"k{i}"}},
                         "required": ["kind"]} for i in range(6)]}
    c.call("tools.register", {"sandbox": sb, "tools": [{"name": "ast", "input_schema": schema}]})
    bad = {"kind": "none"}
    for _ in range(9):
        bad = {"child": bad, "kind": "k0"}
    job = c.call("job.start", {"sandbox": sb, "command": "tool_call ast -; echo rc=$? >&2",
                               "stdin": json.dumps(bad)})["job_id"]
    # Checked in full, this input takes about a minute of the loop's time (every ping and
    # the job's end would wait for it); a budget of steps refuses it as too complex at once.
    st = c.call("job.wait", {"job_id": job, "timeout": 100}, timeout=120)
    assert st["running"] is False, st
    err = c.call("job.output", {"job_id": job})["stderr"]
    assert "invalid_input" in err and "steps" in err and "rc=2" in err, err
    assert alive(daemon, timeout=60), "the daemon does not answer after validating one call's input"
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


# ---- F5: JSON nested 1,500 deep reaches the harness ------------------------------------------


def test_deeply_nested_input_is_refused_inside(daemon, ws):
    owner = daemon.client()
    owner.handlers["tool.call"] = lambda p: "ok"
    other = daemon.client()
    sb = other.call("sandbox.create", {"workspace": str(ws), "tool_timeout": 5}, timeout=30)["id"]
    owner.call("tools.register", {"sandbox": sb, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
    deep = '{"a":' + "[" * 1500 + "]" * 1500 + "}"
    # (the record of such a call, under 4 KiB, also makes the exec.run result itself too deep for
    # the client that ran the command)
    r = other.call("exec.run", {"sandbox": sb, "command": "tool_call echo -; echo rc=$?", "stdin": deep}, timeout=15)
    reached = [m for m in owner.incoming if m["method"] == "tool.call"]
    assert not owner.bad_lines and not owner.eof
    assert "rc=2" in r["stdout"] and reached == [], (r["stdout"], r["stderr"])
    # the harness still answers
    r = other.call("exec.run", {"sandbox": sb, "command": "tool_call echo '{}'; echo rc=$?"}, timeout=60)
    assert "rc=0" in r["stdout"], r
    other.call("sandbox.destroy", {"id": sb}, timeout=30)


# ---- F6: conch run --tools starts one host process per call, 1,024 at once --------------------


@pytest.mark.slow
def test_conch_run_tools_host_processes_are_bounded(tmp_path):
    from rpcclient import pids_matching
    # F6: host commands run behind a small concurrency cap (16), not one per call at once
    secs = f"2.{os.getpid() % 1000:03d}{time.monotonic_ns() % 1000}"
    f = tmp_path / "tools.json"
    f.write_text(json.dumps({"tools": [{"name": "slow", "input_schema": {"type": "object"}, "command": ["sleep", secs]}]}))
    ws = tmp_path / "ws"
    ws.mkdir()
    script = ("import socket, json\n"
              "s = socket.socket(socket.AF_UNIX); s.connect('/run/conch/ptc.sock')\n"
              "for i in range(100): s.sendall((json.dumps({'id': i, 'op': 'call', 'name': 'slow', 'input': {}}) + '\\n').encode())\n"
              "f = s.makefile('rb')\n"
              "print(sum(json.loads(f.readline())['ok'] for i in range(100)))\n")
    p = subprocess.Popen([CONCH_BIN, "run", "--json", "--workspace", str(ws), "--tools", str(f), "--pids", "32",
                          "--", "python3", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws)
    most = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and p.poll() is None:
        most = max(most, len(pids_matching(secs)))
        time.sleep(0.2)
    out, _ = p.communicate(timeout=120)
    assert most <= 16, f"{most} host tool processes ran at once for one command limited to --pids 32"
    assert json.loads(out)["stdout"].strip() == "100", out  # every call was answered


# ---- F7: no cap on registered tools, and registering costs O(tools) each ---------------------


def test_registry_size_is_bounded_or_cheap(daemon, ws):
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]

    def batch(b):
        return [{"name": f"t{b}_{i}", "description": "d" * 100,
                 "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}} for i in range(1000)]

    for b in range(30):
        try:
            c.call("tools.register", {"sandbox": sb, "tools": batch(b)}, timeout=120)
        except RpcError as e:
            # a cap on the registry: fine, if it is one (a limit error naming it)
            assert e.data["code"] == "limit" and "at most" in e.message, (e.data, e.message)
            assert b >= 4, f"refused after only {b * 1000} tools"
            assert len(c.call("tools.list", {"sandbox": sb})["tools"]) == b * 1000
            return
    # (it used to allow an unbounded registry if registering stayed cheap, a time bound: the
    # registry is bounded, and that is what is asserted)
    pytest.fail("30,000 tools were registered in one sandbox: the registry has no cap")


# ---- F8: detached spawns keep their whole task: memory without bound -------------------------

DETACHER = r"""
import socket, json, time
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
f = s.makefile("rb")
task = "x" * ((4 << 20) - 200)
for i in range(60):
    s.sendall((json.dumps({"id": i, "op": "spawn", "task": task, "detach": True}) + "\n").encode())
    r = json.loads(f.readline())
    if not r["ok"]:
        print("refused", i, r["error"]["kind"], flush=True)
        break
print("sent", flush=True)
time.sleep(60)
"""


@not_under_asan
def test_detached_spawns_cannot_grow_the_daemon(daemon, ws):
    starter = daemon.client()
    sb = starter.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    before = rss_kb(daemon.pid)
    job = starter.call("job.start", {"sandbox": sb, "command": "python3 -", "stdin": DETACHER})["job_id"]
    deadline = time.time() + 60
    out = ""
    while time.time() < deadline:
        out = starter.call("job.output", {"job_id": job})["stdout"]
        if "sent" in out or "refused" in out:
            break
        time.sleep(0.5)
    grown = rss_kb(daemon.pid) - before
    starter.close()  # (its job.exited would carry the 240 MB)
    other = daemon.client()
    other.call("sandbox.destroy", {"id": sb}, timeout=60)
    assert grown < 100 * 1024, f"the daemon grew by {grown // 1024} MB for one command's detached spawns ({out.strip()})"


# ---- F9: the sanitizer build CI makes cannot link tool_call ---------------------------------


def test_sanitizer_build_links_tool_call(tmp_path):
    import shutil
    from conftest import REPO
    if not (REPO / "meson.build").exists() or not shutil.which("meson") or not shutil.which("ninja"):
        pytest.skip("needs the source tree, meson and ninja")
    b = tmp_path / "build-asan"
    p = subprocess.run(["meson", "setup", str(b), "--werror", "-Db_sanitize=address,undefined", "-Db_lundef=false"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    p = subprocess.run(["ninja", "-C", str(b), "src/ptc/tool_call"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]


# ---- F10: docs/TOOLS.md, which every pointer names, does not exist ---------------------------


def test_tools_guide_exists():
    from conftest import REPO
    if not (REPO / "docs").exists():
        pytest.skip("needs the source tree")
    guide = REPO / "docs" / "TOOLS.md"
    assert guide.exists(), "docs/TOOLS.md is missing"
    text = guide.read_text()
    assert "--tools" in text and '"command"' in text


# ---- F11: a caller that half-closes after its request never gets the answer ------------------

HALF_CLOSER = r"""
import socket
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
s.sendall(b'{"id": 1, "op": "call", "name": "echo", "input": {"k": 1}}\n')
s.shutdown(socket.SHUT_WR)   # as `nc -N`, socat, or printf ... | nc -U do
s.settimeout(10)
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
print(repr(data))
"""


def test_half_closed_caller_still_gets_its_answer(daemon, ws):
    c = daemon.client()
    c.handlers["tool.call"] = lambda p: (time.sleep(0.3), p["input"])[1]  # a tool that takes a moment
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    c.call("tools.register", {"sandbox": sb, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
    r = c.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": HALF_CLOSER, "timeout": 30}, timeout=60)
    assert '"ok": true' in r["stdout"].replace('"ok":true', '"ok": true'), (r["stdout"], r["tool_calls"])
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


# ---- F12: 64 MiB of calls in flight is 1.3 GB of daemon memory -------------------------------

AMPLIFIER = r"""
import socket, json, time
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
line = (json.dumps({"id": 0, "op": "call", "name": "slow", "input": {"a": [0] * 2000000}}, separators=(",", ":")) + "\n").encode()
for i in range(40):
    s.sendall(line.replace(b'"id":0', b'"id":%d' % i, 1))
time.sleep(30)
"""


@not_under_asan
@pytest.mark.slow
def test_calls_in_flight_cannot_hold_gigabytes(daemon, ws):
    c = daemon.client()
    owner = daemon.client()
    owner._answer = lambda m: None  # reads its requests, answers later (a slow tool)
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    owner.call("tools.register", {"sandbox": sb, "tools": [{"name": "slow", "input_schema": {"type": "object"}}]})
    before = rss_kb(daemon.pid)
    job = c.call("job.start", {"sandbox": sb, "command": "python3 -", "stdin": AMPLIFIER})["job_id"]
    peak = 0
    for _ in range(20):
        time.sleep(0.5)
        peak = max(peak, rss_kb(daemon.pid))
    c.call("job.kill", {"job_id": job}, timeout=10)
    c.call("sandbox.destroy", {"id": sb}, timeout=60)
    grown = (peak - before) // 1024
    assert grown < 400, f"the daemon grew by {grown} MB holding one command's calls in flight"


# ---- F13: tools.prompt expands every $ref in place: exponential in a 2 KB schema ---------------


def test_tools_prompt_is_bounded_for_shared_defs(daemon, ws):
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    props, levels = 6, 7
    defs = {f"d{i}": {"type": "object", "properties": {f"p{j}": {"$ref": f"#/$defs/d{i + 1}"} for j in range(props)}}
            for i in range(levels)}
    defs[f"d{levels}"] = {"type": "string"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    assert len(json.dumps(schema)) < 2000
    try:
        c.call("tools.register", {"sandbox": sb, "tools": [{"name": "tree", "input_schema": schema}]})
    except RpcError:
        return  # refused at registration: fine
    text = c.call("tools.prompt", {"sandbox": sb}, timeout=60)["text"]
    assert len(text) < (1 << 20), f"a {len(json.dumps(schema))}-byte schema rendered {len(text)} bytes of prompt"


# ---- F14: records keep inputs under 4 KiB as parsed JSON: 20x that in memory, kept after the end -

RECORDER = r"""
import socket, json
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
f = s.makefile("rb")
line = (json.dumps({"id": 0, "op": "call", "name": "echo", "input": {"a": [0] * 2040}}, separators=(",", ":")) + "\n").encode()
for b in range(30):
    for i in range(100):
        s.sendall(line)
    for i in range(100):
        assert json.loads(f.readline())["ok"]
print("done", flush=True)
"""


@not_under_asan
def test_call_records_do_not_amplify_memory(daemon, ws):
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    # a fast owner on a raw socket (answers {"ok": 1})
    o = socket.socket(socket.AF_UNIX)
    o.connect(daemon.sock)
    o.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools.register", "params": {
        "sandbox": sb, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]}}) + "\n").encode())

    def answer():
        for line in o.makefile("rb"):
            m = json.loads(line)
            if m.get("method") == "tool.call":
                o.sendall(b'{"jsonrpc":"2.0","id":%d,"result":{"ok":1}}\n' % m["id"])

    threading.Thread(target=answer, daemon=True).start()
    before = rss_kb(daemon.pid)
    r = c.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": RECORDER, "timeout": 120}, timeout=180)
    assert "done" in r["stdout"], r["stderr"][-2000:]
    del r
    grown = (rss_kb(daemon.pid) - before) // 1024
    o.close()
    c.call("sandbox.destroy", {"id": sb}, timeout=60)
    assert grown < 100, f"the daemon still holds {grown} MB after one command's 3,000 calls of 4 KiB"
