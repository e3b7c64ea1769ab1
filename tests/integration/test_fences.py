# test_fences.py - the seccomp allowlist and the no-privilege-to-the-host rules, through the
# real `conch run`: real programs (bash, coreutils, python3 with threads/subprocess/asyncio/
# sockets, node, gcc, make, git, tar, strace) keep working under the default-deny filter;
# the calls it leaves out fail (ENOSYS for the unlisted, EPERM for the known dangerous); and
# nothing a command writes carries privilege to the host (set-uid/set-gid bits, devices, file
# capabilities), checked on the host, as root and as a user, in rw and overlay mode.
import errno
import os
import platform
import shutil
import stat
import subprocess
from textwrap import dedent

import pytest

from conftest import IS_ROOT

BOTH_IDS = pytest.mark.parametrize("opts", [[], ["--as-root"]], ids=["agent", "as-root"])

# Python prelude used inside the sandbox: sc(nr, *args) -> errno (0 on success).
PRELUDE = dedent(
    """
    import ctypes, errno, json, os, stat, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def sc(nr, *args):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        return ctypes.get_errno() if r == -1 else 0
    def tr(fn):
        try:
            fn()
            return 0
        except OSError as e:
            return e.errno
    """
)


def inside(py, code, *opts, **kw):
    r = py(PRELUDE + dedent(code), *opts, **kw)
    assert r.val is not None, f"inside script printed no JSON\n{r.describe()}"
    return r.val


# ---- real programs under the allowlist -----------------------------------------------------


@BOTH_IDS
def test_shell_and_coreutils(sh, opts):
    r = sh(
        dedent(
            """
            set -euo pipefail
            seq 1 20000 | awk '{s+=$1} END {print s}' | tee sum.txt | sed 's/^/sum=/'
            printf 'b\\na\\nc\\n' | sort --parallel=2 | tr -d '\\n'; echo
            mkdir -p d/e && touch d/e/f && find d -type f | xargs ls -l >/dev/null
            cp -a d d2 && mv d2 d3 && ln -s d3 link && readlink link && rm -r d3 link
            dd if=/dev/zero of=z bs=4k count=8 status=none && stat -c %s z
            ( flock 9; echo locked ) 9>lockfile
            timeout 5 sleep 0.1 && echo timeout-ok
            date +%Y >/dev/null && id -u >/dev/null && uname -m >/dev/null
            mkfifo fifo && (echo through-fifo > fifo &) && cat fifo
            """
        ),
        *opts,
    )
    assert r.rc == 0, r.describe()
    assert r.out.split() == ["sum=200010000", "abc", "d3", "32768", "locked", "timeout-ok", "through-fifo"]


@BOTH_IDS
def test_python_threads_subprocess_asyncio_sockets(py, opts):
    code = dedent(
        """
        import asyncio, concurrent.futures, json, mmap, os, selectors, signal, socket
        import subprocess, tempfile, threading
        res = {}
        # threads
        out = []
        ts = [threading.Thread(target=lambda i=i: out.append(sum(range(i * 1000)))) for i in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        res["threads"] = len(out)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            res["pool"] = sum(ex.map(lambda x: x * x, range(100)))
        # subprocess and pipes
        p = subprocess.run(["sh", "-c", "echo hi; echo err >&2; exit 3"], capture_output=True, text=True)
        res["subprocess"] = [p.stdout, p.stderr, p.returncode]
        # fork, signals
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        res["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        got = []
        signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
        os.kill(os.getpid(), signal.SIGUSR1)
        res["signal"] = got
        # TCP, UDP and unix sockets on loopback, epoll
        srv = socket.create_server(("127.0.0.1", 0))
        c = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
        c.sendall(b"ping")
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ)
        res["epoll"] = type(sel).__name__ if sel.select(5) else None
        res["tcp"] = a.recv(4).decode()
        u1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u1.bind(("127.0.0.1", 0))
        u2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u2.sendto(b"udp", u1.getsockname())
        res["udp"] = u1.recv(3).decode()
        s1, s2 = socket.socketpair(); s1.send(b"unix"); res["unix"] = s2.recv(4).decode()
        # asyncio echo server
        async def main():
            async def echo(r, w):
                w.write(await r.read(5)); await w.drain(); w.close()
            server = await asyncio.start_server(echo, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"async"); await w.drain()
            data = await r.read(5)
            w.close(); server.close()
            proc = await asyncio.create_subprocess_exec("true")
            return data.decode() + str(await proc.wait())
        res["asyncio"] = asyncio.run(main())
        # mmap of a temp file, and an anonymous one
        with tempfile.TemporaryFile() as f:
            f.write(b"x" * 4096); f.flush()
            m = mmap.mmap(f.fileno(), 4096); res["mmap"] = m[:1].decode(); m.close()
        print(json.dumps(res))
        """
    )
    r = py(code, *opts)
    assert r.rc == 0, r.describe()
    assert r.val == {
        "threads": 8,
        "pool": 328350,
        "subprocess": ["hi\n", "err\n", 3],
        "fork": 7,
        "signal": [1],
        "epoll": "EpollSelector",
        "tcp": "ping",
        "udp": "udp",
        "unix": "unix",
        "asyncio": "async0",
        "mmap": "x",
    }, r.describe()


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
def test_node(run):
    script = (
        "const http=require('http'),cp=require('child_process'),{Worker}=require('worker_threads');"
        "const w=new Worker('require(\"worker_threads\").parentPort.postMessage(6*7)',{eval:true});"
        "w.on('message',n=>{const s=http.createServer((q,r)=>r.end('ok'+n));"
        "s.listen(0,'127.0.0.1',()=>http.get({port:s.address().port,host:'127.0.0.1'},r=>{"
        "let b='';r.on('data',d=>b+=d);r.on('end',()=>{console.log(b,cp.execSync('echo sub').toString().trim());"
        "s.close();w.terminate();});}));});"
    )
    r = run(["--", "node", "-e", script])
    assert r.rc == 0, r.describe()
    assert r.out.strip() == "ok42 sub", r.describe()


