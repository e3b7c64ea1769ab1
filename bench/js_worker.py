#!/usr/bin/env python3
"""js_worker.py - the JS worker as a process (`conch __js-worker`) on a socketpair, from a
Python client: a new worker's first eval (process start included), one eval's round trip,
one tool call's extra round trip, 100 parallel tool calls. No sandbox, no daemon yet: the
worker runs on the host. Prints medians beside issue 17's goals and its @langchain/quickjs
figures. Usage: bench/js_worker.py [CONCH_BIN] [ROUNDS]"""
import json
import select
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

BIN = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent.parent / "build" / "conch")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 500


class Worker:
    def __init__(self):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([BIN, "__js-worker"], stdin=theirs)
        theirs.close()

    def send(self, obj):
        data = json.dumps(obj).encode()
        self.sock.sendall(struct.pack("=Q", len(data)) + data)

    def recv(self):
        n = struct.unpack("=Q", self._exact(8))[0]
        return json.loads(self._exact(n))

    def _exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise SystemExit("js_worker.py: the worker closed its end")
            buf += chunk
        return bytes(buf)

    def eval(self, code, tools=None):
        params = {"code": code}
        if tools:
            params["tools"] = tools
        self.send({"method": "eval", "params": params})
        answers = bytearray()
        while True:
            m = self.recv()
            if "tool_call" in m:
                # Answered in one send with every other call already here, as a harness
                # answering concurrent calls would.
                c = m["tool_call"]
                data = json.dumps({"method": "tool_result",
                                   "params": {"id": c["id"], "ok": True, "value": c["input"]}}).encode()
                answers += struct.pack("=Q", len(data)) + data
                if not select.select([self.sock], [], [], 0)[0]:
                    self.sock.sendall(answers)
                    answers.clear()
                continue
            r = m["result"]
            if not r["ok"]:
                raise SystemExit(f"js_worker.py: eval failed: {r}")
            return r

    def close(self):
        self.sock.close()
        self.proc.wait()


def median_ms(f, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def first_eval():
    w = Worker()
    w.eval("1 + 1")
    w.close()


floor = median_ms(lambda: subprocess.run(["/bin/true"]), max(20, ROUNDS // 10))
starts = median_ms(first_eval, max(20, ROUNDS // 10))
w = Worker()
w.eval("let n = 0", tools=["echo"])
per_eval = median_ms(lambda: w.eval("n = n + 1"), ROUNDS)
with_call = median_ms(lambda: w.eval("await tools.echo({ i: 1 })"), ROUNDS)
hundred = median_ms(lambda: w.eval(
    "(await Promise.all(Array.from({ length: 100 }, (_, i) => tools.echo(i)))).length"), max(20, ROUNDS // 10))
w.close()

rows = [
    ("floor: /bin/true from subprocess.run", floor, None, "-"),
    ("new worker (process start) + first eval", starts, 5.0, "2-7"),
    ("one eval round trip (`n = n + 1`)", per_eval, 0.2, "0.1-0.25"),
    ("one tool call's extra round trip", with_call - per_eval, 0.3, "~3"),
    ("eval of 100 parallel tool calls", hundred, 5.0, "~21"),
]
print(f"{'conch __js-worker, Python client':44} {'conch':>10} {'goal':>9} {'@langchain/quickjs':>20}")
for name, v, goal, ref in rows:
    g = f"{goal:6.2f} ms" if goal else f"{'-':>9}"
    print(f"{name:44} {v:7.3f} ms {g} {ref:>17} ms")
