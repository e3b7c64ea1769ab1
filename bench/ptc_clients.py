#!/usr/bin/python3
"""bench/ptc_clients.py - what a tool call costs from inside a sandbox, client side: the round
trip of one call from the Python module (conch_tools), the Node package (conch-tools) and the
tool_call command from bash (against fork+exec of /bin/true in the same bash loop), plus 100
concurrent calls from asyncio.gather, Promise.all and 100 Python threads. All against a fake
bridge in this process that answers at once (a selectors loop echoing each call's input), on
the host: no sandbox and no daemon in between, so the figures are the clients' own cost plus
the fake bridge's (shown by a bare-socket row). See bench/README.md ("ptc_clients.py").

Environment: CONCH_PTC_DIR (default build/ptc), BENCH_N (sequential calls per row, 2000),
BENCH_EXEC_N (tool_call and /bin/true runs per round, 500; 5 alternating rounds, the best
kept), BENCH_QUICK=1 (N=200, EXEC_N=50),
BENCH_REQUIRE_GOAL=1 (exit 2 if a goal fails).
"""

import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTC = os.environ.get("CONCH_PTC_DIR") or os.path.join(ROOT, "build", "ptc")
QUICK = os.environ.get("BENCH_QUICK") == "1"
N = int(os.environ.get("BENCH_N") or (200 if QUICK else 2000))
EXEC_N = int(os.environ.get("BENCH_EXEC_N") or (50 if QUICK else 500))


class Bridge:
    """A fake bridge answering every call at once with its input (one thread, selectors)."""

    def __init__(self, path):
        self.path = path
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(path)
        self.lsock.listen(512)
        self.lsock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.stop_r, self.stop_w = os.pipe()
        self.sel.register(self.stop_r, selectors.EVENT_READ, "stop")
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        bufs = {}
        while True:
            for key, _ in self.sel.select():
                if key.data == "stop":
                    return
                if key.fileobj is self.lsock:
                    try:
                        c, _ = self.lsock.accept()
                    except BlockingIOError:
                        continue
                    c.setblocking(False)
                    bufs[c] = b""
                    self.sel.register(c, selectors.EVENT_READ, "c")
                    continue
                c = key.fileobj
                try:
                    data = c.recv(1 << 20)
                except (BlockingIOError, ConnectionError):
                    data = b"" if not isinstance(sys.exc_info()[1], BlockingIOError) else None
                if data is None:
                    continue
                if not data:
                    self.sel.unregister(c)
                    c.close()
                    bufs.pop(c, None)
                    continue
                buf = bufs[c] + data
                out = []
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    req = json.loads(buf[:nl])
                    buf = buf[nl + 1 :]
                    if req.get("op") == "list":
                        res = {"tools": [], "agents": []}
                    else:
                        res = req.get("input", req.get("task"))
                    out.append(json.dumps({"id": req.get("id"), "ok": True, "result": res}).encode() + b"\n")
                bufs[c] = buf
                if out:
                    c.setblocking(True)
                    c.sendall(b"".join(out))
                    c.setblocking(False)

    def close(self):
        os.write(self.stop_w, b"x")
        self.thread.join(5)
        self.lsock.close()


def run_json(argv, env, timeout=600):
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"bench: {argv[0]} failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


PY_SEQ = """
import json, socket, time, os, sys, asyncio, threading
sys.path.insert(0, os.environ["PTC_PY"])
import conch_tools as ct
N = int(os.environ["N"])
for _ in range(200): ct.call("echo", {"i": 1})
t = time.perf_counter()
for i in range(N): ct.call("echo", {"i": i})
seq = (time.perf_counter() - t) / N
async def gather():
    await ct.acall("echo", {})
    best = 1e9
    for _ in range(20):
        t = time.perf_counter()
        await asyncio.gather(*(ct.acall("echo", {"i": i}) for i in range(100)))
        best = min(best, time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(N): await ct.acall("echo", {"i": i})
    return best, (time.perf_counter() - t) / N
g100, aseq = asyncio.run(gather())
def threads():
    best = 1e9
    for _ in range(10):
        ts = [threading.Thread(target=ct.call, args=("echo", {"i": i})) for i in range(100)]
        t = time.perf_counter()
        [x.start() for x in ts]; [x.join() for x in ts]
        best = min(best, time.perf_counter() - t)
    return best
t100 = threads()
# The floor: the same round trip on a bare socket, no module.
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["CONCH_PTC_SOCK"]); f = s.makefile("rb")
t = time.perf_counter()
for i in range(N):
    s.sendall(b'{"id":%d,"op":"call","name":"echo","input":{"i":%d}}\\n' % (i, i)); f.readline()
raw = (time.perf_counter() - t) / N
print(json.dumps({"seq": seq, "aseq": aseq, "gather100": g100, "threads100": t100, "raw": raw}))
"""

