# test_lease_attack.py - attacks on `conch run` borrowing a pool sandbox from a running daemon
# (sandbox.lease / sandbox.release), as an outsider would: what a borrowed command can do to
# the daemon and to its own conch run, what survives the daemon's death, and whether a
# borrowed sandbox behaves like a sandbox of conch run's own (README: "everything else is
# the same"). Each defect it found is fixed; the tests stay as regressions, with what held.
import fcntl
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import CONCH_BIN, conch, descendants, proc_argv, unique_marker
from rpcclient import RpcError, wait_gone
from test_fresh_reuse import LEAVE, LOOK, settled, wardens
from test_run_lease import borrowing, named, wait_named, watching


def popen_watched(args, marker, timeout=60, preexec_fn=None, **kw):
    """Run `conch ARGS` (its command shows a process whose argv[0] is @marker for a while);
    return (CompletedProcess, the host pids from that process up to init). Like
    test_run_lease.run_watched, but with a preexec_fn (resource limits of the caller)."""
    with watching(marker, timeout) as chain:
        p = subprocess.run([CONCH_BIN, *map(str, args)], capture_output=True, timeout=timeout,
                           preexec_fn=preexec_fn, stdin=subprocess.DEVNULL, **kw)
    return p, chain


def warden_of(d, pid):
    """The daemon's warden (direct child) that @pid runs under."""
    for w in descendants(d.pid) if d.proc.poll() is None else []:
        if proc_argv(w) and proc_argv(w)[0].startswith("conch-warden") and pid in descendants(w):
            return w
    return None


def chain_warden(chain):
    """The conch-warden in a chain of host pids (command up to init)."""
    for q in chain:
        a = proc_argv(q)
        if a and a[0].startswith("conch-warden"):
            return q
    return None


# ---- a borrowed command eats its own exit event through the daemon's tool bridge ----------

# Inside a borrowed sandbox /run/conch/ptc.sock is the daemon's tool bridge for that pool
# sandbox (a sandbox of conch run's own has none without --tools). Each "call" request from a
# pid namespace the bridge does not know makes the daemon read the warden's control socket
# (bridge_resolve -> conch_super_dispatch) - the socket it lent to conch run and promised not
# to read. The command queues many such requests just before it exits: the daemon works
# through them after the command is gone, while the warden's EXITED is on that socket.
FLOOD = r"""
import os, socket, sys, time
conns = []
try:
    for i in range(30):
        s = socket.socket(socket.AF_UNIX)
        s.connect("/run/conch/ptc.sock")
        s.setblocking(False)
        conns.append(s)
except OSError:
    os._exit(4)  # not borrowed: a sandbox of conch run's own has no bridge
time.sleep(0.3)
blob = b'{"op":"call","id":1,"name":"x"}\n' * 6000
for s in conns:
    try:
        s.send(blob)
    except OSError:
        pass
os._exit(3)
"""


