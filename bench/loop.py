#!/usr/bin/python3
"""bench/loop.py - how long another client's daemon.ping waits while the daemon does slow
work for someone else: exec.run and session.run results keeping 8 MiB of output, workspace
scans of many changed files, fs.download answers of 60 MB. The work is built off the event
loop (the tests in tests/integration/test_daemon_loop.py assert that, without a clock); this
measures what is left of the wait. Starts its own daemon on a temporary socket and state
directory, pings back to back from one connection while each load runs in the main thread,
and prints median, p90, p99 and worst ping latency per load, side by side with the same
pinger on an idle daemon (the reference). See bench/README.md ("loop.py").

Environment: CONCH_BIN (default build/conch), BENCH_ROUNDS (repetitions of each load, 4),
BENCH_FILES (changed files for the scans, 100000), BENCH_TIMEOUT (whole run, 900 s).
"""

import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCH = os.environ.get("CONCH_BIN") or os.path.join(ROOT, "build", "conch")
ROUNDS = int(os.environ.get("BENCH_ROUNDS") or 4)
FILES = int(os.environ.get("BENCH_FILES") or 100000)
TIMEOUT = int(os.environ.get("BENCH_TIMEOUT") or 900)
from rpc import Client, RpcError  # noqa: E402 (bench/rpc.py)

RPC_TIMEOUT = 300.0


class Pinger:
    """Pings back to back from its own connection; keeps each round trip's latency."""

    def __init__(self, path):
        self.c = Client(path, RPC_TIMEOUT)
        self.lat = []
        self.stop_ev = threading.Event()
        self.error = None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop_ev.is_set():
            t0 = time.perf_counter()
            try:
                self.c.call("daemon.ping")
            except Exception as e:  # noqa: BLE001 - reported by main
                self.error = e
                return
            self.lat.append(time.perf_counter() - t0)

    def stop(self):
        self.stop_ev.set()
        self.t.join(RPC_TIMEOUT)
        self.c.close()
        if self.error:
            raise RpcError(f"daemon.ping failed: {self.error}")
        return self.lat


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def main():
    if not os.access(CONCH, os.X_OK):
        sys.exit(f"bench: error: no conch binary at {CONCH} (ninja -C build, or set CONCH_BIN)")
    tmp = tempfile.mkdtemp(prefix="conch-bench-loop-")
    sock = os.path.join(tmp, "conch.sock")
    state = os.path.join(tmp, "state")
    ws = os.path.join(tmp, "ws")
    os.mkdir(ws)
    libc = ctypes.CDLL(None, use_errno=True)
    log = open(os.path.join(tmp, "daemon.log"), "wb")
    d = subprocess.Popen([CONCH, "serve", "--socket", sock, "--state-dir", state],
                         stdout=log, stderr=subprocess.STDOUT,
                         preexec_fn=lambda: libc.prctl(1, signal.SIGTERM))  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGALRM, lambda *_: sys.exit("bench: error: timed out"))
    signal.alarm(TIMEOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if d.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"bench: error: conch serve did not start: {open(log.name).read()}")
            time.sleep(0.02)
        c = Client(sock, RPC_TIMEOUT)
        sb = c.call("sandbox.create", {"workspace": ws})["id"]
        sid = c.call("session.open", {"sandbox": sb})["session"]
        c.call("exec.run", {"sandbox": sb, "timeout": 600, "command":
                            "for i in 1 2 3 4 5; do head -c 9000000 /dev/urandom > f$i; done; "
                            f"python3 -c 'import os\nos.mkdir(\"many\")\nfor i in range({FILES}): "
                            "open(\"many/f%06d\" % i, \"w\").close()'"})
        big = "head -c 6000000 /dev/zero | base64 -w 0"

        def results():
            for _ in range(ROUNDS):
                r = c.call("exec.run", {"sandbox": sb, "max_output": 16 << 20, "command": big})
                assert len(r["stdout"]) == 8000000, len(r["stdout"])
                r = c.call("session.run", {"session": sid, "max_output": 16 << 20, "command": big})
                assert len(r["stdout"].strip()) >= 8000000, len(r["stdout"])

        def scans():
            for _ in range(ROUNDS):
                assert c.call("workspace.changes", {"sandbox": sb})["changes_total"] >= FILES

        def downloads():
            for _ in range(ROUNDS):
                got = c.call("fs.download", {"sandbox": sb, "paths": [f"f{i}" for i in range(1, 6)]})
                assert [len(f["content"]) for f in got["files"]] == [12000000] * 5

        def idle():
            time.sleep(2.0)

        loads = [("idle (reference)", idle), ("8 MiB exec/session results", results),
                 (f"workspace.changes, {FILES} files", scans), ("fs.download 60 MB", downloads)]
        rows = []
        for name, fn in loads:
            p = Pinger(sock)
            t0 = time.perf_counter()
            fn()
            took = time.perf_counter() - t0
            lat = p.stop()
            rows.append((name, took, lat))
        c.call("sandbox.destroy", {"id": sb})
        c.close()
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"conch {CONCH}, {os.cpu_count()} CPUs, load average {load:.2f}, uid {os.getuid()}, "
          f"{ROUNDS} rounds per load")
    print()
    ref = statistics.median(rows[0][2])
    print(f"{'load':<34} {'s':>6} {'pings':>7} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8} "
          f"{'worst ms':>9} {'median vs idle':>15}")
    for name, took, lat in rows:
        med = statistics.median(lat)
        print(f"{name:<34} {took:>6.2f} {len(lat):>7} {med * 1e3:>10.3f} {pct(lat, 0.9) * 1e3:>8.3f} "
              f"{pct(lat, 0.99) * 1e3:>8.3f} {max(lat) * 1e3:>9.3f} {med / ref:>14.2f}x")


if __name__ == "__main__":
    main()
