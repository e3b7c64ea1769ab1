# test_remote.py - the remote transport (issue 21): `conch serve --listen HOST:PORT
# --tls-cert --tls-key --tokens` and its gateway process, driven by an independent client
# (Debian's python3-websockets on Python's ssl) over loopback: TLS 1.2+ only, plaintext
# refused, 401/429/503 before the upgrade, /healthz, JSON-RPC both ways (a tool call answered
# by the remote client), the bounds (a client that never reads, one that sends nothing, 1,000
# at once, the message cap), the daemon or the gateway restarted under clients, and the
# certificate reloaded on SIGHUP. Certificates are made with the openssl CLI.
import asyncio
import json
import os
import resource
import signal
import socket
import ssl
import subprocess
import time

import pytest

from conftest import CONCH_BIN, descendants, proc_argv
from rpcclient import Client

websockets = pytest.importorskip("websockets")
from websockets.exceptions import ConnectionClosed, InvalidStatusCode  # noqa: E402

TOKEN = "admin-token-0123456789abcdef"
TOK_ALICE = "alice-token-0123456789abcdef"
# What the gateway may hold: its own few MiB, 1 MiB of unsent data per client, OpenSSL's
# buffers. The caps below are well over what it needs and well under what it would take to
# hold 100 MB of output or 1,000 clients' worth of unbounded queues.
RSS_CAP_ONE = 16 << 20
RSS_CAP_THOUSAND = 128 << 20


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_cert(d, name, ca="ca"):
    """A server certificate for 127.0.0.1/localhost signed by @ca, as NAME.pem/NAME.key."""
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("certs"))
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=conch test CA", cwd=d)
    make_cert(d, "server")
    make_cert(d, "renewed")
    return d


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_ctx(ca, **kw):
    ctx = ssl.create_default_context(cafile=ca)
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


class Remote:
    """A daemon with its gateway: .url, .port, .ca, .daemon, .gateway_pid()."""

    def __init__(self, daemon, port, certdir, cert, key):
        self.daemon, self.port, self.ca = daemon, port, os.path.join(certdir, "ca.pem")
        self.cert, self.key = cert, key
        self.url = f"wss://127.0.0.1:{port}/rpc"

    def gateway_pid(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in descendants(self.daemon.pid):
                argv = proc_argv(pid)
                if len(argv) > 1 and argv[1] == "__gateway":
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"no gateway process under the daemon\n{self.daemon.log()}")

    def healthz(self, timeout=5.0):
        """(status, body) of GET /healthz, or None when nothing answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
                with client_ctx(self.ca).wrap_socket(s, server_hostname="127.0.0.1") as t:
                    t.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    data = b""
                    while chunk := t.recv(4096):
                        data += chunk
        except (OSError, ssl.SSLError):
            return None
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    def wait_ready(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.healthz()
            if h and h[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"the gateway did not answer /healthz\n{self.daemon.log()}")


@pytest.fixture
def remote_factory(daemon_factory, certs, tmp_path):
    def make(extra=(), port=None):
        tokens = tmp_path / "tokens"
        tokens.write_text(f"admin {TOKEN}\nalice {TOK_ALICE}\n")
        os.chmod(tokens, 0o600)
        cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
        for src, dst in (("server.pem", cert), ("server.key", key)):
            with open(os.path.join(certs, src), "rb") as f, open(dst, "wb") as g:
                g.write(f.read())
        port = port or free_port()
        d = daemon_factory(extra_args=["--pool", "0", "--listen", f"127.0.0.1:{port}", "--tls-cert",
                                       cert, "--tls-key", key, "--tokens", str(tokens), *extra])
        r = Remote(d, port, certs, cert, key)
        r.wait_ready()
        return r

    return make


@pytest.fixture
def remote(remote_factory):
    return remote_factory()


class Ws:
    """A JSON-RPC client over one WebSocket: call(), and handlers for the daemon's requests."""

    def __init__(self, ws):
        self.ws, self.next_id, self.pending, self.handlers = ws, 0, {}, {}
        self.notes = []
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, r, token=TOKEN, **kw):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ws = await websockets.connect(r.url, ssl=client_ctx(r.ca), extra_headers=headers,
                                      max_size=80 << 20, open_timeout=30, **kw)
        return cls(ws)

    async def _read(self):
        try:
            async for text in self.ws:
                msg = json.loads(text)
                if "method" in msg and "id" in msg:
                    h = self.handlers.get(msg["method"])
                    res = h(msg["params"]) if h else None
                    await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}))
                elif "method" in msg:
                    self.notes.append(msg)
                elif msg.get("id") in self.pending:
                    self.pending.pop(msg["id"]).set_result(msg)
        except ConnectionClosed:
            pass
        for f in self.pending.values():
            if not f.done():
                f.set_exception(ConnectionError("connection lost"))

    async def call(self, method, params=None, timeout=60):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                       "params": params or {}}))
        msg = await asyncio.wait_for(fut, timeout)
        if "error" in msg:
            raise AssertionError(f"{method}: {msg['error']}")
        return msg["result"]

    async def close(self):
        await self.ws.close()
        self.reader.cancel()


