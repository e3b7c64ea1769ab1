# test_attack_today2.py - an outside attack on the features of issues 18 and 19 (path rules,
# host unix sockets passed in, `since`, the MCP snapshot tools), from a hostile command in a
# sandbox, a hostile MCP agent and a hostile caller. Two held not: conch mcp's fork and
# restore tools reached any snapshot of its daemon (one left in a shared --state-dir by
# another session, of another workspace or without this session's rules), and a bind mount
# whose source holds a rule's path showed it uncovered. The rest guard attacks that held.
import json
import os
import socket
import subprocess
import threading

import pytest

from conftest import CONCH_BIN, conch
from rpcclient import RpcError

SECRET = "s3cr3t-value"
HOOK = "#!/bin/sh\necho original hook\n"


def make_ws(ws):
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text(HOOK)
    (ws / ".env").write_text(f"TOKEN={SECRET}\n")
    (ws / "secrets").mkdir()
    (ws / "secrets" / "key").write_text(f"{SECRET}-key\n")
    (ws / "src").mkdir()
    (ws / "src" / "main.c").write_text("int main(void) { return 0; }\n")


def mcp_session(args, calls):
    """One `conch mcp` session: initialize, then each (tool, arguments); the result texts."""
    p = subprocess.Popen([CONCH_BIN, "mcp", *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def send(m):
            p.stdin.write((json.dumps(m) + "\n").encode())
            p.stdin.flush()

        def answer(i):
            while True:
                line = p.stdout.readline()
                assert line, p.stderr.read()
                m = json.loads(line)
                if m.get("id") == i:
                    return m

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}})
        assert "result" in answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        out = []
        for i, (name, a) in enumerate(calls):
            send({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                  "params": {"name": name, "arguments": a}})
            m = answer(10 + i)
            out.append((m["result"].get("isError"),
                        "".join(c.get("text", "") for c in m["result"]["content"])))
        return out
    finally:
        p.stdin.close()
        p.wait(timeout=60)


# ---- what broke ------------------------------------------------------------------------------

