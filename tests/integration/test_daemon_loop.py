# test_daemon_loop.py - the daemon's event loop never stalls and never grows without bound
# (issue 6, defects 6 and 12, and the range checks of 14): a client that never reads is
# disconnected past its output buffer's hard limit while the daemon's memory stays bounded
# and other clients are answered; numbers out of range are refused by the param table;
# workspace scans run off the loop.
import json
import os
import socket
import time

import pytest

from loopcheck import FirstByte, Pinger, thread_cpu
from rpcclient import RpcError


def vm_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def raw_request(sock, req_id, method, params):
    line = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
    sock.sendall(line.encode() + b"\n")


@pytest.mark.plain_build  # its RSS bound; under ASan RSS means little
def test_non_reading_client_is_disconnected_and_memory_bounded(daemon_factory):
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {})["id"]
    rss0 = vm_kb(d.pid, "VmRSS")
    pinger = Pinger(d.sock, pause=0.02)
    pinger.wait_first()
    t0 = time.monotonic()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(d.sock)
    # 20 commands of ~27 MB of output each, 8 MiB of it kept per result; never read a byte.
    # Paced so that the daemon holds one or two results at a time, not 20 commands' buffers.
    peak = 0
    for i in range(20):
        try:
            raw_request(s, i + 1, "exec.run", {"sandbox": sb, "max_output": 8 << 20, "timeout": 60,
                                               "command": "head -c 20M /dev/zero | base64 -w 0"})
        except (BrokenPipeError, ConnectionResetError):
            break  # already disconnected: that is the point
        for _ in range(10):
            time.sleep(0.1)
            peak = max(peak, vm_kb(d.pid, "VmRSS"))
    # Before reading, let the daemon get there: the commands lag behind the pacing above on a
    # loaded machine (and under ASan), their answers are built after they end, and a read
    # started early drains the queue the daemon would have cut the client off at. Waiting
    # costs no memory: answers being built count against the clients' budget.
    deadline = time.monotonic() + 300
    while ("hard limit" not in d.log() and "--max-client-output-memory" not in d.log()
           and time.monotonic() < deadline):
        time.sleep(0.2)
        peak = max(peak, vm_kb(d.pid, "VmRSS"))
    # the daemon closed the connection: reading now gets what the kernel held, then EOF
    s.settimeout(30)
    got = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            b = s.recv(1 << 20)
        except (ConnectionResetError, socket.timeout):
            break
        if not b:
            break
        got += len(b)
        peak = max(peak, vm_kb(d.pid, "VmRSS"))
    eof = time.monotonic() < deadline
    s.close()
    pinger.stop()
    assert eof, "the daemon never closed the non-reading client's connection"
    # 20 results of 8+ MiB (plus their text) is 320+ MB: far less was ever queued
    assert got < 200 << 20, f"{got} bytes were sent to the client: no hard limit"
    # The promise (docs/ARCHITECTURE.md, budgets): under 256 MiB whatever a client asks. What
    # the daemon holds at once depends on how many results workers build at the same time,
    # which a loaded machine changes; answers being built are charged to the clients' budget
    # (268 MB seen in CI before they were, ~200 MB after): bound the promise.
    assert peak < 256 * 1024, f"daemon RSS peaked at {peak} kB (started at {rss0} kB)"
    # the other client was answered all along: pings sent while the non-reading client's
    # commands ran were answered (a loop stuck on it would leave them waiting)
    assert not pinger.errors, pinger.errors
    answered = pinger.answered_between(t0, time.monotonic())
    assert answered > 10, answered
    # the daemon and the sandbox still serve
    r = c.call("exec.run", {"sandbox": sb, "command": "echo ok"}, timeout=60)
    assert r["stdout"] == "ok\n", r
    # cut off for its own queue (the per-client hard limit) or as the client with the most
    # unread when all of them, with the answers being built, passed the daemon's budget
    log = d.log()
    assert "hard limit" in log or "--max-client-output-memory" in log, log


