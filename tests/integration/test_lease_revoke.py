# test_lease_revoke.py - what is lent is revoked. `conch run` borrowing from the daemon's pool
# (sandbox.lease) gets a channel to the sandbox's warden; at sandbox.release the sandbox is
# made as new and lent again. A borrower that keeps its copy of the channel past the loan (a
# malicious client speaking the lease protocol itself, with SCM_RIGHTS) must reach nothing of
# the next user's: it reads EOF, and what it sends (a command, a shutdown) is lost, while the
# next borrower and the daemon's own `fresh` commands run as if it were not there. Before the
# fix the borrower got a copy of the warden's control socket itself, kept across recycles:
# it ran commands in the next user's workspace, read their STARTED/EXITED (their exec.run
# waited for ever) and could make the warden kill everything.
import json
import os
import re
import select
import socket
import struct
import subprocess
import threading
import time

from conftest import CONCH_BIN, unique_marker
from test_fresh_reuse import settled
from test_run_lease import ancestry, wait_named

# The warden protocol (src/jail/jail-internal.h), as a client that speaks it by hand would.
MSG_SIZE = 720  # sizeof(struct jail_msg): 56 bytes of header, struct rusage, struct conch_err
JMSG_RUN, JMSG_STARTED, JMSG_EXITED, JMSG_SIGNAL, JMSG_SHUTDOWN, JMSG_RECYCLE = 3, 4, 6, 7, 8, 11


def msg(proto, mtype, id=0, a=0, b=0, timeout_ms=0, grace_ms=0):
    head = struct.pack("<IIiIqQQQQ", proto, mtype, a, b, id, timeout_ms, grace_ms, 0, 0)
    return head + bytes(MSG_SIZE - len(head))


def blob(argv, env=("PATH=/usr/bin:/bin",), cwd="/workspace"):
    """The command blob (struct jail_cmd_blob, then argv, env and cwd NUL-separated), in a
    memfd."""
    strings = b"".join(s.encode() + b"\0" for s in (*argv, *env, cwd))
    size = 280 + len(strings)
    data = struct.pack("<IIIIIi", len(argv), len(env), size, 0, 0o022, 0) + bytes(256) + strings
    fd = os.memfd_create("cmd")
    os.write(fd, data)
    return fd


class Borrower:
    """A client that borrows a pool sandbox by speaking sandbox.lease itself and keeps the
    channel it is lent (self.chan) for as long as it likes."""

    def __init__(self, d, ws, proto=None):
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(d.sock)
        self.conn.settimeout(30)
        st = os.stat(ws)
        params = {"workspace": str(ws), "ws_dev": st.st_dev, "ws_ino": st.st_ino}
        if proto is not None:
            params["proto"] = proto
        self.answer, fds = self._call("sandbox.lease", params)
        self.chan = socket.socket(fileno=fds[0]) if fds else None
        for fd in fds[1:]:
            os.close(fd)

    def _call(self, method, params=None):
        req = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            req["params"] = params
        self.conn.sendall((json.dumps(req) + "\n").encode())
        buf, fds = b"", []
        while b"\n" not in buf:
            data, got, _, _ = socket.recv_fds(self.conn, 4096, 1)
            assert data, f"the daemon closed the connection answering {method}"
            buf += data
            fds += got
        return json.loads(buf.split(b"\n")[0]), fds

    @property
    def warden(self):
        return self.answer["result"]["warden_pid"]

    def release(self):
        ans, _ = self._call("sandbox.release")
        assert ans.get("result") == {"released": 1}, ans

    def close(self):
        if self.chan:
            self.chan.close()
        self.conn.close()


def proto_of(d, ws):
    """The daemon's warden protocol version, from its refusal of another."""
    b = Borrower(d, ws, proto=1)
    try:
        m = re.search(r"protocol (0x[0-9a-f]+)", b.answer["error"]["message"])
        assert m, b.answer
        return int(m.group(1), 16)
    finally:
        b.close()


def lend_and_keep(d, ws):
    """Borrow the pool's one sandbox, give it back, and keep the channel: (the borrower, the
    warden's pid, the protocol version). Returns once the sandbox is in the pool again."""
    proto = proto_of(d, ws)
    before = settled(d, 1)
    old = Borrower(d, ws)
    assert old.chan is not None, old.answer
    assert [old.warden] == before, (old.answer, before)
    old.release()
    assert settled(d, 1) == before, "the sandbox was not made as new for the pool"
    return old, old.warden, proto


