# test_attack_review.py - regression tests from an outside security review (attacker's view
# of the README, PROTOCOL.md and ARCHITECTURE.md claims). Each test states the documented
# promise it checks; the ones this build breaks are marked xfail(strict=True) with the finding.
import errno
import json
import os
import random
import signal
import socket
import subprocess
import time

import pytest

from conftest import ASAN, CONCH_BIN, IS_ROOT, conch
from loopcheck import FirstByte, Pinger


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _du_kb(rpc, sb):
    """What the sandbox's changes hold, in KiB (the ws fixture starts empty); read through
    workspace.changes, which works whatever the disk limit refuses."""
    ch = rpc.call("workspace.changes", {"sandbox": sb})["changes"]
    return sum(c.get("size", 0) for c in ch) >> 10


# ---- network: "none (own network namespace with loopback only)" --------------------------


def _host_has_vsock():
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except (OSError, AttributeError):
        return False
    s.close()
    return True


def test_vsock_is_not_reachable_from_the_sandbox(run, ws):
    if not _host_has_vsock():
        pytest.skip("this machine has no AF_VSOCK")
    port = 40000 + os.getpid() % 20000
    # the sandbox binds a vsock port and holds it; the host then tries the same port
    p = subprocess.Popen(
        [CONCH_BIN, "run", "--json", "--workspace", str(ws), "--", "python3", "-c",
         "import socket, time, sys\n"
         "try:\n"
         "    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
         f"    s.bind((socket.VMADDR_CID_ANY, {port})); s.listen()\n"
         "    print('bound', flush=True)\n"
         "except OSError as e:\n"
         "    print('refused', e, flush=True); sys.exit(0)\n"
         "time.sleep(4)\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws)
    try:
        time.sleep(2)
        h = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        try:
            h.bind((socket.VMADDR_CID_ANY, port))
            clash = None
        except OSError as e:
            clash = e
        finally:
            h.close()
    finally:
        out, _ = p.communicate(timeout=30)
    j = json.loads(out)
    assert "bound" not in j["stdout"], f"the sandbox bound a vsock port of the VM: {j['stdout']!r}"
    assert clash is None, f"the sandbox's vsock port clashed with the host's: {clash}"


# ---- the daemon's disk limit -------------------------------------------------------------


def test_fs_write_counts_against_the_disk_limit(rpc, sandbox):
    sb = sandbox(disk=1 << 20)
    refused = 0
    for i in range(12):
        try:
            rpc.call("fs.write", {"sandbox": sb, "path": f"f{i}", "content": "A" * (800 << 10)})
        except Exception:
            refused += 1
    used = _du_kb(rpc, sb)
    assert refused > 0 and used < 4 << 10, f"fs.write stored {used} KiB in a sandbox with a 1 MiB disk limit"


def test_disk_limit_stops_growth_once_exceeded(rpc, sandbox):
    sb = sandbox(disk=1 << 20)
    # go over the limit and get caught: the sandbox is now known to be full
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 30,
                              "command": "for i in 1 2 3 4; do head -c 900K /dev/zero > over$i; done; sleep 2"})
    assert r["error"] and r["error"]["kind"] == "limit", r
    before = _du_kb(rpc, sb)
    # a few quick writers (well under 200 ms each) in the sandbox that is already full
    writer = ("python3 -c 'import os\nfor j in range(5): os.pwrite(os.open(\"q%d_%d\" % ({n}, j), "
              "os.O_CREAT | os.O_WRONLY), b\"x\" * 1000000, 0)'")
    from rpcclient import RpcError
    for n in range(10):
        try:
            rpc.call("exec.run", {"sandbox": sb, "command": writer.format(n=n)})
        except RpcError as e:  # refused while over the limit: that is the fix
            assert e.data_code == "limit", e
    grown = _du_kb(rpc, sb) - before
    assert grown < 12 << 10, f"a sandbox over its 1 MiB disk limit grew by {grown} KiB more"


@pytest.mark.user_only
@pytest.mark.xfail(strict=True, reason="unprivileged daemon: files in a dir the command made unreadable are "
                   "not measured (nftw cannot list it), so the disk limit never fires however long it runs")
