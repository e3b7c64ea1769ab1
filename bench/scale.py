#!/usr/bin/python3
"""bench/scale.py - how conch's cost grows with the number of live sandboxes, and what one idle
sandbox costs beside its peers. Starts its own `conch serve --pool 0` on a temporary socket,
creates sandboxes up to each step of BENCH_STEPS (default 1,10,100,1000), and at each step
measures: the total PSS of every conch process (the daemon and every process below it:
wardens, ready shepherds, their command processes), PSS per sandbox, the median time to create
one more sandbox and the median of `exec.run true` in one of them, both against the first
step. Then, side by side, the PSS of one idle sandbox of each kind: conch (warden + ready
shepherd + its command process), bubblewrap holding `sleep infinity`, and a plain
`sleep infinity` (the floor). Prints a table and a goals block; see bench/README.md
("scale.py").

Environment: CONCH_BIN (default build/conch), BENCH_STEPS (comma-separated counts),
BENCH_N (timed creations / exec.runs per step, 20), BENCH_IDLE (idle sandboxes of each kind
for the side-by-side, 20).
"""

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from rpc import Client  # bench/rpc.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCH = os.environ.get("CONCH_BIN") or os.path.join(ROOT, "build", "conch")
STEPS = [int(x) for x in os.environ.get("BENCH_STEPS", "1,10,100,1000").split(",")]
N = int(os.environ.get("BENCH_N", "20"))
N_IDLE = int(os.environ.get("BENCH_IDLE", "20"))
KiB = 1024.0


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def private_kib(pid):
    """What @pid alone costs, whatever else runs: its private pages (smaps_rollup's
    Private_Clean + Private_Dirty) and its page tables (VmPTE). PSS also charges a share of
    every page mapped by others too, so it moves with what else runs."""
    kib = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    kib += int(line.split()[1])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmPTE:"):
                    kib += int(line.split()[1])
    except OSError:
        pass
    return kib


def tree_private(pid):
    return sum(private_kib(p) for p in tree(pid))


def tree(pid):
    """pid and every descendant, from /proc/*/stat (ppid)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
            ppid = int(s[s.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def total_pss(pid):
    procs = tree(pid)
    return sum(pss_kib(p) for p in procs), len(procs)


def settle(pid, want_procs, limit=60.0):
    """Wait until the tree's process count stops changing (ready shepherds are built late)."""
    end = time.monotonic() + limit
    last = -1
    while time.monotonic() < end:
        n = len(tree(pid))
        if n == last and n >= want_procs:
            return
        last = n
        time.sleep(0.5)


def med_ms(xs):
    return statistics.median(xs) * 1000.0


def idle_side_by_side(ws):
    """PSS of N_IDLE idle sandboxes of each kind, per sandbox."""
    rows = {}
    # bubblewrap holding sleep infinity
    bw = shutil.which("bwrap")
    if bw:
        ps = [subprocess.Popen([bw, "--unshare-all", "--die-with-parent", "--new-session",
                                "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
                                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                                "--ro-bind", "/etc", "/etc", "--tmpfs", "/tmp", "--proc", "/proc",
                                "--dev", "/dev", "--bind", ws, "/workspace", "--",
                                "sleep", "infinity"]) for _ in range(N_IDLE)]
        # settled: each bwrap has its namespace's init and `sleep` below it, past their exec
        end = time.monotonic() + 30
        while time.monotonic() < end and not all(
                any(open(f"/proc/{q}/comm").read().strip() == "sleep" for q in tree(p.pid)[1:])
                for p in ps):
            time.sleep(0.2)
        time.sleep(1)
        rows["bwrap + sleep infinity"] = sum(total_pss(p.pid)[0] for p in ps) / N_IDLE
        rows["bwrap + sleep infinity, private + page tables"] = \
            sum(tree_private(p.pid) for p in ps) / N_IDLE
        for p in ps:
            p.kill()
            p.wait()
    ps = [subprocess.Popen(["sleep", "infinity"]) for _ in range(N_IDLE)]
    time.sleep(1)
    rows["sleep infinity (the floor)"] = sum(pss_kib(p.pid) for p in ps) / N_IDLE
    for p in ps:
        p.kill()
        p.wait()
    return rows


