# test_fresh_reuse.py - `exec.run {fresh: true}` hands back the pool's sandbox, made as new by
# its warden, instead of destroying it (issue 6's speed goal for fresh sandboxes). A fresh
# sandbox must still be as new as a brand-new one: each test leaves everything a command can
# leave behind (files in every writable place, SysV IPC, a process, sockets, ptys), then looks
# for it from the next fresh command, which runs in the same recycled sandbox (same warden).
# Runs as root and as the unprivileged user (tests/integration/as_user.sh).
import time

from conftest import descendants, proc_cmdline, proc_stat, unique_marker
from rpcclient import wait_gone


def wardens(daemon):
    """Host pids of the daemon's wardens (its direct children)."""
    return sorted(p for p in descendants(daemon.pid)
                  if (proc_stat(p) or ("", 0))[1] == daemon.pid
                  and proc_cmdline(p).startswith(b"conch-warden"))


def settled(daemon, n, timeout=60.0):
    """Wait until the pool holds @n wardens again, each ready to be taken (built, or made as
    new: daemon.ping's pool_ready); return them."""
    deadline = time.monotonic() + timeout
    c = daemon.client()
    try:
        while True:
            w = wardens(daemon)
            if (len(w) == n and c.call("daemon.ping", {})["pool_ready"] == n) \
                    or time.monotonic() > deadline:
                return w
            time.sleep(0.05)
    finally:
        c.close()


LEAVE = r"""
set -e
echo secret > /tmp/left; echo secret > /home/agent/left; echo secret > /dev/shm/left
echo secret > /workspace/left; echo secret > /tmp/large_tool_results/left
python3 - <<'PY'
import ctypes, socket, os
libc = ctypes.CDLL(None, use_errno=True)
# SysV shared memory, a semaphore set and a message queue, keyed: they outlive processes
assert libc.shmget(0x5eed, 4096, 0o1666) >= 0
assert libc.semget(0x5eed, 1, 0o1666) >= 0
assert libc.msgget(0x5eed, 0o1666) >= 0
PY
# a process that would outlive the command, holding an abstract socket and a TCP port
(exec -a MARKER python3 -c '
import socket, time
a = socket.socket(socket.AF_UNIX); a.bind("\0conch-left"); a.listen()
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", 47123)); t.listen()
time.sleep(300)' &)
sleep 0.3
echo left
"""

LOOK = r"""
found=""
for f in /tmp/left /home/agent/left /dev/shm/left /workspace/left /tmp/large_tool_results/left; do
    [ -e "$f" ] && found="$found $f"
done
for d in /tmp /home/agent /dev/shm /workspace /dev/pts; do printf '%s=%s ' $d "$(ls -A $d | tr '\n' ,)"; done; echo
python3 - <<'PY'
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
for name, r in (("shm", libc.shmget(0x5eed, 0, 0)), ("sem", libc.semget(0x5eed, 0, 0)),
                ("msg", libc.msgget(0x5eed, 0))):
    if r >= 0:
        print("ipc-left", name)
a = socket.socket(socket.AF_UNIX)
try:
    a.connect("\0conch-left"); print("abstract-left")
except OSError:
    pass
t = socket.socket()
try:
    t.connect(("127.0.0.1", 47123)); print("tcp-left")
except OSError:
    pass
PY
ps -eo args | grep MARKER | grep -v grep || true
echo "files:$found"
hostname
"""


def test_fresh_sandbox_is_recycled_and_as_new(daemon_factory):
    daemon = daemon_factory(extra_args=["--pool", "1"])
    rpc = daemon.client()
    marker = unique_marker("left")
    before = settled(daemon, 1)
    assert len(before) == 1, before
    r = rpc.call("exec.run", {"fresh": True, "command": LEAVE.replace("MARKER", marker)},
                 timeout=60)
    assert r["exit_code"] == 0 and r["stdout"] == "left\n", r
    # the command's leftover process is gone with it, on the host too
    assert wait_gone(marker) == []
    assert settled(daemon, 1) == before, "the pool's sandbox was not recycled"
    time.sleep(0.2)  # the warden's answer to the recycle
    r = rpc.call("exec.run", {"fresh": True, "command": LOOK.replace("MARKER", marker)},
                 timeout=60)
    assert r["exit_code"] == 0, r
    out = r["stdout"]
    assert settled(daemon, 1) == before, "the second command did not run in the recycled sandbox"
    assert "files:\n" in out, out
    for leftover in ("ipc-left", "abstract-left", "tcp-left", marker, "secret"):
        assert leftover not in out, out
    # new, empty writable mounts: only what a new sandbox has
    assert out.splitlines()[0].split() == [
        "/tmp=conversation_history,large_tool_results,", "/home/agent=", "/dev/shm=",
        "/workspace=", "/dev/pts=ptmx,"], out
    assert out.rstrip().endswith("conch"), out


def test_recycled_sandbox_has_a_new_id_and_other_uses_are_not_recycled(daemon_factory, ws):
    """A fresh sandbox's id stops working once its command is answered (it is back in the
    pool under another id), and a fresh sandbox with a workspace is destroyed, not reused."""
    daemon = daemon_factory(extra_args=["--pool", "1"])
    rpc = daemon.client()
    before = settled(daemon, 1)
    r = rpc.call("exec.run", {"fresh": True, "command": "true"}, timeout=60)
    assert r["exit_code"] == 0, r
    ids = [s["id"] for s in rpc.call("sandbox.list")["sandboxes"]]
    assert ids == [], ids
    assert settled(daemon, 1) == before
    # with a workspace: a sandbox of its own, built and destroyed, the pool untouched
    r = rpc.call("exec.run", {"fresh": True, "workspace": str(ws), "command": "touch made"},
                 timeout=60)
    assert r["exit_code"] == 0, r
    assert [c["path"] for c in r["changes"]] == ["made"], r
    assert settled(daemon, 1) == before
    assert not (ws / "made").exists()


def test_many_fresh_commands_back_to_back_stay_correct(daemon_factory):
    """100 fresh commands in a row through a pool of 2: every answer is the command's own,
    each starts in an empty /tmp, and the pool ends with its two wardens."""
    daemon = daemon_factory(extra_args=["--pool", "2"])
    rpc = daemon.client()
    settled(daemon, 2)
    for i in range(100):
        r = rpc.call("exec.run", {"fresh": True,
                                  "command": f"ls -A /tmp | tr '\\n' ' '; echo {i} > /tmp/n; cat /tmp/n"},
                     timeout=60)
        assert r["exit_code"] == 0, r
        assert r["stdout"] == f"conversation_history large_tool_results {i}\n", (i, r)
    assert len(settled(daemon, 2)) == 2