def run(coro):
    return asyncio.run(coro)


def vmrss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ---- TLS and the handshake ----------------------------------------------------------------


def test_ping_over_wss_on_tls12_or_later(remote):
    async def go():
        c = await Ws.connect(remote)
        version = c.ws.transport.get_extra_info("ssl_object").version()
        pong = await c.call("daemon.ping")
        await c.close()
        return version, pong

    version, pong = run(go())
    assert version in ("TLSv1.2", "TLSv1.3")
    assert pong["version"] and pong["tenant"] == "admin"
    assert remote.healthz() == (200, b"ok\n")


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_tls_1_1_refused_1_2_accepted(remote):
    def handshake(lo, hi):
        ctx = client_ctx(remote.ca)
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # so that the client itself may offer 1.1
        ctx.minimum_version, ctx.maximum_version = lo, hi
        with socket.create_connection(("127.0.0.1", remote.port), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
                return t.version()

    with pytest.raises(ssl.SSLError) as ei:
        handshake(ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_1)
    # Refused by the server (an alert), not by this client for lack of a protocol to offer.
    assert "NO_PROTOCOLS_AVAILABLE" not in str(ei.value), ei.value
    assert "PROTOCOL_VERSION" in str(ei.value) or "UNSUPPORTED_PROTOCOL" in str(ei.value), ei.value
    assert handshake(ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"


def test_plaintext_http_and_websocket_refused(remote):
    with socket.create_connection(("127.0.0.1", remote.port), timeout=20) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    assert not data.startswith(b"HTTP/"), data[:200]

    async def plain_ws():
        await websockets.connect(f"ws://127.0.0.1:{remote.port}/rpc", open_timeout=20,
                                 extra_headers={"Authorization": f"Bearer {TOKEN}"})

    with pytest.raises((websockets.exceptions.InvalidMessage, websockets.exceptions.InvalidHandshake,
                        ConnectionError, EOFError, asyncio.TimeoutError)):
        run(plain_ws())


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef", TOKEN[:-1]])
def test_no_or_wrong_token_is_401_before_the_upgrade(remote, token):
    with pytest.raises(InvalidStatusCode) as ei:
        run(Ws.connect(remote, token=token))
    assert ei.value.status_code == 401
    assert token is None or token not in remote.daemon.log()


def raw_upgrade_status(r, auth: bytes):
    """The status code of a WebSocket upgrade sent by hand (any bytes in Authorization)."""
    host, port = r.url[len("wss://"):].split("/")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        with client_ctx(r.ca).wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"GET /rpc HTTP/1.1\r\nHost: " + f"{host}:{port}".encode() +
                        b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        b"Sec-WebSocket-Version: 13\r\nAuthorization: " + auth + b"\r\n\r\n")
            head = b""
            while b"\r\n" not in head:
                chunk = tls.recv(4096)
                if not chunk:
                    break
                head += chunk
    return int(head.split(b" ", 2)[1])


def test_a_token_that_is_not_utf8_is_401_not_503(remote):
    """The attack's finding: such a token could not go into connection.auth's JSON, and the
    gateway answered 503 (the daemon unavailable) instead of refusing the token."""
    assert raw_upgrade_status(remote, b"Bearer \xff\xfe" + b"x" * 30) == 401
    assert raw_upgrade_status(remote, b"Bearer " + TOKEN.encode()) == 101


def test_failed_tokens_rate_limited_429_even_for_a_good_one(remote):
    for _ in range(10):
        with pytest.raises(InvalidStatusCode) as ei:
            run(Ws.connect(remote, token="wrong-token-0123456789abcdef"))
        assert ei.value.status_code == 401
    with pytest.raises(InvalidStatusCode) as ei:
        run(Ws.connect(remote, token=TOKEN))
    assert ei.value.status_code == 429


def test_only_rpc_is_a_websocket_and_healthz_needs_no_token(remote):
    async def other_path():
        await websockets.connect(f"wss://127.0.0.1:{remote.port}/other", ssl=client_ctx(remote.ca),
                                 extra_headers={"Authorization": f"Bearer {TOKEN}"})

    with pytest.raises(InvalidStatusCode) as ei:
        run(other_path())
    assert ei.value.status_code == 404
    assert remote.healthz()[0] == 200


def test_max_connections_answered_503(remote_factory):
    r = remote_factory(extra=["--max-connections", "3"])

    async def go():
        held = [await Ws.connect(r) for _ in range(3)]
        with pytest.raises(InvalidStatusCode) as ei:
            await Ws.connect(r)
        assert ei.value.status_code == 503
        await held[0].close()
        # One went: there is room again.
        for _ in range(100):
            try:
                c = await Ws.connect(r)
                break
            except InvalidStatusCode:
                await asyncio.sleep(0.05)
        assert (await c.call("daemon.ping"))["tenant"] == "admin"
        for h in held[1:] + [c]:
            await h.close()

    run(go())


def test_listen_needs_tls_and_tokens(certs, tmp_path):
    for extra in ([], ["--tls-cert", os.path.join(certs, "server.pem")],
                  ["--tls-cert", os.path.join(certs, "server.pem"), "--tls-key", os.path.join(certs, "server.key")]):
        p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                            str(tmp_path / "st"), "--listen", "127.0.0.1:1", *extra],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "--listen, --tls-cert, --tls-key and --tokens go together" in p.stderr
    # A key that is not the certificate's: refused at start, naming both.
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin {TOKEN}\n")
    os.chmod(tokens, 0o600)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--listen", "127.0.0.1:1", "--tls-cert",
                        os.path.join(certs, "server.pem"), "--tls-key", os.path.join(certs, "renewed.key"),
                        "--tokens", str(tokens)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "is not the key of the certificate" in p.stderr

    def serve(listen):
        return subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                               str(tmp_path / "st"), "--listen", listen, "--tls-cert",
                               os.path.join(certs, "server.pem"), "--tls-key", os.path.join(certs, "server.key"),
                               "--tokens", str(tokens)], capture_output=True, text=True, timeout=30)

    # An address, not a name; a port someone else holds is refused at start, not retried.
    p = serve("localhost:8443")
    assert p.returncode == 2 and "'localhost' is not an IP address" in p.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        p = serve(f"127.0.0.1:{busy.getsockname()[1]}")
    assert p.returncode == 1 and "Address already in use" in p.stderr


