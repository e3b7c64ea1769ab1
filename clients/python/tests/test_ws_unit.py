# test_ws_unit.py - the remote transport's WebSocket framing (conch_client/_ws.py) without a
# network: URLs, masking, the frames the server may send (fragments, pings, close, and what
# RFC 6455 forbids it to send), and the frames the client sends. The whole transport (TLS,
# the handshake, a real gateway) is tested in tests/integration/test_remote_clients.py.
import struct

import pytest

from conch_client import ConnectionLost
from conch_client import _ws


class FakeTls:
    """Feeds the bytes a server would send; records what the client sends."""

    def __init__(self, data: bytes):
        self.data = bytearray(data)
        self.sent = []
        self.sock = None

    def recv(self, n):
        out = bytes(self.data[:min(n, 7)])  # short reads: frames straddle them
        del self.data[:len(out)]
        return out

    def send(self, b):
        self.sent.append(bytes(b))


def transport(data: bytes):
    t = _ws.WebSocketTransport.__new__(_ws.WebSocketTransport)
    t.url = "wss://h:1/rpc"
    t._buf = bytearray()
    t._closed = False
    t._tls = FakeTls(data)
    import threading
    t._wlock = threading.Lock()
    return t


def frame(op, payload, fin=True, mask=False, rsv=0):
    b0 = (0x80 if fin else 0) | rsv | op
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", b0, (0x80 if mask else 0) | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, (0x80 if mask else 0) | 126, n)
    else:
        head = struct.pack("!BBQ", b0, (0x80 if mask else 0) | 127, n)
    if mask:
        return head + b"abcd" + _ws._mask(payload, b"abcd")
    return head + payload


def unmask(f: bytes):
    """(fin, opcode, payload) of a client frame, checking it is masked."""
    b0, b1 = f[0], f[1]
    assert b1 & 0x80, "client frames are masked"
    n, off = b1 & 0x7F, 2
    if n == 126:
        (n,), off = struct.unpack("!H", f[2:4]), 4
    elif n == 127:
        (n,), off = struct.unpack("!Q", f[2:10]), 10
    key = f[off:off + 4]
    return bool(b0 & 0x80), b0 & 0x0F, _ws._mask(f[off + 4:off + 4 + n], key)


def test_urls():
    assert _ws.parse_url("wss://h.example:8443") == ("h.example", 8443, "/rpc")
    assert _ws.parse_url("wss://h") == ("h", 443, "/rpc")
    assert _ws.parse_url("wss://[::1]:9/x") == ("::1", 9, "/x")
    for bad in ("ws://h:1", "https://h", "wss://", "wss://u:secret@h:1", "wss://h:99999"):
        with pytest.raises(ValueError) as e:
            _ws.parse_url(bad)
        assert "secret" not in str(e.value)


def test_mask_is_its_own_inverse():
    data = bytes(range(256)) * 41 + b"xyz"
    m = _ws._mask(data, b"\x01\x02\x03\x04")
    assert m != data and _ws._mask(m, b"\x01\x02\x03\x04") == data
    assert _ws._mask(b"", b"abcd") == b""


def test_fragments_pings_and_close():
    data = (frame(0x1, b'{"a":', fin=False) + frame(0x9, b"p1") + frame(0x0, b"1", fin=False)
            + frame(0x0, b"}") + frame(0x1, b"x" * 70000) + frame(0x8, struct.pack("!H", 1000)))
    t = transport(data)
    assert t.readline() == b'{"a":1}\n'
    # The ping in the middle of the fragmented message was answered with its payload.
    assert [unmask(f) for f in t._tls.sent] == [(True, 0xA, b"p1")]
    assert t.readline() == b"x" * 70000 + b"\n"
    assert t.readline() == b""  # close: answered, then the end
    assert unmask(t._tls.sent[-1])[1] == 0x8
    assert transport(b"").readline() == b""  # the end of the stream


@pytest.mark.parametrize("data, why", [
    (frame(0x1, b"{}", mask=True), "masked"),
    (frame(0x1, b"{}", rsv=0x40), "reserved"),
    (frame(0x0, b"{}"), "unexpected"),
    (frame(0x1, b"{", fin=False) + frame(0x1, b"}"), "inside a fragmented"),
    (frame(0x9, b"p", fin=False), "control"),
    (struct.pack("!BBQ", 0x81, 127, (64 << 20) + 1), "64 MiB"),
])
def test_what_a_server_may_not_send(data, why):
    with pytest.raises(ConnectionLost, match=why):
        transport(data).readline()


def test_sent_messages_masked_and_fragmented(monkeypatch):
    monkeypatch.setattr(_ws, "FRAGMENT", 1000)
    t = transport(b"")
    t.write(b'{"id":1}\n' + b'"' + b"y" * 2500 + b'"\n')
    frames = [unmask(f) for f in t._tls.sent]
    assert frames[0] == (True, 0x1, b'{"id":1}')
    assert [(fin, op) for fin, op, _ in frames[1:]] == [(False, 0x1), (False, 0x0), (True, 0x0)]
    assert b"".join(p for _, _, p in frames[1:]) == b'"' + b"y" * 2500 + b'"'
    with pytest.raises(ValueError, match="64 MiB"):
        t.write(b"z" * ((64 << 20) + 1) + b"\n")
