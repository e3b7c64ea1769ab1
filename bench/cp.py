#!/usr/bin/python3
"""bench/cp.py - how fast `conch cp` moves a 100 MiB file into and out of a daemon sandbox, in
MB/s of wall time, with the CPU the client and the daemon's side (the daemon, the sandbox's
warden and its file workers) spent, against `cp` of the same file on the host as the
reference. Starts its own daemon on a temporary socket and state directory. See
bench/README.md ("cp.py").

Environment: CONCH_BIN (default build/conch), BENCH_MIB (file size, 100), BENCH_RUNS (3; the
best run is reported), BENCH_REQUIRE_GOAL=1 (exit 2 when a direction is under 200 MB/s),
BENCH_BEFORE_BIN (an older conch, e.g. a build of main: its `cp` is timed too, against the same
daemon, as the "before" rows of a before/after in one run; not held to the goal).

The daemon side's CPU counts live processes only: a file worker forked for one fs.copy_in is
reaped before the figure is read, so the copy path's daemon side shows little.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCH = os.environ.get("CONCH_BIN") or os.path.join(ROOT, "build", "conch")
BEFORE = os.environ.get("BENCH_BEFORE_BIN")
MIB = int(os.environ.get("BENCH_MIB") or 100)
RUNS = int(os.environ.get("BENCH_RUNS") or 3)
GOAL = 200.0
TCK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root):
    """CPU seconds used so far by @root and its descendants (live ones)."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            rest = st[st.rindex(")") + 2:].split()
            procs[int(d)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
    total, todo, seen = 0, [root], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in procs:
            continue
        seen.add(p)
        total += procs[p][1]
        todo += [q for q, v in procs.items() if v[0] == p]
    return total / TCK


def timed(argv, daemon_pid):
    c0, t0, r0 = tree_cpu(daemon_pid), time.monotonic(), os.times()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    t1, r1, c1 = time.monotonic(), os.times(), tree_cpu(daemon_pid)
    client = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    return t1 - t0, client, c1 - c0


def main():
    tmp = tempfile.mkdtemp(prefix="conch-bench-cp-")
    sock = os.path.join(tmp, "conch.sock")
    daemon = subprocess.Popen([CONCH, "serve", "--socket", sock, "--state-dir",
                               os.path.join(tmp, "state"), "--pool", "0"],
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        subprocess.run([CONCH, "create", "--socket", sock, "--name", "bench"], check=True,
                       stdout=subprocess.DEVNULL)
        src = os.path.join(tmp, "src.bin")
        with open(src, "wb") as f:
            f.write(os.urandom(MIB << 20))
        mb = (MIB << 20) / 1e6
        rows = {"host cp (reference)": [], "conch cp in": [], "conch cp out": []}
        bins = [("", CONCH)] + ([(" (before)", BEFORE)] if BEFORE else [])
        for tag, _ in bins[1:]:
            rows[f"conch cp in{tag}"], rows[f"conch cp out{tag}"] = [], []
        for i in range(RUNS):
            t0 = time.monotonic()
            shutil.copyfile(src, os.path.join(tmp, "ref.bin"))
            rows["host cp (reference)"].append((time.monotonic() - t0, 0.0, 0.0))
            for tag, binary in bins:
                rows[f"conch cp in{tag}"].append(timed([binary, "cp", "--socket", sock, src,
                                                        "bench:/tmp/in.bin"], daemon.pid))
                rows[f"conch cp out{tag}"].append(timed([binary, "cp", "--socket", sock,
                                                         "bench:/tmp/in.bin",
                                                         os.path.join(tmp, "out.bin")],
                                                        daemon.pid))
                # room in the sandbox's /tmp (a tmpfs of a few hundred MiB) for the next run
                subprocess.run([CONCH, "exec", "--socket", sock, "bench", "--", "rm", "-f",
                                "/tmp/in.bin"], check=True, stdin=subprocess.DEVNULL)
        print(f"conch cp of a {MIB} MiB file, best of {RUNS} "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        print(f"{'row':<22} {'MB/s':>8} {'wall s':>8} {'client cpu s':>13} {'daemon side cpu s':>18}")
        ref = min(w for w, _, _ in rows["host cp (reference)"])
        below = False
        for name, runs in rows.items():
            w, cl, dm = min(runs)
            print(f"{name:<22} {mb / w:8.1f} {w:8.2f} {cl:13.2f} {dm:18.2f}")
            if name != "host cp (reference)" and "(before)" not in name and mb / w < GOAL:
                below = True
        print(f"goal: {GOAL:.0f} MB/s each way; host cp took {ref:.2f} s")
        if below and os.environ.get("BENCH_REQUIRE_GOAL") == "1":
            sys.exit(2)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