# ---- JSON-RPC across the transport ----------------------------------------------------------


def test_tool_call_answered_across_the_transport(remote):
    """The daemon's tool.call reaches the remote client as a WebSocket message and its answer
    goes back to the command in the sandbox (tool_call over the ptc bridge)."""
    async def go():
        c = await Ws.connect(remote)
        seen = []

        def tool_call(p):
            seen.append(p)
            return {"echoed": p["input"], "by": "remote"}

        c.handlers["tool.call"] = tool_call
        sb = (await c.call("sandbox.create", {}, timeout=60))["id"]
        await c.call("tools.register", {"sandbox": sb, "tools": [
            {"name": "echo", "description": "returns its input", "input_schema": {"type": "object"}}]})
        r = await c.call("exec.run", {"sandbox": sb, "command": """tool_call echo '{"x": 1}'"""}, timeout=120)
        await c.call("sandbox.destroy", {"id": sb}, timeout=60)
        await c.close()
        return r, seen

    r, seen = run(go())
    assert r["exit_code"] == 0, r
    assert json.loads(r["stdout"]) == {"echoed": {"x": 1}, "by": "remote"}
    assert [s["input"] for s in seen] == [{"x": 1}]


def test_messages_with_newlines_binary_and_over_64_mib(remote):
    async def go():
        c = await Ws.connect(remote)
        # Pretty-printed JSON: the gateway's line framing must not split it.
        c.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        c.pending[c.next_id] = fut
        await c.ws.send(json.dumps({"jsonrpc": "2.0", "id": c.next_id, "method": "daemon.ping",
                                    "params": {}}, indent=2))
        pong = (await asyncio.wait_for(fut, 30))["result"]
        await c.ws.send(b"\x00binary")
        await asyncio.wait_for(c.ws.wait_closed(), 30)
        code_binary = c.ws.close_code
        d = await Ws.connect(remote)
        try:
            await d.ws.send("x" * ((64 << 20) + 1))
        except ConnectionClosed:
            pass
        await asyncio.wait_for(d.ws.wait_closed(), 60)
        return pong, code_binary, d.ws.close_code

    pong, code_binary, code_big = run(go())
    assert pong["tenant"] == "admin"
    assert code_binary == 1003 and code_big == 1009


