# test_escape.py - every fence of the sandbox, attacked from inside: each test tries to get
# out (read a host file, reach a host socket, gain a privilege, call a blocked syscall...)
# and asserts it fails, for the specific reason (errno) where one can be named.
import errno
import os
import socket
import subprocess
import threading
import time
from textwrap import dedent

import pytest

from conftest import CONCH_BIN, conch, proc_argv, proc_comm, proc_status, unique_marker

EPERM = errno.EPERM
BOTH_MODES = pytest.mark.parametrize("opts", [[], ["--as-root"]], ids=["agent", "as-root"])

# Python prelude used inside the sandbox: try(fn) -> 0 on success, errno on OSError.
PRELUDE = dedent(
    """
    import ctypes, errno, json, os, socket, stat, sys
    def tr(fn):
        try:
            fn()
            return 0
        except OSError as e:
            return e.errno
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def arg(a):
        if isinstance(a, bytes):
            return ctypes.c_char_p(a)
        if isinstance(a, ctypes._SimpleCData):
            return a
        return ctypes.c_long(a)
    def sc(nr, *args):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
        return [r, ctypes.get_errno() if r == -1 else 0]
    def write(path, data="x", mode="w"):
        with open(path, mode) as f:
            f.write(data)
    """
)


def inside(py, code, *opts, **kw):
    r = py(PRELUDE + dedent(code), *opts, **kw)
    assert r.val is not None, f"inside script printed no JSON\n{r.describe()}"
    return r.val


# ---- host files ------------------------------------------------------------------------


def test_host_file_outside_workspace_unreadable(tmp_path, sh):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    token = "S3CRET-" + unique_marker("secret")
    secret.write_text(token + "\n")
    r = sh(f"cat {secret}; echo rc=$?; ls {outside}; echo rc2=$?")
    assert r.j["error"] is None or r.kind == "command", r.describe()
    assert token not in r.out and token not in r.err
    assert "rc=1" in r.out, r.describe()
    assert "No such file or directory" in r.err or "Permission denied" in r.err, r.describe()
    assert "secret.txt" not in r.out


def test_repo_and_host_home_not_visible(py):
    val = inside(
        py,
        f"""
        res = {{}}
        res["repo"] = tr(lambda: open({str(os.path.abspath(__file__))!r}).read())
        try:
            res["root_entries"] = os.listdir("/root")
        except OSError as e:
            res["root_entries"] = e.errno
        try:
            res["home"] = sorted(os.listdir("/home"))
        except OSError as e:
            res["home"] = e.errno
        print(json.dumps(res))
        """,
    )
    assert val["repo"] in (errno.ENOENT, errno.EACCES), val
    # /root is either absent/unreadable or an empty placeholder: never the host's.
    assert val["root_entries"] in (errno.ENOENT, errno.EACCES, []), val
    assert val["home"] in (errno.ENOENT, [], ["agent"]), val


@BOTH_MODES
def test_etc_shadow_absent_or_unreadable(py, opts):
    val = inside(
        py,
        """
        try:
            data = open("/etc/shadow").read()
            print(json.dumps({"read": True, "has_root_hash": any(l.startswith("root:$") for l in data.splitlines())}))
        except OSError as e:
            print(json.dumps({"read": False, "errno": e.errno}))
        """,
        *opts,
    )
    if val["read"]:
        # A curated /etc may carry its own shadow, but never the host's password hashes.
        assert not val["has_root_hash"], val
    else:
        assert val["errno"] in (errno.ENOENT, errno.EACCES), val


@pytest.mark.root_only
def test_host_etc_file_not_visible(sh):
    # /etc inside is curated: a file the host adds to /etc must not show up.
    path = f"/etc/{unique_marker('etc')}"
    with open(path, "w") as f:
        f.write("host-only\n")
    try:
        r = sh(f"cat {path}")
        assert r.rc != 0 and "host-only" not in r.out, r.describe()
        assert "No such file or directory" in r.err, r.describe()
    finally:
        os.unlink(path)


# ---- read-only system dirs -------------------------------------------------------------


