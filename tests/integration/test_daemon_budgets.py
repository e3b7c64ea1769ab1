# test_daemon_budgets.py - what a sandbox or a client makes the daemon hold counts against a
# per-sandbox and a daemon-wide budget (issue 16, defects 3 and 4; docs/ARCHITECTURE.md,
# "Budgets"). Each test is an attack on a fence: it holds as much as it can and measures the
# daemon's resident memory (VmRSS of /proc/<pid>/status), never time.
import json
import os
import time

import pytest

from conftest import ASAN

not_under_asan = pytest.mark.plain_build  # memory bounds: see conftest.py

MiB = 1 << 20


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


def hwm_reset(pid):
    """Start measuring the peak resident memory of @pid afresh (VmHWM := VmRSS)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) / 1024


def sandbox_held(client, sb):
    """Bytes the daemon holds for @sb (charged to its budget), as sandbox.get reports them."""
    return client.call("sandbox.get", {"id": sb})["held"]


def wait_held(client, sb, want=0, timeout=30):
    deadline = time.time() + timeout
    while True:
        held = sandbox_held(client, sb)
        if held == want or time.time() > deadline:
            return held
        time.sleep(0.1)


def wait_file(client, sb, path, timeout=60):
    """Wait until @path exists inside @sb (a command there wrote it); returns its text."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = client.call("exec.run", {"sandbox": sb, "command": f"cat {path} 2>/dev/null", "timeout": 30}, timeout=60)
        if r["exit_code"] == 0:
            return r["stdout"]
        time.sleep(0.2)
    raise AssertionError(f"{path} never appeared in {sb}")


# ---- defect 3: half-read lines to the tool bridge --------------------------------------------

# Many connections, each sending almost 4 MiB (the payload cap) of one request line and never
# its newline, then staying open. What the daemon refuses is reported in /tmp/hog.json.
HOG = r"""
import json, socket, sys
n = int(sys.argv[1])
chunk = b'{"id": 1, "op": "call", "name": "echo", "input": {"s": "' + b"a" * ((4 << 20) - 100)
held, refused, messages = [], 0, []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/conch/ptc.sock")
        s.sendall(chunk)
        held.append(s)
    except OSError:
        refused += 1
        s.settimeout(2)
        try:
            line = s.makefile("rb").readline()
            if line:
                messages.append(json.loads(line)["error"])
        except (OSError, ValueError):
            pass
        s.close()
with open("/tmp/hog.json.part", "w") as f:
    json.dump({"sent": n, "refused": refused, "messages": messages[:3]}, f)
import os; os.rename("/tmp/hog.json.part", "/tmp/hog.json")
import time; time.sleep(120)
"""


