# test_file_events.py - file workers and file servers are process objects of the supervisor
# (issue 16): each has one final event, which the warden sends when it reaps the worker, so a
# request whose worker died is answered at once with the reason (what killed it, or the
# sandbox stopping), never at a timeout; and a burst of requests behind a full control queue
# is answered, every one.
import os
import signal
import subprocess
import time

import pytest

from conftest import descendants, titled_descendants
from rpcclient import RpcError, result_of

SERVER = b"conch-file-server"


def _servers(daemon):
    return titled_descendants(daemon.pid, SERVER)


def _wait_servers(daemon, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        s = _servers(daemon)
        if pred(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


def _wardens(daemon):
    out = subprocess.run(["ps", "-o", "pid=,ppid=,args=", "-e"], capture_output=True,
                         text=True).stdout
    return [int(l.split()[0]) for l in out.splitlines()
            if l.split()[1] == str(daemon.pid) and "conch-warden" in l]


def _held_request(daemon, sb, method="fs.grep", **params):
    """A file server stopped (SIGSTOP) with a request of a new client in flight on it:
    returns (server pid, client, request id)."""
    rpc = daemon.client()
    rpc.call("fs.read", {"sandbox": sb, "path": "a.txt"}, timeout=60)
    (pid,) = _wait_servers(daemon, lambda s: len(s) == 1)
    os.kill(pid, signal.SIGSTOP)
    rid = rpc.request(method, {"sandbox": sb, "pattern": "alpha", **params})
    time.sleep(0.3)
    assert rid not in rpc._responses, "answered by a stopped worker?"
    return pid, rpc, rid


def test_file_server_killed_from_the_host_fails_its_request_with_the_reason(daemon, rpc, ws,
                                                                            sandbox):
    """SIGKILL to the file server from the host: the warden reaps it and reports its end, and
    its request fails saying what killed it (it used to say only "no answer"); the next
    request is served by a new server."""
    (ws / "a.txt").write_text("alpha\n")
    sb = sandbox()
    pid, c, rid = _held_request(daemon, sb)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RpcError) as e:
        result_of(c.wait(rid, timeout=60))
    assert e.value.data.get("code") == "internal_error", e.value
    assert "no answer" in str(e.value) and "signal 9" in str(e.value), e.value
    assert rpc.call("fs.read", {"sandbox": sb, "path": "a.txt"})["content"] == "alpha\n"
    after = _wait_servers(daemon, lambda s: len(s) >= 1)
    assert after and pid not in after, (pid, after)
    # and again: the replacement is supervised as the first was
    pid2, c2, rid2 = _held_request(daemon, sb)
    os.kill(pid2, signal.SIGKILL)
    with pytest.raises(RpcError) as e:
        result_of(c2.wait(rid2, timeout=60))
    assert "signal 9" in str(e.value), e.value
    assert rpc.call("fs.read", {"sandbox": sb, "path": "a.txt"})["content"] == "alpha\n"


def test_warden_killed_with_a_file_request_in_flight(daemon_factory, ws):
    """kill -9 of the warden while a file server holds a request: the request is answered
    with sandbox_stopped, naming the warden, as soon as its end is seen (the server died
    with the warden's namespace; its EOF alone does not decide the answer)."""
    (ws / "a.txt").write_text("alpha\n")
    daemon = daemon_factory(extra_args=["--pool", "0"])
    rpc = daemon.client()
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    pid, c, rid = _held_request(daemon, sb)
    wardens = _wardens(daemon)
    assert len(wardens) == 1, wardens
    os.kill(wardens[0], signal.SIGKILL)
    resp = c.wait(rid, timeout=60)
    assert "error" in resp, resp
    assert resp["error"]["data"]["code"] == "sandbox_stopped", resp
    assert "warden" in resp["error"]["message"], resp
    # the sandbox is listed stopped, and the daemon still serves
    assert rpc.call("sandbox.list", {})["sandboxes"] is not None


def test_file_requests_behind_a_full_control_queue_are_all_answered(rpc, ws, sandbox):
    """Hundreds of job starts sent at once fill the warden's control socket (it takes ~130
    messages carrying fds) and its queue; file requests sent right behind them (their
    workers and servers are started through the same queue) are all answered, in full."""
    n_jobs, n_files = 250, 60
    for i in range(n_files):
        (ws / f"f{i}.txt").write_text(f"file {i}\n" * (i + 1))
    sb = sandbox()
    jobs = [rpc.request("job.start", {"sandbox": sb, "command": "true"}) for _ in range(n_jobs)]
    files = {}
    for i in range(n_files):
        if i % 3 == 2:
            files[rpc.request("fs.write", {"sandbox": sb, "path": f"w{i}.txt",
                                           "content": f"w{i}"})] = ("w", i)
        else:
            files[rpc.request("fs.read", {"sandbox": sb, "path": f"f{i}.txt"})] = ("r", i)
    errors = []
    for rid, (kind, i) in files.items():
        resp = rpc.wait(rid, timeout=180)
        if "error" in resp:
            errors.append((kind, i, resp["error"]))
        elif kind == "r" and resp["result"]["content"] != f"file {i}\n" * (i + 1):
            errors.append((kind, i, resp["result"]))
    assert not errors, f"{len(errors)} of {n_files} file requests failed, first: {errors[0]}"
    for rid in jobs:
        resp = rpc.wait(rid, timeout=180)
        assert "result" in resp, resp
    for i in range(2, n_files, 3):
        assert rpc.call("fs.read", {"sandbox": sb, "path": f"w{i}.txt"})["content"] == f"w{i}"


def _workers_forked(daemon):
    found = []
    for p in descendants(daemon.pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read().startswith(b"conch-file-worker"):
                    found.append(p)
        except OSError:
            continue
    return found


def _both_servers_held(daemon, sb):
    """Both file servers stopped, each holding a request: [(pid, client, request id)] x2.
    The next request is served by a worker forked for it."""
    pid1, c1, r1 = _held_request(daemon, sb)
    c2 = daemon.client()
    c2.call("fs.read", {"sandbox": sb, "path": "a.txt"}, timeout=60)  # starts the second
    servers = _wait_servers(daemon, lambda s: len(s) == 2)
    (pid2,) = [p for p in servers if p != pid1]
    os.kill(pid2, signal.SIGSTOP)
    r2 = c2.request("fs.grep", {"sandbox": sb, "pattern": "alpha"})
    time.sleep(0.3)
    assert r2 not in c2._responses, "answered by a stopped worker?"
    return [(pid1, c1, r1), (pid2, c2, r2)]


def _forked_worker_caught(daemon, sb, client, act):
    """Send a request big enough that its forked worker is seen at work, and @act(pid) on
    it. Returns (request id, pid)."""
    for _attempt in range(10):
        rid = client.request("fs.download", {"sandbox": sb,
                                             "paths": [f"big{i}" for i in range(5)]})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and rid not in client._responses:
            found = _workers_forked(daemon)
            if found:
                act(found[0])
                return rid, found[0]
        client.wait(rid, timeout=60)
    raise AssertionError("no forked file worker was ever seen at work")


def _big_files(ws):
    (ws / "a.txt").write_text("alpha\n")
    for i in range(5):
        (ws / f"big{i}").write_bytes(os.urandom(9_000_000))


def test_forked_worker_killed_from_the_host_fails_its_request_with_the_reason(daemon, ws,
                                                                             sandbox):
    """With both file servers busy (stopped, each holding a request), a request is served by
    a worker forked for it; SIGKILLed from the host, its request fails saying so (its empty
    answer waits for the worker's final event, which tells why), and the held requests are
    answered once their servers run again."""
    _big_files(ws)
    sb = sandbox()
    held = _both_servers_held(daemon, sb)
    c3 = daemon.client()
    try:
        rid, _ = _forked_worker_caught(daemon, sb, c3, lambda p: os.kill(p, signal.SIGKILL))
        resp = c3.wait(rid, timeout=60)
        assert "error" in resp, resp
        assert "signal 9" in resp["error"]["message"], resp
    finally:
        for pid, _, _ in held:
            os.kill(pid, signal.SIGCONT)
    for _, c, r in held:
        assert "result" in c.wait(r, timeout=60)
    assert c3.call("fs.read", {"sandbox": sb, "path": "a.txt"}, timeout=60)["content"] == "alpha\n"


def test_warden_killed_with_servers_and_a_forked_worker_in_flight(daemon_factory, ws):
    """kill -9 of the warden while both file servers and a forked worker hold requests (all
    three stopped): every request is answered with sandbox_stopped naming the warden, from
    the final events the warden's death gives them, and the daemon serves on."""
    _big_files(ws)
    daemon = daemon_factory(extra_args=["--pool", "0"])
    rpc = daemon.client()
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    held = _both_servers_held(daemon, sb)
    c3 = daemon.client()
    rid, _ = _forked_worker_caught(daemon, sb, c3, lambda p: os.kill(p, signal.SIGSTOP))
    wardens = _wardens(daemon)
    assert len(wardens) == 1, wardens
    os.kill(wardens[0], signal.SIGKILL)
    for c, r in [(c, r) for _, c, r in held] + [(c3, rid)]:
        resp = c.wait(r, timeout=60)
        assert "error" in resp, resp
        assert resp["error"]["data"]["code"] == "sandbox_stopped", resp
        assert "warden" in resp["error"]["message"], resp
    assert rpc.call("daemon.ping", {}) is not None
