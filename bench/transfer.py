#!/usr/bin/env python3
# bench/transfer.py - upload and download MB/s of one big file through the Python client
# (Sandbox.upload / Sandbox.download over `conch serve --stdio`): by fs.copy_in / fs.copy_out
# (the default where the daemon can open our files), then forced through the chunked
# fallback (fs.write append / fs.read offset+length) at a few chunk sizes, beside a host `cp`
# of the same file as the reference; each transfer checked byte for byte.
# See bench/README.md ("transfer.py / transfer.mjs").
import hashlib
import os
import shutil
import subprocess
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
CHUNKS = [int(x) for x in os.environ.get("BENCH_CHUNKS_MIB", "10").split(",") if x]


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
            print(f"{'path':>12} {'upload MB/s':>12} {'cpu d+c':>10} {'download MB/s':>14} "
                  f"{'cpu d+c':>10}")
            daemon = c.process.pid
            # the reference: the same bytes to a host file, and a host cp of it
            src, dst = os.path.join(state, "ref.bin"), os.path.join(state, "ref2.bin")
            up = down = float("inf")
            for _ in range(RUNS):
                t = time.perf_counter()
                with open(src, "wb") as f:
                    f.write(data)
                up = min(up, time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(["cp", src, dst], check=True)
                down = min(down, time.perf_counter() - t)
            print(f"{'write / cp':>12} {SIZE / up / 1e6:>12.0f} {'':>10} {SIZE / down / 1e6:>14.0f}")
            os.unlink(src)
            os.unlink(dst)
            for chunk in [0] + CHUNKS:
                # 0: fs.copy_in / fs.copy_out; else the chunked fallback at that chunk size
                c._conch_no_copy = chunk != 0
                sandbox_mod.CHUNK = (chunk or 10) * MIB
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
                name = "copy" if chunk == 0 else f"chunks {chunk}Mi"
                print(f"{name:>12} {SIZE / up / 1e6:>12.0f} {up_cpu[0]:>5.1f}+{up_cpu[1]:<4.1f} "
                      f"{SIZE / down / 1e6:>14.0f} {down_cpu[0]:>5.1f}+{down_cpu[1]:<4.1f}")
            sb.destroy()
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