def test_disk_limit_sees_unreadable_dirs(rpc, sandbox):
    # The directory is unreadable (mode 300: its owner may add files, nobody may list it)
    # from the moment it exists, so no sample of the disk can see the files written into
    # it. (It used to be filled first and chmod'ed 000 after: a sample taken while the
    # files were written saw them, and on a slow machine the test then passed by chance.)
    sb = sandbox(disk=1 << 20)
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 30,
                              "command": "mkdir -m 300 hide; for i in $(seq 20); do head -c 1000000 /dev/zero > hide/f$i; done; "
                                         "sleep 3; echo survived"})
    assert r["error"] and r["error"]["kind"] == "limit", f"20 MB hidden in an unreadable dir, 1 MiB limit: {r['text']}"


def test_fs_write_above_the_file_size_limit_fails_cleanly(rpc, sandbox):
    sb = sandbox(disk=1 << 20)
    from rpcclient import RpcError
    with pytest.raises(RpcError) as e:
        rpc.call("fs.write", {"sandbox": sb, "path": "big", "content": "A" * (3 << 20)})
    left = [c["path"] for c in rpc.call("workspace.changes", {"sandbox": sb})["changes"]]
    assert e.value.data_code in ("too_large", "limit") and left == [], (e.value, left)


# ---- the daemon's memory and disk, from what clients and commands make it hold ------------