@not_under_asan
def test_half_read_bridge_lines_are_bounded_per_sandbox(daemon, ws, tmp_path):
    c = daemon.client()
    c.handlers["tool.call"] = lambda p: p["input"]
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    other_ws = tmp_path / "other"
    other_ws.mkdir()
    sb2 = c.call("sandbox.create", {"workspace": str(other_ws)}, timeout=30)["id"]
    for s in (sb, sb2):
        c.call("tools.register", {"sandbox": s, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
    # Warm up the daemon (a tool call, a command) before the baseline is taken.
    r = c.call("exec.run", {"sandbox": sb2, "command": "tool_call echo '{\"x\": 1}'", "timeout": 30}, timeout=60)
    assert r["exit_code"] == 0, r["text"]
    before = rss_mib(daemon.pid)
    # 48 connections x 4 MiB: 192 MiB held on a daemon without a budget.
    conns = 48
    job = c.call("job.start", {"sandbox": sb, "command": f"python3 - {conns}", "stdin": HOG})["job_id"]
    report = json.loads(wait_file(c, sb, "/tmp/hog.json", timeout=120))
    grown = rss_mib(daemon.pid) - before
    print(f"half-read lines: the daemon grew by {grown:.0f} MiB; {report}")
    # The per-sandbox budget is 64 MiB: the daemon holds at most that for it, plus slack for
    # the allocator and the commands run meanwhile.
    assert grown < 96, f"the daemon grew by {grown:.0f} MiB holding one sandbox's half-read lines ({report})"
    assert report["refused"] > 0, report
    # The caller is told why: a line naming the budget, not a bare hang-up.
    assert any(m["kind"] == "limit" and "MiB" in m["message"] for m in report["messages"]), report
    # Another sandbox's tools still work while this one is at its budget.
    r = c.call("exec.run", {"sandbox": sb2, "command": "tool_call echo '{\"x\": 2}'", "timeout": 30}, timeout=60)
    assert r["exit_code"] == 0 and json.loads(r["stdout"]) == {"x": 2}, r["text"]
    # Once its connections are gone, the sandbox's own calls work again.
    c.call("job.kill", {"job_id": job}, timeout=10)
    deadline = time.time() + 30
    while True:
        r = c.call("exec.run", {"sandbox": sb, "command": "tool_call echo '{\"x\": 3}'", "timeout": 30}, timeout=60)
        if r["exit_code"] == 0 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert r["exit_code"] == 0 and json.loads(r["stdout"]) == {"x": 3}, r["text"]


# Complete request lines that are small as text and huge parsed: 4 MiB of "[0,0,...]" is 2
# million JSON values, ~90 MiB in the daemon once parsed and held by a call in flight.
AMPLIFIER = r"""
import json, socket
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
f = s.makefile("rb")
line = json.dumps({"id": 0, "op": "call", "name": "slow", "input": {"a": [0] * 2000000}}, separators=(",", ":")).encode()
for i in range(6):
    s.sendall(line.replace(b'"id":0', b'"id":%d' % i, 1) + b"\n")
answers = []
s.settimeout(5)
try:
    for i in range(6):
        answers.append(json.loads(f.readline())["error"])
except (OSError, ValueError):
    pass
print(json.dumps(answers))
"""


@not_under_asan
def test_parsed_calls_count_against_the_budget(daemon, ws):
    c = daemon.client()
    owner = daemon.client()
    owner._answer = lambda m: None  # a slow tool: its calls stay in flight
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    owner.call("tools.register", {"sandbox": sb, "tools": [{"name": "slow", "input_schema": {"type": "object"}}]})
    c.call("exec.run", {"sandbox": sb, "command": "true"}, timeout=60)
    before = rss_mib(daemon.pid)
    r = c.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": AMPLIFIER, "timeout": 60}, timeout=90)
    grown = rss_mib(daemon.pid) - before
    print(f"parsed calls: the daemon grew by {grown:.0f} MiB; {r['stdout'][:300]}")
    assert grown < 96, f"the daemon grew by {grown:.0f} MiB holding one command's parsed calls"
    answers = json.loads(r["stdout"])
    assert answers and all(a["kind"] == "limit" for a in answers), answers


# A call whose request takes more than half of the sandbox's budget, and less than all of it.
HALF_BUDGET_CALL = r"""
import json, socket
s = socket.socket(socket.AF_UNIX); s.connect("/run/conch/ptc.sock")
f = s.makefile("rb")
s.sendall(json.dumps({"id": 1, "op": "call", "name": "size", "input": {"s": "a" * 600000}}).encode() + b"\n")
print(f.readline().decode().strip())
"""


@not_under_asan
def test_a_kept_request_is_charged_once(daemon_factory, ws):
    # A budget of 2 MiB: a request line of 600 KB (read into a buffer of 1 MiB) fits with its
    # parsed form once. The line's charge while it was parsed and the call's charge for keeping
    # it were both held: 2.2 MB, refused.
    d = daemon_factory(extra_args=["--max-sandbox-bridge-memory", "2M"])
    c = d.client()
    c.handlers["tool.call"] = lambda p: {"n": len(p["input"]["s"])}
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    c.call("tools.register", {"sandbox": sb, "tools": [{"name": "size", "input_schema": {"type": "object"}}]})
    for _ in range(3):
        r = c.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": HALF_BUDGET_CALL, "timeout": 60}, timeout=90)
        assert r["exit_code"] == 0, r["text"]
        answer = json.loads(r["stdout"])
        assert answer.get("ok") and answer["result"] == {"n": 600000}, answer
    # Once the calls and their connections are gone, the budget holds nothing.
    assert wait_held(c, sb) == 0
    assert c.call("daemon.ping")["held"]["sandboxes"] == 0


# ---- file answers: what the file workers inside send back --------------------------------------

@not_under_asan
def test_file_answers_in_flight_are_bounded_per_sandbox(daemon_factory, ws):
    import socket
    import threading

    # A sandbox's budget of 16 MiB (the older name of the option, which the daemon still takes):
    # one answer of 13 MiB fits, two do not.
    d = daemon_factory(extra_args=["--max-sandbox-bridge-memory", "16M"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    # Files a command wrote: each read is an answer of 13.3 MiB (base64) from a worker inside.
    n_files = 4
    r = c.call("exec.run", {"sandbox": sb, "timeout": 60, "command":
               f"for i in $(seq {n_files}); do head -c 10000000 /dev/urandom > /tmp/big$i; done"}, timeout=90)
    assert r["exit_code"] == 0, r["text"]
    first = c.call("fs.read", {"sandbox": sb, "path": "/tmp/big1", "encoding": "base64"}, timeout=60)
    assert first["size"] == 10000000
    assert wait_held(c, sb) == 0
    # 20 reads at once, from a client that reads its answers as they come: on a daemon without
    # the budget, every worker's answer (2 persistent, 8 forked) was held at once, and again as
    # the line being sent.
    n = 20
    s = socket.socket(socket.AF_UNIX)
    s.connect(d.sock)
    hwm_reset(d.pid)
    before = rss_mib(d.pid)
    for i in range(n):
        req = {"jsonrpc": "2.0", "id": i, "method": "fs.read", "params": {
            "sandbox": sb, "path": f"/tmp/big{i % n_files + 1}", "encoding": "base64"}}
        s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile("rb")
    ok, limited, other, closed = 0, [], [], False
    for _ in range(n):
        line = f.readline()
        if not line.endswith(b"\n"):
            closed = True  # cut off past its output buffer limit
            break
        if len(line) > 1 << 20:
            assert line.startswith(b'{"jsonrpc":"2.0","id":') and b'"result":{' in line[:64], line[:200]
            ok += 1
            continue
        m = json.loads(line)
        if m.get("error", {}).get("data", {}).get("code") == "limit":
            limited.append(m["error"]["message"])
        else:
            other.append(m)
    peak = hwm_mib(d.pid)
    s.close()
    grown = peak - before
    print(f"file answers: {ok} read, {len(limited)} refused, closed: {closed}; the daemon grew by "
          f"{grown:.0f} MiB at its peak; {limited[:1]}")
    # The budget (16 MiB), the line being built from the one answer it holds (13 MiB, copied
    # once into the response) and the responses queued for the client (it reads them as they
    # come; a few when it is slow to), with margin for the allocator: 72 MiB. Measured: 29-39
    # MiB; without the budget, 153 MiB and the client was cut off.
    assert grown < 72, f"the daemon grew by {grown:.0f} MiB holding 20 file answers of 13 MiB"
    assert not closed and not other, other[:3]
    assert ok >= 1
    # Refused with a message naming the budget and the option that raises it.
    assert all("sandbox " + sb in m and "--max-sandbox-held" in m for m in limited), limited[:3]
    # Nothing stays charged, and the sandbox reads its files again.
    assert wait_held(c, sb) == 0
    again = c.call("fs.read", {"sandbox": sb, "path": "/tmp/big2", "encoding": "base64"}, timeout=60)
    assert again["size"] == 10000000


# ---- sessions: scrollback and keys waiting for the terminal ---------------------------------


@not_under_asan
def test_session_scrollback_is_charged_to_the_sandbox(daemon_factory, ws):
    # Four sessions asking for 16 MiB of scrollback each, whose programs print 40 MB with no
    # client attached: 64 MiB of rings on a daemon without the budget (each allocated whole at
    # open and filled). With a budget of 4 MiB for the sandbox, the rings grow as far as it
    # grants, then wrap: the scrollback holds less, the daemon no more.
    d = daemon_factory(extra_args=["--max-sandbox-bridge-memory", "4M"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    sids = [c.call("session.open", {"sandbox": sb, "scrollback": 16 * MiB}, timeout=30)["session"]
            for _ in range(4)]
    hwm_reset(d.pid)
    before = rss_mib(d.pid)
    for i, sid in enumerate(sids):
        c.call("session.write", {"session": sid,
                                 "data": f"head -c 40000000 /dev/zero | tr '\\0' x; echo; echo flood-{i}-done\n"})
    for i, sid in enumerate(sids):
        deadline = time.time() + 120
        while time.time() < deadline:
            sbk = c.call("session.attach", {"session": sid})["scrollback"]
            c.call("session.detach", {"session": sid})
            if f"flood-{i}-done" in sbk.replace(f"echo flood-{i}-done", ""):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"session {i}'s flood did not end")
        # The scrollback keeps the latest output, in a ring the budget allowed.
        assert 0 < len(sbk) <= 4 * MiB, len(sbk)
    grown = hwm_mib(d.pid) - before
    print(f"session floods: the daemon grew by {grown:.0f} MiB at its peak")
    # The budget (4 MiB), the copies of a scrollback that attach makes (4 MiB), the allocator.
    assert grown < 24, f"the daemon grew by {grown:.0f} MiB holding the scrollback of 4 sessions"
    # Scrollback takes half of the sandbox's budget at most: the rest stays for its tool
    # bridge and its file answers.
    assert 0 < sandbox_held(c, sb) <= 2 * MiB
    r = c.call("fs.read", {"sandbox": sb, "path": "/etc/hostname"}, timeout=60)
    assert r["size"] > 0
    for sid in sids:
        c.call("session.close", {"session": sid})
    assert wait_held(c, sb) == 0


def test_keys_waiting_for_the_terminal_are_charged_to_the_sandbox(daemon_factory, ws):
    # A program in the foreground that reads nothing: keys wait in the daemon. With a budget of
    # 256 KiB for the sandbox, the keys past it are refused (limit, naming the budget), before
    # the session's own cap of 1 MiB.
    d = daemon_factory(extra_args=["--max-sandbox-bridge-memory", "256K"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    # Once READY is printed, the shell runs the sleep and reads no keys until it ends.
    c.call("session.write", {"session": sid, "data": "stty -icanon -echo; echo READY-$((6*7)); sleep 600\n"})
    deadline = time.time() + 30
    while "READY-42" not in c.call("session.attach", {"session": sid})["scrollback"]:
        assert time.time() < deadline, "the session's program did not start"
        time.sleep(0.1)
    c.call("session.detach", {"session": sid})
    chunk = "k" * (100 << 10)
    c.call("session.write", {"session": sid, "data": chunk})
    with pytest.raises(Exception) as e:
        for _ in range(2):
            c.call("session.write", {"session": sid, "data": chunk})
    err = e.value
    assert getattr(err, "data_code", None) == "limit", err
    assert "sandbox " + sb in err.message and "--max-sandbox-held" in err.message, err.message
    assert sandbox_held(c, sb) > 0
    # The program goes: the keys reach the terminal (or go with it), and nothing stays charged.
    c.call("session.close", {"session": sid})
    assert wait_held(c, sb) == 0


# ---- defect 4: output held for a client that does not read ----------------------------------


@not_under_asan
def test_unread_output_of_many_commands_is_bounded_and_complete(daemon_factory, ws):
    import glob
    import socket
    import threading

    # The daemon-wide output budget, small so that a few commands show it (without it the
    # daemon grew by 238 MiB on this test).
    d = daemon_factory(extra_args=["--max-output-memory", "16M"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    c.call("exec.run", {"sandbox": sb, "command": "true"}, timeout=60)
    before = rss_mib(d.pid)
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib(d.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # 8 commands at once, each printing ~10 MB with max_output 40 MB, from a client that reads
    # nothing until they are all done: 80 MB of output, held several times over (kept, text,
    # JSON) on a daemon without the budget.
    n, count = 8, 1400000
    expected = "".join(f"{i}\n" for i in range(1, count + 1)).encode()
    s = socket.socket(socket.AF_UNIX)
    s.connect(d.sock)
    for i in range(n):
        req = {"jsonrpc": "2.0", "id": i, "method": "exec.run", "params": {
            "sandbox": sb, "command": f"seq 1 {count}; touch /tmp/done.{i}", "max_output": 40 * MiB, "timeout": 120}}
        s.sendall((json.dumps(req) + "\n").encode())
    deadline = time.time() + 120
    while time.time() < deadline:
        r = c.call("exec.run", {"sandbox": sb, "command": "ls /tmp/ | grep -c '^done\\.'", "timeout": 30}, timeout=60)
        if r["stdout"].strip() == str(n):
            break
        time.sleep(0.1)
    # Every result, read now: complete, in memory or in its spill file.
    f = s.makefile("rb")
    results = {}
    while len(results) < n:
        line = f.readline()
        assert line, f"the daemon closed the connection after {len(results)} results"
        m = json.loads(line)
        results[m["id"]] = m
    stop.set()
    sampler.join()
    s.close()
    grown = peak[0] - before
    print(f"unread output: the daemon grew by {grown:.0f} MiB at its peak")
    for i, m in results.items():
        assert "result" in m, m
        r = m["result"]
        assert r["exit_code"] == 0 and r["stdout_bytes"] == len(expected), {k: r[k] for k in ("exit_code", "stdout_bytes")}
        if r["stdout_truncated"]:
            [path] = glob.glob(os.path.join(d.state_dir, "**", os.path.basename(r["stdout_spill"])), recursive=True)
            with open(path, "rb") as sp:
                assert sp.read() == expected, f"spill file {path} of command {i} is not the whole stream"
        else:
            assert r["stdout"].encode() == expected
    # The budget (16 MiB), the results being built from what it kept (a text, a JSON string
    # and its serialisation: up to 3x) and queued for the client, with margin.
    assert grown < 100, f"the daemon grew by {grown:.0f} MiB holding the output of {n} unread commands"