# ---- bounds -----------------------------------------------------------------------------------


def command_running(daemon, marker):
    return any(marker in " ".join(proc_argv(p) or []) for p in descendants(daemon.pid))


@pytest.mark.plain_build
def test_client_that_never_reads_costs_the_gateway_a_bounded_amount(remote):
    """A command prints 100 MB as exec.output notifications to a client that reads nothing:
    the gateway's memory stays under RSS_CAP_ONE over its start for as long as the command
    runs (until it is done, or its own 30 s timeout stops it when the daemon holds its
    output back for the congested client)."""
    gw = remote.gateway_pid()
    unix = remote.daemon.client()
    sb = unix.call("sandbox.create", {}, timeout=60)["id"]
    marker = "fold -w 1000"

    async def go():
        # The library stops reading the socket once one message waits unread.
        c = await Ws.connect(remote, max_queue=1, read_limit=1 << 12)
        base = peak = vmrss(gw)
        c.reader.cancel()  # nothing reads from here on
        await c.ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "exec.run", "params": {
            "sandbox": sb, "stream": True, "timeout": 30,
            "command": f"head -c 100000000 /dev/zero | tr '\\0' a | {marker}"}}))
        seen = False
        for _ in range(3000):
            running = command_running(remote.daemon, marker)
            seen = seen or running
            peak = max(peak, vmrss(gw))
            if seen and not running:
                break
            await asyncio.sleep(0.1)
        assert seen
        peak = max(peak, vmrss(gw))
        c.ws.transport.abort()
        return base, peak

    base, peak = run(go())
    assert peak - base < RSS_CAP_ONE, f"gateway RSS grew by {(peak - base) >> 20} MiB"
    # The gateway still serves.
    assert run(_ping(remote))["tenant"] == "admin"
    unix.call("sandbox.destroy", {"id": sb}, timeout=60)


async def _ping(r):
    c = await Ws.connect(r)
    try:
        return await c.call("daemon.ping")
    finally:
        await c.close()


def test_client_that_sends_nothing_is_dropped(remote):
    """TCP open and nothing sent; TLS done and no HTTP request: both dropped by the handshake
    deadline (10 s; the test waits up to 40)."""
    with socket.create_connection(("127.0.0.1", remote.port), timeout=40) as s:
        assert s.recv(1) == b""
    with socket.create_connection(("127.0.0.1", remote.port), timeout=40) as s:
        with client_ctx(remote.ca).wrap_socket(s, server_hostname="127.0.0.1") as t:
            try:
                assert t.recv(1) == b""
            except (ConnectionResetError, ssl.SSLEOFError):
                pass


@pytest.mark.plain_build
def test_1000_connections_at_once(remote):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    gw = remote.gateway_pid()

    async def go():
        sem = asyncio.Semaphore(100)

        async def one():
            async with sem:
                return await Ws.connect(remote)

        clients = await asyncio.gather(*[one() for _ in range(1000)])
        rss = vmrss(gw)
        pongs = await asyncio.gather(*[c.call("daemon.ping") for c in clients[::50]])
        # The daemon still answers its unix socket, and a new remote client.
        assert remote.daemon.client().call("daemon.ping")["pid"] == remote.daemon.pid
        assert (await _ping(remote))["tenant"] == "admin"
        await asyncio.gather(*[c.close() for c in clients])
        return rss, pongs

    rss, pongs = run(go())
    assert len(pongs) == 20 and all(p["tenant"] == "admin" for p in pongs)
    assert rss < RSS_CAP_THOUSAND, f"gateway RSS {rss >> 20} MiB with 1,000 clients"