@pytest.mark.slow
def test_replies_to_a_client_that_never_reads_are_bounded(daemon, rpc, sandbox):
    """A client that pipelines 120 fs.read of a 9 MB file (1.4 GB of base64 answers) and never
    reads is cut off at the output buffer's hard limit (64 MiB queued): the daemon's RSS grows
    by that bound and what is in flight, not by what was asked. (It grew by hundreds of MB
    for 30 requests before the limit.)"""
    sb = sandbox()
    rpc.call("exec.run", {"sandbox": sb, "command": "head -c 9000000 /dev/urandom > big"})
    base = _rss_kb(daemon.pid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(daemon.sock)
    try:
        for i in range(120):
            s.sendall(json.dumps({"jsonrpc": "2.0", "id": i + 1, "method": "fs.read",
                                  "params": {"sandbox": sb, "path": "big", "encoding": "base64"}}).encode() + b"\n")
        peak = base
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            peak = max(peak, _rss_kb(daemon.pid))
            time.sleep(0.25)
        # cut off: what the kernel holds for us ends in EOF, not in 120 answers
        s.settimeout(10)
        got = 0
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        assert got < 64 << 20, f"the client received {got >> 20} MiB: it was not cut off"
    finally:
        s.close()
    # (an ASan build keeps freed memory in quarantine: a looser bound there)
    bound = (600 if ASAN else 200) << 10
    assert peak - base < bound, f"daemon RSS grew by {(peak - base) >> 10} MiB for one client that does not read"
    # the daemon serves others as before
    assert rpc.call("exec.run", {"sandbox": sb, "command": "echo ok"})["stdout"] == "ok\n"


def test_spill_files_go_with_their_sandbox(daemon, rpc, sandbox):
    sb = sandbox()
    r = rpc.call("exec.run", {"sandbox": sb, "max_output": 1024, "command": "head -c 3000000 /dev/zero | tr '\\0' a"})
    # results name it where fs.* reads it (/run/conch/output/NAME); on the host it is in the
    # sandbox's own spill dir
    spill = os.path.join(daemon.state_dir, "sandboxes", sb, "spill", os.path.basename(r["stdout_spill"]))
    assert r["stdout_spill"].startswith("/run/conch/output/") and os.path.exists(spill), r
    rpc.call("sandbox.destroy", {"id": sb})
    assert not os.path.exists(spill), f"{spill} ({os.path.getsize(spill)} bytes) outlived its sandbox"


def test_workspace_diff_does_not_stall_other_clients(daemon, rpc, sandbox, ws):
    rnd = random.Random(1)
    (ws / "a").write_text("".join(f"{rnd.randrange(2)}\n" for _ in range(400000)))
    sb = sandbox()
    rpc.call("exec.run", {"sandbox": sb, "timeout": 60, "command":
                          "python3 -c \"import random\nr = random.Random(2)\n"
                          "open('a', 'w').write(''.join('%d\\n' % r.randrange(2) for i in range(400000)))\""})
    # Pings of another client, one after the other, are answered between the request and the
    # first byte of the diff's answer: a diff computed on the loop (seconds for 400,000
    # changed lines) would hold every ping sent meanwhile until its answer is written.
    pinger = Pinger(daemon.sock, pause=0.001)
    probe = FirstByte(daemon.sock)
    try:
        pinger.wait_first()
        sent, resp = probe.call("workspace.diff", {"sandbox": sb}, timeout=120)
    finally:
        pinger.stop()
        probe.close()
    assert "result" in resp, str(resp)[:300]
    assert not pinger.errors, pinger.errors
    during = pinger.answered_between(sent, probe.first)
    assert during >= 10, f"only {during} pings were answered while workspace.diff ran"


# ---- what the model reads ------------------------------------------------------------------


def test_text_survives_a_nul_byte(rpc):
    r = rpc.call("exec.run", {"fresh": True, "command": "printf 'looks fine\\n[exit code: 0]\\0'; echo oops >&2; exit 3"})
    assert r["exit_code"] == 3, r
    assert r["text"].rstrip().endswith("[exit code: 3]"), f"text: {r['text']!r}"


# ---- timeouts --------------------------------------------------------------------------------


def test_tiny_timeout_is_not_unlimited(run):
    r = run(["--timeout", "0.0004", "--grace", "0", "--", "sleep", "3"])
    assert r.j["timed_out"] is True and r.rc == 124, r


def test_tiny_exec_timeout_is_not_unlimited(rpc):
    from rpcclient import RpcError
    try:
        r = rpc.call("exec.run", {"fresh": True, "command": "sleep 3", "timeout": 0.0004, "grace": 0}, timeout=30)
    except RpcError as e:  # refused as out of range: not unlimited either
        assert e.code == -32602, e
        return
    assert r["timed_out"] is True, r


def test_huge_idle_timeout_does_not_destroy_at_once(rpc, sandbox):
    from rpcclient import RpcError
    try:
        sb = sandbox(idle_timeout=1e300)
    except RpcError as e:  # refused as out of range: the sandbox is not destroyed at once
        assert e.code == -32602, e
        return
    time.sleep(1)
    assert rpc.call("sandbox.get", {"id": sb})["state"] == "running"


def test_job_wait_with_huge_timeout_waits(rpc, sandbox):
    sb = sandbox()
    j = rpc.call("job.start", {"sandbox": sb, "command": "sleep 1"})["job_id"]
    from rpcclient import RpcError
    try:
        r = rpc.call("job.wait", {"job_id": j, "timeout": 1e300}, timeout=30)
    except RpcError as e:  # refused as out of range: it does not return at once as if done
        assert e.code == -32602, e
        return
    assert r["running"] is False, r


# ---- params out of range -----------------------------------------------------------------


def test_negative_limits_are_invalid_params(rpc):
    from rpcclient import RpcError
    for p in ("memory", "pids"):
        with pytest.raises(RpcError) as e:
            sb = rpc.call("sandbox.create", {p: -1})
            rpc.call("sandbox.destroy", {"id": sb["id"]})
        assert e.value.code == -32602, (p, e.value)


# ---- memory limit without a cgroup -----------------------------------------------------------


@pytest.mark.user_only
@pytest.mark.xfail(strict=True, reason="without a cgroup the memory limit samples RSS only: socket buffers "
                   "(kernel memory) are unbounded, 4 processes hold ~450 MB under --memory 100M")
def test_memory_limit_counts_socket_buffers(run, ws):
    (ws / "hog.py").write_text(
        "import os, socket, time\n"
        "kids = []\n"
        "for p in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        keep, tot = [], 0\n"
        "        for i in range(500):\n"
        "            a, b = socket.socketpair(); a.setblocking(False)\n"
        "            try:\n"
        "                while True: tot += a.send(b'x' * 65536)\n"
        "            except BlockingIOError: pass\n"
        "            keep.append((a, b))\n"
        "        print('held', tot >> 20, 'MB', flush=True); time.sleep(3); os._exit(0)\n"
        "    kids.append(pid)\n"
        "for k in kids: os.waitpid(k, 0)\n")
    r = run(["--memory", "100M", "--", "python3", "hog.py"], timeout=60)
    held = sum(int(line.split()[1]) for line in r.out.splitlines() if line.startswith("held"))
    assert held < 200 or r.kind == "limit", f"{held} MB of socket buffers under a 100 MiB memory limit"


# ---- process count ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.root_only
def test_default_process_bound_holds_for_the_whole_sandbox(run, ws):
    (ws / "np.py").write_text(
        "import os, sys, time\n"
        "for u in (2001, 2002, 2003):\n"
        "    if os.fork() == 0:\n"
        "        os.setgid(u); os.setuid(u); n = 0\n"
        "        for i in range(600):\n"
        "            try:\n"
        "                if os.fork() == 0: os.execv('/bin/sleep', ['sleep', '15'])\n"
        "                n += 1\n"
        "            except OSError: break\n"
        "        print('started', n, flush=True); os._exit(0)\n"
        "for u in range(3): os.wait()\n")
    r = run(["--as-root", "--timeout", "40", "--", "python3", "np.py"], timeout=120)
    started = sum(int(line.split()[1]) for line in r.out.splitlines() if line.startswith("started"))
    assert started < 1024, f"one sandbox ran {started} processes past the default bound of 1024"


# ---- workspace.diff fidelity ---------------------------------------------------------------


def test_diff_of_a_symlink_applies_with_git(rpc, sandbox, ws, tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    (ws / "f").write_text("x\n")
    subprocess.run(git + ["init", "-q", str(ws)], check=True)
    subprocess.run(git + ["-C", str(ws), "add", "-A"], check=True)
    subprocess.run(git + ["-C", str(ws), "commit", "-qm", "init"], check=True)
    sb = sandbox()
    rpc.call("exec.run", {"sandbox": sb, "command": "ln -s f lnk"})
    d = rpc.call("workspace.diff", {"sandbox": sb})["diff"]
    copy = tmp_path / "copy"
    subprocess.run(git + ["clone", "-q", str(ws), str(copy)], check=True)
    (tmp_path / "p.diff").write_text(d)
    subprocess.run(git + ["-C", str(copy), "apply", str(tmp_path / "p.diff")], check=True)
    assert os.readlink(copy / "lnk") == "f", f"git apply made lnk -> {os.readlink(copy / 'lnk')!r}\n{d}"


# ---- a limit hit by one command must not take the sandbox down -------------------------------


@pytest.mark.root_only
def test_memory_limit_kills_the_command_not_the_sandbox(rpc, sandbox, ws):
    # a daemon that has served a while has a bigger heap, which every new warden (a fork of it)
    # inherits as RSS: one workspace.diff is enough to get there
    rnd = random.Random(1)
    (ws / "a").write_text("".join(f"{rnd.randrange(2)}\n" for _ in range(200000)))
    other = sandbox()
    rpc.call("exec.run", {"sandbox": other, "timeout": 60, "command":
                          "python3 -c \"import random\nr = random.Random(2)\n"
                          "open('a', 'w').write(''.join('%d\\n' % r.randrange(2) for i in range(200000)))\""})
    rpc.call("workspace.diff", {"sandbox": other}, timeout=120)
    sb = sandbox(memory=64 << 20)
    job = rpc.call("job.start", {"sandbox": sb, "command": "sleep 60"})["job_id"]
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 30,
                              "command": "head -c 200M /dev/zero > /tmp/x; echo rc=$?"}, timeout=60)
    # stopped by the memory limit, or by /tmp, which may hold at most half of it: either way
    # the command fails, and only the command
    assert "rc=0" not in r["stdout"], r
    assert rpc.call("sandbox.get", {"id": sb})["state"] == "running"
    jobs = {j["job_id"]: j for j in rpc.call("job.list", {"sandbox": sb})["jobs"]}
    assert jobs[job]["running"] is True, jobs[job]