def bad_param(c, method, params, param):
    with pytest.raises(RpcError) as ei:
        c.call(method, params)
    e = ei.value
    assert (e.code, e.data_code) == (-32602, "invalid_params"), f"{method} {params}: {e}"
    assert e.data.get("param") == param, f"{method} {params}: {e}"
    assert param in e.message and ("between" in e.message), e.message
    return e


@pytest.mark.parametrize("params,param", [
    ({"idle_timeout": 1e308}, "idle_timeout"),
    ({"idle_timeout": -1}, "idle_timeout"),
    ({"idle_timeout": 1e-7}, "idle_timeout"),
    ({"memory": -1}, "memory"),
    ({"memory": 1}, "memory"),
    ({"memory": 9223372036854775807}, "memory"),
    ({"pids": -5}, "pids"),
    ({"cpu": 1e308}, "cpu"),
    ({"cpu": -0.5}, "cpu"),
    ({"tmp_size": -4096}, "tmp_size"),
    ({"disk": -1}, "disk"),
    ({"disk": 1 << 62}, "disk"),
])
def test_sandbox_numbers_range_checked(rpc, params, param):
    n = len(rpc.call("sandbox.list", {})["sandboxes"])
    bad_param(rpc, "sandbox.create", params, param)
    assert len(rpc.call("sandbox.list", {})["sandboxes"]) == n, "a sandbox was created anyway"


def test_command_numbers_range_checked(rpc):
    sb = rpc.call("sandbox.create", {})["id"]
    for params, param in [({"timeout": 1e-7}, "timeout"), ({"timeout": 1e308}, "timeout"),
                          ({"timeout": -1}, "timeout"), ({"grace": 1e308}, "grace"),
                          ({"grace": -2}, "grace"), ({"max_output": 1 << 40}, "max_output"),
                          ({"max_output": (64 << 20) + 1}, "max_output"),
                          ({"max_output": -5}, "max_output")]:
        bad_param(rpc, "exec.run", {"sandbox": sb, "command": "true", **params}, param)
    bad_param(rpc, "job.start", {"sandbox": sb, "command": "true", "max_output": 1 << 40}, "max_output")
    job = rpc.call("job.start", {"sandbox": sb, "command": "echo hi"})["job_id"]
    bad_param(rpc, "job.wait", {"job_id": job, "timeout": 1e308}, "timeout")
    bad_param(rpc, "job.wait", {"job_id": job, "timeout": -1}, "timeout")
    bad_param(rpc, "job.output", {"job_id": job, "max_bytes": 1 << 40}, "max_bytes")
    bad_param(rpc, "job.output", {"job_id": job, "stdout_offset": -1}, "stdout_offset")
    bad_param(rpc, "fs.read", {"sandbox": sb, "path": "x", "limit": 0}, "limit")
    bad_param(rpc, "fs.glob", {"sandbox": sb, "pattern": "*", "max_results": 1 << 40}, "max_results")
    # the bounds are accepted
    r = rpc.call("exec.run", {"sandbox": sb, "command": "echo ok", "timeout": 0.5, "grace": 0,
                              "max_output": 64 << 20}, timeout=30)
    assert r["stdout"] == "ok\n", r
    assert rpc.call("job.wait", {"job_id": job, "timeout": 10}, timeout=20)["running"] is False
    rpc.call("sandbox.destroy", {"id": sb})


def test_oversize_line_keeps_its_id(daemon_factory):
    d = daemon_factory(extra_args=["--max-message", "4096"])
    c = d.client()
    for req_id in (c.new_id(), "req-x"):
        line = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": "daemon.ping",
                           "params": {"pad": "x" * 10000}})
        c.send_raw(line.encode() + b"\n")
        resp = c.wait_reply(req_id if isinstance(req_id, int) else None, 10)
        assert resp["id"] == req_id, resp
        assert resp["error"]["data"]["code"] == "message_too_large", resp
        assert resp["error"]["data"]["limit"] == 4096, resp
    # an id after the cap is found too: the daemon scans the rest of the line for it
    line = json.dumps({"jsonrpc": "2.0", "method": "daemon.ping", "params": {"pad": "x" * 10000},
                       "id": 5}).encode() + b"\n"
    c.send_raw(line[:6000])
    time.sleep(0.3)
    c.send_raw(line[6000:])
    resp = c.wait_reply(None, 10)
    assert resp["id"] == 5 and resp["error"]["data"]["code"] == "message_too_large", resp
    assert c.call("daemon.ping", {})["version"]


