# _ws.py - the remote transport of conch_client: JSON-RPC over WebSocket (RFC 6455, client
# side) on TLS, to a `conch serve --listen` gateway (docs/PROTOCOL.md, "Remote transport").
# Standard library only. One JSON-RPC message per text message; TLS runs over memory BIOs
# under one lock, so the reader thread and writers never use OpenSSL's object at once.
from __future__ import annotations

import base64
import hashlib
import os
import socket as _socket
import ssl
import struct
import threading
import urllib.parse
from typing import Optional, Tuple

from .errors import ConnectionLost

#: The largest message either side sends (the gateway's limit too).
MAX_MESSAGE = 64 << 20
#: Outgoing messages are cut into frames of this size.
FRAGMENT = 1 << 20
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_HEADERS = 16 << 10


def parse_url(url: str) -> Tuple[str, int, str]:
    """wss://HOST[:PORT][/PATH] -> (host, port, path); the path defaults to /rpc."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "wss":
        raise ValueError(f"remote URL {url!r}: the scheme must be wss:// (TLS); "
                         f"a token is never sent in the clear")
    if not u.hostname:
        raise ValueError(f"remote URL {url!r} names no host")
    if u.username or u.password:
        raise ValueError("remote URL: put the token in CONCH_TOKEN or token=, not in the URL")
    try:
        port = u.port or 443
    except ValueError:
        raise ValueError(f"remote URL {url!r}: bad port") from None
    path = u.path or "/rpc"
    if u.query:
        path += "?" + u.query
    return u.hostname, port, path


def tls_context(ca: Optional[str]) -> ssl.SSLContext:
    """The system's CAs, plus @ca (a PEM bundle) when given; hostname checked; TLS 1.2+."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise ConnectionLost(f"cannot load the CA bundle '{ca}' (CONCH_CA / ca=): {e}") \
                from None
    return ctx


def _mask(data: bytes, key: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return b""
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(k, "little")).to_bytes(n, "little")


class _Tls:
    """TLS over a connected TCP socket through memory BIOs; @lock serialises OpenSSL."""

    def __init__(self, sock: _socket.socket, ctx: ssl.SSLContext, host: str):
        self.sock = sock
        self.inc = ssl.MemoryBIO()
        self.out = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inc, self.out, server_hostname=host)
        self.lock = threading.Lock()

    def _flush(self) -> None:
        data = self.out.read()
        if data:
            self.sock.sendall(data)

    def _feed(self) -> None:
        data = self.sock.recv(1 << 16)
        if data:
            self.inc.write(data)
        else:
            self.inc.write_eof()

    def handshake(self) -> None:
        while True:
            with self.lock:
                try:
                    self.obj.do_handshake()
                    self._flush()
                    return
                except ssl.SSLWantReadError:
                    self._flush()
            self._feed()

    def recv(self, n: int) -> bytes:
        """Up to @n bytes; b"" at the end of the stream."""
        while True:
            with self.lock:
                try:
                    data = self.obj.read(n)
                    self._flush()
                    return data
                except ssl.SSLWantReadError:
                    self._flush()
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return b""
            self._feed()

    def send(self, data: bytes) -> None:
        with self.lock:
            self.obj.write(data)
            self._flush()


