# test_review_attack.py - a review's attack on the recent changes: the pool sandbox's ready
# shepherd kept through a workspace attach (shared /workspace, late Landlock), large exec.run
# and session.run results built off the loop, the lent sandbox's refused tool bridge, and
# conch run's command taking the caller's umask, nice value and limits. Each defect it found
# is fixed (the tests stay as regressions); the rest cover what held and the suite did not
# check.
import os
import resource
import subprocess
import time

import pytest

from conftest import CONCH_BIN, conch, unique_marker
from rpcclient import Client, RpcError
from test_fences import LANDLOCK_FREE_LAYERS, landlock_abi
from test_fresh_reuse import settled
from test_lease_attack import popen_watched
from test_run_lease import run_watched, wait_named

BIG = "head -c 3000000 /dev/zero | tr '\\0' b; echo"  # > 64 KiB kept: built by a worker


def sandbox_ids(daemon_pid, t0, t1, counters=64):
    """Every id daemon_make_id (src/daemon/server.c) can have given between times @t0 and @t1:
    time, the daemon's pid and a counter, multiplied by a constant - nothing secret."""
    out = []
    for t in range(t0, t1 + 1):
        for n in range(1, counters):
            x = (((t << 20) ^ (daemon_pid << 8) ^ n) * 0x9E3779B97F4A7C15) & (2**64 - 1)
            out.append("sb-%08x" % (x >> 32))
    return out


def find_unlisted_sandbox(c, daemon_pid, t0):
    """The id of a sandbox of the daemon that sandbox.get knows but sandbox.list does not show."""
    listed = {s["id"] for s in c.call("sandbox.list", {})["sandboxes"]}
    for i in sandbox_ids(daemon_pid, t0, int(time.time())):
        if i in listed:
            continue
        try:
            c.call("sandbox.get", {"id": i}, timeout=5)
            return i
        except RpcError:
            pass
    return None


# ---- 1. a lent sandbox is reachable by its id ---------------------------------------------