MANY = 30_000


@pytest.mark.slow
def test_workspace_scans_do_not_stall_other_clients(daemon, ws):
    """Scans of a workspace with 30,000 changed files (seconds of work on the loop before:
    5-8 s for 100,000) run off the loop: another client's pings, sent one after the other, are answered
    while they run, and every scan's answer is whole."""
    c = daemon.client()
    c2 = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    r = c.call("exec.run", {"sandbox": sb, "timeout": 300, "command":
                            "python3 -c 'import os\nos.mkdir(\"many\")\n"
                            f"for i in range({MANY}): open(\"many/f%06d\" % i, \"w\").close()'"},
               timeout=600)
    assert r["exit_code"] == 0, r
    pinger = Pinger(daemon.sock, pause=0.001)
    probe = FirstByte(daemon.sock)
    try:
        pinger.wait_first()
        ids = [c.request("workspace.diff", {"sandbox": sb}),
               c2.request("workspace.changes", {"sandbox": sb})]
        sent, first = probe.call("workspace.changes", {"sandbox": sb}, timeout=300)
        resp = [c.wait(ids[0], 300), c2.wait(ids[1], 300)]
        during = pinger.answered_between(sent, probe.first)
    finally:
        pinger.stop()
        probe.close()
    for x in resp + [first]:
        assert "result" in x, str(x)[:500]
    # workspace.changes pages (10,000 at most per call); the total counts them all
    assert resp[1]["result"]["changes_total"] >= MANY, resp[1]["result"]["changes_total"]
    assert first["result"]["changes_total"] >= MANY, first["result"]["changes_total"]
    assert not pinger.errors, pinger.errors
    # Pings sent after the scans were asked for were answered before the first byte of a
    # scan's answer. A scan on the loop holds every ping sent during it until it is done (a
    # ping or two slip in between two scans), and its answer is written as soon as it ends.
    assert during >= 10, f"only {during} pings were answered while three scans of {MANY} files ran"
    # destroy answers only once the directory is gone, and does not stall the loop either
    c.call("sandbox.destroy", {"id": sb}, timeout=120)
    left = [n for n in os.listdir(os.path.join(daemon.state_dir, "sandboxes")) if n == sb]
    assert left == [], left


def test_inodes_count_against_the_disk_budget(rpc, ws):
    sb = rpc.call("sandbox.create", {"workspace": str(ws), "disk": 8 << 20})["id"]
    # 5,000 empty files occupy no blocks, but 5,000 inodes: 20 MB at 4 KiB each
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 60, "command":
                              "python3 -c 'for i in range(5000): open(\"e%d\" % i, \"w\").close()'; "
                              "sleep 20; echo survived"}, timeout=90)
    assert "survived" not in r["stdout"], r
    assert r["error"] and r["error"]["kind"] == "limit" and "disk" in r["error"]["message"], r
    rpc.call("sandbox.destroy", {"id": sb})


def test_spill_files_count_and_go_with_the_sandbox(daemon, rpc):
    sb = rpc.call("sandbox.create", {"disk": 20 << 20})["id"]
    sbdir = os.path.join(daemon.state_dir, "sandboxes", sb)
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 60, "command":
                              "for i in $(seq 200); do head -c 1M /dev/zero; sleep 0.02; done; echo survived >&2"},
                 timeout=90)
    assert "survived" not in r["stderr"], r
    assert r["error"] and r["error"]["kind"] == "limit" and "disk" in r["error"]["message"], r
    assert r["stdout_spill"].startswith("/run/conch/output/"), r
    spill = os.path.join(sbdir, "spill", os.path.basename(r["stdout_spill"]))
    assert os.path.exists(spill)
    assert os.path.getsize(spill) < 100 << 20
    rpc.call("sandbox.destroy", {"id": sb})
    assert not os.path.exists(spill)
    assert not os.path.exists(sbdir)