@pytest.mark.skipif(not shutil.which("gcc") or not shutil.which("make"), reason="gcc/make missing")
def test_gcc_make_and_run_threads_epoll(sh):
    src = dedent(
        r"""
        #include <pthread.h>
        #include <stdio.h>
        #include <sys/epoll.h>
        #include <sys/eventfd.h>
        #include <sys/wait.h>
        #include <unistd.h>
        static void *t(void *a) { return (char *)a + 1; }
        int main(void) {
            pthread_t th; void *r; char c;
            pthread_create(&th, NULL, t, &c); pthread_join(th, &r);
            int ep = epoll_create1(0), ev = eventfd(0, 0);
            struct epoll_event e = {.events = EPOLLIN};
            epoll_ctl(ep, EPOLL_CTL_ADD, ev, &e);
            unsigned long long one = 1; write(ev, &one, 8);
            int n = epoll_wait(ep, &e, 1, 1000);
            pid_t p = fork(); if (p == 0) _exit(5);
            int st; waitpid(p, &st, 0);
            printf("%d %d %d\n", r == &c + 1, n, WEXITSTATUS(st));
            return 0;
        }
        """
    )
    r = sh(
        f"cat > m.c <<'EOF'\n{src}\nEOF\n"
        "printf 'm: m.c\\n\\tgcc -O2 -pthread -o m m.c\\n' > Makefile && make -s && ./m"
    )
    assert r.rc == 0, r.describe()
    assert r.out.strip() == "1 1 5", r.describe()


@BOTH_IDS
def test_git_and_tar(sh, opts):
    r = sh(
        dedent(
            """
            set -euo pipefail
            export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b
            git init -q repo && cd repo
            echo one > f && mkdir -p sub && echo two > sub/g && chmod +x sub/g
            git add -A && git commit -qm first
            git checkout -qb topic && echo three >> f && git commit -qam second
            git checkout -q - && git merge -q topic && git gc -q
            git log --oneline | wc -l
            cd .. && tar czf r.tgz repo && mkdir x && tar xzf r.tgz -C x
            tar --same-permissions -xzf r.tgz -C x && test -x x/repo/sub/g
            (cd x/repo && git status --porcelain | wc -l)
            """
        ),
        *opts,
    )
    assert r.rc == 0, r.describe()
    assert r.out.split() == ["2", "0"], r.describe()


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
def test_strace_traces_own_processes(sh):
    r = sh("strace -f -qq -e trace=execve -o trace.txt sh -c '/bin/true; /bin/true' && grep -c execve trace.txt")
    assert r.rc == 0, r.describe()
    assert int(r.out.strip()) >= 2, r.describe()


# ---- what the allowlist leaves out ---------------------------------------------------------