NODE_SEQ = """
const { call } = require(process.env.PTC_NODE);
(async () => {
  const N = +process.env.N;
  for (let i = 0; i < 200; i++) await call('echo', { i });
  let t = process.hrtime.bigint();
  for (let i = 0; i < N; i++) await call('echo', { i });
  const seq = Number(process.hrtime.bigint() - t) / 1e9 / N;
  let best = 1e9;
  for (let r = 0; r < 20; r++) {
    t = process.hrtime.bigint();
    await Promise.all(Array.from({ length: 100 }, (_, i) => call('echo', { i })));
    best = Math.min(best, Number(process.hrtime.bigint() - t) / 1e9);
  }
  console.log(JSON.stringify({ seq, all100: best }));
})();
"""

BASH_LOOP = """
# Alternating rounds (the machine may be busy): the caller keeps the best round of each row.
TIMEFORMAT=%R
n=$1 rounds=$2
t() { { time for ((i = 0; i < n; i++)); do "$@" >/dev/null; done; } 2>&1; }
tr=() tc=() th=()
for ((r = 0; r < rounds; r++)); do
  tr+=("$(t /bin/true)")
  tc+=("$(t "$TOOL_CALL" echo '{"i": 1}')")
  th+=("$(t "$TOOL_CALL" --help)")
done
j() { local IFS=,; echo "[$*]"; }
echo "{\\"true\\": $(j "${tr[@]}"), \\"tool_call\\": $(j "${tc[@]}"), \\"start\\": $(j "${th[@]}")}"
"""


def us(x):
    return f"{x * 1e6:8.1f} µs"


def ms(x):
    return f"{x * 1e3:8.2f} ms"


def main():
    tool_call = os.path.join(PTC, "bin", "tool_call")
    if not os.access(tool_call, os.X_OK):
        sys.exit(f"bench: {tool_call} missing: build conch first (ninja -C build)")
    d = tempfile.mkdtemp(prefix="ptc-bench-", dir="/tmp")
    path = os.path.join(d, "ptc.sock")
    bridge = Bridge(path)
    env = dict(os.environ, CONCH_PTC_SOCK=path, N=str(N), PTC_PY=os.path.join(PTC, "python"),
               PTC_NODE=os.path.join(PTC, "node", "conch-tools", "index.js"), TOOL_CALL=tool_call)
    rows, goals = [], []
    try:
        py = run_json([sys.executable, "-c", PY_SEQ], env)
        rows += [
            ("python: call() round trip", us(py["seq"])),
            ("python: await acall() round trip", us(py["aseq"])),
            ("python: asyncio.gather of 100 calls", ms(py["gather100"])),
            ("python: 100 threads, one call each", ms(py["threads100"])),
            ("bare socket round trip (the floor)", us(py["raw"])),
        ]
        goals.append(("python call <= 0.3 ms", py["seq"] <= 0.3e-3))
        goals.append(("python 100 concurrent <= 10 ms", py["gather100"] <= 10e-3))
        node = shutil.which("node")
        if node:
            nd = run_json([node, "-e", NODE_SEQ], env)
            rows += [("node: await call() round trip", us(nd["seq"])),
                     ("node: Promise.all of 100 calls", ms(nd["all100"]))]
            goals.append(("node call <= 0.3 ms", nd["seq"] <= 0.3e-3))
            goals.append(("node 100 concurrent <= 10 ms", nd["all100"] <= 10e-3))
        b = run_json(["bash", "-c", BASH_LOOP, "bench", str(EXEC_N), "5"], env)
        t_true, t_call = min(b["true"]) / EXEC_N, min(b["tool_call"]) / EXEC_N
        rows += [("bash: /bin/true (fork+exec)", us(t_true)),
                 ("bash: tool_call --help (start-up, no call)", us(min(b["start"]) / EXEC_N)),
                 ("bash: tool_call echo (fork+exec+call)", us(t_call)),
                 ("tool_call / true", f"{t_call / t_true:8.2f} x")]
        goals.append(("tool_call <= 1.5x /bin/true", t_call <= 1.5 * t_true))
    finally:
        bridge.close()
        shutil.rmtree(d, ignore_errors=True)
    print(f"ptc clients, against a fake bridge answering at once (N={N}, exec N={EXEC_N})")
    for name, v in rows:
        print(f"  {name:42s} {v}")
    print("goals:")
    for name, ok in goals:
        print(f"  {'ok  ' if ok else 'MISS'} {name}")
    if os.environ.get("BENCH_REQUIRE_GOAL") == "1" and not all(ok for _, ok in goals):
        sys.exit(2)


if __name__ == "__main__":
    main()