@pytest.mark.root_only
def test_create_fails_when_the_state_dir_is_full(daemon_factory, tmp_path):
    import subprocess
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "conchtest-state", str(state)], check=True)
    try:
        d = daemon_factory(state_dir=str(state))
        c = d.client()
        # fill the state dir's filesystem
        with open(state / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        created, failure = [], None
        for i in range(200):
            try:
                created.append(c.call("sandbox.create", {"name": "x" * 60 + str(i),
                                                         "env": {"PAD": "p" * 3000}})["id"])
            except RpcError as e:
                failure = e
                break
        assert failure is not None, "sandbox.create never failed on a full state dir"
        assert failure.code == -32001 and "record" in failure.message, failure
        listed = [s["id"] for s in c.call("sandbox.list", {})["sandboxes"]]
        assert sorted(listed) == sorted(created), (listed, created)
        os.unlink(state / "filler")
        for sb in created:
            c.call("sandbox.destroy", {"id": sb})
        d.stop()
    finally:
        subprocess.run(["umount", "-l", str(state)])


def _nofile(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def test_open_files_limit_raised_for_the_daemon_only(daemon_factory):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= hard:
        # make room to see the daemon raise it
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        d = daemon_factory()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    dsoft, dhard = _nofile(d.pid)
    assert dsoft == dhard, (dsoft, dhard)
    c = d.client()
    sb = c.call("sandbox.create", {})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "ulimit -Sn"}, timeout=60)
    expected = min(1024, hard) if soft >= hard else soft
    assert int(r["stdout"]) == expected, r
    c.call("sandbox.destroy", {"id": sb})


def test_a_second_daemon_on_the_same_state_dir_is_refused(daemon_factory):
    import subprocess
    d = daemon_factory()
    p = subprocess.run([d.conch_bin, "serve", "--socket", d.sock + "2", "--state-dir", d.state_dir],
                       capture_output=True, timeout=30)
    assert p.returncode != 0, p
    assert b"another conch daemon" in p.stderr, p.stderr
    assert d.client().call("daemon.ping", {})["pid"] == d.pid


@pytest.mark.slow
def test_destroy_and_shutdown_during_a_scan(daemon_factory, tmp_path):
    d = daemon_factory()
    c = d.client()
    ws1, ws2 = tmp_path / "w1", tmp_path / "w2"
    ws1.mkdir()
    ws2.mkdir()
    make = ("python3 -c 'import os\nos.mkdir(\"d\")\n"
            "for i in range(20000): open(\"d/f%d\" % i, \"w\").close()'")
    sbs = [c.call("sandbox.create", {"workspace": str(w)})["id"] for w in (ws1, ws2)]
    for sb in sbs:
        assert c.call("exec.run", {"sandbox": sb, "command": make, "timeout": 300}, timeout=400)["exit_code"] == 0
    # a destroy behind a scan in flight: both answered, the scan with the changes it saw
    i1 = c.request("workspace.changes", {"sandbox": sbs[0]})
    i2 = c.request("workspace.diff", {"sandbox": sbs[0]})
    i3 = c.request("sandbox.destroy", {"id": sbs[0]})
    r1, r2, r3 = c.wait(i1, 120), c.wait(i2, 120), c.wait(i3, 120)
    assert r1["result"]["changes_total"] >= 20000, str(r1)[:300]
    assert r3["result"] == {"destroyed": True}, r3
    # the diff was queued behind the scan when the sandbox went: refused, or done
    assert ("error" in r2 and r2["error"]["data"]["code"] == "sandbox_not_found") or "result" in r2, str(r2)[:300]
    assert not os.path.exists(os.path.join(d.state_dir, "sandboxes", sbs[0]))
    # SIGTERM while a scan runs: the daemon still exits cleanly (the fixture checks it)
    c.request("workspace.diff", {"sandbox": sbs[1]})
    time.sleep(0.05)
    exited, rc = d.stop()
    assert exited and rc == 0, (exited, rc, d.log())


