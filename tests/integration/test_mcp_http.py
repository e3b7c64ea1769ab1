# test_mcp_http.py - `conch mcp --listen` (issue 21): MCP's Streamable HTTP transport over
# TLS in front of a daemon with a --tokens file. What the MCP SDK never tries: no token, a
# wrong token, another tenant's token on a session (refused like an unknown one), an unknown
# session, a body over the cap, DELETE, GET, a bad Origin, a bad MCP-Protocol-Version,
# plaintext on the TLS port, the sessions cap, idle sessions expiring, and failed tokens
# rate-limited by the daemon. Each session's sandbox belongs to its token's tenant.
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
import warnings

import pytest

from conftest import CONCH_BIN

TOK_A = "alice-token-0123456789abcdef"
TOK_B = "bob-token-0123456789abcdef00"
MAX_BODY = 65536
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}}


def make_cert(d):
    key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


class Server:
    def __init__(self, proc, port, cert, daemon):
        self.proc, self.port, self.cert, self.daemon = proc, port, cert, daemon
        self.ctx = ssl.create_default_context(cafile=cert)

    def conn(self):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=60)

    def req(self, method="POST", body=None, token=TOK_A, sid=None, headers=None):
        """(status, headers, parsed body or None)."""
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        if sid:
            h["Mcp-Session-Id"] = sid
        h.update(headers or {})
        c = self.conn()
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        c.request(method, "/mcp", body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, r.headers, (json.loads(raw) if raw else None)

    def init(self, token=TOK_A):
        st, h, body = self.req(body=INIT, token=token)
        assert st == 200, (st, body, self.log())
        assert body.get("result", {}).get("protocolVersion") == "2025-06-18", body
        sid = h["Mcp-Session-Id"]
        assert re.fullmatch(r"[0-9a-f]{32}", sid)
        return sid

    def call(self, sid, name, args, token=TOK_A, rid=7):
        st, _, body = self.req(body={"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                     "params": {"name": name, "arguments": args}},
                               token=token, sid=sid)
        assert st == 200, (st, body)
        return body["result"]

    def log(self):
        return self.proc.stderr_text() if hasattr(self.proc, "stderr_text") else ""


@pytest.fixture
def mcp_http(daemon_factory, tmp_path):
    """start(*extra args) -> a Server: conch mcp --listen in front of a daemon with tokens."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {TOK_A}\nbob {TOK_B}\n")
    os.chmod(tokens, 0o600)
    d = daemon_factory(extra_args=["--tokens", str(tokens), "--pool", "0"])
    cert, key = make_cert(str(tmp_path))
    procs = []

    def start(*extra):
        errf = open(tmp_path / f"mcp{len(procs)}.log", "w+")
        p = subprocess.Popen([CONCH_BIN, "mcp", "--listen", "127.0.0.1:0", "--tls-cert", cert,
                              "--tls-key", key, "--socket", d.sock, "--max-body",
                              str(MAX_BODY), *extra], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=errf)
        procs.append((p, errf))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            errf.seek(0)
            m = re.search(r"https://127\.0\.0\.1:(\d+)/mcp", errf.read())
            if m:
                srv = Server(p, int(m.group(1)), cert, d)
                srv.tokens = tokens
                return srv
            assert p.poll() is None, open(errf.name).read()
            time.sleep(0.05)
        raise AssertionError("conch mcp --listen did not start")

    yield start
    for p, errf in procs:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        errf.close()


def tenant_sandboxes(d, token):
    c = d.client()
    c.call("connection.auth", {"token": token})
    got = c.call("sandbox.list", {})
    c.close()
    return got["sandboxes"] if isinstance(got, dict) else got


def test_tools_work_and_sandbox_is_the_tenants(mcp_http):
    s = mcp_http()
    sid = s.init()
    st, _, body = s.req(body={"jsonrpc": "2.0", "method": "notifications/initialized"}, sid=sid)
    assert st == 202 and body is None
    st, _, body = s.req(body={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid=sid,
                        headers={"MCP-Protocol-Version": "2025-06-18"})
    assert st == 200
    assert "bash" in [t["name"] for t in body["result"]["tools"]]
    res = s.call(sid, "bash", {"command": "echo hi; id -un"})
    assert res["content"][0]["text"].startswith("hi\nagent\n"), res
    assert len(tenant_sandboxes(s.daemon, TOK_A)) == 1
    assert tenant_sandboxes(s.daemon, TOK_B) == []
    # A second session of the same tenant at once: its own sandbox (none is named, so they
    # do not collide), which expires by itself if the session cannot destroy it.
    sid2 = s.init()
    s.call(sid2, "write_file", {"path": "only2.txt", "content": "2"})
    res = s.call(sid, "read_file", {"path": "only2.txt"})
    assert res["isError"], res
    boxes = tenant_sandboxes(s.daemon, TOK_A)
    assert len(boxes) == 2 and all(b["idle_timeout"] > 1800 for b in boxes), boxes


def test_no_token_and_wrong_token_401(mcp_http):
    s = mcp_http()
    st, h, body = s.req(body=INIT, token=None)
    assert st == 401 and h["WWW-Authenticate"] == "Bearer" and "Mcp-Session-Id" not in h
    st, h, body = s.req(body=INIT, token="not-a-token-of-this-daemon-000")
    assert st == 401 and "Mcp-Session-Id" not in h, body
    st, _, _ = s.req(body=INIT, headers={"Authorization": "Basic YWxpY2U6eA=="}, token=None)
    assert st == 401
    sid = s.init()
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert s.req(body=ping, sid=sid, token=None)[0] == 401
    assert s.req(body=ping, sid=sid, token="not-a-token-of-this-daemon-000")[0] == 401
    assert s.req(body=ping, sid=sid)[0] == 200
    # A refusal of a request with a large body (under the cap) comes after the body: the
    # client sees it, not a reset connection, and the connection serves the next request.
    c = s.conn()
    hdrs = {"Content-Type": "application/json", "Accept": "application/json"}
    big = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "ping", "x": "y" * (MAX_BODY - 100)})
    c.request("POST", "/mcp", body=big, headers=hdrs)
    r = c.getresponse()
    assert r.status == 401
    r.read()
    c.request("POST", "/mcp", body=json.dumps(ping),
              headers={**hdrs, "Authorization": f"Bearer {TOK_A}", "Mcp-Session-Id": sid})
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["id"] == 3
    c.close()


def test_session_of_another_token_refused_like_unknown(mcp_http):
    s = mcp_http()
    sid = s.init(TOK_A)
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    st, _, other = s.req(body=ping, sid=sid, token=TOK_B)
    assert st == 404
    st, _, unknown = s.req(body=ping, sid="0" * 32, token=TOK_B)
    assert st == 404 and other == unknown
    # bob can neither use nor end alice's session
    st, _, _ = s.req(body={"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                           "params": {"name": "bash", "arguments": {"command": "true"}}},
                     sid=sid, token=TOK_B)
    assert st == 404
    assert s.req("DELETE", sid=sid, token=TOK_B)[0] == 404
    assert s.req(body=ping, sid=sid)[0] == 200


def test_unknown_session_404_and_no_session_400(mcp_http):
    s = mcp_http()
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert s.req(body=ping, sid="f" * 32)[0] == 404
    assert s.req(body=ping, sid="x" * 500)[0] == 404
    assert s.req(body=ping)[0] == 400


def test_body_over_cap_413(mcp_http):
    s = mcp_http()
    sid = s.init()
    # A declared length over the cap is refused before the body is read, and a chunked body
    # (no length) is refused, not waited for: both answered as soon as the headers are in
    # (the body is not sent here: the server closes the connection after its answer).
    for extra, want in (({"Content-Length": str(MAX_BODY + 1)}, 413),
                        ({"Transfer-Encoding": "chunked"}, 411)):
        c = s.conn()
        c.putrequest("POST", "/mcp")
        for k, v in {"Authorization": f"Bearer {TOK_A}", "Mcp-Session-Id": sid,
                     "Content-Type": "application/json", "Accept": "application/json",
                     **extra}.items():
            c.putheader(k, v)
        c.endheaders()
        r = c.getresponse()
        assert r.status == want, extra
        c.close()
    # A body under the cap works.
    res = s.call(sid, "write_file", {"path": "/workspace/f.txt", "content": "x" * (MAX_BODY // 2)})
    assert not res["isError"], res


def test_delete_ends_session_and_sandbox(mcp_http):
    s = mcp_http()
    sid = s.init()
    assert len(tenant_sandboxes(s.daemon, TOK_A)) == 1
    assert s.req("DELETE", sid=sid)[0] == 204
    assert s.req(body={"jsonrpc": "2.0", "id": 3, "method": "ping"}, sid=sid)[0] == 404
    assert s.req("DELETE", sid=sid)[0] == 404
    deadline = time.monotonic() + 30
    while tenant_sandboxes(s.daemon, TOK_A) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tenant_sandboxes(s.daemon, TOK_A) == []


def test_get_405_and_bad_version_400(mcp_http):
    s = mcp_http()
    sid = s.init()
    st, h, _ = s.req("GET", sid=sid, headers={"Accept": "text/event-stream"})
    assert st == 405 and "POST" in h["Allow"]
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert s.req(body=ping, sid=sid, headers={"MCP-Protocol-Version": "1999-01-01"})[0] == 400
    assert s.req(body=ping, sid=sid, headers={"MCP-Protocol-Version": "2025-03-26"})[0] == 200
    assert s.req(body=ping, sid=sid, headers={"Content-Type": "text/plain"})[0] == 415
    assert s.req(body=b"{nope", sid=sid)[0] == 400


def test_bad_origin_403(mcp_http):
    s = mcp_http("--allow-origin", "https://app.example")
    sid = s.init()
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    for bad in ("http://evil.example", "http://localhost.evil.example", "null",
                "https://app.example.evil", "http://127.0.0.1.evil.example", "localhost"):
        st, _, _ = s.req(body=ping, sid=sid, headers={"Origin": bad})
        assert st == 403, bad
        assert s.req(body=INIT, headers={"Origin": bad})[0] == 403
    for good in ("http://localhost:3000", "http://127.0.0.1", "http://[::1]:8080",
                 "https://app.example"):
        assert s.req(body=ping, sid=sid, headers={"Origin": good})[0] == 200, good


def test_plaintext_refused(mcp_http, tmp_path):
    s = mcp_http()
    with socket.create_connection(("127.0.0.1", s.port), timeout=15) as sk:
        sk.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOK_A.encode() +
                   b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        try:
            got = sk.recv(4096)
        except (ConnectionResetError, socket.timeout):
            got = b""
    assert not got.startswith(b"HTTP/"), got
    # TLS below 1.2 is refused too.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(s.cert)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
            ctx.set_ciphers("ALL:@SECLEVEL=0")
        except (ValueError, ssl.SSLError):
            pass
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        with socket.create_connection(("127.0.0.1", s.port), timeout=15) as sk:
            with ctx.wrap_socket(sk, server_hostname="127.0.0.1"):
                pass
    # The server is still up after both.
    assert s.proc.poll() is None
    s.init()
    # Serving without TLS is refused at start.
    r = subprocess.run([CONCH_BIN, "mcp", "--listen", "127.0.0.1:0", "--socket", s.daemon.sock],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--tls-cert" in r.stderr
    r = subprocess.run([CONCH_BIN, "mcp", "--listen", "127.0.0.1:0", "--tls-cert",
                        str(tmp_path / "missing.pem"), "--tls-key", s.cert],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--tls-cert: cannot read" in r.stderr, r.stderr


def test_sessions_cap_and_idle_expiry(mcp_http):
    s = mcp_http("--max-sessions", "2", "--session-idle", "4")
    a, b = s.init(), s.init(TOK_B)
    st, _, body = s.req(body=INIT)
    assert st == 503, body
    # Idle sessions end (and their sandboxes with them), which makes room again. Watched
    # from the daemon's side: a request to the session would keep it alive.
    deadline = time.monotonic() + 60
    while (tenant_sandboxes(s.daemon, TOK_A) or tenant_sandboxes(s.daemon, TOK_B)) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tenant_sandboxes(s.daemon, TOK_A) == [] and tenant_sandboxes(s.daemon, TOK_B) == []
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert s.req(body=ping, sid=a)[0] == 404
    assert s.req(body=ping, sid=b, token=TOK_B)[0] == 404
    s.init()


def test_busy_session_does_not_expire(mcp_http):
    s = mcp_http("--session-idle", "3")
    sid = s.init()
    res = s.call(sid, "bash", {"command": "sleep 8; echo done"})
    assert "done" in res["content"][0]["text"], res


def test_failed_tokens_rate_limited(mcp_http):
    s = mcp_http()
    codes = [s.req(body=INIT, token=f"wrong-token-{i:020d}")[0] for i in range(12)]
    assert codes[:10] == [401] * 10 and codes[-1] == 429, codes
    # the peer is limited even with a good token, as the daemon says
    assert s.req(body=INIT)[0] == 429


def test_daemon_restart(mcp_http):
    """The daemon going away ends the sessions (404 from then on), new ones get 503 while it
    is down, and a restarted daemon serves new sessions; conch mcp stays up throughout."""
    s = mcp_http()
    sid = s.init()
    s.daemon.stop()
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    deadline = time.monotonic() + 30
    while s.req(body=ping, sid=sid)[0] != 404 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert s.req(body=ping, sid=sid)[0] == 404
    assert s.req(body=INIT)[0] == 503
    assert s.proc.poll() is None
    s.daemon.start()
    sid2 = s.init()
    res = s.call(sid2, "bash", {"command": "echo back"})
    assert res["content"][0]["text"].startswith("back\n"), res


def test_rotated_token_ends_its_sessions(mcp_http):
    """A token changed in the daemon's file (SIGHUP) ends the sessions it opened: the daemon
    closes their connections; the old token opens none, the new one does."""
    s = mcp_http()
    sid_a, sid_b = s.init(TOK_A), s.init(TOK_B)
    new_a = "alice-new-token-fedcba9876543210"
    s.tokens.write_text(f"alice {new_a}\nbob {TOK_B}\n")
    os.kill(s.daemon.pid, signal.SIGHUP)
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    deadline = time.monotonic() + 30
    while s.req(body=ping, sid=sid_a)[0] != 404 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert s.req(body=ping, sid=sid_a)[0] == 404
    assert s.req(body=INIT)[0] == 401
    assert s.req(body=ping, sid=sid_b, token=TOK_B)[0] == 200
    s.init(new_a)


def test_sighup_reloads_the_certificate(mcp_http, tmp_path):
    """SIGHUP ended conch mcp --listen; a renewed certificate (cert-manager's, a Kubernetes
    secret's) needed a restart that dropped every session. Now SIGHUP reloads the pair, the
    sessions go on, and a broken pair is refused with the one in use kept."""
    srv = mcp_http()

    def served():
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            with ctx.wrap_socket(s, server_hostname="localhost") as t:
                return t.getpeercert(binary_form=True)

    first = served()
    sid = srv.init()
    renewed = tmp_path / "renewed"
    renewed.mkdir()
    cert, key = make_cert(str(renewed))
    key_path = srv.cert.replace("cert.pem", "key.pem")
    for src, dst in ((cert, srv.cert), (key, key_path)):
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read())
    os.kill(srv.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while served() == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served() != first and srv.proc.poll() is None
    srv.ctx = ssl.create_default_context(cafile=srv.cert)
    assert "still" in srv.call(sid, "bash", {"command": "echo still"})["content"][0]["text"]
    now = served()
    with open(key_path, "w") as f:
        f.write("not a key\n")
    os.kill(srv.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "keeping the pair in use" not in open(tmp_path / "mcp0.log").read() and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert "keeping the pair in use" in open(tmp_path / "mcp0.log").read()
    assert served() == now and srv.proc.poll() is None