# Syscall numbers by architecture for the calls the test makes by number.
NR = {
    "x86_64": {"mount": 165, "unshare": 272, "personality": 135, "keyctl": 250, "bpf": 321,
               "userfaultfd": 323, "perf_event_open": 298, "io_uring_setup": 425,
               "clone3": 435, "openat2": 437, "quotactl_fd": 443, "statmount": 457,
               "listmount": 458, "open_tree_attr": 467, "lsm_list_modules": 461,
               "modify_ldt": 154, "getpid": 39},
    "aarch64": {"mount": 40, "unshare": 97, "personality": 92, "keyctl": 219, "bpf": 280,
                "userfaultfd": 282, "perf_event_open": 241, "io_uring_setup": 425,
                "clone3": 435, "openat2": 437, "quotactl_fd": 443, "statmount": 457,
                "listmount": 458, "open_tree_attr": 467, "lsm_list_modules": 461,
                "getpid": 172},
}


@BOTH_IDS
def test_unlisted_and_dangerous_syscalls_fail(py, opts):
    nr = NR.get(platform.machine())
    if nr is None:
        pytest.skip(f"no syscall numbers for {platform.machine()}")
    # Arguments the kernel would answer with EFAULT/EBADF/EINVAL (null pointers, fd -1), so
    # ENOSYS/EPERM can only come from the filter.
    res = inside(
        py,
        f"""
        nr = {nr!r}
        res = {{}}
        for name in ("statmount", "listmount"):
            res[name] = sc(nr[name], 0, 0, 0, 0)
        res["open_tree_attr"] = sc(nr["open_tree_attr"], -1, 0, 0, 0, 0)
        res["quotactl_fd"] = sc(nr["quotactl_fd"], -1, 0, 0, 0)
        res["lsm_list_modules"] = sc(nr["lsm_list_modules"], 0, 0, 0)
        res["clone3"] = sc(nr["clone3"], 0, 0)
        res["openat2"] = sc(nr["openat2"], -100, 0, 0, 0)
        if "modify_ldt" in nr:
            res["modify_ldt"] = sc(nr["modify_ldt"], 0, 0, 0)
        res["mount"] = sc(nr["mount"], 0, 0, 0, 0, 0)
        res["unshare"] = sc(nr["unshare"], 0x10000000)
        res["keyctl"] = sc(nr["keyctl"], -1, 0, 0, 0, 0)
        res["bpf"] = sc(nr["bpf"], 5, 0, 0)
        res["userfaultfd"] = sc(nr["userfaultfd"], 0)
        res["perf_event_open"] = sc(nr["perf_event_open"], 0, 0, -1, -1, 0)
        res["io_uring_setup"] = sc(nr["io_uring_setup"], 1, 0)
        res["personality_rie"] = sc(nr["personality"], 0x0400000)
        res["personality_query"] = sc(nr["personality"], 0xffffffff)
        res["getpid"] = sc(nr["getpid"])
        print(json.dumps(res))
        """,
        *opts,
    )
    E, P = errno.ENOSYS, errno.EPERM
    want = {"statmount": E, "listmount": E, "open_tree_attr": E, "quotactl_fd": E,
            "lsm_list_modules": E, "clone3": E, "openat2": E, "mount": P, "unshare": P,
            "keyctl": P, "bpf": P, "userfaultfd": P, "perf_event_open": P, "io_uring_setup": P,
            "personality_rie": P, "personality_query": 0, "getpid": 0}
    if "modify_ldt" in nr:
        want["modify_ldt"] = E
    assert res == want


# ---- nothing written carries privilege to the host ------------------------------------------

