# test_run_lease.py - `conch run` with a daemon of the same user running borrows a sandbox
# from its pool with the workspace attached (sandbox.lease), drives it itself, and gives it
# back; the daemon makes it as new for the pool (or destroys it when the borrower went away).
# Each test checks where the command really ran (the daemon's sandbox or one of conch run's
# own), as root and as the unprivileged user (tests/integration/as_user.sh).
import contextlib
import os
import subprocess
import threading
import time

import pytest

from conftest import CONCH_BIN, conch, descendants, proc_argv, proc_cmdline, proc_stat, unique_marker
from rpcclient import RpcError, wait_gone
from test_fresh_reuse import settled, wardens


def named(marker):
    """Host pids of the processes whose argv[0] is @marker (exec -a), not those that merely
    carry it in their arguments (conch run, bash -c)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            argv = proc_argv(int(d))
            if argv and argv[0] == marker:
                out.append(int(d))
    return out


def wait_named(marker, timeout=20):
    """Wait until a process named @marker runs; return the host pids of those that do."""
    deadline = time.monotonic() + timeout
    while not named(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return named(marker)


def ancestry(pid):
    """Host pids from @pid up to init (not included)."""
    chain, q = [], pid
    while q > 1:
        chain.append(q)
        try:
            with open(f"/proc/{q}/stat", "rb") as f:
                st = f.read()
        except OSError:
            break
        q = int(st[st.rindex(b")") + 2:].split()[1])
    return chain


@contextlib.contextmanager
def watching(marker, timeout=60):
    """While the body runs, look for a process named @marker; yields a list that holds, after
    the body, the host pids from that process up to init (empty: never seen)."""
    seen = []
    done = threading.Event()

    def watch():
        deadline = time.monotonic() + timeout
        while not done.is_set() and not seen and time.monotonic() < deadline:
            for p in named(marker):
                chain = ancestry(p)
                if chain:
                    seen.extend(chain)
                    break
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    try:
        yield seen
    finally:
        done.set()
        t.join()


def run_watched(args, marker, timeout=60):
    """Run `conch ARGS`, whose command runs a process with @marker in its command line for a
    while; return (result, the host pids from that process up to init)."""
    with watching(marker, timeout) as chain:
        r = conch(args, timeout=timeout)
    return r, chain


@contextlib.contextmanager
def borrowing(d, ws, marker, seconds):
    """`conch run` borrowing from daemon @d, its command a process named @marker that sleeps
    @seconds; yields (the conch run process, the command's host pids) once it runs."""
    p = subprocess.Popen([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws), "--",
                          "bash", "-c", f"exec -a {marker} sleep {seconds}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        pids = wait_named(marker)
        assert pids, "the command did not start"
        yield p, pids
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def sleeper(marker):
    # the marker appears in a host process's command line while it sleeps
    return ["bash", "-c", f"exec -a {marker} sleep 0.6; true"]


def test_conch_run_borrows_from_the_pool_and_gives_back(daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "1"])
    before = settled(d, 1)
    (ws / "a.txt").write_text("hi\n")
    marker = unique_marker("lease")
    r, chain = run_watched(["run", "--socket", d.sock, "--workspace", ws, "--", "bash", "-c",
                            f"cat a.txt; echo new > b.txt; (exec -a {marker} sleep 0.6); id -un"],
                           marker)
    assert r.rc == 0, r.describe()
    assert r.stdout.startswith("hi\n") and "agent" in r.stdout, r.describe()
    assert "A b.txt" in r.stderr, r.describe()
    assert not (ws / "b.txt").exists()
    # it ran under one of the daemon's wardens, not under a sandbox of conch run's own
    assert chain and d.pid in chain, chain
    assert before[0] in chain, (before, chain)
    # given back: the same warden, made as new, is in the pool again
    assert settled(d, 1) == before


def test_borrowed_sandbox_commits_reads_only_in_ro_and_takes_stdin(daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "2"])
    settled(d, 2)
    (ws / "a.txt").write_text("hi\n")
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--commit", "--", "bash", "-c",
               "echo more >> a.txt; mkdir -p sub; echo x > sub/x; rm -f gone"])
    assert r.rc == 0, r.describe()
    assert (ws / "a.txt").read_text() == "hi\nmore\n"
    assert (ws / "sub" / "x").read_text() == "x\n"
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--mode", "ro", "--", "bash", "-c",
               "cat a.txt; touch z"])
    assert r.rc == 1 and "Read-only file system" in r.stderr, r.describe()
    assert not (ws / "z").exists()
    p = subprocess.run([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws), "-q", "--",
                        "wc", "-c"], input=b"12345", capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == b"5", p
    # exit status, timeout and --json as in a sandbox of its own
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--", "sh", "-c", "exit 7"])
    assert r.rc == 7, r.describe()
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--timeout", "0.5", "--grace",
               "0.2", "--", "sleep", "30"])
    assert r.rc == 124, r.describe()
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--json", "--", "sh", "-c",
               "echo out; echo n > n.txt"], want_json=True)
    assert r.rc == 0 and r.out == "out\n", r.describe()
    assert list(r.changes()) == ["n.txt"], r.j