def test_a_lent_sandbox_cannot_be_reached_by_its_id(daemon_factory, ws):
    """Another client that guesses ids finds no lent sandbox to read or run in."""
    t0 = int(time.time())
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    (ws / "secret.txt").write_text("the borrower's\n")
    marker = unique_marker("lent")
    p = subprocess.Popen([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws), "--commit",
                          "--json", "--", "bash", "-c", f"(exec -a {marker} sleep 2.5); true"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_named(marker), "the borrowed command did not start"
        c = d.client()
        lent = find_unlisted_sandbox(c, d.pid, t0)
        refused = {}
        if lent:
            for method, params in (("fs.read", {"path": "secret.txt"}),
                                   ("exec.run", {"command": "echo intruder > intruder.txt",
                                                 "timeout": 10})):
                try:
                    c.call(method, {"sandbox": lent, **params}, timeout=15)
                    refused[method] = False
                except RpcError as e:
                    refused[method] = e.data_code == "sandbox_not_found"
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, (out, err)
    assert not (ws / "intruder.txt").exists(), "another client's write was committed by conch run"
    assert "intruder.txt" not in out, out
    assert lent is None or all(refused.values()), (lent, refused)


def test_a_lent_sandbox_is_unknown_to_every_other_request(daemon_factory, ws):
    """Whoever knows a lent sandbox's id (the lease's answer names it) reaches nothing by it:
    every method answers sandbox_not_found, from another connection and from the borrower's
    own; the borrower drives the warden alone. Ids are random (the old ones, made of the time,
    the daemon's pid and a counter, were found by trying the few hundred they could be)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    borrower = d.client()
    st = os.stat(ws)
    lent = borrower.call("sandbox.lease", {"workspace": str(ws), "ws_dev": st.st_dev,
                                           "ws_ino": st.st_ino}, timeout=30)["sandbox"]
    for c in (d.client(), borrower):
        for method, params in (("sandbox.get", {"id": lent}), ("sandbox.destroy", {"id": lent}),
                               ("fs.read", {"sandbox": lent, "path": "x"}),
                               ("exec.run", {"sandbox": lent, "command": "true"}),
                               ("job.start", {"sandbox": lent, "command": "true"}),
                               ("session.open", {"sandbox": lent}),
                               ("workspace.changes", {"sandbox": lent})):
            with pytest.raises(RpcError) as e:
                c.call(method, params, timeout=10)
            assert e.value.data_code == "sandbox_not_found", (method, e.value)
    assert borrower.call("sandbox.release", {})["released"] == 1
    # ids of sandboxes made one after another share nothing a client could step through
    c = d.client()
    ids = [c.call("sandbox.create", {})["id"] for _ in range(3)]
    assert len(set(ids)) == 3 and len({i[:5] for i in ids}) > 1, ids


# ---- 4. --disk through the pool ------------------------------------------------------------


def test_disk_bounds_the_largest_file_through_the_pool_as_without(daemon_factory, ws):
    """--disk is also the largest file a command may write, borrowed or not."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("fsize")
    cmd = f"(exec -a {marker} sleep 0.5); ulimit -f"
    r, chain = run_watched(["run", "--socket", d.sock, "--workspace", ws, "--disk", "1M", "-q",
                            "--", "bash", "-c", cmd], marker)
    assert chain and d.pid in chain, "not borrowed"
    own = conch(["run", "--no-daemon", "--workspace", ws, "--disk", "1M", "-q", "--", "bash", "-c",
                 "ulimit -f"])
    assert own.rc == 0 and own.stdout == "1024\n", own.describe()
    assert r.rc == 0 and r.stdout == own.stdout, (r.describe(), own.describe())


def test_a_small_caller_stack_limit_is_reported_or_works(daemon_factory, ws):
    """A 64 KiB stack limit: conch run works or says so, never crashes (SIGSEGV, 139)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)

    def small_stack():
        resource.setrlimit(resource.RLIMIT_STACK, (64 << 10, 64 << 10))

    for extra in (["--socket", d.sock], ["--no-daemon"]):
        p = subprocess.run([CONCH_BIN, "run", *extra, "--workspace", str(ws), "-q", "--", "true"],
                           capture_output=True, text=True, timeout=30, preexec_fn=small_stack)
        assert p.returncode == 0 or (p.returncode == 125 and "stack" in p.stderr), (extra, p)


def test_caller_limits_are_only_lowered_through_the_pool(daemon_factory, ws):
    """The caller's soft limits lower the borrowed command's; a caller's higher soft limit than
    the sandbox's own (RLIMIT_NOFILE: the pool's command has the daemon's original soft limit)
    does not raise it, and its nice value only lowers the priority."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("lim")
    base = conch(["run", "--socket", d.sock, "--workspace", ws, "-q", "--", "bash", "-c",
                  "ulimit -Sn; ulimit -Hn"])
    assert base.rc == 0, base.describe()
    soft, hard = (int(x) for x in base.stdout.split())
    settled(d, 1)  # made as new for the pool again: else the next conch run builds its own

    def caller():
        resource.setrlimit(resource.RLIMIT_CPU, (7, resource.RLIM_INFINITY))
        own_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, own_hard, soft * 4), own_hard))
        os.nice(3)

    p, chain = popen_watched(["run", "--socket", d.sock, "--workspace", ws, "-q", "--", "bash", "-c",
                              f"(exec -a {marker} sleep 0.4); ulimit -St; ulimit -Sn; "
                              "cut -d' ' -f19 /proc/self/stat"], marker, preexec_fn=caller)
    assert p.returncode == 0 and chain and d.pid in chain, (p, chain)
    cpu, nofile, nice = p.stdout.decode().split()
    assert cpu == "7" and int(nofile) <= soft and int(nice) >= 3, p.stdout


# ---- 1. Landlock for every kind of command --------------------------------------------------


