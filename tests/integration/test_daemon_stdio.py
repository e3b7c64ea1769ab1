# test_daemon_stdio.py - `conch serve --stdio`: one client on stdin/stdout (nothing but
# JSON lines on stdout), and on EOF the daemon exits 0 leaving no process behind.
import time

from conftest import unique_marker
from rpcclient import pids_matching, wait_gone


def test_stdio_session(daemon_factory, ws):
    (ws / "f.txt").write_text("from host\n")
    d = daemon_factory(stdio=True)
    c = d.client()
    r = c.call("daemon.ping", {}, timeout=20)
    assert r["pid"] == d.pid, r
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "echo hi; cat f.txt; echo err >&2"})
    assert r["stdout"] == "hi\nfrom host\n" and r["stderr"] == "err\n" and r["exit_code"] == 0, r
    m = unique_marker("stdio")
    job = c.call("job.start", {"sandbox": sb, "command": f"exec -a {m} sleep 1000"})["job_id"]
    deadline = time.monotonic() + 30
    while not pids_matching(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_matching(m), f"job did not start: {c.call('job.output', {'job_id': job})}\n{d.log()}"

    c.close()  # EOF on the daemon's stdin
    rc = d.proc.wait(15)
    assert rc == 0, f"conch serve --stdio exited {rc} on EOF\n{d.log()}"
    assert c.bad_lines == [], f"non-JSON on stdout: {c.bad_lines[:3]}"
    assert wait_gone(m) == []
    assert wait_gone(d.marker) == []
    assert sorted(p.name for p in ws.iterdir()) == ["f.txt"]


def test_stdio_eof_at_once(daemon_factory):
    d = daemon_factory(stdio=True)
    d.proc.stdin.close()
    assert d.proc.wait(15) == 0, d.log()
    assert d.proc.stdout.read() == b""
