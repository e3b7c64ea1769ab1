# test_network.py - a sandbox's network (issue 19): none (loopback only) stays the default;
# allow reaches only what the policy names, through the daemon's proxy (HTTP and CONNECT),
# with names resolved by the proxy (a hosts file points registry names at loopback servers
# here), deny winning, IP literals and internal addresses refused, every attempt recorded in
# the command's result and network.log, the policy changeable on a live sandbox; host shares
# the host's network and says so. And the attacks: a 1 MiB request line, slowloris heads,
# 1000 connections, CONNECT to a denied port, a name resolving to 127.0.0.1.
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import CONCH_BIN

pytestmark = [pytest.mark.jail, pytest.mark.daemon_code]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/big/"):  # /big/N: N bytes, written as fast as they go
            n = int(self.path[5:])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while n > 0:
                    self.wfile.write(chunk[:min(n, len(chunk))])
                    n -= len(chunk)
            except OSError:
                pass
            return
        body = f"registry says hi for {self.path} host={self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _serve(tls_dir=None):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    if tls_dir:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem"))
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A plain HTTP and an HTTPS server on the host's loopback (self-signed certificate)."""
    d = tmp_path_factory.mktemp("tls")
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed for the HTTPS stand-in")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "1", "-subj",
                    "/CN=registry.test"], check=True, capture_output=True)
    http_srv, https_srv = _serve(), _serve(str(d))
    yield http_srv.server_address[1], https_srv.server_address[1]
    http_srv.shutdown()
    https_srv.shutdown()


