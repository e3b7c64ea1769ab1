#!/usr/bin/env python3
# bench/transfer.py - upload and download MB/s of one big file through the Python client
# (Sandbox.upload / Sandbox.download: fs.write append / fs.read offset+length chunks over
# `conch serve --stdio`), at a few chunk sizes; each transfer checked byte for byte.
# See bench/README.md ("transfer.py / transfer.mjs").
import hashlib
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from conch_client import Client, Sandbox  # noqa: E402
import conch_client.sandbox as sandbox_mod  # noqa: E402

CONCH_BIN = os.environ.get("CONCH_BIN") or os.path.join(HERE, "..", "build", "conch")
MIB = 1 << 20
SIZE = int(os.environ.get("BENCH_MIB", "100")) * MIB
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
CHUNKS = [int(x) for x in os.environ.get("BENCH_CHUNKS_MIB", "1,4,10").split(",")]


HZ = os.sysconf("SC_CLK_TCK")


def tree_cpu(root):
    """CPU seconds (user + system) used so far by process @root and its live descendants
    (the daemon, its wardens and file workers): what a transfer costs whatever the load."""
    kids, own = {}, 0.0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        t = (int(st[11]) + int(st[12])) / HZ
        if int(p) == root:
            own = t
        kids.setdefault(int(st[1]), []).append((int(p), t))
    total, todo = own, [root]
    while todo:
        for pid, t in kids.get(todo.pop(), []):
            total += t
            todo.append(pid)
    return total


def main():
    data = os.urandom(SIZE)
    digest = hashlib.sha256(data).hexdigest()
    state = tempfile.mkdtemp(prefix="conch-bench-xfer-")
    try:
        with Client.spawn(CONCH_BIN, state_dir=state, serve_args=["--pool", "0"], timeout=600) as c:
            sb = Sandbox(c, c.sandbox_create())
            print(f"python client, {SIZE // MIB} MiB, best of {RUNS} (MB/s = 10^6 bytes/s)")
            print("MB/s: wall clock; cpu: CPU seconds of the daemon's process tree and of "
                  "this client, per transfer")
            print(f"{'chunk':>8} {'upload MB/s':>12} {'cpu d+c':>10} {'download MB/s':>14} "
                  f"{'cpu d+c':>10}")
            daemon = c.process.pid
            for chunk in CHUNKS:
                sandbox_mod.CHUNK = chunk * MIB
                up = down = float("inf")
                for _ in range(RUNS):
                    d0, c0, t = tree_cpu(daemon), time.process_time(), time.perf_counter()
                    sb.upload("/workspace/big.bin", data)
                    up = min(up, time.perf_counter() - t)
                    up_cpu = (tree_cpu(daemon) - d0, time.process_time() - c0)
                    d0, c0, t = tree_cpu(daemon), time.process_time(), time.perf_counter()
                    got = sb.download("/workspace/big.bin")
                    down = min(down, time.perf_counter() - t)
                    down_cpu = (tree_cpu(daemon) - d0, time.process_time() - c0)
                    assert hashlib.sha256(got).hexdigest() == digest, "download differs"
                    del got
                print(f"{chunk:>6}Mi {SIZE / up / 1e6:>12.0f} {up_cpu[0]:>5.1f}+{up_cpu[1]:<4.1f} "
                      f"{SIZE / down / 1e6:>14.0f} {down_cpu[0]:>5.1f}+{down_cpu[1]:<4.1f}")
            sb.destroy()
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
