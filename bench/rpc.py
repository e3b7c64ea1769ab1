"""bench/rpc.py - the benchmarks' JSON-RPC client of `conch serve`: one unix-socket connection,
one request at a time, newline-delimited JSON (notifications are skipped). Kept minimal so
that it costs a measurement as little as a harness's client would."""

import json
import socket


class RpcError(Exception):
    pass


class Client:
    def __init__(self, path, timeout=60.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = bytearray()
        self.next_id = 0

    def close(self):
        self.sock.close()

    def _line(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return line
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RpcError("the daemon closed the connection")
            self.buf += chunk

    def call(self, method, params=None):
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        self.sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        while True:
            resp = json.loads(self._line())
            if resp.get("id") != rid:
                continue  # a notification (exec.output, job.exited)
            if "error" in resp:
                raise RpcError(f"{method}: {resp['error']}")
            return resp["result"]