@pytest.fixture
def netd(daemon_factory, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 registry.test other.test a.pkg.test bad.pkg.test rebind.test\n")
    return daemon_factory(extra_args=["--pool", "0", "--net-hosts", str(hosts)])


def run(rpc, sb, command, stdin=None, timeout=60):
    params = {"sandbox": sb, "command": command, "timeout": timeout}
    if stdin is not None:
        params["stdin"] = stdin
    return rpc.call("exec.run", params, timeout=timeout + 30)


# The probe, run inside the sandbox: each check's outcome, as one JSON object.
PROBE = r'''
import json, os, socket, subprocess, sys
H, S = int(sys.argv[1]), int(sys.argv[2])
out = {}
def curl(*a):
    p = subprocess.run(["curl", "-sS", "-k", "-o", "-", "-w", "\n%{http_code}", *a],
                       capture_output=True, text=True, timeout=60)
    body, _, code = p.stdout.rpartition("\n")
    return {"code": code, "body": body, "err": p.stderr}
out["http"] = curl(f"http://registry.test:{H}/simple/")
out["https"] = curl(f"https://registry.test:{S}/tls")
out["denied"] = curl(f"http://other.test:{H}/")
# a forged Host: the request goes where its target says, with that Host
out["forged_host"] = curl("-H", "Host: other.test", f"http://registry.test:{H}/h")
out["suffix_internal"] = curl(f"http://a.pkg.test:{H}/")
out["suffix_apex"] = curl(f"http://pkg.test:{H}/")
out["deny_wins"] = curl(f"http://bad.pkg.test:{H}/")
out["ip_literal"] = curl("--noproxy", "", "-x", "http://127.0.0.1:3128", f"http://127.0.0.1:{H}/")
out["port_denied"] = curl(f"https://registry.test:22/")
out["rebind"] = curl(f"http://rebind.test:{H}/")
# a client that ignores the proxy variables
out["direct"] = curl("--noproxy", "*", f"http://127.0.0.1:{H}/")
try:
    socket.create_connection(("127.0.0.1", H), timeout=5).close(); out["direct_socket"] = "connected"
except OSError as e:
    out["direct_socket"] = e.errno
# no DNS, no UDP out
try:
    socket.getaddrinfo("registry.test", 80); out["dns"] = "resolved"
except OSError as e:
    out["dns"] = "failed"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("8.8.8.8", 53)); out["udp"] = "sent"
except OSError as e:
    out["udp"] = e.errno
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); out["raw"] = "opened"
except OSError as e:
    out["raw"] = e.errno
out["env"] = {k: os.environ.get(k) for k in ("HTTP_PROXY", "https_proxy", "NO_PROXY",
                                             "npm_config_https_proxy", "PIP_PROXY")}
print(json.dumps(out))
'''


def test_allow_mode_policy_records_and_live_changes(netd, servers):
    h, s = servers
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}", f"registry.test:{s}",
                                               f"*.pkg.test:{h}"],
                                     "deny": ["bad.pkg.test"]})
    assert sb["net"] == "allow" and "*.pkg.test:%d" % h in sb["allow"], sb
    r = run(rpc, sb["id"], f"python3 - {h} {s}", stdin=PROBE)
    assert r["exit_code"] == 0, r
    o = json.loads(r["stdout"])
    assert o["http"]["code"] == "200" and "for /simple/ host=registry.test" in o["http"]["body"], o
    assert o["https"]["code"] == "200" and "for /tls" in o["https"]["body"], o
    assert o["forged_host"]["body"].endswith(f"for /h host=registry.test:{h}"), o
    # a denied request's 403 names the rule and how to allow it
    assert o["denied"]["code"] == "403", o
    assert "no rule allows this host" in o["denied"]["body"], o
    assert f"--allow other.test:{h}" in o["denied"]["body"], o
    # *.pkg.test matches a.pkg.test (which the hosts file sends to 127.0.0.1: refused as an
    # internal address, a suffix rule not naming it exactly), not pkg.test itself
    assert o["suffix_internal"]["code"] == "403", o
    assert "internal address (127.0.0.1)" in o["suffix_internal"]["body"], o
    assert "no rule allows" in o["suffix_apex"]["body"], o
    assert "denied by rule 'bad.pkg.test'" in o["deny_wins"]["body"], o
    assert "IP addresses are refused" in o["ip_literal"]["body"], o
    assert "port 22" in o["port_denied"]["err"] + o["port_denied"]["body"] or \
        "403" in o["port_denied"]["err"], o
    assert "no rule allows" in o["rebind"]["body"], o
    # nothing but the proxy: the host's loopback server is not reachable directly
    assert o["direct"]["code"] == "000", o
    assert o["direct_socket"] != "connected", o
    assert o["dns"] == "failed" and o["udp"] != "sent" and o["raw"] != "opened", o
    assert o["env"] == {"HTTP_PROXY": "http://127.0.0.1:3128",
                        "https_proxy": "http://127.0.0.1:3128",
                        "NO_PROXY": "localhost,127.0.0.1,::1",
                        "npm_config_https_proxy": "http://127.0.0.1:3128",
                        "PIP_PROXY": "http://127.0.0.1:3128"}, o

    # the command's result lists its attempts
    recs = r["network"]
    by_host = {}
    for x in recs:
        by_host.setdefault((x["host"], x["port"]), []).append(x)
    ok = by_host[("registry.test", h)][0]
    assert ok["allowed"] and ok["kind"] == "http" and ok["rule"] == f"registry.test:{h}", ok
    assert ok["bytes_in"] > 0 and ok["bytes_out"] > 0 and ok["address"] == f"127.0.0.1:{h}", ok
    tls = by_host[("registry.test", s)][0]
    assert tls["allowed"] and tls["kind"] == "connect" and tls["bytes_in"] > 500, tls
    bad = by_host[("bad.pkg.test", h)][0]
    assert not bad["allowed"] and bad["rule"] == "bad.pkg.test", bad
    assert ("registry.test", 22) in by_host and not by_host[("registry.test", 22)][0]["allowed"]
    assert ("127.0.0.1", h) in by_host  # only the proxied attempt: the direct one never came

    log = rpc.call("network.log", {"sandbox": sb["id"]})
    assert log["total"] >= len(recs) and log["net"] == "allow", log

    # a live change: registry.test denied now, then other.test allowed
    rpc.call("network.set", {"sandbox": sb["id"], "deny": ["registry.test"]})
    r = run(rpc, sb["id"], f"curl -sS http://registry.test:{h}/")
    assert "denied by rule 'registry.test'" in r["stdout"], r
    got = rpc.call("network.set", {"sandbox": sb["id"], "allow": [f"other.test:{h}"],
                                   "deny": []})
    assert got["allow"] == [f"other.test:{h}"] and got["deny"] == [], got
    r = run(rpc, sb["id"], f"curl -sS http://other.test:{h}/x")
    # other.test is named exactly: its internal address is allowed
    assert "for /x host=other.test" in r["stdout"], r
    # the CLI: conch network
    p = subprocess.run([CONCH_BIN, "network", "--socket", netd.sock, sb["id"], "--log"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "allow: other.test" in p.stdout, p
    assert "DENY  registry.test" in p.stdout and "ALLOW other.test" in p.stdout, p


ATTACK = r'''
import json, socket, sys, time
P = ("127.0.0.1", 3128)
out = {}
# a request line of 1 MiB
s = socket.create_connection(P)
try:
    s.sendall(b"GET http://registry.test/" + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n")
except OSError:
    pass
try:
    out["long_line"] = s.recv(100).decode(errors="replace")
except OSError as e:
    out["long_line"] = "reset"
s.close()
# slowloris: heads that never end, held open
slow = []
for i in range(20):
    c = socket.create_connection(P)
    c.sendall(b"GET http://registry.test/ HTTP/1.1\r\nX-a: b\r\n")
    slow.append(c)
# 1000 connections at once
many, refused = [], 0
for i in range(1000):
    try:
        many.append(socket.create_connection(P, timeout=5))
    except OSError:
        refused += 1
time.sleep(0.5)
# past the cap, connections are closed at once
closed = 0
for c in many:
    c.setblocking(False)
    try:
        if c.recv(1) == b"":
            closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
out["many"] = {"opened": len(many), "refused": refused, "closed": closed}
print(json.dumps(out), flush=True)
'''


def test_attacks_on_the_proxy(netd, servers):
    h, _ = servers
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}"]})["id"]
    r = run(rpc, sb, "python3 -", stdin=ATTACK,
            timeout=120)
    assert r["exit_code"] == 0, r
    o = json.loads(r["stdout"])
    assert o["long_line"].startswith("HTTP/1.1 431") or o["long_line"] in ("", "reset"), o
    m = o["many"]
    # the cap (256 connections a sandbox) holds: the rest were closed at once
    assert m["opened"] + m["refused"] == 1000 and m["closed"] >= 1000 - 256, o
    # the proxy still serves, and what it held came back
    r = run(rpc, sb, f"curl -sS http://registry.test:{h}/after")
    assert "for /after" in r["stdout"], r
    held = rpc.call("sandbox.get", {"id": sb})["held"]
    # the log (256 records) is all it holds between requests
    assert held <= 256 * 2048, held


def test_none_is_the_default_and_host_is_flagged(netd, servers, tmp_path):
    h, _ = servers
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {})
    assert sb["net"] == "none", sb
    r = run(rpc, sb["id"], f"curl -sS http://127.0.0.1:{h}/; echo rc=$?; python3 -c "
                           "'import socket; print(*[n for _, n in socket.if_nameindex()])'; "
                           "env | grep -ci proxy")
    assert r["stdout"].split() == ["rc=7", "lo", "0"], r
    assert "network" not in r, r
    # host: the host's loopback server answers, and the result says so
    sb = rpc.call("sandbox.create", {"net": "host"})
    assert sb["net"] == "host", sb
    r = run(rpc, sb["id"], f"curl -sS http://127.0.0.1:{h}/host")
    assert "for /host" in r["stdout"] and r["network"] == "host", r
    # the command line: conch run --net host flags it; allow is the daemon's
    p = subprocess.run([CONCH_BIN, "run", "--no-daemon", "--json", "--net", "host", "--",
                        "curl", "-sS", f"http://127.0.0.1:{h}/run"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    res = json.loads(p.stdout)
    assert "for /run" in res["stdout"] and res["network"] == "host", p
    # conch run --allow: the proxy runs in conch run's process (an IP rule: it has no hosts
    # file, and only a rule naming the address lets it reach the host's loopback)
    p = subprocess.run([CONCH_BIN, "run", "--no-daemon", "--json", "--allow", f"127.0.0.1:{h}",
                        "--", "sh", "-c", f"curl -sS --noproxy '' http://127.0.0.1:{h}/run; "
                        "curl -sS http://other.test/"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    res = json.loads(p.stdout)
    assert "for /run" in res["stdout"] and "no rule allows this host" in res["stdout"], p
    assert [(x["host"], x["allowed"]) for x in res["network"]] == [("127.0.0.1", True),
                                                                   ("other.test", False)], res
    p = subprocess.run([CONCH_BIN, "run", "--no-daemon", "--deny", "other.test", "--allow",
                        "*.test", "--", "curl", "-sS", "http://other.test/"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "conch: network: other.test:80 denied: denied by rule 'other.test'" in p.stderr, p
    # bad input: a clear error, naming the param
    from rpcclient import RpcError
    for params, what in [({"allow": ["http://x.org"]}, "invalid network rule"),
                         ({"net": "open"}, "expected none, allow or host"),
                         ({"net": "none", "allow": ["a.org"]}, "need the network mode 'allow'"),
                         ({"allow": "a.org"}, "array")]:
        with pytest.raises(RpcError) as e:
            rpc.call("sandbox.create", params)
        assert what in str(e.value), (params, e.value)
    with pytest.raises(RpcError) as e:
        rpc.call("network.set", {"sandbox": sb["id"], "net": "allow"})
    assert "cannot change" in str(e.value), e.value


def test_a_client_that_never_reads_holds_the_proxy_to_its_bounds(netd, servers):
    """Backpressure: the proxy stops reading the remote side while the sandbox's side has 256
    KiB queued (libuv's path) or its relay pipe is full (512 KiB, past the first 64 KiB), so
    a client that asks for 1 GB and reads nothing makes the daemon hold next to nothing; the
    download then goes through when it reads."""
    h, _ = servers
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}"]})["id"]
    stall = ("python3 -c 'import socket,time; s=socket.create_connection((\"127.0.0.1\",3128)); "
             f"s.sendall(b\"GET http://registry.test:{h}/big/1000000000 HTTP/1.1\\r\\n\\r\\n\"); "
             "time.sleep(120)'")
    job = rpc.call("job.start", {"sandbox": sb, "command": stall})["job_id"]
    try:
        def stalled():
            recs = rpc.call("network.log", {"sandbox": sb})["records"]
            return recs and recs[-1].get("open") and recs[-1]["bytes_in"] > 0 and recs[-1]
        deadline = time.monotonic() + 120  # a wait, not a bound: generous
        while not (first := stalled()):
            assert time.monotonic() < deadline, "the download did not start"
            time.sleep(0.1)
        # a while later it has read no more than the socket buffers and our 64 KiB hold
        time.sleep(1)
        later = stalled()
        held = rpc.call("sandbox.get", {"id": sb})["held"]
        assert held < 256 * 2048 + (1 << 20), (held, later)
        assert later["bytes_in"] < 64 << 20, later  # not the 1 GB
        assert later["bytes_in"] - first["bytes_in"] < 16 << 20, (first, later)
    finally:
        rpc.call("job.kill", {"job_id": job})
    r = run(rpc, sb, f"curl -sS -o /dev/null -w '%{{size_download}}' "
                     f"http://registry.test:{h}/big/100000000", timeout=120)
    assert r["stdout"] == "100000000", r
    rec = [x for x in r["network"] if x["host"] == "registry.test"][-1]
    assert rec["bytes_in"] > 100000000, rec


def test_the_policy_survives_a_daemon_restart(netd, servers):
    """The mode and rules are in the sandbox's record: a sandbox brought back after a
    restart (sandbox.start) has the policy it had, network.set's changes included."""
    h, _ = servers
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{h}"], "deny": ["other.test"]})["id"]
    rpc.call("network.set", {"sandbox": sb, "allow": [f"registry.test:{h}", "a.pkg.test"]})
    netd.kill9()
    netd.start()
    rpc = netd.client()
    got = rpc.call("sandbox.get", {"id": sb})
    assert got["state"] == "stopped" and got["net"] == "allow", got
    assert got["allow"] == [f"registry.test:{h}", "a.pkg.test"] and got["deny"] == ["other.test"]
    rpc.call("sandbox.start", {"id": sb})
    r = run(rpc, sb, f"curl -sS http://registry.test:{h}/back; curl -sS http://other.test:{h}/")
    assert "for /back" in r["stdout"] and "denied by rule 'other.test'" in r["stdout"], r


def test_a_fork_keeps_the_policy(netd, servers, tmp_path):
    """sandbox.fork makes the sandbox it forks, network policy included (forks had none: the
    allowlist was lost, found by an outside attack). Both of a snapshot and of a sandbox."""
    h, _ = servers
    ws = tmp_path / "ws"
    ws.mkdir()
    rpc = netd.client()
    sb = rpc.call("sandbox.create", {"workspace": str(ws), "allow": [f"registry.test:{h}"],
                                     "deny": ["other.test"]})["id"]
    rpc.call("network.set", {"sandbox": sb, "allow": [f"registry.test:{h}", "b.pkg.test"]})
    snap = rpc.call("workspace.snapshot", {"sandbox": sb}, timeout=60)["id"]
    for params in ({"sandbox": sb}, {"sandbox": sb, "snapshot": snap}):
        f = rpc.call("sandbox.fork", params, timeout=60)["id"]
        got = rpc.call("sandbox.get", {"id": f})
        assert got["net"] == "allow" and got["allow"] == [f"registry.test:{h}", "b.pkg.test"], got
        assert got["deny"] == ["other.test"], got
        r = run(rpc, f, f"curl -sS http://registry.test:{h}/back; curl -sS http://other.test:{h}/")
        assert "for /back" in r["stdout"] and "denied by rule 'other.test'" in r["stdout"], r


def _tcp_server(mode):
    """A raw TCP server on the host's loopback, one thread per connection. "sink": read to
    EOF, then answer b"got N\n" and DOWN bytes, then close. "echo": send back what comes."""
    srv = socket.create_server(("127.0.0.1", 0))

    def one(c):
        with c:
            if mode == "echo":
                while (d := c.recv(1 << 16)):
                    c.sendall(d)
                return
            n = 0
            while (d := c.recv(1 << 16)):
                n += len(d)
            c.sendall(b"got %d\n" % n)
            c.sendall(b"y" * TUNNEL_DOWN)

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv


TUNNEL_UP, TUNNEL_DOWN = 8 << 20, 24 << 20
# Inside the sandbox: a CONNECT tunnel through the proxy; argv: port, mode ("sink": send UP
# bytes, half-close, read the answer to EOF; "hold": send and read back 1 MiB, say so, then
# read until the tunnel closes).
TUNNEL = r'''
import socket, sys
port, mode, up = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT registry.test:%d HTTP/1.1\r\nHost: registry.test:%d\r\n\r\n" % (port, port))
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
if mode == "sink":
    s.sendall(b"u" * up)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while (d := s.recv(1 << 20)):
        got += d
    line, _, rest = bytes(got).partition(b"\n")
    print(line.decode(), len(rest), rest.count(b"y"), flush=True)
else:
    s.sendall(b"e" * (1 << 20))
    n = 0
    while n < (1 << 20):
        n += len(s.recv(1 << 20))
    print("ready", flush=True)
    try:
        while s.recv(1 << 16):
            pass
        print("closed", flush=True)
    except OSError as e:
        print("reset", e.errno, flush=True)
'''


def test_bulk_tunnels_are_relayed_whole_counted_and_closed_by_policy(netd):
    """A connection past its first 64 KiB is relayed by splice(2) (relay.c): the bytes each
    way arrive whole and in order, a half-close goes through (the upload ends, the answer
    still comes), network.log counts exactly what each side sent, and a policy change still
    closes a relayed tunnel."""
    sink, echo = _tcp_server("sink"), _tcp_server("echo")
    ps, pe = sink.getsockname()[1], echo.getsockname()[1]
    try:
        rpc = netd.client()
        sb = rpc.call("sandbox.create", {"allow": [f"registry.test:{ps}",
                                                   f"registry.test:{pe}"]})["id"]
        r = run(rpc, sb, f"python3 - {ps} sink {TUNNEL_UP}", stdin=TUNNEL, timeout=120)
        assert r["exit_code"] == 0, r
        assert r["stdout"].split() == [f"got", str(TUNNEL_UP), str(TUNNEL_DOWN),
                                       str(TUNNEL_DOWN)], r
        rec = [x for x in r["network"] if x["port"] == ps][-1]
        assert rec["kind"] == "connect" and rec["allowed"] and not rec.get("error"), rec
        assert rec["bytes_out"] == TUNNEL_UP, rec
        assert rec["bytes_in"] == len(b"got %d\n" % TUNNEL_UP) + TUNNEL_DOWN, rec

        job = rpc.call("job.start", {"sandbox": sb,
                                     "command": f"python3 -c '{TUNNEL}' {pe} hold 0"})["job_id"]
        deadline = time.monotonic() + 60  # a wait, not a bound
        while "ready" not in rpc.call("job.output", {"job_id": job})["stdout"]:
            assert time.monotonic() < deadline, rpc.call("job.output", {"job_id": job})
            time.sleep(0.1)
        rpc.call("network.set", {"sandbox": sb, "allow": [f"registry.test:{ps}"]})
        st = rpc.call("job.wait", {"job_id": job, "timeout": 30}, timeout=40)
        out = rpc.call("job.output", {"job_id": job})["stdout"]
        assert not st["running"] and ("closed" in out or "reset" in out), (st, out)
        recs = rpc.call("network.log", {"sandbox": sb})["records"]
        rec = [x for x in recs if x["port"] == pe][-1]
        assert "policy changed" in rec["error"] and rec["bytes_in"] == 1 << 20, rec
    finally:
        sink.close()
        echo.close()