SETID_SCRIPT = dedent(
    """
    import subprocess
    res = {}
    def sh(cmd):
        return subprocess.run(["bash", "-c", cmd], capture_output=True).returncode
    res["cp_chmod_4755"] = sh("cp /bin/bash ./sh && chmod 4755 ./sh")
    res["chmod_g+s"] = sh("chmod g+s ./sh")
    res["install_4755"] = sh("install -m 4755 /bin/true ./inst")
    res["install_d_2775"] = sh("install -d -m 2775 ./instdir")
    res["open_creat_4755"] = tr(lambda: os.close(os.open("pyfile", os.O_CREAT | os.O_WRONLY, 0o4755)))
    res["open_creat_2755"] = tr(lambda: os.close(os.open("pyfile2", os.O_CREAT | os.O_WRONLY, 0o2755)))
    res["mkdir_2775"] = tr(lambda: os.mkdir("pydir", 0o2775))
    res["mkdir_4755"] = tr(lambda: os.mkdir("pydir2", 0o4755))
    res["chmod_dir_g+s"] = tr(lambda: (os.mkdir("plain"), os.chmod("plain", 0o2775)))
    res["mknod_chr"] = tr(lambda: os.mknod("null", 0o666 | stat.S_IFCHR, os.makedev(1, 3)))
    res["mknod_blk"] = tr(lambda: os.mknod("sda", 0o666 | stat.S_IFBLK, os.makedev(8, 0)))
    res["mknod_reg_suid"] = tr(lambda: os.mknod("regsuid", 0o4755 | stat.S_IFREG))
    # a valid VFS_CAP_REVISION_2 blob granting cap_setuid (effective): what `setcap
    # cap_setuid+ep` writes
    cap = struct.pack("<IIIII", 0x02000001, 1 << 7, 0, 0, 0)
    res["capfile"] = tr(lambda: open("capfile", "w").close())
    res["setxattr_cap"] = tr(lambda: os.setxattr("capfile", "security.capability", cap))
    res["setcap"] = sh("command -v setcap >/dev/null || exit 99; cp /bin/true ./capbin && setcap cap_setuid+ep ./capbin")
    # ordinary modes keep working
    res["plain_ok"] = tr(lambda: (os.close(os.open("ok", os.O_CREAT | os.O_WRONLY, 0o755)),
                                  os.chmod("ok", 0o700), os.mkdir("okdir", 0o1777),
                                  os.mkfifo("okfifo")))
    print(json.dumps(res))
    """
)