def try_send(sock, data, fds=()):
    """Send on a kept channel; False when the kernel refuses (the warden closed its end)."""
    try:
        socket.send_fds(sock, [data], list(fds))
        return True
    except OSError:
        return False


def run_on(chan, proto, id, argv, timeout_ms=20000):
    """Send a RUN of @argv on @chan with a pipe for its output; (sent, the pipe's read end)."""
    r, w = os.pipe()
    devnull = os.open("/dev/null", os.O_RDONLY)
    b = blob(argv)
    try:
        sent = try_send(chan, msg(proto, JMSG_RUN, id=id, timeout_ms=timeout_ms), (devnull, w, w, b))
    finally:
        for fd in (devnull, w, b):
            os.close(fd)
    return sent, r


def read_all(fd, timeout=20):
    """What comes on pipe @fd until every writer has closed it (or @timeout)."""
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([fd], [], [], deadline - time.monotonic())[0]:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    return out


def events(chan, until_exit_of, timeout=20):
    """Read warden events from @chan until the EXITED of id @until_exit_of: [(type, id, a)]."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        chan.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = chan.recv(MSG_SIZE)
        except socket.timeout:
            break
        if not data:
            break
        _, mtype, a, _, id = struct.unpack_from("<IIiIq", data)
        seen.append((mtype, id, a))
        if mtype == JMSG_EXITED and id == until_exit_of:
            break
    return seen


def test_a_kept_channel_reads_eof_and_runs_nothing_in_the_next_users_sandbox(
        daemon_factory, ws, tmp_path):
    """(a) After the release, the old borrower's channel is closed by the warden: it reads EOF.
    The next borrower gets the same (recycled) sandbox with its own workspace; a RUN the old
    one sends there to read that workspace reaches nothing, and the next borrower's own
    command runs and reports to it as usual."""
    d = daemon_factory(extra_args=["--pool", "1"])
    old, warden, proto = lend_and_keep(d, ws)
    try:
        ws2 = tmp_path / "next"
        ws2.mkdir()
        (ws2 / "secret.txt").write_text("the next user's secret\n")
        nxt = Borrower(d, ws2)
        try:
            assert nxt.chan is not None and nxt.warden == warden, nxt.answer
            sent, out = run_on(old.chan, proto, 77, ["cat", "/workspace/secret.txt"])
            stolen = read_all(out)
            assert b"secret" not in stolen, "the old borrower read the next user's workspace"
            assert not sent, "the old borrower's channel still took a command"
            old.chan.settimeout(15)
            try:
                got = old.chan.recv(MSG_SIZE)
            except socket.timeout:
                got = None
            assert got == b"", f"the lent channel outlived the loan (recv: {got!r})"
            # the next borrower drives its sandbox as ever
            sent, out = run_on(nxt.chan, proto, 1, ["cat", "/workspace/secret.txt"])
            assert sent
            assert read_all(out) == b"the next user's secret\n"
            ev = events(nxt.chan, 1)
            assert (JMSG_EXITED, 1, 0) in ev, ev
            assert any(t == JMSG_STARTED and i == 1 for t, i, _ in ev), ev
            nxt.release()
        finally:
            nxt.close()
        assert settled(d, 1) == [warden]
    finally:
        old.close()


def test_a_kept_channel_steals_no_events_from_the_next_users(daemon_factory, ws):
    """(b) An old borrower reading its kept channel all along takes no STARTED/EXITED of the
    daemon's own `fresh` commands nor of the next `conch run` in the same recycled sandbox:
    both complete normally."""
    d = daemon_factory(extra_args=["--pool", "1"])
    old, warden, proto = lend_and_keep(d, ws)
    stolen = []

    def steal():
        old.chan.settimeout(60)
        try:
            while True:
                data = old.chan.recv(MSG_SIZE)
                if not data:
                    return
                stolen.append(data)
        except OSError:
            return

    t = threading.Thread(target=steal)
    t.start()
    try:
        c = d.client()
        for i in range(3):
            res = c.call("exec.run", {"fresh": True, "command": f"echo fresh-{i}"}, timeout=30)
            assert res["exit_code"] == 0 and res["stdout"] == f"fresh-{i}\n", res
            assert settled(d, 1) == [warden], "the fresh command did not use the recycled sandbox"
        marker = unique_marker("revoke")
        p = subprocess.run([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws), "-q",
                            "--", "bash", "-c", f"(exec -a {marker} true); echo borrowed"],
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL, cwd=ws)
        assert p.returncode == 0 and p.stdout == b"borrowed\n", p
        assert settled(d, 1) == [warden]
    finally:
        try:
            old.chan.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        t.join(60)
        old.close()
    assert not stolen, f"the old borrower read {len(stolen)} events of the next users"


def test_a_kept_channel_cannot_kill_the_next_borrowers_command(daemon_factory, ws, tmp_path):
    """(c) While the next `conch run` borrows the recycled sandbox, the old borrower sends on
    its kept channel what would end everything (SHUTDOWN, RECYCLE, SIGKILL to every early
    id): the next command runs on and ends as it would have."""
    d = daemon_factory(extra_args=["--pool", "1"])
    old, warden, proto = lend_and_keep(d, ws)
    ws2 = tmp_path / "next"
    ws2.mkdir()
    marker = unique_marker("victim")
    p = subprocess.Popen([CONCH_BIN, "run", "--socket", d.sock, "--workspace", str(ws2), "-q",
                          "--", "bash", "-c", f"(exec -a {marker} sleep 600) & read l; "
                          "echo got:$l; kill %1"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=ws2, start_new_session=True)
    try:
        pids = wait_named(marker)
        assert pids, "the next borrower's command did not start"
        assert warden in ancestry(pids[0]), "the next conch run did not borrow the sandbox"
        for id in range(0, 8):
            try_send(old.chan, msg(proto, JMSG_SIGNAL, id=id, a=9))
        try_send(old.chan, msg(proto, JMSG_RECYCLE))
        # A warden that took these has done them once it ran a command sent after them: wait
        # for that one's output (none comes, at once, from a channel that is closed).
        sent, sync = run_on(old.chan, proto, 99, ["echo", "sync"])
        synced = read_all(sync)
        try_send(old.chan, msg(proto, JMSG_SHUTDOWN))
        out, err = p.communicate(b"hello\n", timeout=60)
        assert p.returncode == 0 and out == b"got:hello\n", (p.returncode, out, err)
        assert not sent and not synced, "the old borrower's channel still took commands"
        assert os.path.exists(f"/proc/{warden}")
        assert settled(d, 1) == [warden]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        old.close()


def test_a_borrower_that_never_reads_loses_its_lease(daemon_factory, ws):
    """(d) A borrower that sends commands and never reads their events must not stall the
    sandbox's shepherds or warden (sends on a lease channel never block): once its channel is
    full it loses the lease: the channel is closed (it reads what was queued, then EOF) and
    its commands are killed; the daemon recycles the sandbox at release as ever. Before the
    fix the shepherds blocked sending on the full channel, holding their slots, and the
    lease's commands ran on."""
    d = daemon_factory(extra_args=["--pool", "1"])
    proto = proto_of(d, ws)
    before = settled(d, 1)
    b = Borrower(d, ws)
    try:
        assert b.chan is not None, b.answer
        marker = unique_marker("unread")
        sent, out = run_on(b.chan, proto, 1, ["bash", "-c", f"exec -a {marker} sleep 600"],
                           timeout_ms=600000)
        os.close(out)
        assert sent
        pids = wait_named(marker)
        assert pids, "the borrowed command did not start"
        # Commands, each answered with events that are never read, until the channel is full
        # and the warden lets go of it (our sends fail then).
        b.chan.settimeout(5)
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline:
            sent, out = run_on(b.chan, proto, 100 + n, ["true"])
            os.close(out)
            if not sent:
                break
            n += 1
        # Its command is killed.
        gone = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < gone:
            time.sleep(0.1)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        assert not alive, f"the lease's command ran on after {n} unread commands"
        # Its channel is closed: what was queued, then EOF.
        b.chan.settimeout(30)
        got = None
        for _ in range(100000):
            got = b.chan.recv(MSG_SIZE)
            if not got:
                break
        assert got == b"", "the channel of a borrower that does not read stayed open"
        b.release()
    finally:
        b.close()
    # The sandbox is made as new for the next user, and serves it.
    assert settled(d, 1) == before
    c = d.client()
    res = c.call("exec.run", {"fresh": True, "command": "echo next"}, timeout=30)
    assert res["exit_code"] == 0 and res["stdout"] == "next\n", res
