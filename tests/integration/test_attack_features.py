# test_attack_features.py - an outsider's attacks on the three features of issues 18 and 19
# and on js.eval's tool calls, from the docs only: the network proxy (internal addresses
# reached through a suffix rule, IP literals in every spelling, deny rules dodged by case,
# dots and escapes, user information, ports, header smuggling, pipelining), extra mounts
# (targets over the sandbox's own trees, sizes, set-id bits on a rw bind), snapshots and
# forks (forged ids, another workspace's snapshot, forks writing each other's files, a
# commit sharing a frozen layer's files) and tool calls (a command forging the JS origin, an
# eval reaching another sandbox's tools). What held is an ordinary test; a hole is a strict
# xfail describing it (remove the marker once fixed).
import http.server
import json
import os
import socket
import threading

import pytest

from rpcclient import RpcError

pytestmark = [pytest.mark.jail, pytest.mark.daemon_code]


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers every GET with REACHED, the path and the Host headers it saw; keeps the
    connection open (HTTP/1.1) unless the request said Connection: close."""
    protocol_version = "HTTP/1.1"
    seen = None

    def do_GET(self):
        self.seen.append(self.path)
        body = f"REACHED {self.path} host={self.headers.get_all('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def upstream():
    seen = []
    handler = type("H", (_Upstream,), {"seen": seen})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1], seen
    srv.shutdown()


@pytest.fixture
def netd(daemon_factory, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 registry.test other.test bad.pkg.test\n"
                     "0.0.0.0 zero.pkg.test\n::ffff:127.0.0.1 mapped.pkg.test\n"
                     ":: unspec.pkg.test\n::1 six.pkg.test\n")
    return daemon_factory(extra_args=["--pool", "0", "--net-hosts", str(hosts)])


def run(rpc, sb, command, stdin=None, timeout=60):
    params = {"sandbox": sb, "command": command, "timeout": timeout}
    if stdin is not None:
        params["stdin"] = stdin
    return rpc.call("exec.run", params, timeout=timeout + 30)


# Run inside: each attack is raw bytes to the proxy; prints {name: what came back}.
RAW = r'''
import json, socket, sys
H = int(sys.argv[1])
A, O = f"registry.test:{H}", f"other.test:{H}"
def raw(data):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(data)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except OSError as e:
        out += b"<" + str(e).encode() + b">"
    s.close()
    return out.decode(errors="replace")
def get(target, extra=""):
    return raw(f"GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
def connect(target):
    return raw(f"CONNECT {target} HTTP/1.1\r\n\r\nGET /tunnel HTTP/1.0\r\n\r\n".encode())
out = {"get " + t: get(t) for t in (
    # a suffix rule does not reach internal addresses, however the name resolves
    f"http://zero.pkg.test:{H}/", f"http://mapped.pkg.test:{H}/",
    f"http://unspec.pkg.test:{H}/", f"http://six.pkg.test:{H}/",
    f"http://evilpkg.test:{H}/",
    # the deny rule, dodged by case, dots and escapes
    f"http://BAD.PKG.TEST:{H}/", f"http://bad.pkg.test.:{H}/", f"http://bad.pkg.test..:{H}/",
    f"http://bad%2epkg.test:{H}/",
    # user information, fragments and backslashes that make two hosts of one target
    f"http://{A}@127.0.0.1:{H}/", f"http://x@bad.pkg.test:{H}/",
    f"http://127.0.0.1:{H}#@{A}/", f"http://{A}\\@127.0.0.1:{H}/",
    # ports that wrap or read otherwise
    f"http://registry.test:{H + 65536}/", f"http://registry.test:0{H}/",
    # IP literals in every spelling, and loopback names
    f"http://[::1]:{H}/", f"http://[::ffff:127.0.0.1]:{H}/", f"http://2130706433:{H}/",
    f"http://127.1:{H}/", f"http://0.0.0.0:{H}/", f"http://0:{H}/", f"http://localhost:{H}/",
    f"http://{A}\x00.evil/", "/")}
for t in (f"127.0.0.1:{H}", f"[::1]:{H}", f"[::ffff:127.0.0.1]:{H}", f"2130706433:{H}",
          f"zero.pkg.test:{H}", f"mapped.pkg.test:{H}", f"unspec.pkg.test:{H}",
          f"bad.pkg.test.:{H}", f"BAD.pkg.test:{H}", "registry.test", f"x@{A}", f"{A} x"):
    out["connect " + t] = connect(t)
# smuggling: folding, CR/LF in the target, origin form with an allowed Host
out["fold"] = raw(f"GET http://{A}/x HTTP/1.1\r\nX-a: b\r\n Host: {O}\r\n\r\n".encode())
out["lf target"] = raw(f"GET http://{A}/x\nHost: {O} HTTP/1.1\r\n\r\n".encode())
out["cr target"] = raw(f"GET http://{A}/x\rHost: {O} HTTP/1.1\r\n\r\n".encode())
out["origin form"] = raw(f"GET / HTTP/1.1\r\nHost: {A}\r\n\r\n".encode())
# allowed, but with a forged Host twice, or lines ending in bare LF: Host is the target's
ok = {}
ok["two hosts"] = raw(f"GET http://{A}/two-hosts HTTP/1.1\r\nHost: {O}\r\nHost: {O}\r\n\r\n".encode())
ok["bare lf"] = raw(f"GET http://{A}/bare-lf HTTP/1.1\nHost: {O}\n\n".encode())
# pipelined after an allowed request: Connection: close upstream ends it after the first
ok["pipelined"] = raw(f"GET http://{A}/first HTTP/1.1\r\nHost: {A}\r\n\r\n"
                      f"GET http://{O}/second HTTP/1.1\r\nHost: {O}\r\n\r\n".encode())
# and what else a sandbox might try: DNS, UDP, raw sockets, the host's loopback directly
try:
    socket.getaddrinfo("registry.test", 80); ok["dns"] = "resolved"
except OSError:
    ok["dns"] = "failed"
try:
    socket.create_connection(("127.0.0.1", H), timeout=3).close(); ok["direct"] = "connected"
except OSError as e:
    ok["direct"] = str(e)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)); ok["udp"] = "sent"
except OSError as e:
    ok["udp"] = str(e)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); ok["raw"] = "opened"
except OSError as e:
    ok["raw"] = str(e)
print(json.dumps({"refused": out, "ok": ok}))
'''


def test_the_proxy_refuses_every_spelling_of_an_unallowed_target(netd, upstream):
    h, seen = upstream
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}", f"*.pkg.test:{h}"],
                                     "deny": ["bad.pkg.test"]})["id"]
    r = run(rpc, sb, f"python3 - {h}", stdin=RAW, timeout=120)
    assert r["exit_code"] == 0, r
    o = json.loads(r["stdout"])
    for name, got in o["refused"].items():
        assert "REACHED" not in got, (name, got)
        assert got.startswith(("HTTP/1.1 403 ", "HTTP/1.1 400 ")), (name, got)
    # internal addresses behind a suffix rule are named as such, deny rules as deny rules
    for n in ("zero", "mapped", "unspec", "six"):
        assert "resolves to an internal address" in o["refused"][f"get http://{n}.pkg.test:{h}/"]
    for t in (f"http://BAD.PKG.TEST:{h}/", f"http://bad.pkg.test.:{h}/",
              f"http://bad.pkg.test..:{h}/"):
        assert "denied by rule 'bad.pkg.test'" in o["refused"]["get " + t], t
    ok = o["ok"]
    assert ok["two hosts"].endswith(f"REACHED /two-hosts host=['registry.test:{h}']"), ok
    assert ok["bare lf"].endswith(f"REACHED /bare-lf host=['registry.test:{h}']"), ok
    assert f"REACHED /first host=['registry.test:{h}']" in ok["pipelined"], ok
    assert "REACHED" not in ok["pipelined"].split("REACHED /first", 1)[1], ok
    assert ok["dns"] == "failed" and ok["direct"] != "connected", ok
    assert ok["udp"] != "sent" and ok["raw"] != "opened", ok
    # the upstream saw the allowed requests only (the CONNECT to registry.test without a
    # port is malformed, so no tunnel was ever opened)
    assert sorted(seen) == ["/bare-lf", "/first", "/two-hosts"], seen


PIPELINE = r'''
import socket, sys
H = int(sys.argv[1])
A, O = f"registry.test:{H}", f"other.test:{H}"
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(f"GET http://{A}/first HTTP/1.1\r\nHost: {A}\r\nconnection : keep-alive\r\n\r\n"
          f"GET http://{O}/second HTTP/1.1\r\nHost: {O}\r\n\r\n".encode())
out = b""
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
except OSError:
    pass
print(out.decode(errors="replace"))
'''


# Found here and fixed (net/http.c): a header line with whitespace before its colon
# ('connection : keep-alive') was passed on; Python's http.server stops reading the head
# there, never saw the Host and Connection: close the proxy appends, kept the connection
# and served the pipelined request for other.test (no rule allows it), unchecked.
def test_a_pipelined_request_behind_a_malformed_header_never_reaches_upstream(netd, upstream):
    h, seen = upstream
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}"]})["id"]
    r = run(rpc, sb, f"python3 - {h}", stdin=PIPELINE, timeout=60)
    assert r["exit_code"] == 0, r
    assert not [p for p in seen if "second" in p], seen
    assert "other.test" not in r["stdout"], r["stdout"]
    assert r["stdout"].startswith("HTTP/1.1 400 ") and "malformed header line" in r["stdout"], r


SETID = r'''
cp /bin/true /opt/src/suid; chmod 4755 /opt/src/suid || echo refused-suid
mkdir /opt/src/d; chmod 2777 /opt/src/d || echo refused-sgid
cp /bin/true /workspace/suid; chmod 4755 /workspace/suid || echo refused-ws
ls /run/conch/ptc.sock && echo still-there
'''


def test_mounts_snapshots_and_tool_calls_hold(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--pool", "0"])
    rpc = d.client()
    os.chmod(tmp_path, 0o755)
    src, ws, ws2 = tmp_path / "src", tmp_path / "ws", tmp_path / "ws2"
    for p in (src, ws, ws2):
        p.mkdir()
        os.chmod(p, 0o755)
    (ws / "f").write_text("orig\n")
    (ws2 / "f").write_text("other\n")

    # --- mounts: targets over the sandbox's own trees, sizes out of range
    def refused(params, param="mounts"):
        with pytest.raises(RpcError) as e:
            rpc.call("sandbox.create", params)
        assert e.value.code == -32602, e.value
        return str(e.value)
    for t in ("/lib64", "/lib/x86_64-linux-gnu", "/bin", "/sbin", "/var", "/home", "/var/tmp",
              "/opt//x", "/opt/./x", "/mnt/", "/run/conch", "/proc/self", "/workspace/x"):
        refused({"mounts": [{"type": "tmpfs", "target": t}]})
    for sz in (0, "0k", "1k", "-1", "100%", "1e12", "4096t", "18446744073709551616",
               "1m,nr_inodes=0", 1.5, -1):
        refused({"mounts": [{"type": "tmpfs", "target": "/opt/t", "size": sz}]})
    # /var/run is a link to /run on the host: a mount there must not hide conch's socket;
    # a rw bind of a root-owned dir and an rw workspace do not take set-id bits
    sb = rpc.call("sandbox.create", {
        "workspace": str(ws2), "mode": "rw",
        "mounts": [{"type": "tmpfs", "target": "/var/run/conch", "size": "1m"},
                   {"type": "bind", "source": str(src), "target": "/opt/src", "readonly": False}]})["id"]
    r = run(rpc, sb, SETID)
    assert "refused-suid" in r["stdout"] and "refused-sgid" in r["stdout"], r
    assert "refused-ws" in r["stdout"] and "still-there" in r["stdout"], r
    for p in (src / "suid", src / "d", ws2 / "suid"):
        assert not os.stat(p).st_mode & 0o6000, p
    rpc.call("sandbox.destroy", {"id": sb})

    # --- snapshots: forged ids, another workspace, modes without layers, in-use deletes
    a = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    r = run(rpc, a, "echo snap1 > /workspace/f; echo new > /workspace/n; "
                    "ln -s /etc/shadow /workspace/sh; ln -s /etc /workspace/etc")
    assert r["exit_code"] == 0, r
    s1 = rpc.call("workspace.snapshot", {"sandbox": a})["id"]
    for bad in ("../layers", "snap-../../x", "snap-aaaaaaaa/..", "/etc", "", s1 + "/",
                s1 + "/../" + s1):
        for m, p in (("workspace.restore", {"sandbox": a, "snapshot": bad}),
                     ("workspace.snapshot_delete", {"snapshot": bad}),
                     ("sandbox.fork", {"snapshot": bad})):
            with pytest.raises(RpcError) as e:
                rpc.call(m, p)
            assert e.value.code == -32007, (m, bad, e.value)
    other = rpc.call("sandbox.create", {"workspace": str(ws2)})["id"]
    with pytest.raises(RpcError) as e:
        rpc.call("workspace.restore", {"sandbox": other, "snapshot": s1})
    assert "fork it instead" in str(e.value), e.value
    for spec in ({}, {"workspace": str(ws2), "mode": "rw"}, {"workspace": str(ws2), "mode": "ro"}):
        nows = rpc.call("sandbox.create", spec)["id"]
        with pytest.raises(RpcError) as e:
            rpc.call("workspace.snapshot", {"sandbox": nows})
        assert "mode overlay" in str(e.value), e.value
    b = rpc.call("sandbox.fork", {"snapshot": s1})["id"]
    with pytest.raises(RpcError) as e:
        rpc.call("workspace.snapshot_delete", {"snapshot": s1})
    assert e.value.code == -32008 and b in str(e.value), e.value

    # forks: B writes in place, through a hard link, and removes; A and the layer keep theirs
    r = run(rpc, b, "echo forkB >> /workspace/f; ln /workspace/n /workspace/n2 && "
                    "echo viaLink >> /workspace/n2; rm /workspace/sh; cat /workspace/sh 2>&1")
    assert "forkB" not in r["stdout"] and "root:" not in r["stdout"], r
    r = run(rpc, a, "cat /workspace/f /workspace/n; ls /workspace")
    assert r["stdout"].split("\n")[:2] == ["snap1", "new"] and "n2" not in r["stdout"], r
    assert "sh" in r["stdout"].split(), r
    # the layer's symlinks stay links in changes and diff: no host file is read through them
    diff = rpc.call("workspace.diff", {"sandbox": a})["diff"]
    assert "root:" not in diff and "+/etc/shadow" in diff, diff
    # a commit, then the host edits its copy: the snapshot (restore, fork) keeps its content
    rpc.call("workspace.commit", {"sandbox": a})
    assert (ws / "f").read_text() == "snap1\n"
    with open(ws / "f", "a") as f:
        f.write("HOSTEDIT\n")
    with open(ws / "n", "a") as f:
        f.write("HOSTEDIT\n")
    rpc.call("workspace.restore", {"sandbox": a, "snapshot": s1})
    c = rpc.call("sandbox.fork", {"snapshot": s1})["id"]
    for sb in (a, c):
        r = run(rpc, sb, "cat /workspace/f /workspace/n")
        assert r["stdout"] == "snap1\nnew\n", (sb, r)

    # --- tool calls: a command cannot pass as JS, JS cannot reach another sandbox's tools
    t = d.client()
    calls = []
    t.handlers["tool.call"] = lambda p: (calls.append((p["sandbox"], p["name"], p["origin"])),
                                         {"sandbox": p["sandbox"]})[1]
    t.call("tools.register", {"sandbox": a, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
    t.call("tools.register", {"sandbox": b, "tools": [{"name": "secret", "input_schema": {"type": "object"}}]})
    r = rpc.call("js.eval", {"sandbox": a, "code": "await tools.echo({}); let s; try { s = await tools.secret({}) } "
                             "catch (e) { s = String(e) }; [Object.keys(tools), s]"}, timeout=60)
    assert r["value"][0] == ["echo"] and "not a function" in r["value"][1], r
    forge = ("import json, socket\n"
             "s = socket.socket(socket.AF_UNIX); s.connect('/run/conch/ptc.sock'); f = s.makefile('rwb')\n"
             f"for i, x in enumerate([{{'origin': {{'kind': 'js', 'id': 'default'}}}}, {{'sandbox': '{b}', 'name': 'secret'}}, {{'kind': 'js', 'session': 'default'}}]):\n"
             "    m = {'id': i, 'op': 'call', 'name': 'echo', 'input': {}}; m.update(x)\n"
             "    f.write((json.dumps(m) + '\\n').encode()); f.flush(); print(f.readline().decode().strip())\n")
    r = run(rpc, a, "python3 -", stdin=forge)
    assert r["exit_code"] == 0, r
    answers = [json.loads(line) for line in r["stdout"].splitlines()]
    assert answers[1]["error"]["kind"] == "unknown_tool", answers
    assert all(s == a for s, _, _ in calls) and all(n == "echo" for _, n, _ in calls), calls
    assert [o["kind"] for _, _, o in calls] == ["js", "exec", "exec"], calls
    traced = rpc.call("tools.trace", {"sandbox": a, "origin": {"kind": "js", "id": "default"}})
    assert len(traced["calls"]) == 1, traced


STATE = r'''
import os, socket, sys
db, sock = sys.argv[1:]
try:
    open(db, "r+b").close()
    print("WRITABLE", db)
except OSError as e:
    print("refused", db, e.errno)
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
try:
    s.connect(sock)
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n')
    got = s.recv(4096)
    print("ANSWERED" if b'"result"' in got else "refused", sock, got[:80])
except OSError as e:
    print("refused", sock, e)
'''


# Found by the outside attack: a bind source or workspace that held the daemon's own state
# dir was accepted; with rw, the agent opened <state>/state.db for writing and rewrote its own
# record (a rw bind of /tmp/x and net: host), which the daemon trusted at its next start. Now
# a bind source or workspace that is, holds or lies beneath the state dir or the socket's
# directory is refused at create (and in a record read at start).
def test_a_bind_of_the_daemons_own_state_is_refused(daemon_factory):
    d = daemon_factory(extra_args=["--pool", "0"])
    rpc = d.client()
    db = "state/state.db"
    assert os.path.exists(os.path.join(d.base, db))
    outcomes = []
    for spec, inside in (
            ({"mounts": [{"type": "bind", "source": d.base, "target": "/opt/base",
                          "readonly": False}]}, "/opt/base"),
            ({"workspace": d.base, "mode": "rw"}, "/workspace")):
        try:
            sb = rpc.call("sandbox.create", spec)["id"]
        except RpcError as e:
            assert e.code == -32602, e
            outcomes.append("refused at create")
            continue
        r = run(rpc, sb, f"python3 - {inside}/{db} {inside}/conch.sock", stdin=STATE)
        assert r["exit_code"] == 0, r
        outcomes += r["stdout"].splitlines()
    assert not [o for o in outcomes if o.startswith(("WRITABLE", "ANSWERED"))], outcomes


# Found by the outside attack: unprivileged, a sandbox's agent is the daemon's own uid, so a
# bind (or a workspace) of the directory holding the control socket let a command connect and
# drive the daemon (sandbox.create {net: host} answered). The socket now refuses a peer in
# another user namespace; a bind of that directory is refused as well (the state-dir test).
def test_a_sandbox_cannot_drive_the_daemon_through_its_socket(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--pool", "0"], state_dir=str(tmp_path / "state"))
    rpc = d.client()
    # a bind of the socket's own directory is refused now; a hard link of the socket in a
    # directory of the harness's still shows it to the sandbox
    expose = tmp_path / "expose"
    expose.mkdir()
    os.link(d.sock, expose / "conch.sock")
    with pytest.raises(RpcError):
        rpc.call("sandbox.create", {"mounts": [{"type": "bind", "source": d.base,
                                                "target": "/opt/ctl"}]})
    sb = rpc.call("sandbox.create", {"mounts": [{"type": "bind", "source": str(expose),
                                                 "target": "/opt/ctl"}]})["id"]
    probe = ("import socket\ns = socket.socket(socket.AF_UNIX); s.settimeout(10)\n"
             "try:\n    s.connect('/opt/ctl/conch.sock')\n"
             "    s.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"sandbox.create\","
             "\"params\":{\"net\":\"host\"}}\\n')\n    print(s.recv(4096))\n"
             "except OSError as e:\n    print('refused', e)\n")
    r = run(rpc, sb, "python3 -", stdin=probe)
    assert r["exit_code"] == 0, r
    assert '"result"' not in r["stdout"], r["stdout"]
    assert [x["id"] for x in rpc.call("sandbox.list", {})["sandboxes"]] == [sb]


TUNNEL = r'''
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(f"CONNECT registry.test:{sys.argv[1]} HTTP/1.1\r\n\r\n".encode())
print(s.recv(100).decode().split("\r\n")[0], flush=True)
while not os.path.exists("/tmp/go"):
    time.sleep(0.05)
try:
    s.sendall(b"GET /after-none HTTP/1.1\r\nHost: x\r\n\r\n")
    print(s.recv(300).decode(errors="replace"))
except OSError as e:
    print("closed", e)
'''


# Found by the outside attack: network.set {net: none} left a CONNECT tunnel opened before
# it carrying requests; now the connections the new policy refuses are closed.
def test_network_set_none_ends_open_tunnels(netd, upstream):
    h, seen = upstream
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}"]})["id"]
    job = rpc.call("job.start", {"sandbox": sb, "command": f"python3 -c '{TUNNEL}' {h}"})["job_id"]
    for _ in range(300):
        recs = rpc.call("network.log", {"sandbox": sb})["records"]
        if any(x.get("open") and x["allowed"] for x in recs):
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail(f"the tunnel never opened: {recs}")
    rpc.call("network.set", {"sandbox": sb, "net": "none"})
    run(rpc, sb, "touch /tmp/go")
    rpc.call("job.wait", {"job_id": job, "timeout": 30}, timeout=40)
    out = rpc.call("job.output", {"job_id": job})["stdout"]
    assert out.startswith("HTTP/1.1 200 Connection established"), out
    assert "REACHED" not in out and "/after-none" not in seen, (out, seen)
