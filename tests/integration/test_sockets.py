# test_sockets.py - host unix sockets passed into a sandbox (issue 19): `conch run
# --pass-socket HOST[:INSIDE]` and sandbox.create "sockets". A host echo server is reached at
# the inside path in every network mode (a unix socket is not network), and nothing else of
# the host's is; what a hostile caller could name is refused: a file, a link to a socket, a
# missing path, a path through /proc's links (another sandbox's tool bridge), conch's own
# control socket and what lies beside it or under the state dir, another user's socket.
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from conftest import CONCH_BIN, conch
from rpcclient import RpcError

# Connect to argv[1], send "ping", print the answer (or the error's name).
CLIENT = ("import socket,sys\n"
          "s=socket.socket(socket.AF_UNIX)\n"
          "try:\n"
          "    s.connect(sys.argv[1]); s.sendall(b'ping'); print(s.recv(100).decode())\n"
          "except OSError as e:\n"
          "    print(type(e).__name__)\n")


class EchoServer:
    """A unix stream server at @path answering each connection's first read with 'echo:'."""

    def __init__(self, path, tag="echo"):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.tag = tag
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.sendall(f"{self.tag}:".encode() + c.recv(100))

    def close(self):
        self.sock.close()


@pytest.fixture
def sockdir(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    servers = []
    yield d, servers
    for s in servers:
        s.close()


def run(ws, sockets, script, *extra):
    args = ["run", "--no-daemon", "--workspace", str(ws)]
    for s in sockets:
        args += ["--pass-socket", s]
    return conch([*args, *extra, "--", "bash", "-c", script])


def test_run_reaches_a_host_socket_in_every_network_mode(ws, sockdir):
    d, servers = sockdir
    servers.append(EchoServer(d / "echo.sock"))
    (ws / "client.py").write_text(CLIENT)
    for extra in (("--net", "none"), ("--net", "allow"), ("--net", "host"), ("--as-root",)):
        r = run(ws, [f"{d}/echo.sock:/run/echo.sock"], "python3 client.py /run/echo.sock", *extra)
        assert r.rc == 0 and r.stdout == "echo:ping\n", (extra, r.describe())
    # Without INSIDE it keeps its host path (an ssh agent's /tmp/ssh-XXXX/agent.N stays where
    # SSH_AUTH_SOCK says), and it is set only when asked.
    r = run(ws, [f"{d}/echo.sock"], 'python3 client.py "$SSH_AUTH_SOCK"; echo "${SSH_AUTH_SOCK:-unset}"',
            "--env", f"SSH_AUTH_SOCK={d}/echo.sock")
    assert r.rc == 0 and r.stdout == f"echo:ping\n{d}/echo.sock\n", r.describe()
    r = run(ws, [f"{d}/echo.sock:/run/a.sock"], 'echo "${SSH_AUTH_SOCK:-unset}"')
    assert r.rc == 0 and r.stdout == "unset\n", r.describe()


def test_only_the_named_socket_is_reachable(ws, sockdir):
    d, servers = sockdir
    servers.append(EchoServer(d / "a.sock", "a"))
    servers.append(EchoServer(d / "b.sock", "b"))
    (d / "secret.txt").write_text("host file\n")
    (ws / "client.py").write_text(CLIENT)
    script = (f"ls -A {d}; python3 client.py {d}/a.sock; python3 client.py {d}/b.sock; "
              f"cat {d}/secret.txt 2>/dev/null || echo no-file; "
              # the bind can be neither removed nor replaced nor remounted from inside
              f"rm -f {d}/a.sock 2>/dev/null; umount {d}/a.sock 2>/dev/null; "
              f"python3 client.py {d}/a.sock; ls /run")
    for extra in ((), ("--as-root",)):
        r = run(ws, [str(d / "a.sock")], script, *extra)
        assert r.rc == 0, (extra, r.describe())
        lines = r.stdout.splitlines()
        assert lines[:5] == ["a.sock", "a:ping", "FileNotFoundError", "no-file", "a:ping"], (
            extra, r.describe())
    # The host's side is untouched.
    assert sorted(os.listdir(d)) == ["a.sock", "b.sock", "secret.txt"]


def test_what_a_caller_may_not_pass_is_refused(ws, sockdir, tmp_path):
    d, servers = sockdir
    servers.append(EchoServer(d / "ok.sock"))
    (d / "file").write_text("x")
    (d / "link.sock").symlink_to(d / "ok.sock")
    (d / "dirlink").symlink_to(d)
    bad = [
        (f"{d}/file:/run/x.sock", "not a unix socket"),
        (f"{d}/link.sock:/run/x.sock", "symbolic link"),
        (f"{d}/missing.sock:/run/x.sock", "No such file"),
        (f"/proc/self/root{d}/ok.sock:/run/x.sock", "/proc's links"),
        (f"{d}:/run/x.sock", "not a unix socket"),
        (f"{d}/ok.sock:/workspace/x.sock", "/workspace"),
        (f"{d}/ok.sock:/run/conch/ptc.sock", "/run/conch"),
        (f"{d}/ok.sock:/etc/x.sock", "/etc"),
        (f"{d}/ok.sock:/run", "hide"),
        (f"{d}/ok.sock:/run/../etc/x.sock", "'..'"),
        ("relative.sock:/run/x.sock", "absolute"),
        (f"{d}/ok.sock:/run/" + "a" * 120, "at most 107 bytes"),
    ]
    for spec, why in bad:
        r = run(ws, [spec], "echo ran")
        assert r.rc == 2 and "ran" not in r.stdout and why in r.stderr, (spec, r.describe())
    # A link in the directories above is followed (/var/run is one); the socket is still ours.
    r = run(ws, [f"{d}/dirlink/ok.sock:/run/x.sock"], "test -S /run/x.sock && echo ran")
    assert r.rc == 0 and r.stdout == "ran\n", r.describe()
    r = run(ws, [f"{d}/ok.sock:/run/x.sock", f"{d}/ok.sock:/run/x.sock"], "echo ran")
    assert r.rc == 2 and "overlap" in r.stderr, r.describe()
    r = run(ws, [f"{d}/ok.sock:/data/x.sock"], "echo ran", "--mount", "type=tmpfs,target=/data")
    assert r.rc == 2 and "ran" not in r.stdout, r.describe()
    r = run(ws, [f"{d}/ok.sock:/run/s{i}.sock" for i in range(9)], "echo ran")
    assert r.rc == 2 and "at most 8" in r.stderr, r.describe()
    # conch run: the daemon's control socket it would talk to, and what lies beside it.
    ctl = tmp_path / "ctl"
    ctl.mkdir(mode=0o700)
    servers.append(EchoServer(ctl / "conch.sock"))
    servers.append(EchoServer(ctl / "other.sock"))
    for s in ("conch.sock", "other.sock"):
        r = conch(["run", "--no-daemon", "--socket", str(ctl / "conch.sock"), "--workspace",
                   str(ws), "--pass-socket", f"{ctl}/{s}:/run/x.sock", "--", "echo", "ran"])
        assert r.rc == 2 and "ran" not in r.stdout and "conch's" in r.stderr, (s, r.describe())


@pytest.mark.root_only
def test_another_users_socket_is_refused_to_an_unprivileged_caller(ws):
    # conch as uid 65534 (a copy it can reach), naming root's socket: refused before anything
    # is built. The unprivileged pass checks that its own sockets work (the tests above).
    import tempfile
    from pathlib import Path
    base = Path(tempfile.mkdtemp(prefix="conch-sock-"))
    os.chmod(base, 0o755)
    binary = base / "conch"
    shutil.copy(CONCH_BIN, binary)
    os.chmod(binary, 0o755)
    srv = EchoServer(base / "root.sock")
    try:
        wsn = base / "ws"
        wsn.mkdir()
        os.chown(wsn, 65534, 65534)
        p = subprocess.run([str(binary), "run", "--no-daemon", "--workspace", str(wsn),
                            "--pass-socket", f"{base}/root.sock:/run/x.sock", "--", "echo", "ran"],
                           user=65534, group=65534, capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        assert p.returncode == 2 and "ran" not in p.stdout, (p.stdout, p.stderr)
        assert "owned by uid 0" in p.stderr, p.stderr
    finally:
        srv.close()
        shutil.rmtree(base, ignore_errors=True)


def test_daemon_sockets_are_checked_and_kept(daemon_factory, ws, sockdir):
    d, servers = sockdir
    servers.append(EchoServer(d / "db.sock", "db"))
    (ws / "client.py").write_text(CLIENT)
    dm = daemon_factory()
    c = dm.client()
    probe = "python3 client.py /run/db.sock"
    sb = c.call("sandbox.create", {"workspace": str(ws), "net": "none",
                                   "sockets": [{"host": str(d / "db.sock"), "path": "/run/db.sock"}]})
    assert sb["sockets"] == [{"host": str(d / "db.sock"), "path": "/run/db.sock"}], sb
    sb = sb["id"]
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == "db:ping\n"
    # A string form too, and in the allow mode.
    sb2 = c.call("sandbox.create", {"workspace": str(ws), "net": "allow",
                                    "sockets": [f"{d}/db.sock:/run/db.sock"]})["id"]
    assert c.call("exec.run", {"sandbox": sb2, "command": probe})["stdout"] == "db:ping\n"
    # Kept across a daemon restart and in a fork.
    dm.stop()
    dm.start()
    c = dm.client()
    c.call("sandbox.start", {"id": sb}, timeout=30)
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == "db:ping\n"
    f = c.call("sandbox.fork", {"sandbox": sb})["id"]
    assert c.call("exec.run", {"sandbox": f, "command": probe})["stdout"] == "db:ping\n"
    # What the daemon refuses: its own control socket, a socket in its socket dir or under
    # its state dir, and the refusals every caller gets.
    os.link(dm.sock, d / "hardlink.sock")  # the control socket under another name
    servers.append(EchoServer(os.path.join(dm.base, "beside.sock")))
    servers.append(EchoServer(os.path.join(dm.state_dir, "in-state.sock")))
    bad = [
        ([{"host": dm.sock, "path": "/run/x.sock"}], "control socket"),
        ([{"host": str(d / "hardlink.sock"), "path": "/run/x.sock"}], "control socket"),
        ([{"host": os.path.join(dm.base, "beside.sock"), "path": "/run/x.sock"}], "directory"),
        ([{"host": os.path.join(dm.state_dir, "in-state.sock"), "path": "/run/x.sock"}],
         "state directory"),
        ([{"host": str(d / "db.sock"), "path": "/workspace/x"}], "/workspace"),
        ([{"host": str(d / "db.sock")}], None),  # no path: the host path, which is fine
        ([{"host": f"/proc/self/root{d}/db.sock", "path": "/run/x"}], "/proc"),
        ([{"host": str(d / "db.sock"), "path": "/run/x", "extra": 1}], "{host, path?}"),
        ([7], "{host, path?}"),
        ("not-an-array", None),
    ]
    for socks, why in bad:
        if why is None and isinstance(socks, list):
            sbx = c.call("sandbox.create", {"workspace": str(ws), "sockets": socks})["id"]
            r = c.call("exec.run", {"sandbox": sbx, "command": f"python3 client.py {d}/db.sock"})
            assert r["stdout"] == "db:ping\n", r
            continue
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), "sockets": socks})
        assert ei.value.data_code == "invalid_params", (socks, ei.value)
        assert why is None or why in str(ei.value), (socks, why, str(ei.value))
    # The socket gone and back: a start without it fails and says why; with it, it works.
    servers[0].close()
    os.unlink(d / "db.sock")
    dm.stop()
    dm.start()
    c = dm.client()
    with pytest.raises(RpcError) as ei:
        c.call("sandbox.start", {"id": sb}, timeout=30)
    assert "db.sock" in str(ei.value), ei.value
    servers.append(EchoServer(d / "db.sock", "db2"))
    c.call("sandbox.start", {"id": sb}, timeout=30)
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == "db2:ping\n"