class WebSocketTransport:
    """A JSON-RPC connection to a remote conch gateway: ``readline()`` returns the next
    message (one JSON value) with a newline, b"" once the connection ended; ``write()``
    sends each line it is given as one text message. The token is sent once, in the
    upgrade request, and kept nowhere else."""

    def __init__(self, url: str, token: Optional[str] = None, ca: Optional[str] = None, *,
                 connect_timeout: float = 10.0):
        self.url = url
        host, port, path = parse_url(url)
        ctx = tls_context(ca)
        self._buf = bytearray()
        self._wlock = threading.Lock()
        self._closed = False
        try:
            sock = _socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to {url}: {e}") from None
        try:
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            self._tls = _Tls(sock, ctx, host)
            try:
                self._tls.handshake()
            except ssl.SSLCertVerificationError as e:
                raise ConnectionLost(
                    f"cannot connect to {url}: the server's certificate was refused: "
                    f"{e.verify_message} (a private CA: set CONCH_CA or ca= to its PEM file)"
                ) from None
            except (ssl.SSLError, OSError) as e:
                raise ConnectionLost(f"cannot connect to {url}: TLS handshake failed: {e}") \
                    from None
            self._upgrade(host, port, path, token)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)

    def __repr__(self) -> str:
        return f"WebSocketTransport({self.url!r})"

    # -- the opening handshake -----------------------------------------------------------
    def _upgrade(self, host: str, port: int, path: str, token: Optional[str]) -> None:
        key = base64.b64encode(os.urandom(16))
        hosthdr = f"[{host}]" if ":" in host else host
        if port != 443:
            hosthdr += f":{port}"
        req = (f"GET {path} HTTP/1.1\r\nHost: {hosthdr}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\n"
               f"Sec-WebSocket-Version: 13\r\nUser-Agent: conch-client-python\r\n")
        if token:
            if any(c in token for c in "\r\n"):
                raise ConnectionLost("the token (CONCH_TOKEN / token=) holds a line break")
            req += f"Authorization: Bearer {token}\r\n"
        self._tls.send((req + "\r\n").encode())
        del req
        while b"\r\n\r\n" not in self._buf:
            if len(self._buf) > _MAX_HEADERS:
                raise ConnectionLost(f"{self.url}: the server's HTTP answer is too long")
            data = self._tls.recv(1 << 14)
            if not data:
                raise ConnectionLost(f"{self.url}: the server closed the connection during "
                                     f"the WebSocket handshake")
            self._buf += data
        head, _, rest = bytes(self._buf).partition(b"\r\n\r\n")
        self._buf = bytearray(rest)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status == 401:
            raise ConnectionLost(f"{self.url}: unauthorized (HTTP 401): the server refused "
                                 f"the token (CONCH_TOKEN / token=)" if token else
                                 f"{self.url}: unauthorized (HTTP 401): no token given "
                                 f"(set CONCH_TOKEN or token=)")
        if status == 429:
            raise ConnectionLost(f"{self.url}: rate limited (HTTP 429): too many failed "
                                 f"authentications from this address; wait a minute")
        if status != 101:
            raise ConnectionLost(f"{self.url}: the server did not accept the WebSocket "
                                 f"upgrade: {lines[0][:200]!r}")
        hdrs = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        want = base64.b64encode(hashlib.sha1(key + _GUID).digest()).decode()
        if (hdrs.get("upgrade", "").lower() != "websocket"
                or "upgrade" not in hdrs.get("connection", "").lower()
                or hdrs.get("sec-websocket-accept") != want):
            raise ConnectionLost(f"{self.url}: bad WebSocket handshake answer "
                                 f"(Upgrade, Connection or Sec-WebSocket-Accept)")

    # -- frames --------------------------------------------------------------------------
    def _frame(self, opcode: int, payload: bytes, fin: bool = True) -> bytes:
        n = len(payload)
        b0 = (0x80 if fin else 0) | opcode
        if n < 126:
            head = struct.pack("!BB", b0, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", b0, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", b0, 0x80 | 127, n)
        key = os.urandom(4)
        return head + key + _mask(payload, key)

    def _send_frames(self, frames) -> None:
        with self._wlock:
            for f in frames:
                self._tls.send(f)

    def _need(self, n: int) -> bytes:
        while len(self._buf) < n:
            data = self._tls.recv(max(1 << 16, min(n - len(self._buf), 1 << 22)))
            if not data:
                raise EOFError
            self._buf += data
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _read_frame(self):
        b0, b1 = self._need(2)
        if b1 & 0x80:
            raise ConnectionLost(f"{self.url}: the server sent a masked frame")
        if b0 & 0x70:
            raise ConnectionLost(f"{self.url}: the server set reserved frame bits")
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._need(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._need(8))
        op = b0 & 0x0F
        if op >= 8 and (n > 125 or not b0 & 0x80):
            raise ConnectionLost(f"{self.url}: a bad control frame")
        if n > MAX_MESSAGE:
            raise ConnectionLost(f"{self.url}: a message over {MAX_MESSAGE >> 20} MiB")
        return bool(b0 & 0x80), op, self._need(n)

    # -- the transport interface ---------------------------------------------------------
    def readline(self) -> bytes:
        msg = bytearray()
        started = False
        try:
            while True:
                fin, op, payload = self._read_frame()
                if op == 0x9:  # ping
                    self._send_frames([self._frame(0xA, payload)])
                    continue
                if op == 0xA:  # pong
                    continue
                if op == 0x8:  # close: answer it, the connection ends
                    try:
                        self._send_frames([self._frame(0x8, payload[:2])])
                    except (OSError, ssl.SSLError):
                        pass
                    return b""
                if op in (0x1, 0x2):
                    if started:
                        raise ConnectionLost(f"{self.url}: a new message inside a fragmented one")
                    started = True
                elif op != 0x0 or not started:
                    raise ConnectionLost(f"{self.url}: an unexpected frame (opcode {op})")
                msg += payload
                if len(msg) > MAX_MESSAGE:
                    self.close(1009)
                    raise ConnectionLost(f"{self.url}: a message over {MAX_MESSAGE >> 20} MiB")
                if fin:
                    return bytes(msg) + b"\n"
        except EOFError:
            return b""

    def write(self, data: bytes) -> None:
        if self._closed:
            raise OSError("the connection is closed")
        for line in data.split(b"\n"):
            if not line:
                continue
            if len(line) > MAX_MESSAGE:
                raise ValueError(f"a message of {len(line)} bytes is over the remote "
                                 f"transport's {MAX_MESSAGE >> 20} MiB")
            chunks = [line[i:i + FRAGMENT] for i in range(0, len(line), FRAGMENT)]
            self._send_frames(self._frame(0x1 if i == 0 else 0x0, c, i == len(chunks) - 1)
                              for i, c in enumerate(chunks))

    def close(self, code: int = 1000) -> None:
        if self._closed:
            return
        self._closed = True
        sock = self._tls.sock
        try:
            sock.settimeout(2)
            self._send_frames([self._frame(0x8, struct.pack("!H", code))])
        except (OSError, ssl.SSLError, ValueError):
            pass
        try:
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


class AsyncAdapter:
    """A WebSocketTransport as the (reader, writer) pair AsyncClient reads and writes: a
    thread blocks in readline(), another sends, in order; nothing blocks the event loop."""

    def __init__(self, t: WebSocketTransport):
        import asyncio
        import concurrent.futures
        self._t = t
        self._loop = asyncio.get_running_loop()
        self._rpool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conch-ws-r")
        self._wpool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conch-ws-w")
        self._last = None

    def __repr__(self) -> str:
        return f"AsyncAdapter({self._t!r})"

    # reader
    async def readline(self) -> bytes:
        return await self._loop.run_in_executor(self._rpool, self._t.readline)

    # writer
    def write(self, data: bytes) -> None:
        self._last = self._loop.run_in_executor(self._wpool, self._t.write, data)

    async def drain(self) -> None:
        last = self._last
        if last is not None:
            await last

    def close(self) -> None:
        self._t.close()
        self._rpool.shutdown(wait=False)
        self._wpool.shutdown(wait=False)

    async def wait_closed(self) -> None:
        return None