def test_mcp_fork_reaches_only_the_sessions_own_snapshots(tmp_path):
    # A state dir kept between sessions holds the sandboxes and snapshots of earlier ones:
    # one of another project, one of this project without the rule. The agent of a session
    # with --hidden .env names them by name (names are guessable) in its fork tool.
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".env").write_text(f"TOKEN={SECRET}\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "private.txt").write_text("OTHER PROJECT DATA\n")
    base = ["--state-dir", str(state)]
    mcp_session([*base, "--workspace", str(other)], [("snapshot", {"name": "other-base"})])
    # That session, without the rule, copied the secret: a restore would bring the copy.
    mcp_session([*base, "--workspace", str(ws)], [("bash", {"command": "cp .env copy.txt"}),
                                                  ("snapshot", {"name": "plain"})])
    out = mcp_session([*base, "--workspace", str(ws), "--hidden", ".env"], [
        ("bash", {"command": "cat .env"}),
        ("fork", {"snapshot": "plain"}),
        ("bash", {"command": "cat .env"}),
        ("fork", {"snapshot": "other-base"}),
        ("bash", {"command": "cat private.txt"}),
        ("restore", {"snapshot": "plain", "force": True}),
        ("bash", {"command": "cat copy.txt"}),
        ("snapshot", {"name": "mine"}),
        ("fork", {"snapshot": "mine"}),
        ("bash", {"command": "cat .env; echo in-own-fork > f"}),
        ("restore", {"snapshot": "mine", "force": True}),
        ("bash", {"command": "test -e f || echo restored-own"}),
    ])
    texts = "\n".join(t for _, t in out)
    assert SECRET not in texts and "OTHER PROJECT DATA" not in texts, out
    assert out[1][0] and "not one of sandbox" in out[1][1], out[1]
    assert out[3][0] and "not one of sandbox" in out[3][1], out[3]
    assert out[5][0] and "no snapshot 'plain' of this sandbox" in out[5][1], out[5]
    # Its own snapshots still fork and restore (the fork stands on "mine"), with its rule.
    assert not out[8][0] and "Forked" in out[8][1], out[8]
    assert "Permission denied" in out[9][1], out[9]
    assert not out[10][0] and "restored-own" in out[11][1], out[10:]


def test_daemon_fork_of_a_snapshot_named_with_its_sandbox_checks_it_is_that_sandboxs(
        daemon_factory, tmp_path):
    wa, wb = tmp_path / "a", tmp_path / "b"
    wa.mkdir()
    wb.mkdir()
    (wa / "a.txt").write_text("in a\n")
    c = daemon_factory().client()
    a = c.call("sandbox.create", {"workspace": str(wa)}, timeout=30)["id"]
    b = c.call("sandbox.create", {"workspace": str(wb), "hidden": ["x"]}, timeout=30)["id"]
    sa = c.call("workspace.snapshot", {"sandbox": a, "name": "sa"})["id"]
    sb1 = c.call("workspace.snapshot", {"sandbox": b, "name": "sb1"})["id"]
    with pytest.raises(RpcError) as ei:
        c.call("sandbox.fork", {"sandbox": b, "snapshot": sa}, timeout=30)
    assert ei.value.data_code == "invalid_params" and ei.value.data.get("param") == "snapshot"
    with pytest.raises(RpcError) as ei:
        c.call("sandbox.fork", {"sandbox": "sb-nope", "snapshot": sa}, timeout=30)
    assert ei.value.data_code == "sandbox_not_found", ei.value
    with pytest.raises(RpcError) as ei:
        c.call("sandbox.fork", {}, timeout=30)
    assert ei.value.data_code == "invalid_params", ei.value
    # Its own, and one its workspace stands on after a fork (the chain), are forked.
    f = c.call("sandbox.fork", {"sandbox": b, "snapshot": sb1}, timeout=30)
    assert f["snapshot"] == sb1, f
    f2 = c.call("sandbox.fork", {"sandbox": f["id"], "snapshot": "sb1"}, timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": f2, "command": "stat -c %a x"})
    assert r["stdout"] == "0\n", r  # the hidden rule came along
    # The caller of the API (trusted) may still fork any snapshot alone.
    g = c.call("sandbox.fork", {"snapshot": sa}, timeout=30)["id"]
    assert c.call("exec.run", {"sandbox": g, "command": "cat a.txt"})["stdout"] == "in a\n"


def test_a_bind_mount_showing_a_rule_path_is_refused(ws, tmp_path, daemon_factory):
    make_ws(ws)
    rules = ["--hidden", ".env", "--hidden", "secrets", "--readonly", ".git/hooks"]
    probe = ("cat /data/.env /data/ws/.env /data/key 2>/dev/null; "
             "echo evil > /data/pre-commit 2>/dev/null; echo ran")
    for src in (ws, ws.parent, ws / ".git", ws / "secrets", ws / ".git" / "hooks"):
        r = conch(["run", "--no-daemon", "--workspace", str(ws), *rules, "--mount",
                   f"type=bind,source={src},target=/data,rw", "--", "sh", "-c", probe])
        assert r.rc != 0 and "ran" not in r.stdout and SECRET not in r.stdout, (src, r.describe())
        assert "path rule" in r.stderr, (src, r.describe())
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == HOOK
    # A dir of the workspace that holds no rule's path is fine.
    r = conch(["run", "--no-daemon", "--workspace", str(ws), *rules, "--mount",
               f"type=bind,source={ws / 'src'},target=/data", "--", "ls", "/data"])
    assert r.rc == 0 and r.stdout == "main.c\n", r.describe()
    c = daemon_factory().client()
    with pytest.raises(RpcError) as ei:
        c.call("sandbox.create", {"workspace": str(ws), "hidden": [".env"],
                                  "mounts": [{"type": "bind", "source": str(ws), "target": "/data"}]},
               timeout=30)
    assert ei.value.data_code == "invalid_params" and "path rule" in str(ei.value), ei.value


# ---- what held: guards ---------------------------------------------------------------------

def test_file_methods_js_and_sessions_keep_the_rules(daemon_factory, ws):
    import base64
    make_ws(ws)
    os.symlink(".env", ws / "envlink")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "readonly": [".git/hooks"],
                                   "hidden": [".env", "secrets"]}, timeout=30)["id"]
    seen = []

    def attempt(method, params):
        try:
            seen.append((method, json.dumps(c.call(method, params, timeout=30))))
        except RpcError as e:
            seen.append((method, str(e)))

    for p in (".env", "/workspace/.env", "envlink", "secrets/key",
              "/proc/self/root/workspace/.env", "/proc/1/root/workspace/.env"):
        attempt("fs.read", {"sandbox": sb, "path": p})
    attempt("fs.download", {"sandbox": sb, "paths": [".env", "secrets", "envlink"]})
    attempt("fs.grep", {"sandbox": sb, "pattern": "s3cr3t"})
    attempt("fs.grep", {"sandbox": sb, "pattern": "s3cr3t", "path": "secrets"})
    attempt("fs.glob", {"sandbox": sb, "pattern": "secrets/*"})
    attempt("fs.ls", {"sandbox": sb, "path": "secrets"})
    attempt("fs.write", {"sandbox": sb, "path": ".git/hooks/pre-commit", "content": "evil"})
    attempt("fs.write", {"sandbox": sb, "path": ".git/hooks/post-checkout", "content": "evil"})
    attempt("fs.edit", {"sandbox": sb, "path": ".git/hooks/pre-commit",
                        "old_string": "original", "new_string": "evil"})
    evil = base64.b64encode(b"evil").decode()
    attempt("fs.upload", {"sandbox": sb, "files": [
        {"path": ".git/hooks/pre-commit", "content": evil}, {"path": ".env", "content": evil},
        {"path": "secrets/new", "content": evil}]})
    attempt("fs.delete", {"sandbox": sb, "path": ".git/hooks", "recursive": True})
    attempt("fs.delete", {"sandbox": sb, "path": "secrets", "recursive": True})
    with pytest.raises(RpcError) as ei:  # a clear error, not an internal one
        c.call("fs.delete", {"sandbox": sb, "path": ".env"})
    assert ei.value.data_code == "permission_denied" and "path rule" in str(ei.value), ei.value
    attempt("js.eval", {"sandbox": sb, "code": "readFile('/workspace/.env')"})
    attempt("js.eval", {"sandbox": sb, "code": "readFile('envlink')"})
    attempt("js.eval", {"sandbox": sb,
                        "code": "writeFile('/workspace/.git/hooks/pre-commit', 'evil')"})
    ses = c.call("session.open", {"sandbox": sb})["session"]
    attempt("session.run", {"session": ses, "command":
                            "cat .env secrets/key envlink; echo evil > .git/hooks/pre-commit"})
    assert not [s for s in seen if SECRET in s[1]], seen
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == HOOK
    assert sorted(os.listdir(ws / ".git" / "hooks")) == ["pre-commit"]
    assert os.listdir(ws / "secrets") == ["key"]
    # Nothing of that reached the upper dir either: no change is listed, none is committed.
    ch = c.call("workspace.changes", {"sandbox": sb})["changes"]
    assert [x for x in ch if "skip" not in x] == [], ch
    c.call("workspace.commit", {"sandbox": sb}, timeout=60)
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == HOOK
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n"