def test_a_borrowed_sandbox_is_as_new_for_its_next_user(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--pool", "1"])
    before = settled(d, 1)
    ws1, ws2 = tmp_path / "one", tmp_path / "two"
    ws1.mkdir()
    ws2.mkdir()
    (ws1 / "secret.txt").write_text("secret\n")
    marker = unique_marker("left")
    r = conch(["run", "--socket", d.sock, "--workspace", ws1, "--", "bash", "-c",
               f"echo secret > /tmp/left; echo secret > /home/agent/left; echo w > made.txt;"
               f" (exec -a {marker} sleep 300 &) ; true"])
    assert r.rc == 0, r.describe()
    assert wait_gone(marker) == []
    assert settled(d, 1) == before
    time.sleep(0.2)  # the warden's answer to the recycle
    look = ("ls -A /tmp /home/agent /workspace; cat /workspace/secret.txt /workspace/made.txt"
            " /tmp/left /home/agent/left 2>/dev/null; true")
    r = conch(["run", "--socket", d.sock, "--workspace", ws2, "--", "bash", "-c", look])
    assert r.rc == 0, r.describe()
    assert settled(d, 1) == before, "the second run did not borrow the recycled sandbox"
    assert "secret" not in r.stdout and "left" not in r.stdout and "made" not in r.stdout, r.stdout
    time.sleep(0.2)
    res = d.client().call("exec.run", {"fresh": True, "command": look}, timeout=60)
    assert res["exit_code"] == 0, res
    assert "secret" not in res["stdout"] and "made" not in res["stdout"], res


def test_a_borrower_killed_mid_command_takes_the_sandbox_with_it(daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "1"])
    before = settled(d, 1)
    marker = unique_marker("orphan")
    with borrowing(d, ws, marker, 300) as (p, pids):
        assert all(q in descendants(d.pid) for q in pids), pids
        p.kill()
        p.wait(10)
        # the daemon sees its connection go: the sandbox and its processes go with it
        assert wait_gone(marker) == []
        after = settled(d, 1)
        assert len(after) == 1 and after != before, "the borrowed sandbox was not destroyed"
    # the daemon goes on serving
    assert d.client().call("daemon.ping", {}) is not None


