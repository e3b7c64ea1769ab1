# loopcheck.py - helpers for tests that the daemon's event loop is not held by slow work:
# a pinger that records the order of its pings, a connection that notes the first byte of an
# answer, and the CPU time of the daemon's threads. They let a test assert what happened
# (pings answered while X ran; X's work done by the threadpool), never how fast: latency is
# measured by bench/loop.py.
import json
import os
import socket
import threading
import time

from rpcclient import Client


class Pinger:
    """Pings the daemon from its own connection in a thread, one ping after the other, and
    records when each was sent and answered (time.monotonic()). Tests ask about the order of
    events (was a ping sent after X's request answered before X's answer?), never about how
    long a ping took: latency is measured by bench/loop.py."""

    def __init__(self, sock, pause=0.005):
        self.c = Client.unix(sock)
        self.pause = pause
        self.pings = []  # (sent, answered)
        self.errors = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.c.call("daemon.ping", {}, timeout=120)
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
                return
            self.pings.append((t0, time.monotonic()))
            time.sleep(self.pause)

    def wait_first(self, timeout=120):
        """Wait until one ping was answered (the pinger's connection is up and served)."""
        deadline = time.monotonic() + timeout
        while not self.pings and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.pings, f"no ping answered: {self.errors}"

    @property
    def count(self):
        return len(self.pings)

    def answered_between(self, start, end):
        """How many pings were sent at or after @start and answered before @end."""
        return sum(1 for s, a in list(self.pings) if s >= start and a < end)

    def stop(self):
        self._stop.set()
        self._t.join(130)
        self.c.close()


def thread_cpu(pid):
    """(the event loop's CPU time, every other thread's), in clock ticks, from
    /proc/PID/task/*/stat (utime + stime). The loop runs on the main thread (tid == pid); the
    others are libuv's threadpool (and whatever else the daemon starts)."""
    main = rest = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue  # a thread that just ended
        fields = st[st.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])
        if int(tid) == pid:
            main += ticks
        else:
            rest += ticks
    return main, rest


class FirstByte:
    """A raw connection that sends one request and records when the first byte of any
    answer arrives (the moment the daemon started writing it: a result built on the loop
    holds every other client until then) and the whole answer (one line)."""

    def __init__(self, sock_path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock_path)
        self.first = None
        self.data = bytearray()

    def call(self, method, params, timeout=120):
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        self.s.sendall(line.encode() + b"\n")
        sent = time.monotonic()
        self.s.settimeout(timeout)
        while not self.data.endswith(b"\n"):
            b = self.s.recv(1 << 20)
            assert b, "the daemon closed the connection"
            if self.first is None:
                self.first = time.monotonic()
            self.data += b
        return sent, json.loads(self.data)

    def close(self):
        self.s.close()