@BOTH_MODES
def test_usr_and_etc_read_only(py, opts):
    name = unique_marker("pwn")
    val = inside(
        py,
        f"""
        res = {{}}
        res["usr_create"] = tr(lambda: write("/usr/{name}"))
        res["usr_bin_create"] = tr(lambda: write("/usr/bin/{name}"))
        res["usr_chmod"] = tr(lambda: os.chmod("/usr/bin/ls", 0o777))
        res["etc_create"] = tr(lambda: write("/etc/{name}"))
        res["etc_passwd_append"] = tr(lambda: write("/etc/passwd", "evil::0:0::/:/bin/sh\\n", "a"))
        res["bin_create"] = tr(lambda: write("/bin/{name}"))
        # The curated /etc's files: the host's contents, read-only even for the namespace's
        # root (whatever they are made of: binds, or copies should they ever be).
        res["etc_profile"] = open("/etc/profile").read()
        res["etc_profile_append"] = tr(lambda: write("/etc/profile", "evil", "a"))
        res["etc_profile_chmod"] = tr(lambda: os.chmod("/etc/profile", 0o4777))
        res["etc_profile_chown"] = tr(lambda: os.chown("/etc/profile", 1000, 1000))
        res["etc_profile_unlink"] = tr(lambda: os.unlink("/etc/profile"))
        res["etc_profile_rename"] = tr(lambda: os.rename("/etc/profile", "/etc/p2"))
        print(json.dumps(res))
        """,
        *opts,
    )
    with open("/etc/profile") as f:
        assert val["etc_profile"] == f.read()
    for k in ("append", "chmod", "chown", "unlink", "rename"):
        assert val[f"etc_profile_{k}"] in (errno.EROFS, errno.EACCES, errno.EPERM), (k, val)
    assert val["usr_create"] == errno.EROFS, val
    assert val["usr_bin_create"] == errno.EROFS, val
    assert val["usr_chmod"] in (errno.EROFS, errno.EPERM), val
    assert val["etc_create"] in (errno.EROFS, errno.EACCES), val
    assert val["etc_passwd_append"] in (errno.EROFS, errno.EACCES), val
    assert val["bin_create"] in (errno.EROFS, errno.EACCES), val
    for d in ("/usr", "/usr/bin", "/etc", "/bin"):
        assert not os.path.exists(f"{d}/{name}")


@BOTH_MODES
def test_workspace_source_not_left_in_the_tree(py, opts):
    # As host root the workspace's idmapped tree comes to the warden by fd and is attached at
    # /.conch-lower only while /workspace is built from it: no command may find it there, nor
    # any other mount point than /workspace showing the workspace or the old root.
    val = inside(
        py,
        """
        res = {"lower": os.path.lexists("/.conch-lower"), "oldroot": os.path.lexists("/oldroot")}
        res["points"] = [l.split()[4] for l in open("/proc/self/mountinfo")]
        print(json.dumps(res))
        """,
        *opts,
    )
    assert not val["lower"] and not val["oldroot"], val
    bad = [p for p in val["points"] if p.startswith(("/.conch", "/oldroot", "/run/conch/stage"))]
    assert not bad, val["points"]
    assert val["points"].count("/workspace") >= 1, val["points"]


@BOTH_MODES
def test_dev_is_nosuid_and_noexec(py, opts):
    # The host's device nodes bound into /dev, and /dev itself: no set-id program and no
    # program at all runs from there (one recursive mount_setattr, not a remount each).
    val = inside(
        py,
        """
        res = {}
        for l in open("/proc/self/mountinfo"):
            f = l.split()
            if f[4] == "/dev" or f[4] in ("/dev/" + n for n in ("null", "zero", "full", "random", "urandom", "tty")):
                res[f[4]] = f[5].split(",")
        print(json.dumps(res))
        """,
        *opts,
    )
    assert len(val) == 7, val
    for point, flags in val.items():
        assert "nosuid" in flags and "noexec" in flags, (point, flags)


@BOTH_MODES
def test_writable_places_are_writable(sh, ws, opts):
    # Sanity for the fences above: the sandbox is not simply read-only everywhere.
    r = sh("set -e; echo a > /workspace/w; echo b > /tmp/t; echo c > $HOME/h; cat /workspace/w /tmp/t $HOME/h", *opts)
    assert r.rc == 0, r.describe()
    assert r.out == "a\nb\nc\n"