def main():
    if not os.path.exists(CONCH):
        sys.exit(f"bench: no conch binary at {CONCH} (set CONCH_BIN)")
    base = tempfile.mkdtemp(prefix="conch-scale-")
    ws = os.path.join(base, "ws")
    os.mkdir(ws)
    with open(os.path.join(ws, "f.txt"), "w") as f:
        f.write("x\n")
    sock = os.path.join(base, "conch.sock")
    d = subprocess.Popen([CONCH, "serve", "--socket", sock, "--state-dir",
                          os.path.join(base, "state"), "--pool", "0", "--idle-timeout", "0",
                          "--max-sandboxes", str(max(STEPS) + N + 8)],
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = Client(sock, timeout=120)
        made = []
        rows = []
        for step in STEPS:
            while len(made) < step:
                made.append(c.call("sandbox.create", {"workspace": ws})["id"])
            settle(d.pid, 1 + 3 * len(made))
            pss, nprocs = total_pss(d.pid)
            create, run = [], []
            for _ in range(N):  # one more sandbox, timed, then destroyed
                t0 = time.perf_counter()
                sb = c.call("sandbox.create", {"workspace": ws})["id"]
                create.append(time.perf_counter() - t0)
                c.call("sandbox.destroy", {"id": sb})
            for _ in range(N):
                t0 = time.perf_counter()
                c.call("exec.run", {"sandbox": made[0], "command": "true"})
                run.append(time.perf_counter() - t0)
            rows.append((step, pss, nprocs, med_ms(create), med_ms(run)))
            print(f"  {step:5d} sandboxes: {pss / KiB:8.1f} MiB PSS in {nprocs} processes "
                  f"({pss / step:6.0f} KiB each), create {med_ms(create):6.1f} ms, "
                  f"exec.run true {med_ms(run):5.2f} ms", flush=True)
        idle = {"conch (warden + ready shepherd)": None}
        # conch's own per-sandbox figure: the difference between two steps, without the daemon
        if len(rows) >= 2:
            (s0, p0, *_), (s1, p1, *_) = rows[-2], rows[-1]
            idle["conch (warden + ready shepherd)"] = (p1 - p0) / (s1 - s0)
        # and what one sandbox alone costs: a warden's tree (warden, ready shepherd, its
        # command's process), private pages and page tables, averaged over N_IDLE of them
        wardens = [p for p in tree(d.pid)[1:] if p in set(children_of(d.pid))][:N_IDLE]
        if wardens:
            idle["conch, private + page tables"] = sum(tree_private(w) for w in wardens) / len(wardens)
        idle.update(idle_side_by_side(ws))
    finally:
        os.killpg(d.pid, signal.SIGTERM)
        try:
            d.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(d.pid, signal.SIGKILL)
            d.wait()
        shutil.rmtree(base, ignore_errors=True)

    print("\nscale (total PSS of every conch process; times are medians of "
          f"{N}; ratios against {rows[0][0]} sandbox(es)):")
    print(f"  {'sandboxes':>9} {'PSS MiB':>9} {'KiB each':>9} {'procs':>6} {'create ms':>10} "
          f"{'x':>5} {'exec.run ms':>12} {'x':>5}")
    for step, pss, nprocs, cr, ru in rows:
        print(f"  {step:9d} {pss / KiB:9.1f} {pss / step:9.0f} {nprocs:6d} {cr:10.2f} "
              f"{cr / rows[0][3]:5.2f} {ru:12.2f} {ru / rows[0][4]:5.2f}")
    print("\nidle sandbox, PSS each (side by side):")
    for k, v in idle.items():
        print(f"  {k:46s} {v:8.0f} KiB" if v is not None else f"  {k:46s}      n/a")
    last = rows[-1]
    print("\ngoals (issue 16):")
    if last[0] >= 1000:
        print(f"  1,000 idle sandboxes <= 1 GiB in all: {last[1] / KiB:.0f} MiB "
              f"-> {'met' if last[1] <= 1024 * KiB else 'not met'}")
    print(f"  create at {last[0]} within 1.2x of at {rows[0][0]}: {last[3] / rows[0][3]:.2f}x "
          f"-> {'met' if last[3] <= 1.2 * rows[0][3] else 'not met'}")
    print(f"  exec.run at {last[0]} within 1.2x of at {rows[0][0]}: {last[4] / rows[0][4]:.2f}x "
          f"-> {'met' if last[4] <= 1.2 * rows[0][4] else 'not met'}")
    # (private + page tables is printed above, not judged: pages a warden shares copy-on-write
    # with its own shepherd and command process count as shared there, which understates
    # conch; PSS per step is the figure)
    for what, ck, bk in [("PSS", "conch (warden + ready shepherd)", "bwrap + sleep infinity")]:
        c_idle, b_idle = idle.get(ck), idle.get(bk)
        if c_idle and b_idle:
            print(f"  an idle sandbox no heavier than bwrap's ({what}): {c_idle:.0f} vs "
                  f"{b_idle:.0f} KiB -> {'met' if c_idle <= b_idle else 'not met'}")


if __name__ == "__main__":
    main()