def test_a_borrowed_command_cannot_steal_its_exit_event_through_the_tool_bridge(
        daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "1"])
    (ws / "flood.py").write_text(FLOOD)
    outcomes = []
    for attempt in range(4):
        settled(d, 1)
        time.sleep(0.3)  # the recycle's answer
        p = subprocess.Popen([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws),
                              "--timeout", "3", "-q", "--", "python3", "/workspace/flood.py"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
        try:
            _, err = p.communicate(timeout=15)
            outcomes.append(p.returncode)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            outcomes.append("hung")
            break
    borrowed = [o for o in outcomes if o != 4]
    assert borrowed, f"no attempt borrowed a pool sandbox: {outcomes}"
    # every borrowed run ends by itself with the command's own status
    assert all(o == 3 for o in borrowed), outcomes
    assert d.client().call("daemon.ping", {}) is not None


# A borrowed command asks the daemon's bridge for a tool: the connection is closed unread.
ASK_BRIDGE = r"""
import os, socket
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/conch/ptc.sock")
except OSError:
    print("no bridge")
    raise SystemExit
s.settimeout(10)
try:
    s.sendall(b'{"op":"call","id":1,"name":"x","input":{}}\n')
    print("answer:", s.recv(4096) or b"none")
except OSError as e:
    print("answer:", type(e).__name__)
"""


def test_a_borrowed_sandbox_serves_no_tool_bridge(daemon_factory, ws):
    """conch run has no --tools when it borrows: its command reaches no tool bridge, as in a
    sandbox of conch run's own (which has no socket at all). The daemon's socket for the pool
    sandbox stays in place (it is in the read-only root), and the daemon closes every
    connection from a lent sandbox without reading it: a request would have made the daemon
    read the lent control socket. Made as new, the sandbox serves fresh commands' tools again."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    (ws / "ask.py").write_text(ASK_BRIDGE)
    marker = unique_marker("bridge")
    cmd = f"(exec -a {marker} sleep 0.6); python3 /workspace/ask.py; tool_call x '{{}}'; echo rc=$?"
    p, chain = popen_watched(["run", "--socket", d.sock, "--workspace", ws, "-q", "--",
                              "bash", "-c", cmd], marker)
    assert p.returncode == 0, p
    assert chain and d.pid in chain, "not borrowed"
    out = p.stdout.decode()
    assert any(f"answer: {a}" in out for a in ("b'none'", "BrokenPipeError", "ConnectionResetError")), out
    assert "rc=0" not in out, out
    own = conch(["run", "--no-daemon", "--workspace", ws, "-q", "--", "bash", "-c", cmd])
    assert own.rc == 0 and "no bridge" in own.stdout and "rc=0" not in own.stdout, own.describe()
    # the recycled sandbox's bridge answers a fresh command again (unknown tool: an answer)
    settled(d, 1)
    c = d.client()
    deadline = time.monotonic() + 10
    while True:
        r = c.call("exec.run", {"fresh": True, "command": "python3 -c \"$(cat)\"",
                                "stdin": ASK_BRIDGE}, timeout=60)
        if "answer: b'{" in r["stdout"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "answer: b'{" in r["stdout"], r


# ---- the daemon killed mid-lease -------------------------------------------------------------

@pytest.mark.root_only  # unprivileged, the warden does die with its daemon
def test_a_daemon_killed_mid_lease_takes_the_borrowed_command_with_it(daemon_factory, ws):
    """kill -9 of the daemon mid-lease: the borrowed command dies with it, as root too (the
    warden's parent-death signal was cleared by its own change to the host id block, and
    conch run's copy of the control socket kept it from seeing EOF)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("orphan")
    with borrowing(d, ws, marker, 30) as (p, pids):
        assert all(q in descendants(d.pid) for q in pids), pids
        d.kill9()
        deadline = time.monotonic() + 5
        while named(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = named(marker)
        assert left == [], f"the borrowed command outlived its daemon: {left}"


@pytest.mark.root_only
def test_a_borrowed_sandbox_that_outlives_its_daemon_keeps_its_host_ids(daemon_factory, ws):
    """No live sandbox runs in a host id block whose lock died with its daemon (another
    sandbox would get the same host uids)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("ids")
    with borrowing(d, ws, marker, 30) as (p, pids):
        w = warden_of(d, pids[0])
        assert w, "no warden found for the borrowed command"
        base = os.stat(f"/proc/{w}").st_uid
        d.kill9()
        time.sleep(0.3)
        if not os.path.exists(f"/proc/{w}") or not named(marker):
            return  # the sandbox died with its daemon: nothing can share its ids
        # it still runs: its block must still be claimed (a held flock on its lock file)
        path = f"/run/conch/ids/{base}"
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # held: no other sandbox can get it
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        pytest.fail(f"host id block {base} is free while sandbox warden {w} still runs in it")


@pytest.mark.root_only  # unprivileged, the command dies with the daemon: conch run reports
def test_conch_run_reports_when_its_daemon_died_mid_lease(daemon_factory, ws):
    """The daemon dies under a borrowed command: conch run reports (one JSON result) instead
    of dying of SIGPIPE on the dead connection."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("pipe")
    p = subprocess.Popen([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws),
                          "--json", "--", "bash", "-c", f"(exec -a {marker} sleep 2); echo done"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        pids = wait_named(marker)
        assert pids and all(q in descendants(d.pid) for q in pids), "not borrowed"
        d.kill9()
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode >= 0, f"conch run died of signal {-p.returncode}: {err!r}"
    j = json.loads(out)  # a result (the command's, or an infrastructure error), as always
    assert isinstance(j, dict), out


def test_a_daemon_stopped_mid_lease_fails_the_borrowed_run(daemon_factory, ws):
    """SIGTERM (a clean stop) mid-lease: the daemon destroys the borrowed sandbox and its
    command; conch run reports an infrastructure error (125) instead of hanging or passing."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("stop")
    p = subprocess.Popen([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws), "--",
                          "bash", "-c", f"(exec -a {marker} sleep 30); echo done"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        pids = wait_named(marker)
        assert pids and all(q in descendants(d.pid) for q in pids)
        exited, _ = d.stop()
        assert exited
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 125, (p.returncode, err)
    assert b"done" not in out and b"warden died" in err, (out, err)
    assert wait_gone(marker) == []


# ---- a borrowed sandbox must behave like one of conch run's own ------------------------------

def _tight_limits():
    resource.setrlimit(resource.RLIMIT_CPU, (7, 7))
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
    # below the sandbox's own process limit, whose setting then failed with EPERM
    resource.setrlimit(resource.RLIMIT_NPROC, (500, 500))
    os.nice(5)


def test_a_borrowed_command_keeps_the_callers_resource_limits(daemon_factory, ws):
    """The caller's CPU-time, open-files and process limits and its nice value hold for the command,
    borrowed or not (a harness's `ulimit` must not vanish because a daemon runs)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    look = "ulimit -t; ulimit -n; ulimit -u; nice"
    own = subprocess.run([CONCH_BIN, "run", "--no-daemon", "--workspace", str(ws), "-q", "--",
                          "bash", "-c", look], capture_output=True, timeout=60,
                         preexec_fn=_tight_limits, stdin=subprocess.DEVNULL)
    assert own.returncode == 0 and own.stdout.split() == [b"7", b"300", b"500", b"5"], own
    marker = unique_marker("rlim")
    p, chain = popen_watched(["run", "--socket", d.sock, "--workspace", ws, "-q", "--", "bash",
                              "-c", f"(exec -a {marker} sleep 0.6); {look}"], marker,
                             preexec_fn=_tight_limits)
    assert p.returncode == 0, p
    assert chain and d.pid in chain, "not borrowed"
    assert p.stdout.split() == own.stdout.split(), (p.stdout, own.stdout)


@pytest.mark.root_only
def test_umask_077_runs_without_a_daemon_as_through_the_pool(daemon_factory, ws):
    """Under the caller's umask 077 a command runs either way (its own sandbox's mount points
    were made unreachable for the agent), with that umask."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)

    def umask():
        os.umask(0o077)

    marker = unique_marker("umask")
    p, chain = popen_watched(["run", "--socket", d.sock, "--workspace", ws, "-q", "--", "bash",
                              "-c", f"(exec -a {marker} sleep 0.6); echo ok; umask"], marker,
                             preexec_fn=umask)
    assert p.returncode == 0 and p.stdout == b"ok\n0077\n", p
    assert chain and d.pid in chain, "not borrowed"
    own = subprocess.run([CONCH_BIN, "run", "--no-daemon", "--workspace", str(ws), "-q", "--",
                          "bash", "-c", "echo ok; umask"], capture_output=True, timeout=60,
                         preexec_fn=umask, stdin=subprocess.DEVNULL)
    assert own.returncode == 0 and own.stdout == b"ok\n0077\n", own


RESULTS = [
    ["bash", "-c", "kill -9 $$"],
    ["bash", "-c", "kill -TERM $$"],
    ["bash", "-c", "exit 255"],
    ["bash", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo err >&2; exit 4"],
]


def _norm(j):
    j = dict(j)
    for k in ("duration_ms", "usage", "stdout_spill", "stderr_spill"):
        j.pop(k, None)
    for k in ("stdout", "stderr"):
        # the omission marker names the spill file
        j[k] = j[k].split("[...")[0]
    return j


def test_borrowed_results_are_those_of_a_sandbox_of_its_own(daemon_factory, ws):
    """Exit statuses, signals, output limits and timeouts through the pool and with
    --no-daemon: the same result, field by field."""
    d = daemon_factory(extra_args=["--pool", "1"])
    cases = [(["--max-output", "1000"], c) for c in RESULTS]
    cases.append((["--timeout", "0.5", "--grace", "0.2"],
                  ["bash", "-c", "trap '' TERM; sleep 20"]))
    for opts, cmd in cases:
        settled(d, 1)
        time.sleep(0.2)
        before = wardens(d)
        lent = conch(["run", "--socket", d.sock, "--workspace", ws, "--json", *opts, "--", *cmd],
                     want_json=True)
        own = conch(["run", "--no-daemon", "--workspace", ws, "--json", *opts, "--", *cmd],
                    want_json=True)
        assert lent.rc == own.rc, (cmd, lent.describe(), own.describe())
        assert _norm(lent.j) == _norm(own.j), (cmd, lent.j, own.j)
        assert settled(d, 1) == before, "the pool's sandbox was not lent and given back"


def test_what_a_borrowed_command_leaves_does_not_reach_the_next_fresh_user(daemon_factory, ws):
    """test_fresh_reuse's leftovers (files in every writable place, SysV IPC, an abstract
    socket, a TCP listener, a process), left by a borrowed command, are gone for the next
    user of the same pool sandbox (exec.run {fresh} from another client)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    before = settled(d, 1)
    marker = unique_marker("leave")
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "-q", "--", "bash", "-c",
               LEAVE.replace("MARKER", marker)])
    assert r.rc == 0 and r.stdout == "left\n", r.describe()
    assert wait_gone(marker) == []
    assert settled(d, 1) == before
    time.sleep(0.3)
    res = d.client().call("exec.run", {"fresh": True, "command": LOOK.replace("MARKER", marker)},
                          timeout=60)
    assert res["exit_code"] == 0, res
    assert settled(d, 1) == before, "the next user did not get the recycled sandbox"
    out = res["stdout"]
    assert "files:\n" in out, out
    for leftover in ("ipc-left", "abstract-left", "tcp-left", marker, "secret"):
        assert leftover not in out, out
    assert "/workspace= " in out, out


def test_leases_are_per_connection(daemon_factory, ws):
    """sandbox.release gives back only what its own connection borrowed; a connection that
    closes while its lease is being attached, or holding two leases, leaves the daemon well
    and the pool whole."""
    d = daemon_factory(extra_args=["--pool", "2"])
    settled(d, 2)
    st = os.stat(ws)
    params = {"workspace": str(ws), "ws_dev": st.st_dev, "ws_ino": st.st_ino}
    a, b = d.client(), d.client()
    lent = a.call("sandbox.lease", params, timeout=30)
    w = lent["warden_pid"]
    assert w in wardens(d)
    assert b.call("sandbox.release", {}) == {"released": 0}
    time.sleep(0.3)
    assert os.path.exists(f"/proc/{w}") and w in wardens(d), "another client's release took it"
    # a second lease on the same connection; both go back with one release
    try:
        a.call("sandbox.lease", params, timeout=30)
        n = 2
    except RpcError as e:
        assert e.data_code == "limit", e
        n = 1
    assert a.call("sandbox.release", {}) == {"released": n}
    assert settled(d, 2) and len(settled(d, 2)) == 2
    # a client that goes away right after asking
    for _ in range(3):
        s = socket.socket(socket.AF_UNIX)
        s.connect(d.sock)
        s.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "sandbox.lease",
                               "params": params}) + "\n").encode())
        s.close()
    time.sleep(0.5)
    assert d.client().call("daemon.ping", {}) is not None
    assert len(settled(d, 2)) == 2
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--", "true"])
    assert r.rc == 0, r.describe()