# ---- network ---------------------------------------------------------------------------


class Server:
    """A TCP server on the host that counts the connections it accepts."""

    def __init__(self, family, addr):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(addr)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted += 1
            try:
                c.sendall(b"HOST-SECRET\n")
            finally:
                c.close()

    def close(self):
        self.stop = True
        self.t.join()
        self.sock.close()


def host_ipv4():
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("10.254.254.254", 9))
        ip = s.getsockname()[0]
        s.close()
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


@BOTH_MODES
def test_host_loopback_and_interfaces_unreachable(py, opts):
    srv = Server(socket.AF_INET, ("0.0.0.0", 0))
    port = srv.sock.getsockname()[1]
    ip = host_ipv4()
    try:
        val = inside(
            py,
            f"""
            def conn(host):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.settimeout(3)
                s.connect((host, {port}))
                return s.recv(100)
            res = {{"lo": tr(lambda: conn("127.0.0.1"))}}
            if {ip!r}:
                res["ip"] = tr(lambda: conn({ip!r}))
            res["public"] = tr(lambda: conn("1.1.1.1"))
            print(json.dumps(res))
            """,
            *opts,
        )
        # Own network namespace: its loopback has no listener; no route anywhere else.
        assert val["lo"] == errno.ECONNREFUSED, val
        if ip:
            assert val["ip"] in (errno.ENETUNREACH, errno.EHOSTUNREACH), val
        assert val["public"] in (errno.ENETUNREACH, errno.EHOSTUNREACH), val
        assert "HOST-SECRET" not in str(val)
        assert srv.accepted == 0
    finally:
        srv.close()


def test_bash_dev_tcp_to_host_port_fails(sh):
    srv = Server(socket.AF_INET, ("127.0.0.1", 0))
    port = srv.sock.getsockname()[1]
    try:
        r = sh(f"exec 3<>/dev/tcp/127.0.0.1/{port} && cat <&3; echo rc=$?")
        assert "HOST-SECRET" not in r.out
        assert "Connection refused" in r.err, r.describe()
        assert srv.accepted == 0
    finally:
        srv.close()


def test_host_abstract_unix_socket_unreachable(py):
    name = "\0" + unique_marker("abstract")
    srv = Server(socket.AF_UNIX, name)
    try:
        val = inside(
            py,
            f"""
            def conn():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(3)
                s.connect({name!r})
                return s.recv(100)
            print(json.dumps({{"abstract": tr(conn)}}))
            """,
        )
        assert val["abstract"] in (errno.ECONNREFUSED, errno.EPERM), val
        assert srv.accepted == 0
    finally:
        srv.close()


def test_dns_does_not_resolve(py, sh):
    r = sh("getent hosts example.com; echo rc=$?")
    assert "rc=0" not in r.out, r.describe()
    val = inside(
        py,
        """
        try:
            print(json.dumps({"ok": socket.getaddrinfo("example.com", 80)[0][4][0]}))
        except socket.gaierror as e:
            print(json.dumps({"gaierror": e.errno}))
        """,
    )
    assert "gaierror" in val, val


# ---- mounts and namespaces -------------------------------------------------------------


@BOTH_MODES
def test_mount_fails(sh, opts):
    r = sh("mkdir -p /tmp/m && mount -t tmpfs none /tmp/m; echo rc=$?; grep -c ' /tmp/m ' /proc/self/mounts", *opts)
    assert "rc=0" not in r.out, r.describe()
    assert r.out.strip().endswith("0"), r.describe()


@BOTH_MODES
def test_mount_syscall_eperm(py, opts):
    val = inside(
        py,
        """
        os.makedirs("/tmp/m", exist_ok=True)
        res = {"mount": sc(165, b"none", b"/tmp/m", b"tmpfs", 0, 0)}
        res["umount_proc"] = sc(166, b"/proc", 2)
        print(json.dumps(res))
        """,
        *opts,
    )
    assert val["mount"] == [-1, EPERM], val
    assert val["umount_proc"][0] == -1 and val["umount_proc"][1] == EPERM, val