def test_no_daemon_an_empty_pool_and_misfits_build_their_own(daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    for extra in (["--no-daemon"], ["--memory", "256M"], ["--mode", "rw"], ["--as-root"],
                  ["--hidden", ".env"], ["--readonly", "src"]):
        marker = unique_marker("own")
        r, chain = run_watched(["run", "--socket", d.sock, "--workspace", ws, *extra, "--",
                                *sleeper(marker)], marker)
        assert r.rc == 0, (extra, r.describe())
        assert chain and d.pid not in chain, (extra, chain)
    # a daemon without a pool: conch run still runs, in a sandbox of its own
    d0 = daemon_factory(extra_args=["--pool", "0"])
    marker = unique_marker("nopool")
    r, chain = run_watched(["run", "--socket", d0.sock, "--workspace", ws, "--",
                            *sleeper(marker)], marker)
    assert r.rc == 0, r.describe()
    assert chain and d0.pid not in chain, chain


def test_sandbox_lease_refuses_bad_requests(daemon_factory, ws, tmp_path):
    d = daemon_factory(extra_args=["--pool", "1"])
    before = settled(d, 1)
    rpc = d.client()
    st = os.stat(ws)
    other = tmp_path / "other"
    other.mkdir()
    for params, code, says in (
            ({"workspace": "relative"}, -32602, "absolute"),
            ({"workspace": str(ws), "mode": "rw"}, -32602, "overlay"),
            ({"workspace": str(tmp_path / "missing")}, None, "No such file"),
            ({"workspace": str(ws / "a.txt")}, None, "Not a directory"),
            # a workspace that is not the directory the client looked at (swapped meanwhile)
            ({"workspace": str(other), "ws_dev": st.st_dev, "ws_ino": st.st_ino}, None,
             "not the directory"),
            # a conch of another build: its warden messages would all be refused
            ({"workspace": str(ws), "proto": 1}, -32600, "protocol")):
        if params["workspace"].endswith("a.txt"):
            (ws / "a.txt").write_text("x")
        with pytest.raises(RpcError) as e:
            rpc.call("sandbox.lease", params)
        assert says in str(e.value), (params, e.value)
        if code is not None:
            assert e.value.code == code, (params, e.value)
    # nothing was lent, nothing rebuilt: the very same sandbox waits in the pool
    assert wardens(d) == before
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--", "true"])
    assert r.rc == 0, r.describe()


def test_sandbox_lease_needs_a_socket(daemon_factory, ws):
    d = daemon_factory(stdio=True, extra_args=["--pool", "1"])
    with pytest.raises(RpcError) as e:
        d.client().call("sandbox.lease", {"workspace": str(ws)})
    assert "socket connection" in str(e.value), e.value


def test_a_borrowed_overlay_holds_no_more_than_disk(daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("disk")
    r, chain = run_watched(["run", "--socket", d.sock, "--workspace", ws, "--disk", "1M",
                            "--commit", "--", "bash", "-c",
                            f"(exec -a {marker} sleep 0.6); head -c 4M /dev/zero > big"],
                           marker)
    assert chain and d.pid in chain, chain
    # as in a sandbox of its own: --disk is also the largest file (SIGXFSZ, 128+25), a limit
    assert r.rc == 153 and "disk limit" in r.stderr, r.describe()
    assert not (ws / "big").exists() or (ws / "big").stat().st_size <= 1 << 20
    own = conch(["run", "--no-daemon", "--workspace", ws, "--disk", "1M", "--commit", "--",
                 "bash", "-c", "head -c 4M /dev/zero > big"])
    assert own.rc == r.rc and "disk limit" in own.stderr, own.describe()


def test_nothing_a_borrowed_command_runs_under_holds_the_wardens_host_view(daemon_factory, ws):
    """Unprivileged, an attachable warden keeps a mount namespace that sees the host (to clone
    workspaces from). Only the warden may hold it: not the shepherds (they close it; they are
    not dumpable, so only root could look) and above all not the command, which could reach
    the host's tree through it (the descriptor is close-on-exec too)."""
    d = daemon_factory(extra_args=["--pool", "1"])
    settled(d, 1)
    marker = unique_marker("view")
    with borrowing(d, ws, marker, 30) as (p, cmd):
        wardens = [q for q in descendants(d.pid)
                   if proc_argv(q) and proc_argv(q)[0].startswith("conch-warden")]
        warden = next(w for w in wardens if cmd[0] in descendants(w))
        checked = 0
        for q in descendants(warden):
            try:
                links = [os.readlink(f"/proc/{q}/fd/{n}") for n in os.listdir(f"/proc/{q}/fd")]
            except (PermissionError, FileNotFoundError):
                continue
            checked += 1
            assert not [l for l in links if l.startswith("mnt:")], (q, proc_argv(q), links)
        assert checked, "no process of the sandbox could be inspected"
    assert wait_gone(marker) == []


def shepherds(warden):
    """Host pids of @warden's shepherds (its children named conch-shepherd)."""
    return sorted(p for p in descendants(warden)
                  if (proc_stat(p) or ("", 0))[1] == warden
                  and proc_cmdline(p).startswith(b"conch-shepherd"))


def test_a_borrowed_command_runs_in_the_shepherd_built_before_the_attach(daemon_factory, ws):
    """The pool sandbox's ready shepherd, built before conch run borrowed the sandbox, runs
    the command (no shepherd is built on the command's path): the attach's mount reached its
    namespace, so the command reads and writes the workspace, and its Landlock, applied only
    when the command came, is whole - one domain, with the workspace's rule on the attached
    mount."""
    from test_fences import LANDLOCK_FREE_LAYERS, landlock_abi

    d = daemon_factory(extra_args=["--pool", "1"])
    [warden] = settled(d, 1)
    deadline = time.monotonic() + 10
    while not shepherds(warden) and time.monotonic() < deadline:
        time.sleep(0.02)
    ready = shepherds(warden)
    assert len(ready) == 1, ready
    (ws / "a.txt").write_text("hi\n")
    marker = unique_marker("ready")
    layers = f"python3 -c '{LANDLOCK_FREE_LAYERS}';" if landlock_abi() >= 1 else "echo 15;"
    r, chain = run_watched(["run", "--socket", d.sock, "--workspace", ws, "--", "bash", "-c",
                            f"cat a.txt; {layers} echo w > w.txt; cat w.txt; "
                            f"(exec -a {marker} sleep 0.6)"], marker)
    assert r.rc == 0 and r.stdout == "hi\n15\nw\n", r.describe()
    assert "A w.txt" in r.stderr, r.describe()
    assert warden in chain and ready[0] in chain, (ready, chain)
    # the recycled sandbox's next ready shepherd is a new one, and serves as well
    assert settled(d, 1) == [warden]
    r = conch(["run", "--socket", d.sock, "--workspace", ws, "--mode", "ro", "--", "cat", "a.txt"])
    assert r.rc == 0 and r.stdout == "hi\n", r.describe()
