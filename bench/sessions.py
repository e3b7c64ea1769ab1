#!/usr/bin/python3
"""bench/sessions.py - a session's command round trip: session.run(":") against
exec.run("true") in the same sandbox of a live `conch serve`, measured from a Python client
over the unix socket. One run; prints medians, p90s and the ratio, and the goal (a builtin in
under 0.5 ms, at most 0.5x exec.run). See bench/README.md ("sessions.py").

Environment: CONCH_BIN (default build/conch), BENCH_N (iterations per row, 300),
BENCH_REQUIRE_GOAL=1 (exit 2 when a goal fails).
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from rpcclient import Daemon  # noqa: E402


def timed(c, method, params, n):
    for _ in range(min(20, n)):  # warm up
        c.call(method, params)
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = c.call(method, params)
        xs.append((time.perf_counter() - t0) * 1000)
        assert r["exit_code"] == 0, r
    xs.sort()
    return statistics.median(xs), xs[int(len(xs) * 0.9)]


ws = None


def main():
    global ws
    conch = os.environ.get("CONCH_BIN", os.path.join(ROOT, "build", "conch"))
    n = int(os.environ.get("BENCH_N", "300"))
    d = Daemon(conch)
    d.start()
    try:
        c = d.client()
        # over a workspace (overlay): both results list the workspace's changes
        ws = tempfile.mkdtemp(prefix="conch-bench-ws-")
        sb = c.call("sandbox.create", {"workspace": ws})["id"]
        sid = c.call("session.open", {"sandbox": sb})["session"]
        s_med, s_p90 = timed(c, "session.run", {"session": sid, "command": ":"}, n)
        e_med, e_p90 = timed(c, "exec.run", {"sandbox": sb, "command": "true"}, n)
        s2_med, s2_p90 = timed(c, "session.run", {"session": sid, "command": "/bin/true"}, n)
    finally:
        d.stop()
        shutil.rmtree(d.base, ignore_errors=True)
        shutil.rmtree(ws, ignore_errors=True)
    ratio = s_med / e_med
    print(f"n={n} per row, medians (p90) in ms, Python client over the unix socket")
    print(f"  session.run(':')          {s_med:7.3f} ({s_p90:.3f})")
    print(f"  session.run('/bin/true')  {s2_med:7.3f} ({s2_p90:.3f})")
    print(f"  exec.run('true')          {e_med:7.3f} ({e_p90:.3f})")
    print(f"  ratio session/exec        {ratio:7.3f}")
    ok_abs = s_med < 0.5
    ok_ratio = ratio <= 0.5
    print("goals:")
    print(f"  builtin round trip < 0.5 ms: {'met' if ok_abs else 'MISSED'} ({s_med:.3f} ms)")
    print(f"  <= 0.5x exec.run:            {'met' if ok_ratio else 'MISSED'} ({ratio:.3f}x)")
    if os.environ.get("BENCH_REQUIRE_GOAL") == "1" and not (ok_abs and ok_ratio):
        sys.exit(2)


if __name__ == "__main__":
    main()