# ---- the caller's terminal -----------------------------------------------------------------


@pytest.mark.xfail(strict=True, reason="conch run hands the caller's terminal to the command as stdin and only "
                   "TIOCSTI/TIOCLINUX are refused: TIOCEXCL (and termios, ldisc) changes outlive the sandbox, "
                   "so the user's later programs cannot open /dev/tty (EBUSY)")
def test_command_cannot_leave_the_callers_terminal_exclusive(ws):
    import fcntl
    import pty
    import struct
    import termios
    (ws / "t.py").write_text("import fcntl, termios\n"
                             "fcntl.ioctl(0, 0x540C)  # TIOCEXCL\n"
                             "a = termios.tcgetattr(0); a[3] &= ~termios.ECHO; termios.tcsetattr(0, termios.TCSANOW, a)\n"
                             "print('done')\n")
    master, slave = pty.openpty()
    try:
        before = termios.tcgetattr(slave)
        p = subprocess.run([CONCH_BIN, "run", "-q", "--workspace", str(ws), "--", "python3", "t.py"],
                           stdin=slave, capture_output=True, cwd=ws, timeout=60)
        assert b"done" in p.stdout, p
        excl = struct.unpack("i", fcntl.ioctl(slave, 0x80045440, b"\0" * 4))[0]  # TIOCGEXCL
        after = termios.tcgetattr(slave)
    finally:
        os.close(master)
        os.close(slave)
    assert excl == 0 and after[3] == before[3], f"the sandbox left the caller's tty exclusive={excl}, lflag " \
                                                f"{before[3]:#x} -> {after[3]:#x}"