def test_large_file_answers_do_not_stall_other_clients(daemon):
    """fs.download answers of 60 MB (five 9 MB files, base64) are encoded by a worker, not by
    the event loop; another client's pings are answered all along; every answer is whole.
    Where the work ran is read from the CPU time of the daemon's threads, as in
    test_large_results_are_built_off_the_loop (the ping latency: bench/loop.py)."""
    c = daemon.client()
    sb = c.call("sandbox.create", {})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command":
                            "for i in 1 2 3 4 5; do head -c 9000000 /dev/urandom > f$i; done"}, timeout=120)
    assert r["exit_code"] == 0, r
    pinger = Pinger(daemon.sock, pause=0.02)
    pinger.wait_first()
    t0 = time.monotonic()
    main0, rest0 = thread_cpu(daemon.pid)
    try:
        for _ in range(3):
            got = c.call("fs.download", {"sandbox": sb, "paths": [f"f{i}" for i in range(1, 6)]},
                         timeout=120)
            assert [len(f["content"]) for f in got["files"]] == [12000000] * 5
        main1, rest1 = thread_cpu(daemon.pid)
        t1 = time.monotonic()
    finally:
        pinger.stop()
    assert not pinger.errors, pinger.errors
    assert pinger.answered_between(t0, t1) > 0, "no ping was answered while the work ran"
    main, rest = main1 - main0, rest1 - rest0
    # The loop still moves the bytes (from the file worker, to the client: about twice what
    # the threadpool spends encoding them, up to four times on a loaded machine or under
    # ASan); encoded on the loop, the threadpool spends next to none (a tick or two).
    assert rest * 10 > main, f"the event loop's thread used {main} ticks of CPU, the threadpool {rest}"
    c.call("sandbox.destroy", {"id": sb})


@pytest.mark.plain_build  # its RSS bound; under ASan RSS means little
def test_streaming_to_a_slow_reader_pauses_the_command(daemon_factory):
    """A client that streams a command's output (stream: true) but stops reading for a while:
    the daemon stops reading the command's pipes once the client is congested (the command
    blocks on its writes) instead of buffering without end or cutting the client off; when
    the client reads again, every byte arrives and the command completes."""
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {})["id"]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(d.sock)
    total = 40 << 20
    raw_request(s, 1, "exec.run", {"sandbox": sb, "stream": True, "timeout": 120,
                                   "command": f"head -c {total} /dev/zero | tr '\\0' x; echo done >&2"})
    peak = 0
    for _ in range(30):  # 3 s without reading
        time.sleep(0.1)
        peak = max(peak, vm_kb(d.pid, "VmRSS"))
    # now read everything: notifications, then the response
    f = s.makefile("rb")
    streamed = 0
    result = None
    s.settimeout(120)
    while result is None:
        line = f.readline()
        assert line, "the daemon closed the connection of a client that was only slow"
        msg = json.loads(line)
        if msg.get("method") == "exec.output" and msg["params"]["stream"] == "stdout":
            streamed += len(msg["params"]["data"])
        elif msg.get("id") == 1:
            result = msg
    s.close()
    assert "result" in result, str(result)[:300]
    assert result["result"]["exit_code"] == 0 and result["result"]["stderr"] == "done\n", str(result)[:300]
    assert streamed == total, (streamed, total)
    # the 40 MB were not buffered while the client did not read (8 MiB soft limit; without
    # the pause the daemon peaks near 50 MB)
    assert peak < 32 * 1024, f"daemon RSS peaked at {peak} kB while the client was not reading"
    assert "hard limit" not in d.log()