def host_privileges(root):
    """Every set-uid/set-gid file, device node and security.capability xattr under root."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(f"{p}: mode {oct(st.st_mode)}")
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                found.append(f"{p}: device")
            if not stat.S_ISLNK(st.st_mode):
                try:
                    os.getxattr(p, "security.capability", follow_symlinks=False)
                    found.append(f"{p}: security.capability")
                except OSError:
                    pass
    return found


@BOTH_IDS
@pytest.mark.parametrize("mode", [["--mode", "rw"], ["--commit"]], ids=["rw", "overlay-commit"])
def test_no_setid_devices_or_caps_reach_the_host(py, ws, opts, mode):
    if IS_ROOT:
        assert os.stat(ws).st_uid == 0  # the dangerous case: files created as host root
    r = py(PRELUDE + SETID_SCRIPT, *mode, *opts)
    assert r.val is not None, r.describe()
    res = r.val
    refused_by_filter = ("open_creat_4755", "open_creat_2755", "mkdir_2775", "mkdir_4755",
                         "chmod_dir_g+s", "mknod_chr", "mknod_blk", "mknod_reg_suid")
    refused_by_tools = ("cp_chmod_4755", "chmod_g+s", "install_4755", "install_d_2775", "setcap")
    if res["plain_ok"] == 0:
        for key in refused_by_filter + ("setxattr_cap",):
            assert res[key] == errno.EPERM, f"{key}: {res[key]}\n{r.describe()}"
        # the ordinary files did reach the host: the check below looks at real results
        assert (ws / "ok").exists() and (ws / "sh").exists(), r.describe()
    else:
        # As namespace root on a host-root workspace in rw mode nothing can be created at
        # all (EOVERFLOW: the idmapped mount has no mapping for it): still nothing may land.
        assert opts and "rw" in mode, r.describe()
        for key in refused_by_filter + ("setxattr_cap",):
            assert res[key] != 0, f"{key} succeeded\n{r.describe()}"
    for key in refused_by_tools:
        assert res[key] != 0, f"{key} succeeded\n{r.describe()}"
    assert host_privileges(ws) == [], r.describe()


def test_commands_have_an_empty_bounding_set(sh):
    """The warden cuts the capability bounding set once for the whole sandbox (not each
    command's process): a command can never gain a capability, whatever it execs."""
    r = sh("grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status")
    assert r.rc == 0, r.describe()
    caps = {line.split(":")[0]: int(line.split()[1], 16) for line in r.out.splitlines()}
    assert caps == {"CapEff": 0, "CapPrm": 0, "CapBnd": 0, "CapAmb": 0}, caps


@pytest.mark.root_only
def test_as_root_keeps_no_setfcap_or_fsetid(sh):
    r = sh("grep -E '^Cap(Eff|Bnd):' /proc/self/status", "--as-root")
    assert r.rc == 0, r.describe()
    caps = {line.split(":")[0]: int(line.split()[1], 16) for line in r.out.splitlines()}
    for name, bit in (("CAP_FSETID", 4), ("CAP_SETFCAP", 31)):
        assert not caps["CapEff"] & (1 << bit), f"{name} in CapEff {caps}"
        assert not caps["CapBnd"] & (1 << bit), f"{name} in CapBnd {caps}"
    assert caps["CapEff"] & 1, "CAP_CHOWN should stay"


# ---- Landlock scoping (ABI >= 6) -----------------------------------------------------------


def landlock_abi():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr = {"x86_64": 444, "aarch64": 444}.get(platform.machine())
    if nr is None:
        return 0
    r = libc.syscall(ctypes.c_long(nr), None, ctypes.c_long(0), ctypes.c_long(1))
    return max(int(r), 0)


def test_command_cannot_signal_its_supervisors(py):
    if landlock_abi() < 6:
        pytest.skip("Landlock ABI < 6: no signal scoping on this kernel")
    # As namespace root the command has the warden's uid (PID 1) and its shepherd's (its
    # parent): only Landlock's signal scope stops it. Its own children stay reachable.
    res = inside(
        py,
        """
        import signal, subprocess
        kid = subprocess.Popen(["sleep", "30"])
        res = {"warden": tr(lambda: os.kill(1, 0)), "parent": tr(lambda: os.kill(os.getppid(), 0)),
               "own_child": tr(lambda: os.kill(kid.pid, signal.SIGKILL))}
        kid.wait()
        print(json.dumps(res))
        """,
        "--as-root",
    )
    assert res == {"warden": errno.EPERM, "parent": errno.EPERM, "own_child": 0}


# Counts the Landlock layers a process may still add (the kernel allows 16 in all): 15 means
# the command runs in exactly one Landlock domain, 16 none. Each layer handles one right.
LANDLOCK_FREE_LAYERS = r"""
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: set inside already; outside it lets us count
attr = struct.pack("Q", 1 << 2)
n = 0
while n < 40:
    fd = libc.syscall(444, ctypes.c_char_p(attr), ctypes.c_size_t(8), 0)
    if fd < 0 or libc.syscall(446, ctypes.c_int(fd), 0) < 0:
        break
    n += 1
print(n)
"""


def test_every_kind_of_command_runs_under_landlock(run, rpc, sandbox, ws):
    """conch run's own sandbox, a daemon sandbox with a workspace and a fresh one from the pool
    (whose command's process applies Landlock only when its command comes, see
    spawn_shepherd): each command is in exactly one Landlock domain, and writes its
    workspace."""
    if landlock_abi() < 1:
        pytest.skip("no Landlock on this kernel")
    cmd = f"python3 -c '{LANDLOCK_FREE_LAYERS}' && echo w > w.txt && cat w.txt"
    r = run(["--no-daemon", "--", "bash", "-c", cmd])
    assert r.rc == 0 and r.out == "15\nw\n", r.describe()
    sb = sandbox()
    res = rpc.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=60)
    assert res["exit_code"] == 0 and res["stdout"] == "15\nw\n", res
    res = rpc.call("exec.run", {"fresh": True, "command": f"cd /workspace && {cmd}"}, timeout=60)
    assert res["exit_code"] == 0 and res["stdout"] == "15\nw\n", res
    # and outside, for contrast: the count sees a process with no domain
    out = subprocess.run(["python3", "-c", LANDLOCK_FREE_LAYERS], capture_output=True, text=True)
    assert out.stdout == "16\n", out


# ---- the file worker under the same filter ---------------------------------------------------


@pytest.mark.parametrize("mode", ["overlay", "rw"])
def test_fs_write_over_a_setid_host_file(rpc, ws, sandbox, mode):
    # A set-uid/set-gid file already in the host workspace: fs.write replaces its content
    # (the file worker runs under the command filter, which refuses to set those bits) and,
    # like an in-place write by an unprivileged process, the result loses them.
    f = ws / "tool"
    f.write_text("old\n")
    os.chmod(f, 0o6755)
    sb = sandbox(mode=mode)
    r = rpc.call("fs.write", {"sandbox": sb, "path": "tool", "content": "new\n"})
    assert r["created"] is False, r
    r = rpc.call("exec.run", {"sandbox": sb, "command": "cat tool; stat -c %a tool"}, timeout=60)
    assert r["stdout"].split() == ["new", "755"], r
    if mode == "rw":
        assert f.read_text() == "new\n" and stat.S_IMODE(os.stat(f).st_mode) == 0o755