@BOTH_MODES
def test_nested_user_namespace_fails(py, sh, opts):
    r = sh("unshare -U true; echo rc=$?", *opts)
    assert "rc=0" not in r.out and "Operation not permitted" in r.err, r.describe()
    val = inside(
        py,
        """
        CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
        res = {"unshare_user": sc(272, CLONE_NEWUSER)}
        res["unshare_mnt"] = sc(272, CLONE_NEWNS)
        # raw clone(CLONE_NEWUSER): a child that gets 0 must leave at once.
        r = sc(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
        if r[0] == 0:
            os._exit(0)
        if r[0] > 0:
            os.waitpid(r[0], 0)
        res["clone"] = r
        # clone3 carries its flags in memory, out of seccomp's sight: it must be refused too.
        args = (ctypes.c_uint64 * 11)()
        args[0] = CLONE_NEWUSER
        args[4] = SIGCHLD
        r = sc(435, ctypes.cast(args, ctypes.c_void_p).value, 88)
        if r[0] == 0:
            os._exit(0)
        if r[0] > 0:
            os.waitpid(r[0], 0)
        res["clone3"] = r
        print(json.dumps(res))
        """,
        *opts,
    )
    assert val["unshare_user"] == [-1, EPERM], val
    assert val["unshare_mnt"] == [-1, EPERM], val
    assert val["clone"][0] == -1 and val["clone"][1] in (EPERM, errno.ENOSPC), val
    assert val["clone3"][0] == -1 and val["clone3"][1] in (EPERM, errno.ENOSPC, errno.ENOSYS), val


# ---- processes -------------------------------------------------------------------------


def test_host_processes_invisible(sh):
    r = sh("echo $$; ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; ps -e -o pid= | wc -l")
    assert r.rc == 0, r.describe()
    lines = r.out.splitlines()
    assert int(lines[0]) < 10, r.describe()
    pids = [int(p) for p in lines[1].split()]
    assert pids and max(pids) < 50 and len(pids) < 10, r.describe()
    if os.getpid() >= 50:
        assert os.getpid() not in pids
    assert int(lines[2]) < 10, r.describe()