# The mount API, handles and namespaces from inside: each prints its errno name.
SYSCALLS = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *a):
    r = libc.syscall(nr, *a)
    print(name, "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
F = -100
buf = ctypes.create_string_buffer(256)
sc("open_tree", 428, F, b"/workspace/.env", 1 | 0x80000)
sc("open_tree_dir", 428, F, b"/workspace", 1 | 0x8000)
sc("fsopen", 430, b"tmpfs", 0)
sc("fspick", 433, F, b"/workspace/.git/hooks", 0)
sc("move_mount", 429, F, b"/workspace/.env", F, b"/tmp", 4)
sc("mount_setattr", 442, F, b"/workspace/.git/hooks", 0, buf, 32)
sc("umount2", 166, b"/workspace/.env", 2)
sc("name_to_handle_at", 303, F, b"/workspace/src", buf, ctypes.byref(ctypes.c_int()), 0)
sc("open_by_handle_at", 304, F, buf, 0)
sc("unshare", 272, 0x00020000 | 0x10000000)
sc("pivot_root", 155, b"/tmp", b"/tmp")
"""


@pytest.mark.parametrize("as_root", [False, True], ids=["agent", "root"])
def test_the_mount_api_and_handles_are_refused_inside(ws, as_root):
    make_ws(ws)
    (ws / "sc.py").write_text(SYSCALLS)
    extra = ["--as-root"] if as_root else []
    r = conch(["run", "--no-daemon", "--workspace", str(ws), "--hidden", ".env", "--readonly",
               ".git/hooks", *extra, "--", "sh", "-c",
               "python3 sc.py; cat .env; echo evil > .git/hooks/pre-commit; cat .git/hooks/pre-commit"])
    lines = dict(l.split(" ", 1) for l in r.stdout.splitlines() if " " in l and l.split()[0].islower())
    names = ["open_tree", "open_tree_dir", "fsopen", "fspick", "move_mount", "mount_setattr",
             "umount2", "name_to_handle_at", "open_by_handle_at", "unshare", "pivot_root"]
    assert [n for n in names if lines.get(n) == "OK"] == [], r.describe()
    assert SECRET not in r.stdout and r.stdout.endswith(HOOK), r.describe()


def test_changes_and_diff_follow_no_host_symlink_into_a_rule(daemon_factory, ws, tmp_path):
    # Host symlinks to the hidden file and dir and out of the workspace: the sandbox replaces
    # them with dirs and files of the same names; neither the changes nor the diffs (plain and
    # since a snapshot) read through the host's links.
    make_ws(ws)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text(f"OUTSIDE {SECRET}\n")
    os.symlink(".env", ws / "envlink")
    os.symlink("secrets", ws / "cfg")
    os.symlink(str(outside), ws / "abs")
    c = daemon_factory().client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "hidden": [".env", "secrets"]},
                timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": sb, "command":
                            "rm envlink cfg abs; echo n > envlink; mkdir cfg abs; "
                            "echo x > cfg/key; echo y > abs/f"})
    assert r["exit_code"] == 0, r
    snap = c.call("workspace.snapshot", {"sandbox": sb})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "echo z >> cfg/key; echo w >> abs/f"})
    got = [c.call("workspace.changes", {"sandbox": sb}), c.call("workspace.diff", {"sandbox": sb}),
           c.call("workspace.changes", {"sandbox": sb, "since": snap}),
           c.call("workspace.diff", {"sandbox": sb, "since": snap})]
    assert SECRET not in json.dumps(got), got
    kinds = {ch["path"]: ch["kind"] for ch in got[0]["changes"]}
    assert kinds["cfg/key"] == "added" and kinds["abs/f"] == "added", kinds


@pytest.fixture
def echo_sock(tmp_path):
    path = tmp_path / "e.sock"
    os.chmod(tmp_path, 0o755)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(8)

    def serve():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"host-echo")

    threading.Thread(target=serve, daemon=True).start()
    yield path
    s.close()


def test_a_passed_socket_never_shadows_the_tool_bridge(daemon_factory, ws, echo_sock):
    # /var/run is a link to /run on the host; in the sandbox it is a dir of the root tmpfs,
    # so /var/run/conch/ptc.sock is a new file and the tool bridge at /run/conch/ptc.sock stays.
    c = daemon_factory().client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "sockets": [
        f"{echo_sock}:/var/run/conch/ptc.sock", f"{echo_sock}:/home/agent/x/y.sock"]},
        timeout=30)["id"]
    probe = ("import socket\n"
             "for p in ['/var/run/conch/ptc.sock', '/home/agent/x/y.sock', '/run/conch/ptc.sock']:\n"
             "    s = socket.socket(socket.AF_UNIX); s.settimeout(1); s.connect(p)\n"
             "    try: print(p, s.recv(9))\n"
             "    except OSError as e: print(p, type(e).__name__)\n")
    (ws / "probe.py").write_text(probe)
    r = c.call("exec.run", {"sandbox": sb, "command": "python3 probe.py"}, timeout=30)
    lines = r["stdout"].splitlines() + ["", "", ""]
    assert lines[0] == "/var/run/conch/ptc.sock b'host-echo'", (r["stdout"], r["stderr"])
    assert lines[1] == "/home/agent/x/y.sock b'host-echo'", r
    assert lines[2].startswith("/run/conch/ptc.sock") and "host-echo" not in lines[2], r
    for inside in ("/lib/x.sock", "/bin/x.sock", "/usr/x.sock", "/etc/x.sock", "/run/conch/x",
                   "/proc/x", "/workspace/x", "/dev/x"):
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), "sockets": [f"{echo_sock}:{inside}"]})
        assert ei.value.data_code == "invalid_params", (inside, ei.value)


def test_a_socket_swapped_for_a_link_or_another_socket_before_a_restart(daemon_factory, ws,
                                                                         echo_sock, tmp_path):
    # The host path is swapped after creation: for a symlink to the daemon's control socket
    # (refused at start), then for a hard link of it (refused by its identity), then for a
    # socket of the caller's again (taken).
    d = daemon_factory()
    c = d.client()
    path = tmp_path / "swap.sock"
    os.link(echo_sock, path)
    sb = c.call("sandbox.create", {"workspace": str(ws), "sockets": [f"{path}:/run/s.sock"]},
                timeout=30)["id"]
    for swap in ("symlink", "hardlink"):
        d.stop()  # the sandbox is stopped; sandbox.start checks the socket again
        os.unlink(path)
        (os.symlink if swap == "symlink" else os.link)(d.sock if swap == "symlink" else echo_sock,
                                                       path)
        d.start()
        c = d.client()
        if swap == "hardlink":  # the control socket is made anew at each daemon start
            os.unlink(path)
            os.link(d.sock, path)
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.start", {"id": sb}, timeout=30)
        assert "swap.sock" in str(ei.value), (swap, ei.value)
    os.unlink(path)
    os.link(echo_sock, path)
    c.call("sandbox.start", {"id": sb}, timeout=30)
    (ws / "p.py").write_text("import socket\ns = socket.socket(socket.AF_UNIX)\n"
                             "s.connect('/run/s.sock'); print(s.recv(9).decode())\n")
    assert c.call("exec.run", {"sandbox": sb, "command": "python3 p.py"})["stdout"] == "host-echo\n"


def test_a_diff_never_shows_a_hidden_file(daemon_factory, ws):
    # A change at a hidden path cannot be made inside, but can come with a layer: here the
    # caller restores a snapshot of a sandbox without the rule (same workspace) into one with
    # it. The diff's old side would be the host's hidden file: it is not read (plain, for
    # listed paths, and since a snapshot), the change is listed with its skip reason, and a
    # commit leaves it out.
    make_ws(ws)
    c = daemon_factory().client()
    a = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": a, "command":
                            "echo TOKEN=changed > .env; echo new > secrets/key; echo ok > src/x.c"})
    assert r["exit_code"] == 0, r
    c.call("workspace.snapshot", {"sandbox": a, "name": "from-a"})
    b = c.call("sandbox.create", {"workspace": str(ws), "hidden": [".env", "secrets"]},
               timeout=30)["id"]
    base = c.call("workspace.snapshot", {"sandbox": b, "name": "b-base"})["id"]
    c.call("workspace.restore", {"sandbox": b, "snapshot": "from-a", "force": True}, timeout=30)
    got = [c.call("workspace.diff", {"sandbox": b}),
           c.call("workspace.diff", {"sandbox": b, "paths": [".env", "secrets/key"]})]
    assert SECRET not in json.dumps(got), got
    files = {f["path"]: f for f in got[0]["files"]}
    assert "hidden path" in files[".env"]["diff"] and "hidden path" in files["secrets/key"]["diff"]
    assert "+ok" in files["src/x.c"]["diff"], files
    listed = {ch["path"]: ch for ch in c.call("workspace.changes", {"sandbox": b})["changes"]}
    assert "hidden" in listed[".env"]["skip"], listed
    res = c.call("workspace.commit", {"sandbox": b}, timeout=60)
    assert ".env" in {s["path"] for s in res["skipped"]}, res
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n"
    assert (ws / "secrets" / "key").read_text() == f"{SECRET}-key\n"
    # since: b-base is not under b any more (restored away), a's snapshot is not b's.
    for since in (base, "from-a"):
        try:
            d = c.call("workspace.diff", {"sandbox": b, "since": since})
            assert SECRET not in json.dumps(d), d
        except RpcError as e:
            assert e.data_code == "invalid_params", e
