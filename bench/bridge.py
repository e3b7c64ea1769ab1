#!/usr/bin/env python3
"""bench/bridge.py - the tool bridge's round trip, measured as a harness would see it.

One run, side by side:
  * reference: the same answering client (a Python process) answering a local request from
    a Python caller over a unix socket, no sandbox in between: the cheapest way to call a
    host function from another process;
  * Python: conch_tools.call() inside a sandbox of a real `conch serve`, answered by the
    client over the daemon's socket (tool.call);
  * Node: conch-tools' call() inside the sandbox;
  * bash: `tool_call echo '{}'` in a loop, against `/bin/true` in the same loop (the cost of
    spawning a process in the same sandbox);
  * 100 concurrent calls (asyncio.gather of conch_tools.acall) - wall time.
Goals (issue 7): <= 0.3 ms per call from Python and Node, tool_call <= 1.5x /bin/true,
100 concurrent calls <= 10 ms.

Usage: bench/bridge.py [--conch build/conch] [--calls 2000]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Answerer:
    """A lean JSON-RPC client of the daemon that answers tool.call at once on its reader
    thread (no thread per call): what a fast harness does."""

    def __init__(self, sock_path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(sock_path)
        self.f = self.s.makefile("rb")
        self.lock = threading.Lock()
        self.cv = threading.Condition()
        self.replies = {}
        self.next = 1
        threading.Thread(target=self.reader, daemon=True).start()

    def send(self, obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.s.sendall(data)

    def reader(self):
        for line in self.f:
            msg = json.loads(line)
            if "method" in msg and "id" in msg:  # tool.call: answer at once
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": msg["params"]["input"]})
            elif "id" in msg:
                with self.cv:
                    self.replies[msg["id"]] = msg
                    self.cv.notify_all()

    def call(self, method, params, timeout=120):
        with self.cv:
            i = self.next
            self.next += 1
        self.send({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
        with self.cv:
            self.cv.wait_for(lambda: i in self.replies, timeout)
            msg = self.replies.pop(i)
        if "error" in msg:
            raise RuntimeError(msg["error"])
        return msg["result"]


def reference(n):
    """A Python caller and the same kind of answering process, over a unix socket, no
    sandbox: per-call round trip in ms."""
    d = tempfile.mkdtemp()
    path = os.path.join(d, "ref.sock")
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,json,sys\n"
            "s=socket.socket(socket.AF_UNIX);s.bind(sys.argv[1]);s.listen(1);print('ready',flush=True)\n"
            "c,_=s.accept();f=c.makefile('rb')\n"
            "for line in f:\n"
            "  m=json.loads(line);c.sendall((json.dumps({'id':m['id'],'ok':True,'result':m['input']})+'\\n').encode())\n",
            path,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    server.stdout.readline()
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    t0 = time.perf_counter()
    for i in range(n):
        s.sendall((json.dumps({"id": i, "op": "call", "name": "echo", "input": {}}) + "\n").encode())
        json.loads(f.readline())
    per = (time.perf_counter() - t0) / n * 1000
    s.close()
    server.kill()
    server.wait()
    shutil.rmtree(d)
    return per


PY_LOOP = """
import time, conch_tools, asyncio, json
n = {n}
conch_tools.call("echo", {{}})
t0 = time.perf_counter()
for i in range(n):
    conch_tools.call("echo", {{}})
per = (time.perf_counter() - t0) / n * 1000
async def burst():
    await conch_tools.acall("echo", {{}})
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        await asyncio.gather(*(conch_tools.acall("echo", {{"i": i}}) for i in range(100)))
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best
print(json.dumps({{"per_call_ms": per, "burst100_ms": asyncio.run(burst())}}))
"""

NODE_LOOP = """
const {{ call }} = require('conch-tools');
(async () => {{
  const n = {n};
  await call('echo', {{}});
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await call('echo', {{}});
  const per = Number(process.hrtime.bigint() - t0) / 1e6 / n;
  let best = 1e9;
  for (let k = 0; k < 5; k++) {{
    const t1 = process.hrtime.bigint();
    await Promise.all(Array.from({{length: 100}}, (_, i) => call('echo', {{i}})));
    best = Math.min(best, Number(process.hrtime.bigint() - t1) / 1e6);
  }}
  console.log(JSON.stringify({{per_call_ms: per, burst100_ms: best}}));
}})();
"""

BASH_LOOP = """
n={n}
t0=$(date +%s%N); for ((i=0;i<n;i++)); do /bin/true; done; t1=$(date +%s%N)
for ((i=0;i<n;i++)); do tool_call echo '{{}}' >/dev/null; done; t2=$(date +%s%N)
echo "{{\\"true_ms\\": $(( (t1-t0)/n ))e-6, \\"tool_call_ms\\": $(( (t2-t1)/n ))e-6}}"
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conch", default=os.path.join(HERE, "..", "build", "conch"))
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    conch = os.path.abspath(a.conch)
    base = tempfile.mkdtemp(prefix="conch-bench-bridge-")
    sock = os.path.join(base, "conch.sock")
    ws = os.path.join(base, "ws")
    os.mkdir(ws)
    log = open(os.path.join(base, "daemon.log"), "w")
    d = subprocess.Popen([conch, "serve", "--socket", sock, "--state-dir", os.path.join(base, "state")], stderr=log)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = Answerer(sock)
        sb = c.call("sandbox.create", {"workspace": ws})["id"]
        c.call("tools.register", {"sandbox": sb, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
        ref = reference(a.calls)
        rows = []
        r = c.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": PY_LOOP.format(n=a.calls), "timeout": 300})
        py = json.loads(r["stdout"]) if r["exit_code"] == 0 else None
        if py is None:
            print(r["text"], file=sys.stderr)
        node = None
        if shutil.which("node"):
            r = c.call("exec.run", {"sandbox": sb, "command": "node -", "stdin": NODE_LOOP.format(n=a.calls), "timeout": 300})
            node = json.loads(r["stdout"]) if r["exit_code"] == 0 else None
            if node is None:
                print(r["text"], file=sys.stderr)
        r = c.call("exec.run", {"sandbox": sb, "command": BASH_LOOP.format(n=min(a.calls, 500)), "timeout": 300})
        sh = json.loads(r["stdout"].strip().splitlines()[-1]) if r["exit_code"] == 0 else None
        if sh is None:
            print(r["text"], file=sys.stderr)
        print(f"reference: local unix-socket round trip, no sandbox   {ref:8.3f} ms/call")
        if py:
            print(f"Python conch_tools.call                              {py['per_call_ms']:8.3f} ms/call  ({py['per_call_ms'] / ref:.2f}x reference; goal <= 0.3 ms)")
            print(f"Python 100 concurrent acall (best of 5)              {py['burst100_ms']:8.3f} ms     (goal <= 10 ms)")
        if node:
            print(f"Node conch-tools call                                {node['per_call_ms']:8.3f} ms/call  ({node['per_call_ms'] / ref:.2f}x reference; goal <= 0.3 ms)")
            print(f"Node 100 concurrent calls (best of 5)                {node['burst100_ms']:8.3f} ms     (goal <= 10 ms)")
        if sh:
            print(f"bash /bin/true in the sandbox                        {sh['true_ms']:8.3f} ms/run")
            print(f"bash tool_call echo                                  {sh['tool_call_ms']:8.3f} ms/call  ({sh['tool_call_ms'] / sh['true_ms']:.2f}x /bin/true; goal <= 1.5x)")
        c.call("sandbox.destroy", {"id": sb})
    finally:
        d.terminate()
        d.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