def test_short_commands_cannot_outgrow_the_disk_limit(daemon_factory, tmp_path):
    """Short commands each ended between two disk samples, so 20 of them wrote 700 MB past a
    1 MiB `disk` (found by the outside review). Each command's end is measured now: once the
    sandbox is over its limit, new commands, jobs and file writes are refused (limit) until
    room is made (fs.delete, workspace.discard)."""
    d = daemon_factory()
    c = d.client()
    ws = tmp_path / "w"
    ws.mkdir()
    sb = c.call("sandbox.create", {"workspace": str(ws), "disk": 1 << 20})["id"]
    refused = None
    for i in range(20):
        try:
            c.call("exec.run", {"sandbox": sb, "command": f"head -c 700000 /dev/zero > f{i}"})
        except RpcError as e:
            refused = e
            break
        time.sleep(0.3)  # the measurement runs in a worker
    assert refused is not None, "20 commands of 700 kB each ran past a 1 MiB disk limit"
    assert refused.data_code == "limit" and "disk" in refused.message, refused
    upper = os.path.join(d.state_dir, "sandboxes", sb, "upper")
    used = sum(os.path.getsize(os.path.join(upper, f)) for f in os.listdir(upper))
    assert used < 3 << 20, used
    with pytest.raises(RpcError) as ei:
        c.call("fs.write", {"sandbox": sb, "path": "more.txt", "content": "x"})
    assert ei.value.data_code == "limit", ei.value
    # room is made: commands run again
    for name in os.listdir(upper):
        c.call("fs.delete", {"sandbox": sb, "path": name})
    time.sleep(0.5)
    assert c.call("exec.run", {"sandbox": sb, "command": "echo ok"})["stdout"] == "ok\n"


def test_large_results_are_built_off_the_loop(daemon_factory, ws):
    """exec.run and session.run results keeping 8 MiB of output (their UTF-8 repair, text form
    and JSON encoding take ~0.15 s each, ~0.5 s under ASan) are built by a worker, not by the
    event loop; another client's pings are answered all along; the results are whole, with
    their changes; a session's next command runs after its big one, in order.

    Where the work ran is read from the CPU time of the daemon's threads (/proc/PID/task),
    which a loaded machine does not change: built on the loop, the 8 results would cost the
    main thread ~1 s of CPU and the threadpool nothing. (How long a ping waits meanwhile is a
    latency: bench/loop.py measures it.)"""
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    pinger = Pinger(d.sock, pause=0.02)
    pinger.wait_first()
    t0 = time.monotonic()
    big = "head -c 6000000 /dev/zero | base64 -w 0; echo made > m.txt"
    main0, rest0 = thread_cpu(d.pid)
    try:
        for _ in range(4):
            r = c.call("exec.run", {"sandbox": sb, "max_output": 16 << 20, "timeout": 60,
                                    "command": big}, timeout=120)
            assert r["exit_code"] == 0 and r["stdout"] == "A" * 8000000, len(r["stdout"])
            assert [ch["path"] for ch in r["changes"]] == ["m.txt"], r["changes"]
            r = c.call("session.run", {"session": sid, "max_output": 16 << 20, "timeout": 60,
                                       "command": big}, timeout=120)
            assert r["exit_code"] == 0 and r["session"] == sid, {k: r[k] for k in r if k != "stdout"}
            assert r["stdout"].replace("\r\n", "\n").strip() == "A" * 8000000, len(r["stdout"])
            assert [ch["path"] for ch in r["changes"]] == ["m.txt"], r["changes"]
            r = c.call("session.run", {"session": sid, "command": "echo after"}, timeout=60)
            assert r["stdout"].strip() == "after", r
        main1, rest1 = thread_cpu(d.pid)
        t1 = time.monotonic()
    finally:
        pinger.stop()
    assert not pinger.errors, pinger.errors
    assert pinger.answered_between(t0, t1) > 0, "no ping was answered while the work ran"
    main, rest = main1 - main0, rest1 - rest0
    # The loop still moves every byte (pipes, the terminal, the answers to the socket), but
    # the building of the results is the larger part of the work, and it ran elsewhere.
    assert main < rest, f"the event loop's thread used {main} ticks of CPU, the threadpool {rest}"