def _other_user():
    import pwd
    try:
        return pwd.getpwnam("conchtest")
    except KeyError:
        pytest.skip("no user conchtest (tests/integration/as_user.sh creates it)")


def _as_other_user(u, args, marker):
    """`conch ARGS` run by host user @u, in a workspace of its own; (result, chain)."""
    uws = tempfile.mkdtemp(prefix="conchit-other-", dir="/tmp")
    try:
        os.chmod(uws, 0o755)
        os.chown(uws, u.pw_uid, u.pw_gid)

        def drop():
            os.setgid(u.pw_gid)
            os.setuid(u.pw_uid)

        env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
        env.update(HOME=u.pw_dir, USER=u.pw_name, LOGNAME=u.pw_name)
        return popen_watched(["run", *args[:-1], "--workspace", uws, "-q", "--", "bash", "-c",
                              f"(exec -a {marker} sleep 0.3); {args[-1]}"], marker,
                             preexec_fn=drop, cwd="/tmp", env=env)
    finally:
        shutil.rmtree(uws, ignore_errors=True)


@pytest.mark.root_only
def test_another_host_user_cannot_borrow_from_a_root_daemon(daemon_factory):
    """Root's daemon (its socket 0600): another host user's conch run pointed at it does not
    borrow; it runs in a sandbox of its own."""
    u = _other_user()
    d = daemon_factory(extra_args=["--pool", "1"])
    before = settled(d, 1)
    marker = unique_marker("other")
    p, chain = _as_other_user(u, ["--socket", d.sock, "id -u"], marker)
    assert p.returncode == 0, p
    assert chain and d.pid not in chain, chain
    assert wardens(d) == before


@pytest.mark.root_only
def test_conch_run_builds_its_own_when_the_daemon_refuses_it(daemon_factory):
    """A daemon that closes the connection (another uid) never kills conch run with SIGPIPE:
    it builds a sandbox of its own, as README promises for any failure to borrow."""
    u = _other_user()
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    # reachable by anyone (the client trusts a root-owned socket); the daemon itself refuses
    # the other uid and closes the connection at once
    os.chmod(d.sock, 0o666)
    try:
        codes = []
        for _ in range(20):  # a race (1 in 6 hit it): the write must come after the close
            p, chain = _as_other_user(u, ["--socket", d.sock, "echo ran"], unique_marker("ref"))
            codes.append(p.returncode)
            if p.returncode != 0:
                break
            assert p.stdout == b"ran\n" and d.pid not in chain, p
    finally:
        os.chmod(d.sock, 0o600)
    assert all(c == 0 for c in codes), f"conch run exit statuses: {codes}"
    assert "refused a connection" in d.log()