@pytest.mark.slow
def test_idle_connection_is_pinged_every_30_s(remote):
    """A raw WebSocket (handshake by hand, so that no library answers pings for it): after
    30 s idle the server sends a ping frame (opcode 9)."""
    with socket.create_connection(("127.0.0.1", remote.port), timeout=60) as s:
        with client_ctx(remote.ca).wrap_socket(s, server_hostname="127.0.0.1") as t:
            t.sendall(b"GET /rpc HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                      + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                data += t.recv(4096)
            head, _, data = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101"), head
            t0 = time.monotonic()
            while len(data) < 2:
                data += t.recv(4096)
            waited = time.monotonic() - t0
    assert data[0] & 0x0F == 0x9, data[:8]
    assert waited > 20, waited  # pinged for being idle, not at once


# ---- restarts and reloads -------------------------------------------------------------------


def test_daemon_restarted_under_connected_clients(remote):
    async def before():
        c = await Ws.connect(remote)
        sb = (await c.call("sandbox.create", {"name": "survivor"}, timeout=60))["id"]
        return c, sb

    async def scenario():
        c, sb = await before()
        old_gw = remote.gateway_pid()
        remote.daemon.kill9()
        # The gateway goes with the daemon, and the client's connection closes.
        await asyncio.wait_for(c.ws.wait_closed(), 30)
        for _ in range(200):
            if not os.path.exists(f"/proc/{old_gw}"):
                break
            await asyncio.sleep(0.05)
        assert not os.path.exists(f"/proc/{old_gw}")
        remote.daemon.start()
        remote.wait_ready()
        d = await Ws.connect(remote)
        listed = (await d.call("sandbox.list"))["sandboxes"]
        assert [s["id"] for s in listed] == [sb]
        await d.call("sandbox.start", {"id": sb}, timeout=60)
        r = await d.call("exec.run", {"sandbox": sb, "command": "echo back"}, timeout=60)
        await d.call("sandbox.destroy", {"id": sb}, timeout=60)
        await d.close()
        return r

    assert run(scenario())["stdout"] == "back\n"


def test_gateway_killed_is_restarted(remote):
    gw = remote.gateway_pid()

    async def go():
        c = await Ws.connect(remote)
        os.kill(gw, signal.SIGKILL)
        await asyncio.wait_for(c.ws.wait_closed(), 30)

    run(go())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            new = remote.gateway_pid(timeout=1)
            if new != gw:
                break
        except AssertionError:
            pass
        time.sleep(0.05)
    assert new != gw
    remote.wait_ready()
    assert run(_ping(remote))["tenant"] == "admin"


def test_sighup_reloads_the_certificate(remote, certs):
    def served_cn():
        with socket.create_connection(("127.0.0.1", remote.port), timeout=10) as s:
            with client_ctx(remote.ca).wrap_socket(s, server_hostname="127.0.0.1") as t:
                return dict(x[0] for x in t.getpeercert()["subject"])["commonName"]

    assert served_cn() == "server"

    async def go():
        c = await Ws.connect(remote)
        for src, dst in (("renewed.pem", remote.cert), ("renewed.key", remote.key)):
            with open(os.path.join(certs, src), "rb") as f, open(dst, "wb") as g:
                g.write(f.read())
        os.kill(remote.daemon.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while served_cn() != "renewed" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # A connection made before goes on.
        pong = await c.call("daemon.ping")
        await c.close()
        return pong

    assert run(go())["tenant"] == "admin"
    assert served_cn() == "renewed"
    # A broken pair is refused on SIGHUP and the one in use stays.
    with open(remote.key, "w") as f:
        f.write("not a key\n")
    os.kill(remote.daemon.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "keeping the certificate in use" not in remote.daemon.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "keeping the certificate in use" in remote.daemon.log()
    assert served_cn() == "renewed"


def test_gateway_holds_no_fd_of_the_daemon(remote):
    """The gateway is an exec of the binary (none of the daemon's memory) and keeps none of
    the daemon's fds: besides stdio, only sockets and its own event fds, no file."""
    gw = remote.gateway_pid()
    fds = {int(n): os.readlink(f"/proc/{gw}/fd/{n}") for n in os.listdir(f"/proc/{gw}/fd")}
    files = {n: t for n, t in fds.items() if n > 2 and t.startswith("/") and not t.startswith("/dev/")}
    assert files == {}, fds
    assert len(fds) < 12, fds
    with open(f"/proc/{gw}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[1] == b"__gateway"
    with open(f"/proc/{gw}/maps") as f:
        maps = f.read()
    assert "state.db" not in maps
