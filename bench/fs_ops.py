#!/usr/bin/python3
"""bench/fs_ops.py - what one fs.* request costs a Python client of `conch serve`: fs.read,
fs.write and fs.ls of small files in a live sandbox, one request at a time over one
connection, against the same operations done directly by Python on the host (open/read,
open/write, scandir + lstat), with daemon.ping as the floor of a round trip. Starts its own
daemon on a temporary socket and state directory; prints median and p90 per op, in ms.
See bench/README.md ("fs_ops.py").

Environment: CONCH_BIN (default build/conch), BENCH_N (runs per row, 2000),
BENCH_REQUIRE_GOAL=1 (exit 2 when fs.read's median is over 0.25 ms).
"""

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
N = int(os.environ.get("BENCH_N") or 2000)
GOAL_READ_MS = 0.25


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
                chunk = self.sock.recv(65536)
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


def timed_rows(rows, n):
    """Alternate the rows in blocks of 50 so that drift hits each alike; ms per op."""
    res = {name: [] for name, _ in rows}
    for _, fn in rows:
        for _ in range(20):
            fn()
    done = 0
    while done < n:
        k = min(50, n - done)
        for name, fn in rows:
            for _ in range(k):
                t = time.perf_counter()
                fn()
                res[name].append((time.perf_counter() - t) * 1000.0)
        done += k
    return res


def main():
    tmp = tempfile.mkdtemp(prefix="conch-bench-fs-")
    ws = os.path.join(tmp, "ws")
    host = os.path.join(tmp, "host")
    for d in (ws, host):
        os.makedirs(os.path.join(d, "dir"))
        for i in range(10):
            with open(os.path.join(d, "dir", f"f{i}.txt"), "w") as f:
                f.write(f"line {i}\n" * 20)
        with open(os.path.join(d, "small.txt"), "w") as f:
            f.write("hello world\n" * 30)  # 360 bytes
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
        sb = c.call("sandbox.create", {"workspace": ws})["id"]
        content = "x" * 300

        # Check that the answers are real before timing them.
        assert c.call("fs.read", {"sandbox": sb, "path": "small.txt"})["content"].startswith("hello")
        c.call("fs.write", {"sandbox": sb, "path": "out.txt", "content": content})
        assert c.call("fs.read", {"sandbox": sb, "path": "out.txt"})["content"] == content
        assert len(c.call("fs.ls", {"sandbox": sb, "path": "dir"})["entries"]) == 10

        def host_read():
            with open(os.path.join(host, "small.txt")) as f:
                return f.read()

        def host_write():
            with open(os.path.join(host, "out.txt"), "w") as f:
                f.write(content)

        def host_ls():
            return [(e.name, e.stat(follow_symlinks=False)) for e in os.scandir(os.path.join(host, "dir"))]

        rows = [
            ("daemon.ping", lambda: c.call("daemon.ping")),
            ("fs.read", lambda: c.call("fs.read", {"sandbox": sb, "path": "small.txt"})),
            ("host read", host_read),
            ("fs.write", lambda: c.call("fs.write", {"sandbox": sb, "path": "out.txt",
                                                     "content": content})),
            ("host write", host_write),
            ("fs.ls", lambda: c.call("fs.ls", {"sandbox": sb, "path": "dir"})),
            ("host ls", host_ls),
        ]
        res = timed_rows(rows, N)
        print(f"conch: {CONCH}; {N} runs per row, ms per op")
        print(f"{'op':<12} {'median':>8} {'p90':>8}")
        med = {}
        for name, xs in res.items():
            xs.sort()
            med[name] = statistics.median(xs)
            print(f"{name:<12} {med[name]:8.3f} {xs[int(len(xs) * 0.9)]:8.3f}")
        for op in ("read", "write", "ls"):
            print(f"fs.{op} / host {op}: {med['fs.' + op] / med['host ' + op]:.1f}x")
        ok = med["fs.read"] <= GOAL_READ_MS
        print(f"goal fs.read <= {GOAL_READ_MS} ms: {'met' if ok else 'NOT met'} "
              f"({med['fs.read']:.3f} ms)")
        c.call("sandbox.destroy", {"id": sb})
        if not ok and os.environ.get("BENCH_REQUIRE_GOAL") == "1":
            sys.exit(2)
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
