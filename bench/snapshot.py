#!/usr/bin/python3
"""bench/snapshot.py - what workspace.snapshot and sandbox.fork cost against the workspace's
size (issue 18): workspaces of 1,000, 100,000 (and with BENCH_BIG=1 1,000,000) small files,
10 of them changed in the sandbox, then workspace.changes, workspace.snapshot and
sandbox.fork timed over a Python client of `conch serve` (how many forks its pool served is
printed), beside a full scan that walks and hashes every file (how snapshot-and-diff
sandboxes find changes). Starts its own daemon on a
temporary socket and state directory; prints the median per row in ms. See bench/README.md
("snapshot.py").

Environment: CONCH_BIN (default build/conch), BENCH_N (timed rounds per size, 10),
BENCH_BIG=1 (also 1,000,000 files: minutes to create).
"""

import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCH = os.environ.get("CONCH_BIN") or os.path.join(ROOT, "build", "conch")
N = int(os.environ.get("BENCH_N") or 10)
SIZES = [1000, 100000] + ([1000000] if os.environ.get("BENCH_BIG") == "1" else [])


class Client:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 0

    def call(self, method, params=None):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        self.sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    sys.exit("bench: the daemon closed the connection")
                self.buf += chunk
                continue
            line, self.buf = self.buf[:i], self.buf[i + 1:]
            resp = json.loads(line)
            if resp.get("id") != self.next_id:
                continue
            if "error" in resp:
                sys.exit(f"bench: {method}: {resp['error']}")
            return resp["result"]


def make_workspace(path, n):
    per_dir = 1000
    for d in range(0, n, per_dir):
        sub = os.path.join(path, f"d{d // per_dir:04d}")
        os.makedirs(sub)
        for i in range(d, min(n, d + per_dir)):
            with open(os.path.join(sub, f"f{i}.txt"), "w") as f:
                f.write(f"file {i}\n")


def full_scan(path):
    h = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                h[p] = hashlib.sha256(f.read()).hexdigest()
    return len(h)


def ms(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main():
    tmp = tempfile.mkdtemp(prefix="conch-bench-snap-")
    sock = os.path.join(tmp, "conch.sock")
    log = open(os.path.join(tmp, "daemon.log"), "wb")
    daemon = subprocess.Popen([CONCH, "serve", "--socket", sock, "--state-dir",
                               os.path.join(tmp, "state")], stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                c = Client(sock)
                c.call("daemon.ping")
                break
            except OSError:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    sys.exit("bench: conch serve did not start")
                time.sleep(0.02)
        print(f"{'files':>9} {'changes':>9} {'snapshot':>9} {'fork':>9} {'full scan':>10}  (ms, median of {N})")
        for n in SIZES:
            ws = os.path.join(tmp, f"ws{n}")
            os.makedirs(ws)
            make_workspace(ws, n)
            sb = c.call("sandbox.create", {"workspace": ws})["id"]
            rows = {"changes": [], "snapshot": [], "fork": [], "scan": []}
            pooled = 0
            for r in range(N):
                # 10 files changed since the last snapshot, as an agent's step would.
                cmd = "; ".join(f"echo r{r} > d0000/f{i}.txt" for i in range(10))
                res = c.call("exec.run", {"sandbox": sb, "command": cmd, "changes": False})
                assert res["exit_code"] == 0, res
                ch = {}
                rows["changes"].append(ms(lambda: ch.update(c.call("workspace.changes", {"sandbox": sb}))))
                assert ch["changes_total"] == 10, ch["changes_total"]
                snap = {}
                rows["snapshot"].append(ms(lambda: snap.update(c.call("workspace.snapshot", {"sandbox": sb}))))
                fork = {}
                rows["fork"].append(ms(lambda: fork.update(c.call("sandbox.fork", {"snapshot": snap["id"]}))))
                pooled += bool(fork.get("from_pool"))
                out = c.call("exec.run", {"sandbox": fork["id"], "command": "cat d0000/f9.txt"})
                assert out["stdout"] == f"r{r}\n", out
                c.call("sandbox.destroy", {"id": fork["id"]})
                if r < 3:
                    rows["scan"].append(ms(lambda: full_scan(ws)))
            med = {k: statistics.median(v) for k, v in rows.items()}
            print(f"{n:>9} {med['changes']:>9.2f} {med['snapshot']:>9.2f} {med['fork']:>9.2f} "
                  f"{med['scan']:>10.1f}  (forks from the pool: {pooled}/{N})")
            c.call("sandbox.destroy", {"id": sb})
            shutil.rmtree(ws, ignore_errors=True)
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