def test_sessions_and_jobs_run_under_exactly_one_landlock_domain(daemon_factory, ws):
    """test_fences counts the layers of conch run's, exec.run's and a fresh command; a session's
    shell and a job are commands too (a session's command runs in the shell, so it counts the
    shell's domain)."""
    if landlock_abi() < 1:
        pytest.skip("no Landlock on this kernel")
    d = daemon_factory(extra_args=["--pool", "1"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    cmd = f"python3 -c '{LANDLOCK_FREE_LAYERS}' && echo w > w.txt && cat w.txt"
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    r = c.call("session.run", {"session": sid, "command": cmd}, timeout=60)
    assert r["exit_code"] == 0 and r["stdout"].replace("\r\n", "\n") == "15\nw\n", r
    job = c.call("job.start", {"sandbox": sb, "command": cmd}, timeout=30)["job_id"]
    st = c.call("job.wait", {"job_id": job, "timeout": 30}, timeout=40)
    out = c.call("job.output", {"job_id": job}, timeout=30)
    assert st["exit_code"] == 0 and out["stdout"] == "15\nw\n", (st, out)
    c.call("sandbox.destroy", {"id": sb}, timeout=30)  # the pool's warden is then the only one
    # the fresh sandbox's second-ever command (after a recycle) is fenced the same
    for _ in range(2):
        r = c.call("exec.run", {"fresh": True, "command": f"cd /workspace && {cmd}"}, timeout=60)
        assert r["exit_code"] == 0 and r["stdout"] == "15\nw\n", r
        settled(d, 1)


def test_a_borrowed_commands_workspace_is_a_slave_and_nothing_of_it_is_shared(daemon_factory, ws):
    """The attachable warden's /workspace is a shared mount; the borrowed command sees both
    layers (the empty tmpfs and the attached workspace) as slaves only: no mount of its
    namespace is in a peer group it could propagate back through."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("slave")
    for mode in ("overlay", "ro"):
        r, chain = run_watched(["run", "--socket", d.sock, "--workspace", ws, "--mode", mode, "-q",
                                "--", "bash", "-c",
                                f"(exec -a {marker} sleep 0.4); cat /proc/self/mountinfo"], marker)
        assert r.rc == 0 and chain and d.pid in chain, r.describe()
        lines = r.stdout.splitlines()
        assert not [l for l in lines if " shared:" in l], r.stdout
        wsl = [l for l in lines if l.split()[4] == "/workspace"]
        assert len(wsl) == 2 and all(" master:" in l for l in wsl), wsl
        settled(d, 1)


# ---- 2. large results built by a worker, racing the loop ------------------------------------


def test_large_results_race_destroy_close_and_disconnect(daemon_factory, ws):
    """A result over 64 KiB is built by a worker: a sandbox.destroy, a session.close or the
    client's disconnect meanwhile neither loses an answer that can still be given nor hurts
    the daemon (run it against the ASan build for use-after-free and leaks), and a session's
    pipelined commands are answered in order with their own output."""
    d = daemon_factory(extra_args=["--pool", "1"])
    c, c2 = d.client(), d.client()
    # pipelined on one session: big, small, big, small - in order, each its own output
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    ids = [c.request("session.run", {"session": sid, "max_output": 16 << 20, "timeout": 60,
                                     "command": BIG if i % 2 == 0 else f"echo small{i}"})
           for i in range(4)]
    # responses are kept in arrival order (a dict): read the order before taking them
    c.wait_for(lambda: all(i in c._responses for i in ids), timeout=120, what="4 answers")
    with c._cv:
        arrived = [k for k in c._responses if k in ids]
    assert arrived == ids, (arrived, ids)
    outs = [c.wait(i, 5)["result"]["stdout"].replace("\r\n", "\n") for i in ids]
    assert [len(o) for o in outs] == [3000001, 7, 3000001, 7], [len(o) for o in outs]
    assert outs[1] == "small1\n" and outs[3] == "small3\n", outs[1::2]
    # exec.run and session.run with the sandbox destroyed, or the session closed, mid-build
    for delay in (0.05, 0.3):
        sb2 = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
        sid2 = c.call("session.open", {"sandbox": sb2}, timeout=30)["session"]
        e = c.request("exec.run", {"sandbox": sb2, "command": BIG, "max_output": 16 << 20})
        s = c.request("session.run", {"session": sid2, "command": BIG, "max_output": 16 << 20})
        time.sleep(delay)
        c2.call("session.close", {"session": sid2}, timeout=30)
        c2.call("sandbox.destroy", {"id": sb2}, timeout=30)
        for k in (e, s):
            resp = c.wait(k, 60)
            assert "result" in resp or resp["error"]["data"]["code"] in (
                "sandbox_stopped", "session_ended"), resp.get("error")
    # a client that leaves while its big fresh result is built
    for delay in (0.1, 0.4):
        cc = Client.unix(d.sock)
        cc.request("exec.run", {"fresh": True, "command": BIG, "max_output": 16 << 20})
        time.sleep(delay)
        cc.close()
    time.sleep(1)
    r = c.call("exec.run", {"fresh": True, "command": "echo alive"}, timeout=60)
    assert r["stdout"] == "alive\n", r
    assert c.call("daemon.ping", {}, timeout=10)["pid"] == d.pid
    assert "Sanitizer" not in d.log() and "runtime error" not in d.log(), d.log()


def test_sigterm_while_large_results_are_built_answers_them(daemon_factory, ws):
    """SIGTERM with big results in flight: the daemon waits for the workers (they hold it),
    answers, and exits 0 (clean under ASan: nothing left to leak)."""
    import signal
    d = daemon_factory(extra_args=["--pool", "0"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    c.call("exec.run", {"sandbox": sb, "command": "true"}, timeout=30)  # warm
    e = c.request("exec.run", {"sandbox": sb, "command": BIG, "max_output": 16 << 20})
    s = c.request("session.run", {"session": sid, "command": BIG, "max_output": 16 << 20})
    # wait for the first answer to be on its way, then stop the daemon with the other in flight
    c.wait(e, 60)
    d.proc.send_signal(signal.SIGTERM)
    try:
        resp = c.wait(s, 60)
        assert "result" in resp or resp["error"]["data"]["code"] in (
            "sandbox_stopped", "session_ended"), resp
    except AssertionError as ex:  # the connection may close first: the session was ended
        assert "connection closed" in str(ex), ex
    assert d.proc.wait(30) == 0, d.log()
    assert "Sanitizer" not in d.log() and "runtime error" not in d.log(), d.log()
