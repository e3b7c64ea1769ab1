# test_clean_image.py - sandbox-side processes start from a clean image (src/jail/warden-exec.c):
# a warden is the conch binary exec'd anew, not a copy of the multi-threaded daemon, so it holds
# nothing of the daemon's heap (other sandboxes' environments, file contents) and no thread
# stack or lock of the daemon's; its file workers, forks of the warden, carry only the warden's
# own memory, are not dumpable, and share no memory with it. Each test looks from the host, as
# the test process may (root, or the user who owns the daemon and the sandboxes' namespaces).
import base64
import os
import secrets

import pytest

from conftest import CONCH_BIN, IS_ROOT, descendants, proc_cmdline, proc_status


def _wardens(daemon):
    """Host pids of the daemon's wardens (its children titled conch-warden)."""
    return {p for p in descendants(daemon.pid)
            if proc_cmdline(p).startswith(b"conch-warden")
            and (proc_status(p) or {}).get("PPid") == str(daemon.pid)}


def _file_servers(warden):
    return [p for p in descendants(warden) if proc_cmdline(p).startswith(b"conch-file-server")]


def _maps(pid):
    """[(start, end, perms, name)] of /proc/<pid>/maps."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[1], parts[5].strip() if len(parts) > 5 else ""))
    return out


def _memory_holds(pid, needle):
    """Whether @needle is anywhere in the readable memory of @pid (read through
    /proc/<pid>/mem; regions over 256 MiB, a sanitizer's shadow, are skipped)."""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for start, end, perms, name in _maps(pid):
            if perms[0] != "r" or name.startswith("[v") or end - start > (256 << 20):
                continue
            pos, tail = start, b""
            while pos < end:
                try:
                    chunk = os.pread(fd, min(4 << 20, end - pos), pos)
                except OSError:
                    break
                if not chunk:
                    break
                if needle in tail + chunk:
                    return True
                tail = chunk[-(len(needle) - 1):]
                pos += len(chunk)
    finally:
        os.close(fd)
    return False


@pytest.fixture
def two_sandboxes(daemon_factory, ws):
    """A daemon without a pool (so that B's warden is made after A has been used), sandbox A
    given a secret (in a command's environment, in a file written through fs.write, a file big
    enough that its answer is checked on the daemon's threadpool), then sandbox B with a
    command run and a file read. Returns (daemon, secret, B's warden pid)."""
    daemon = daemon_factory(extra_args=["--pool", "0"])
    rpc = daemon.client()
    secret = ("conch-secret-" + secrets.token_hex(12)).encode()
    # Many copies: a freed block's first bytes are the allocator's; the rest stays.
    blob = b" ".join([secret] * 64)
    a = rpc.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    r = rpc.call("exec.run", {"sandbox": a, "command": "echo ${#CONCH_SECRET}",
                              "env": {"CONCH_SECRET": blob.decode()}}, timeout=30)
    assert r["exit_code"] == 0 and r["stdout"].strip() == str(len(blob)), r
    big = (blob + b"\n") * 200  # > 64 KiB: its answer is checked off the loop
    rpc.call("fs.write", {"sandbox": a, "path": "secret.txt",
                          "content": base64.b64encode(big).decode(), "encoding": "base64"},
             timeout=30)
    got = rpc.call("fs.read", {"sandbox": a, "path": "secret.txt"}, timeout=30)
    assert secret.decode() in str(got)
    before = _wardens(daemon)
    b = rpc.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    assert rpc.call("exec.run", {"sandbox": b, "command": "echo ok"})["stdout"] == "ok\n"
    rpc.call("fs.read", {"sandbox": b, "path": "a.txt"}, timeout=30)
    new = _wardens(daemon) - before
    assert len(new) == 1, (before, new)
    return daemon, secret, new.pop()


@pytest.fixture
def ws(ws):
    (ws / "a.txt").write_text("alpha\n")
    return ws


def test_warden_and_file_worker_hold_nothing_of_another_sandbox(two_sandboxes):
    """The secret A was given is in the daemon's memory, but not in B's warden's nor in B's
    file worker's: they are not copies of the daemon."""
    daemon, secret, warden = two_sandboxes
    assert _memory_holds(daemon.pid, secret), "the test's premise: the daemon holds the secret"
    assert not _memory_holds(warden, secret), "sandbox B's warden holds sandbox A's secret"
    servers = _file_servers(warden)
    assert servers, "sandbox B has no file worker"
    for p in servers:
        try:
            assert not _memory_holds(p, secret), "sandbox B's file worker holds sandbox A's secret"
        except PermissionError:
            # As the user: a non-dumpable process's mem belongs to host root (its memory is
            # the host user namespace's); root reads it and checks.
            assert not IS_ROOT


def test_warden_is_a_fresh_image(two_sandboxes):
    """The warden runs the conch binary anew (the daemon's execute-only copy of it, in a
    memfd): one thread, and none of the daemon's thread stacks (its threadpool's) mapped."""
    daemon, _, warden = two_sandboxes
    assert os.listdir(f"/proc/{warden}/task") == [str(warden)]
    assert os.readlink(f"/proc/{warden}/exe").startswith("/memfd:conch"), \
        os.readlink(f"/proc/{warden}/exe")
    stacks = []
    dmaps = _maps(daemon.pid)
    for tid in os.listdir(f"/proc/{daemon.pid}/task"):
        if tid == str(daemon.pid):
            continue
        with open(f"/proc/{daemon.pid}/task/{tid}/syscall") as f:
            fields = f.read().split()
        if len(fields) < 3:
            continue  # running: no stack pointer to read
        sp = int(fields[-2], 16)
        stacks += [(s, e) for s, e, _, _ in dmaps if s <= sp < e]
    assert stacks, "the test's premise: the daemon has threadpool threads"
    wmaps = {(s, e) for s, e, _, _ in _maps(warden)}
    assert not [s for s in stacks if s in wmaps], "the warden maps the daemon's thread stacks"


def test_file_workers_are_not_dumpable(two_sandboxes):
    """A file worker reads files a command wrote: it is not dumpable, so nothing of the same uid
    (another worker, a command) may read or trace it: its /proc files belong to the
    namespace's root, or to host root, not to its own uid. (Today's main had this already,
    by way of its oom score's write: kept as a guard.)"""
    _, _, warden = two_sandboxes
    servers = _file_servers(warden)
    assert servers
    for p in servers:
        uid = int(proc_status(p)["Uid"].split()[1])  # effective
        # /proc/<pid> itself always shows the euid; the files in it a non-dumpable owner
        owner = os.stat(f"/proc/{p}/environ").st_uid
        assert owner != uid, f"file worker {p} is dumpable (owner {owner}, euid {uid})"


def test_file_workers_share_no_memory_with_the_warden_or_the_daemon(two_sandboxes):
    """A file worker shares no memory with its warden: not the shepherds' report page, where a
    write would forge a command's start or exit status, nor (a copy of the daemon's) the
    daemon's state database's shared-memory index."""
    daemon, _, warden = two_sandboxes
    servers = _file_servers(warden)
    assert servers
    shared_elsewhere = {(s, e) for pid in (warden, daemon.pid)
                        for s, e, perms, _ in _maps(pid) if perms[3] == "s"}
    for p in servers:
        try:
            maps = _maps(p)
        except PermissionError:
            # A non-dumpable process whose memory belongs to the host's user namespace (the
            # wardens' image is execute-only: see jail_clean_image_prepare) is closed to the
            # user; root checks it.
            assert not IS_ROOT
            pytest.skip("as the user, a non-dumpable file worker's maps cannot be read")
        shared = [(s, e, n) for s, e, perms, n in maps
                  if perms[3] == "s" and (s, e) in shared_elsewhere]
        assert not shared, f"file worker {p} shares memory with its warden: {shared}"


def test_a_binary_replaced_on_disk_does_not_matter(daemon_factory, ws):
    """Wardens are exec'd from the daemon's own binary, opened when it started: one replaced
    on disk since (an upgrade) is not what a sandbox runs."""
    import shutil

    d = daemon_factory(extra_args=["--pool", "0"], start=False)
    copy = os.path.join(d.base, "conch")
    shutil.copy2(CONCH_BIN, copy)
    d.conch_bin = copy
    d.start()
    os.unlink(copy)
    with open(copy, "w") as f:
        f.write("#!/bin/sh\nexit 3\n")
    os.chmod(copy, 0o755)
    rpc = d.client()
    sb = rpc.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    assert rpc.call("exec.run", {"sandbox": sb, "command": "echo ok"})["stdout"] == "ok\n"
    got = rpc.call("fs.read", {"sandbox": sb, "path": "a.txt"}, timeout=30)
    assert "alpha" in str(got)


def _fd_targets(pid):
    """{fd: what it names} in /proc/<pid>/fd ("socket:[INO]", a path, "pipe:[INO]"...).
    anon_inode files (eventfd, signalfd, epoll) all name one shared inode: left out."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if not t.startswith("anon_inode:"):
            out[int(fd)] = t
    return out


def test_a_warden_holds_no_file_of_the_daemons(daemon_factory, ws):
    """A warden's clone shares the daemon's fd table until its first act, a close_range that
    keeps only the fds below three slots (jail/exec-child.c): it must end up with none of the
    daemon's listening socket, clients, state database or other sandboxes' control sockets,
    and the daemon must keep all of its own (a child closing in a shared table would take
    them from it)."""
    d = daemon_factory(extra_args=["--pool", "0"])
    c = d.client()
    first = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    before = _fd_targets(d.pid)
    others = [d.client() for _ in range(3)]  # more of the daemon's fds: client sockets
    for o in others:
        o.call("daemon.ping", {})
    held = set(_fd_targets(d.pid).values()) - {"/dev/null"}
    old_wardens = _wardens(d)
    new = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    assert c.call("exec.run", {"sandbox": new, "command": "echo ok"})["stdout"] == "ok\n"
    (warden,) = _wardens(d) - old_wardens
    assert any(t.startswith("socket:") for t in held), held  # the premise: sockets to leak
    leaked = {fd: t for fd, t in _fd_targets(warden).items() if t in held}
    assert not leaked, f"warden {warden} holds the daemon's files: {leaked}"
    # the daemon kept every fd it had before the clone, and still serves on all of them
    after = _fd_targets(d.pid)
    assert all(after.get(fd) == t for fd, t in before.items()), (before, after)
    for o in others:
        assert o.call("daemon.ping", {})
    assert c.call("exec.run", {"sandbox": first, "command": "echo still"})["stdout"] == "still\n"
