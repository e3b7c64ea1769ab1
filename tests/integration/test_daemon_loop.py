# test_daemon_loop.py - the daemon's event loop never stalls and never grows without bound
# (issue 6, defects 6 and 12, and the range checks of 14): a client that never reads is
# disconnected past its output buffer's hard limit while the daemon's memory stays bounded
# and other clients are answered; numbers out of range are refused by the param table;
# workspace scans run off the loop.
import json
import os
import socket
import threading
import time

import pytest

from rpcclient import Client, RpcError


def vm_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class Pinger:
    """Pings the daemon from its own connection in a thread; records the worst latency."""

    def __init__(self, sock):
        self.c = Client.unix(sock)
        self.worst = 0.0
        self.count = 0
        self.errors = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.c.call("daemon.ping", {}, timeout=30)
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
                return
            self.worst = max(self.worst, time.monotonic() - t0)
            self.count += 1
            time.sleep(0.02)

    def stop(self):
        self._stop.set()
        self._t.join(40)
        self.c.close()


def raw_request(sock, req_id, method, params):
    line = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
    sock.sendall(line.encode() + b"\n")


def test_non_reading_client_is_disconnected_and_memory_bounded(daemon_factory):
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {})["id"]
    rss0 = vm_kb(d.pid, "VmRSS")
    pinger = Pinger(d.sock)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(d.sock)
    # 20 commands of ~27 MB of output each, 8 MiB of it kept per result; never read a byte.
    # Paced so that the daemon holds one or two results at a time, not 20 commands' buffers.
    peak = 0
    for i in range(20):
        try:
            raw_request(s, i + 1, "exec.run", {"sandbox": sb, "max_output": 8 << 20, "timeout": 60,
                                               "command": "head -c 20M /dev/zero | base64 -w 0"})
        except (BrokenPipeError, ConnectionResetError):
            break  # already disconnected: that is the point
        for _ in range(10):
            time.sleep(0.1)
            peak = max(peak, vm_kb(d.pid, "VmRSS"))
    # the daemon closed the connection: reading now gets what the kernel held, then EOF
    s.settimeout(30)
    got = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            b = s.recv(1 << 20)
        except (ConnectionResetError, socket.timeout):
            break
        if not b:
            break
        got += len(b)
        peak = max(peak, vm_kb(d.pid, "VmRSS"))
    eof = time.monotonic() < deadline
    s.close()
    pinger.stop()
    assert eof, "the daemon never closed the non-reading client's connection"
    # 20 results of 8+ MiB (plus their text) is 320+ MB: far less was ever queued
    assert got < 200 << 20, f"{got} bytes were sent to the client: no hard limit"
    assert peak < 150 * 1024, f"daemon RSS peaked at {peak} kB (started at {rss0} kB)"
    assert not pinger.errors, pinger.errors
    assert pinger.count > 10 and pinger.worst < 1.0, (pinger.count, pinger.worst)
    # the daemon and the sandbox still serve
    r = c.call("exec.run", {"sandbox": sb, "command": "echo ok"}, timeout=60)
    assert r["stdout"] == "ok\n", r
    assert "hard limit" in d.log()