def test_mcp_passes_a_socket(sockdir, tmp_path):
    # conch mcp's session sandbox gets the socket, and its bash tool reaches it.
    import json
    d, servers = sockdir
    servers.append(EchoServer(d / "m.sock", "mcp"))
    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "bash", "arguments": {"command": "python3 -c \"" + CLIENT.replace(
             '"', '\\"') + "\" /run/m.sock"}}},
    ]
    p = subprocess.Popen([CONCH_BIN, "mcp", "--state-dir", str(tmp_path / "state"),
                          "--pass-socket", f"{d}/m.sock:/run/m.sock"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def send(*ms):
            p.stdin.write("".join(json.dumps(m) + "\n" for m in ms).encode())
            p.stdin.flush()

        def answer(i):
            while True:
                line = p.stdout.readline()
                assert line, p.stderr.read()
                m = json.loads(line)
                if m.get("id") == i:
                    return m

        send(msgs[0])
        assert "result" in answer(1)
        send(msgs[1], msgs[2])
        m = answer(2)
        text = "".join(c.get("text", "") for c in m["result"]["content"])
        assert "mcp:ping" in text, m
    finally:
        p.stdin.close()
        p.wait(timeout=60)


@pytest.mark.user_only
def test_a_real_ssh_agent_lists_its_key_inside(ws, tmp_path):
    # git over ssh's way in: the caller's ssh-agent, its key listed from inside. (As host root
    # ssh-agent refuses the sandbox's host uid as its peer: docs/ARCHITECTURE.md, "Network".)
    if not (shutil.which("ssh-agent") and shutil.which("ssh-add") and shutil.which("ssh-keygen")):
        pytest.skip("ssh-agent, ssh-add or ssh-keygen not installed")
    os.chmod(tmp_path, 0o700)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        key = tmp_path / "id"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "conch-test-key",
                        "-f", str(key)], check=True, timeout=60)
        subprocess.run(["ssh-add", "-q", str(key)], check=True, timeout=60,
                       env=dict(os.environ, SSH_AUTH_SOCK=str(sock)))
        r = run(ws, [f"{sock}:/run/ssh-agent.sock"], "ssh-add -l", "--env",
                "SSH_AUTH_SOCK=/run/ssh-agent.sock")
        assert r.rc == 0 and "conch-test-key" in r.stdout, r.describe()
    finally:
        agent.terminate()
        agent.wait(timeout=30)