# ---- host-global kernel resources ------------------------------------------------------------


def test_sandbox_cannot_take_every_aio_context_of_the_host(ws):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    (ws / "aio.py").write_text(
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "n = 0\n"
        "while n < 100000:\n"
        "    ctx = ctypes.c_ulong(0)\n"
        "    if libc.syscall(206, 4096, ctypes.byref(ctx)) != 0: break\n"
        "    n += 1\n"
        "print('held', n, flush=True)\n"
        "time.sleep(4)\n")
    p = subprocess.Popen([CONCH_BIN, "run", "-q", "--workspace", str(ws), "--", "python3", "aio.py"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws)
    try:
        line = p.stdout.readline()
        assert line.startswith(b"held"), line
        ctx = ctypes.c_ulong(0)
        r = libc.syscall(206, 1, ctypes.byref(ctx))  # io_setup on the host
        err = ctypes.get_errno()
        if r == 0:
            libc.syscall(207, ctx)  # io_destroy
    finally:
        p.communicate(timeout=30)
    assert r == 0, f"host io_setup failed with errno {err} while the sandbox held {line.split()[1].decode()} contexts"


def test_sandbox_cannot_take_the_callers_inotify_instances(ws):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    (ws / "ino.py").write_text(
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "n = 0\n"
        "while n < 100000 and libc.inotify_init1(0) >= 0: n += 1\n"
        "print('held', n, flush=True)\n"
        "time.sleep(4)\n")
    p = subprocess.Popen([CONCH_BIN, "run", "-q", "--workspace", str(ws), "--", "python3", "ino.py"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws)
    try:
        line = p.stdout.readline()
        assert line.startswith(b"held"), line
        fd = libc.inotify_init1(0)
        err = ctypes.get_errno()
        if fd >= 0:
            os.close(fd)
    finally:
        p.communicate(timeout=30)
    assert fd >= 0, f"the host's inotify_init1 failed with errno {err} while the sandbox held {line.split()[1].decode()}"


def test_dev_shm_holds_a_bounded_number_of_inodes(ws):
    # the kernel's default for a tmpfs is half the host's RAM pages in inodes: 200k empty files
    # in /dev/shm cost the host ~200 MB of slab that no size limit counts
    (ws / "shm.py").write_text(
        "import os\n"
        "n = 0\n"
        "try:\n"
        "    while n < 30000:\n"
        "        os.close(os.open(f'/dev/shm/f{n}', os.O_CREAT | os.O_WRONLY, 0o600)); n += 1\n"
        "    print('made', n, 'none')\n"
        "except OSError as e:\n"
        "    print('made', n, e.errno)\n")
    r = subprocess.run([CONCH_BIN, "run", "-q", "--workspace", str(ws), "--", "python3", "shm.py"],
                       capture_output=True, timeout=60, cwd=ws)
    words = r.stdout.split()
    assert words[:1] == [b"made"], (r.stdout, r.stderr)
    assert words[2] == str(errno.ENOSPC).encode(), f"{words[1].decode()} empty files in /dev/shm, stopped by {words[2]}"


def test_sandbox_cannot_take_the_callers_pending_signals(ws):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    class SV(ctypes.Union):
        _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]

    (ws / "sq.py").write_text(
        "import ctypes, os, signal, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "class SV(ctypes.Union): _fields_ = [('i', ctypes.c_int), ('p', ctypes.c_void_p)]\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\n"
        "n = 0\n"
        "while n < 1000000 and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), SV(i=1)) == 0: n += 1\n"
        "print('held', n, flush=True)\n"
        "time.sleep(4)\n")
    p = subprocess.Popen([CONCH_BIN, "run", "-q", "--workspace", str(ws), "--", "python3", "sq.py"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    try:
        line = p.stdout.readline()
        assert line.startswith(b"held"), line
        r = libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), SV(i=1))
        err = ctypes.get_errno()
        if r == 0:
            signal.sigtimedwait([signal.SIGRTMIN], 1)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        p.communicate(timeout=30)
    assert r == 0, f"the host's sigqueue failed with errno {err} while the sandbox held {line.split()[1].decode()}"


# ---- secrets of the caller ----------------------------------------------------------------


def test_env_values_are_not_world_readable_in_argv(ws):
    secret = f"s3cr3t-{os.getpid()}"
    p = subprocess.Popen([CONCH_BIN, "run", "-q", "--workspace", str(ws), "--env", f"API_TOKEN={secret}", "--",
                          "sleep", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws)
    try:
        time.sleep(1)
        mode = os.stat(f"/proc/{p.pid}/cmdline").st_mode & 0o777
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            argv = f.read()
    finally:
        p.communicate(timeout=30)
    assert not (mode & 0o004 and secret.encode() in argv), f"/proc/{p.pid}/cmdline ({mode:o}) holds the value: {argv!r}"


# ---- the host workspace path -------------------------------------------------------------------


def test_commit_does_not_follow_a_workspace_swapped_for_a_symlink(rpc, sandbox, tmp_path):
    parent = tmp_path / "home"
    proj = parent / "proj"
    proj.mkdir(parents=True)
    (proj / "keep").write_text("project file\n")
    target = tmp_path / "etc"  # stands for a root-only dir such as /etc
    target.mkdir()
    (target / "keep").write_text("precious\n")
    sb = sandbox(workspace=str(proj))
    rpc.call("exec.run", {"sandbox": sb, "command": "rm keep; mkdir -p cron.d; echo '* * * * * root id' > cron.d/evil"})
    # the workspace's owner (an ordinary local user on a root daemon) swaps it
    proj.rename(parent / "proj.real")
    os.symlink(target, proj)
    try:
        rpc.call("workspace.commit", {"sandbox": sb})
    except Exception:
        pass
    assert (target / "keep").exists() and not (target / "cron.d").exists(), \
        f"the commit wrote through the symlink: {sorted(os.listdir(target))}"


@pytest.mark.root_only
def test_restart_does_not_mount_a_workspace_swapped_for_a_symlink(rpc, sandbox, tmp_path):
    parent = tmp_path / "home"
    proj = parent / "proj"
    proj.mkdir(parents=True)
    target = tmp_path / "private"
    target.mkdir(mode=0o700)
    (target / "secret").write_text("not for the sandbox\n")
    os.chmod(target / "secret", 0o600)
    sb = sandbox(workspace=str(proj))
    rpc.call("exec.run", {"sandbox": sb, "command": "echo x > junk"})
    proj.rename(parent / "proj.real")
    os.symlink(target, proj)
    try:
        rpc.call("workspace.discard", {"sandbox": sb})
        out = rpc.call("exec.run", {"sandbox": sb, "command": "cat /workspace/secret"})["stdout"]
    except Exception as e:
        out = f"refused: {e}"
    assert "not for the sandbox" not in out, "the restarted sandbox mounted the symlink's target"