def _host_view_of_sleeper(opts, ws):
    """Start a sleeping command with a unique argv[0] and return the host's /proc status of it."""
    marker = unique_marker("uid")
    p = subprocess.Popen(
        [CONCH_BIN, "run", "--json",
         "--workspace", str(ws), *opts, "--", "bash", "-c", f"exec -a {marker} sleep 3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ws, start_new_session=True,
    )
    status = None
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and status is None:
            for d in os.listdir("/proc"):
                if d.isdigit():
                    a = proc_argv(int(d))
                    if a and a[0] == marker and proc_comm(int(d)) == "sleep":
                        status = proc_status(int(d))
                        if status is not None:
                            with open(f"/proc/{d}/uid_map") as f:
                                status["uid_map"] = f.read().split()
                        break
            time.sleep(0.02)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    assert status is not None, f"sleeper never seen from the host; rc={p.returncode} out={out!r} err={err!r}"
    return status


@pytest.mark.root_only
@BOTH_MODES
def test_root_mode_sandbox_is_not_host_root(ws, opts):
    st = _host_view_of_sleeper(opts, ws)
    uids = [int(x) for x in st["Uid"].split()]
    gids = [int(x) for x in st["Gid"].split()]
    assert 0 not in uids and 0 not in gids, st
    # Spec: sandbox ids 0..65535 map onto a host block of the sandbox's own in systemd's
    # container range (agent 1000 -> base+1000, root 0 -> base); test_identity.py checks that
    # blocks never overlap /etc/subuid, /etc/subgid or each other.
    inner, base, count = (int(x) for x in st["uid_map"])
    assert inner == 0 and count == 65536 and 0x80000 <= base <= 0x70000000 - count, st
    want = base if opts else base + 1000
    assert uids == [want] * 4, st
    assert gids == [want] * 4, st


@pytest.mark.user_only
@BOTH_MODES
def test_user_mode_sandbox_keeps_caller_uid(ws, opts):
    st = _host_view_of_sleeper(opts, ws)
    uids = [int(x) for x in st["Uid"].split()]
    assert uids == [os.getuid()] * 4, st


@BOTH_MODES
def test_uid_inside(sh, opts):
    r = sh("id -u; id -g", *opts)
    assert r.rc == 0, r.describe()
    want = "0\n0\n" if opts else "1000\n1000\n"
    assert r.out == want, r.describe()


# ---- environment and fds ---------------------------------------------------------------


def test_caller_environment_not_inherited(py, ws):
    token = unique_marker("envsecret")
    env = dict(os.environ, CONCH_TEST_SECRET=token, SSH_AUTH_SOCK="/tmp/host-agent.sock", AWS_SECRET_ACCESS_KEY=token)
    r = py("import os, json; print(json.dumps(dict(os.environ)))", env=env)
    env_in = r.val
    assert env_in is not None, r.describe()
    assert token not in r.out
    for k in ("CONCH_TEST_SECRET", "SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY"):
        assert k not in env_in, env_in
    assert env_in.get("HOME") == "/home/agent", env_in
    # the host's PATH is not inherited; /run/conch/bin holds the tool bridge's tool_call
    assert env_in.get("PATH") == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/conch/bin", env_in
    assert env_in.get("PYTHONPATH") == "/run/conch/python", env_in
    for k, v in {"LANG": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat"}.items():
        assert env_in.get(k) == v, (k, env_in)


def test_inherited_fds_closed(tmp_path, ws):
    secret = tmp_path / "fd-secret.txt"
    secret.write_text("FD-SECRET\n")
    fd = os.open(secret, os.O_RDONLY)
    os.dup2(fd, 57, inheritable=True)
    os.close(fd)
    try:
        r = conch(["run", "--json", "--workspace", ws, "--", "bash", "-c",
                   "ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; ls -l /proc/self/fd; cat <&57"],
                  cwd=ws, pass_fds=(57,), want_json=True)
    finally:
        os.close(57)
    fds = r.out.splitlines()[0].split()
    # 0,1,2 and the directory fd ls itself opened.
    assert fds == ["0", "1", "2", "3"], r.describe()
    assert "fd-secret" not in r.out and "FD-SECRET" not in r.out, r.describe()
    assert "Bad file descriptor" in r.err, r.describe()


# ---- privileges ------------------------------------------------------------------------


@BOTH_MODES
def test_no_new_privs_and_no_caps(sh, opts):
    r = sh("grep -E '^(NoNewPrivs|Seccomp|CapEff|CapPrm|CapAmb|CapInh):' /proc/self/status", *opts)
    st = dict(l.split(":\t") for l in r.out.splitlines())
    assert st.get("NoNewPrivs") == "1", r.describe()
    assert st.get("Seccomp") == "2", r.describe()
    assert st.get("CapAmb") == "0000000000000000", r.describe()
    if not opts:
        assert st.get("CapEff") == "0000000000000000", r.describe()
        assert st.get("CapPrm") == "0000000000000000", r.describe()
    else:
        # a reduced set: at least CAP_SYS_ADMIN (21), CAP_SYS_MODULE (16), CAP_SYS_PTRACE (19) gone
        eff = int(st["CapEff"], 16)
        for cap in (16, 19, 21):
            assert not eff & (1 << cap), (cap, r.describe())


def test_setuid_binaries_do_not_raise(sh):
    r = sh(
        "su root -c 'id -u' </dev/null; echo su=$?; "
        "passwd --status root; echo passwd=$?; "
        "mount -t tmpfs none /tmp; echo mount=$?; id -u"
    )
    lines = r.out.splitlines()
    assert "su=0" not in lines and "passwd=0" not in lines and "mount=0" not in lines, r.describe()
    assert "0" not in lines, r.describe()
    assert lines[-1] == "1000", r.describe()


@BOTH_MODES
def test_clock_cannot_be_set(sh, py, opts):
    before = time.time()
    r = sh("date -s @0; echo rc=$?", *opts)
    assert "rc=0" not in r.out and "Operation not permitted" in r.err, r.describe()
    val = inside(
        py,
        """
        import time
        res = {"clock_settime": tr(lambda: time.clock_settime(time.CLOCK_REALTIME, time.time()))}
        res["settimeofday"] = sc(164, 0, 0)
        print(json.dumps(res))
        """,
        *opts,
    )
    assert val["clock_settime"] == EPERM, val
    assert abs(time.time() - before) < 120


# ---- seccomp ---------------------------------------------------------------------------

# (name, x86_64 number, args chosen so that without a filter the call would succeed or fail
# with an errno other than EPERM, so EPERM can only come from the filter)
BLOCKED = [
    ("bpf", 321, (0, 0, 0)),
    ("keyctl", 250, (0, -4, 0)),  # KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING
    ("add_key", 248, (b"user", b"conchit", b"x", 1, -2)),  # KEY_SPEC_PROCESS_KEYRING
    ("request_key", 249, (b"user", b"conchit", 0, 0)),
    ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("io_uring_setup", 425, (1, 0)),
    ("io_uring_enter", 426, (-1, 0, 0, 0, 0, 0)),
    ("io_uring_register", 427, (-1, 0, 0, 0)),
    ("userfaultfd", 323, (1,)),  # UFFD_USER_MODE_ONLY: allowed to anyone without a filter
    ("open_by_handle_at", 304, (-1, 0, 0)),
    ("unshare", 272, (0x10000000,)),
    ("mount", 165, (b"none", b"/tmp", b"tmpfs", 0, 0)),
    ("clock_settime", 227, (0, 0)),
    ("settimeofday", 164, (0, 0)),
]


@BOTH_MODES
def test_blocked_syscalls_return_eperm(py, opts):
    val = inside(
        py,
        f"""
        res = {{}}
        for name, nr, args in {BLOCKED!r}:
            res[name] = sc(nr, *args)
        print(json.dumps(res))
        """,
        *opts,
    )
    bad = {k: v for k, v in val.items() if v != [-1, EPERM]}
    assert not bad, f"syscalls not refused with EPERM (name: [ret, errno]): {bad}"


@BOTH_MODES
def test_mknod_device_fails_fifo_works(py, opts):
    val = inside(
        py,
        """
        res = {}
        res["chr_tmp"] = tr(lambda: os.mknod("/tmp/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3)))
        res["chr_ws"] = tr(lambda: os.mknod("/workspace/mem", 0o666 | stat.S_IFCHR, os.makedev(1, 1)))
        res["blk_tmp"] = tr(lambda: os.mknod("/tmp/sda", 0o666 | stat.S_IFBLK, os.makedev(8, 0)))
        res["fifo"] = tr(lambda: os.mkfifo("/tmp/fifo"))
        res["is_fifo"] = stat.S_ISFIFO(os.stat("/tmp/fifo").st_mode) if res["fifo"] == 0 else False
        print(json.dumps(res))
        """,
        *opts,
    )
    assert val["chr_tmp"] == EPERM, val
    assert val["chr_ws"] == EPERM, val
    assert val["blk_tmp"] == EPERM, val
    assert val["fifo"] == 0 and val["is_fifo"], val


def test_tiocsti_refused(py):
    val = inside(
        py,
        """
        import fcntl, termios
        res = {"stdin": tr(lambda: fcntl.ioctl(0, termios.TIOCSTI, b"x"))}
        c = ctypes.c_char(b"x")
        # the tty layer truncates cmd to 32 bits: a filter that compares 64 bits is bypassed
        res["stdin_hibits"] = sc(16, 0, termios.TIOCSTI | (1 << 32), ctypes.addressof(c))[1]
        try:
            m, s = os.openpty()
            res["pty"] = tr(lambda: fcntl.ioctl(s, termios.TIOCSTI, b"x"))
            res["pty_hibits"] = sc(16, s, termios.TIOCSTI | (1 << 32), ctypes.addressof(c))[1]
        except OSError as e:
            res["openpty"] = e.errno
        print(json.dumps(res))
        """,
    )
    assert val["stdin"] == EPERM, val
    assert val["stdin_hibits"] == EPERM, val
    if "openpty" not in val:
        assert val["pty"] == EPERM, val
        assert val["pty_hibits"] == EPERM, val


# ---- /proc, /sys, hostname -------------------------------------------------------------


@BOTH_MODES
def test_proc_sys_and_sysrq_not_writable(py, opts):
    host_name = socket.gethostname()
    val = inside(
        py,
        """
        res = {"hostname": tr(lambda: write("/proc/sys/kernel/hostname", "pwned"))}
        res["sysrq"] = tr(lambda: write("/proc/sysrq-trigger", "h"))
        try:
            st = os.stat("/proc/sysrq-trigger")
            res["sysrq_rdev"] = [os.major(st.st_rdev), os.minor(st.st_rdev)] if stat.S_ISCHR(st.st_mode) else None
        except OSError:
            res["sysrq_rdev"] = None
        res["core_pattern"] = tr(lambda: write("/proc/sys/kernel/core_pattern", "|/tmp/x"))
        res["name_after"] = open("/proc/sys/kernel/hostname").read().strip()
        print(json.dumps(res))
        """,
        *opts,
    )
    assert val["hostname"] in (errno.EACCES, errno.EROFS, EPERM), val
    assert val["name_after"] == "conch", val
    assert val["core_pattern"] in (errno.EACCES, errno.EROFS, EPERM), val
    # masked with /dev/null (1,3) is fine too: the write goes nowhere
    assert val["sysrq"] in (errno.EACCES, errno.EROFS, EPERM, errno.ENOENT) or val["sysrq_rdev"] == [1, 3], val
    assert socket.gethostname() == host_name


def test_sys_absent_or_read_only(py):
    val = inside(
        py,
        """
        res = {"exists": os.path.exists("/sys")}
        if res["exists"]:
            res["entries"] = sorted(os.listdir("/sys"))
            res["mkdir_cgroup"] = tr(lambda: os.mkdir("/sys/fs/cgroup/conchit"))
            res["write_uevent"] = tr(lambda: write("/sys/kernel/uevent_helper", "/tmp/x"))
        print(json.dumps(res))
        """,
    )
    if val["exists"] and val["entries"]:
        assert val["mkdir_cgroup"] in (errno.EROFS, errno.EACCES, EPERM, errno.ENOENT), val
        assert val["write_uevent"] in (errno.EROFS, errno.EACCES, EPERM, errno.ENOENT), val


def test_hostname_is_not_the_hosts(sh):
    r = sh("hostname; uname -n")
    assert r.rc == 0, r.describe()
    assert r.out == "conch\nconch\n", r.describe()
    if socket.gethostname() != "conch":
        assert socket.gethostname() not in r.out


@BOTH_MODES
def test_warden_is_out_of_reach(py, opts):
    # PID 1 is conch's warden: it holds the overlay's hidden upper dir, the control socket
    # and full capabilities in the namespace. A command must not read its fds, memory or
    # environment, nor ptrace it, nor signal it to death.
    val = inside(
        py,
        """
        import signal
        def opens():
            errs = []
            try:
                names = os.listdir("/proc/1/fd")
            except OSError as e:
                return [e.errno]
            for n in names:
                try:
                    os.open("/proc/1/fd/" + n, os.O_RDONLY)
                    errs.append(0)
                except OSError as e:
                    errs.append(e.errno)
            return errs
        res = {"fd_opens": opens()}
        res["environ"] = tr(lambda: open("/proc/1/environ", "rb").read())
        res["mem"] = tr(lambda: open("/proc/1/mem", "rb").read(1))
        PTRACE_ATTACH = 16
        res["ptrace"] = sc(101, PTRACE_ATTACH, 1, 0, 0)
        # another uid's process may not be signalled at all; PID 1 of a pid namespace ignores
        # the signals it has no handler for even from its own uid
        res["kill"] = [tr(lambda: os.kill(1, signal.SIGKILL)), tr(lambda: os.kill(1, signal.SIGTERM))]
        res["alive"] = os.path.exists("/proc/1/status")
        print(json.dumps(res))
        """,
        *opts,
    )
    assert val["fd_opens"] and 0 not in val["fd_opens"], val
    assert val["environ"] in (errno.EACCES, EPERM), val
    assert val["mem"] in (errno.EACCES, EPERM), val
    assert val["ptrace"][0] == -1 and val["ptrace"][1] in (EPERM, errno.EACCES), val
    assert val["alive"] is True, val
