#!/usr/bin/python3
"""bench/daemon.py - what a live `conch serve` costs: exec.run round trips in a live sandbox
against plain `bash -c true`, exec.run {fresh: true} against bubblewrap per command,
commands per second with 1, 2 and 8 clients, and daemon memory per idle sandbox. Starts its
own daemon on a temporary socket and state directory, prints medians, ratios and a goals
block. See bench/README.md ("daemon.py").

Environment: CONCH_BIN (default build/conch), BENCH_N (iterations per latency row, 200),
BENCH_SECONDS (per throughput row, 5), BENCH_SANDBOXES (idle sandboxes for memory, 50),
BENCH_PAUSE_MS (pause before a "pool full" fresh run, 20), BENCH_QUICK=1 (N=20, 1 s, fast
smoke run), BENCH_TIMEOUT (whole run, 900 s), BENCH_REQUIRE_GOAL=1 (exit 2 if a goal fails).
"""

import ctypes
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from rpc import Client, RpcError  # noqa: E402 (bench/rpc.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_num(name, default, kind=int):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        x = kind(v)
    except ValueError:
        die(f"{name} must be a number, got '{v}'")
    if x <= 0:
        die(f"{name} must be positive, got '{v}'")
    return x


def die(msg):
    print(f"bench: error: {msg}", file=sys.stderr)
    sys.exit(1)


QUICK = os.environ.get("BENCH_QUICK") == "1"
N = env_num("BENCH_N", 20 if QUICK else 200)
SECONDS = env_num("BENCH_SECONDS", 1.0 if QUICK else 5.0, float)
N_SANDBOXES = env_num("BENCH_SANDBOXES", 10 if QUICK else 50)
PAUSE = env_num("BENCH_PAUSE_MS", 20.0, float) / 1000.0
TIMEOUT = env_num("BENCH_TIMEOUT", 900, int)
REQUIRE_GOAL = os.environ.get("BENCH_REQUIRE_GOAL") == "1"
CONCH = os.environ.get("CONCH_BIN") or os.path.join(ROOT, "build", "conch")
BLOCK = 10  # alternate rows in blocks of this many runs, so drift hits every row alike
WARMUP = 5
RPC_TIMEOUT = 60.0  # seconds for any one request
MiB = 1024.0 * 1024.0

BWRAP_ARGS = ["--unshare-all", "--die-with-parent", "--new-session",
              "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
              "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
              "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc",
              "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--"]


# ---- the daemon under test, its temp dirs, and cleanup on every exit path ----

class Bench:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="conch-bench-daemon-")
        self.daemon = None
        self.sock_path = os.path.join(self.tmp, "conch.sock")
        self.state = os.path.join(self.tmp, "state")
        self.log_path = os.path.join(self.tmp, "daemon.log")
        self.log = None

    def start_daemon(self):
        os.mkdir(self.state, 0o700)
        self.log = open(self.log_path, "wb")
        libc = ctypes.CDLL(None, use_errno=True)

        def child_setup():
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: gone if we are killed -9

        self.daemon = subprocess.Popen(
            [CONCH, "serve", "--socket", self.sock_path, "--state-dir", self.state,
             "--max-sandboxes", str(max(256, N_SANDBOXES + 16))],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=child_setup)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                self.fail(f"conch serve exited with status {self.daemon.returncode}")
            try:
                c = Client(self.sock_path)
                c.call("daemon.ping")
                return c
            except (OSError, RpcError):
                time.sleep(0.02)
        self.fail("conch serve did not answer daemon.ping within 15 s")

    def daemon_log_tail(self, n=20):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join("  | " + l for l in lines[-n:])
        except OSError:
            return ""

    def fail(self, msg):
        print(f"bench: error: {msg}", file=sys.stderr)
        tail = self.daemon_log_tail()
        if tail:
            print("daemon log (last lines):\n" + tail, file=sys.stderr)
        raise SystemExit(1)

    def cleanup(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(15)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(5)
        if self.log:
            self.log.close()

        def onerror(func, path, _exc):
            # overlayfs leaves work dirs with mode 000; open them up and retry.
            try:
                os.chmod(os.path.dirname(path), 0o700)
                os.chmod(path, 0o700)
                func(path)
            except OSError:
                pass
        shutil.rmtree(self.tmp, onerror=onerror)


_ws_count = 0


def make_workspace(tmp):
    """A new small project-like directory (about 64 KiB) under @tmp."""
    global _ws_count
    _ws_count += 1
    path = os.path.join(tmp, f"ws-{_ws_count}")
    os.makedirs(os.path.join(path, "src"))
    os.makedirs(os.path.join(path, "docs"))
    with open(os.path.join(path, "src", "main.py"), "w") as f:
        f.write('print("hello")\n')
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("# bench workspace\n")
    with open(os.path.join(path, "docs", "data.csv"), "w") as f:
        f.write("a,b\n1,2\n")
    with open(os.path.join(path, "blob.bin"), "wb") as f:
        f.write(b"\0" * 65536)
    return path


# ---- statistics and timing ----

def pct(xs, p):
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def timed(fn):
    t = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t) / 1e6


def run_rows(rows, n):
    """rows: [(name, fn, pause_s)]. Runs each fn n times, alternating rows in blocks of
    BLOCK runs so load changes hit every row alike. A pause is slept before each run of that
    row, outside the timing. Returns {name: [ms]}."""
    for _, fn, _ in rows:
        for _ in range(WARMUP):
            fn()
    out = {name: [] for name, _, _ in rows}
    done = 0
    while done < n:
        b = min(BLOCK, n - done)
        for name, fn, pause in rows:
            for _ in range(b):
                if pause:
                    time.sleep(pause)
                out[name].append(timed(fn))
        done += b
    return out


def print_latency(title, res, ref_name, ref_label):
    print(title)
    print(f"  {'row':<36} {'median ms':>9} {'p90 ms':>8} {'min ms':>8} {'vs ' + ref_label:>9}")
    ref = statistics.median(res[ref_name])
    for name, xs in res.items():
        m = statistics.median(xs)
        print(f"  {name:<36} {m:>9.3f} {pct(xs, 0.9):>8.3f} {min(xs):>8.3f} {m / ref:>8.2f}x")
    print()


# ---- /proc readers ----

def proc_kib(pid, field, fname="status"):
    try:
        with open(f"/proc/{pid}/{fname}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(root):
    """Every process below @root (not @root itself), from /proc's ppid links."""
    children = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out


def rollup(pid):
    """/proc/PID/smaps_rollup as {field: KiB}, or {} when unreadable."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return out


def mem_snapshot(dpid):
    kids = descendants(dpid)
    kr = [rollup(p) for p in kids]
    d = rollup(dpid)
    mi = meminfo()
    return {
        "rss": proc_kib(dpid, "VmRSS"),
        "anon": proc_kib(dpid, "RssAnon"),
        "pss": d.get("Pss"),
        "private": d.get("Private_Clean", 0) + d.get("Private_Dirty", 0) if d else None,
        "kids": len(kids),
        "kids_rss": sum(proc_kib(p, "VmRSS") or 0 for p in kids),
        # None when any child's smaps_rollup is unreadable (e.g. not dumpable)
        "kids_pss": sum(r["Pss"] for r in kr) if all("Pss" in r for r in kr) else None,
        "kids_private": (sum(r.get("Private_Clean", 0) + r.get("Private_Dirty", 0) for r in kr)
                         if all("Pss" in r for r in kr) else None),
        "used": mi["MemTotal"] - mi["MemAvailable"],
        "slab": mi.get("Slab", 0),
        "kstack": mi.get("KernelStack", 0),
        "ptables": mi.get("PageTables", 0),
    }


def wait_settled(c, dpid, want_kids=None, timeout=10.0):
    """Wait until the daemon's process tree stops changing (pool refilled, sandboxes gone)."""
    deadline = time.monotonic() + timeout
    last, stable = None, 0
    while time.monotonic() < deadline:
        c.call("daemon.ping")
        n = len(descendants(dpid))
        if n == last and (want_kids is None or n == want_kids):
            stable += 1
            if stable >= 5:
                return n
        else:
            stable = 0
        last = n
        time.sleep(0.05)
    return last


# ---- the benchmarks ----

def bench_memory(b, c, dpid):
    """Daemon RSS/PSS with 0 and then N_SANDBOXES idle sandboxes with workspaces."""
    # Warm up the paths a sandbox takes (allocator arenas, the state database, libuv), so
    # the baseline is not a cold daemon.
    ws0 = make_workspace(b.tmp)
    sb = c.call("sandbox.create", {"workspace": ws0})["id"]
    c.call("exec.run", {"sandbox": sb, "command": "true"})
    c.call("sandbox.destroy", {"id": sb})
    base_kids = wait_settled(c, dpid)
    time.sleep(0.2)
    m0 = mem_snapshot(dpid)
    ids = []
    for i in range(N_SANDBOXES):
        ws = make_workspace(b.tmp)
        ids.append(c.call("sandbox.create", {"workspace": ws, "idle_timeout": 0})["id"])
    wait_settled(c, dpid)
    time.sleep(0.2)
    m1 = mem_snapshot(dpid)
    for sb in ids:
        c.call("exec.run", {"sandbox": sb, "command": "true"})
    wait_settled(c, dpid)
    m2 = mem_snapshot(dpid)
    for sb in ids:
        c.call("sandbox.destroy", {"id": sb})
    wait_settled(c, dpid, want_kids=base_kids)
    m3 = mem_snapshot(dpid)

    n = N_SANDBOXES
    print(f"memory: {n} idle sandboxes, each with its own small workspace (overlay mode)")
    print(f"  {'daemon process':<40} {'VmRSS':>10} {'RssAnon':>10} {'Private':>10} {'Pss':>10}")

    def kib(x):
        return f"{x / 1024:.2f} MiB" if x is not None else "n/a"

    def row(label, m):
        print(f"  {label:<40} {kib(m['rss']):>10} {kib(m['anon']):>10} {kib(m['private']):>10}"
              f" {kib(m['pss']):>10}")

    row("0 sandboxes (warmed up, pool settled)", m0)
    row(f"{n} idle sandboxes", m1)
    row(f"{n} sandboxes after one exec.run each", m2)
    row(f"after destroying the {n}", m3)

    def per(key, a, z):
        if a[key] is None or z[key] is None:
            return None
        return (z[key] - a[key]) / n

    def fmt(x):
        return f"{x:.1f} KiB" if x is not None else "n/a"

    per_rss = per("rss", m0, m1)
    print(f"  per idle sandbox: VmRSS {fmt(per_rss)}, RssAnon {fmt(per('anon', m0, m1))}, "
          f"Private {fmt(per('private', m0, m1))}, Pss {fmt(per('pss', m0, m1))}")
    print(f"  per sandbox after one run each: VmRSS {fmt(per('rss', m0, m2))}; "
          f"left after destroying all: VmRSS {m3['rss'] - m0['rss']:+d} KiB")
    print("  (the daemon's Pss can fall as sandboxes are added: each warden is forked from the"
          " daemon and shares its pages, so the daemon's share of them shrinks)")
    print()
    print("  outside the daemon (not part of the goal):")
    kids = (m1["kids"] - m0["kids"]) / n
    print(f"  sandbox processes per sandbox: {kids:.1f} processes; "
          f"RSS {fmt(per('kids_rss', m0, m1))}, Private {fmt(per('kids_private', m0, m1))}, "
          f"Pss {fmt(per('kids_pss', m0, m1))}")
    if m0["pss"] is not None and m1["kids_pss"] is not None and m0["kids_pss"] is not None:
        tot = (m1["pss"] + m1["kids_pss"] - m0["pss"] - m0["kids_pss"]) / n
        print(f"  daemon + sandbox processes together, Pss per sandbox: {tot:.1f} KiB")
    print(f"  kernel, system-wide /proc/meminfo deltas per sandbox (noisy: every process on the"
          f" machine counts):\n    used {per('used', m0, m1):.0f} KiB, slab "
          f"{per('slab', m0, m1):.0f} KiB, kernel stacks {per('kstack', m0, m1):.0f} KiB, page "
          f"tables {per('ptables', m0, m1):.0f} KiB")
    print()
    return per_rss / 1024.0


def bench_live(b, c):
    ws = make_workspace(b.tmp)
    sb = c.call("sandbox.create", {"workspace": ws})["id"]
    marker = f"conch-bench-{os.getpid()}-{time.time_ns()}"
    r = c.call("exec.run", {"sandbox": sb, "command": f"echo {marker}; cat README.md"})
    if r.get("exit_code") != 0 or marker not in r.get("stdout", ""):
        b.fail(f"exec.run in a live sandbox did not run the command: {r}")
    bash = shutil.which("bash")

    def live():
        r = c.call("exec.run", {"sandbox": sb, "command": "true"})
        if r["exit_code"] != 0:
            b.fail(f"exec.run true failed: {r}")

    # The reference is the cheapest call a harness would make: no timeout= (with one,
    # subprocess polls waitpid with growing sleeps, ~0.15 ms more per call). The bench's own
    # watchdog (BENCH_TIMEOUT) covers a hang.
    def plain():
        subprocess.run([bash, "-c", "true"], check=True)

    res = run_rows([("exec.run true (live sandbox)", live, 0),
                    ("bash -c true (subprocess)", plain, 0)], N)
    print_latency(f"latency: live sandbox, {N} runs per row (+{WARMUP} warm-up), "
                  f"alternating blocks of {BLOCK}", res, "bash -c true (subprocess)", "bash")
    return sb, res


def bench_fresh(b, c):
    marker = f"conch-bench-{os.getpid()}-{time.time_ns()}"
    r = c.call("exec.run", {"fresh": True, "command": f"echo {marker}"})
    if r.get("exit_code") != 0 or marker not in r.get("stdout", ""):
        b.fail(f"exec.run fresh did not run the command: {r}")
    bwrap = shutil.which("bwrap")
    if not bwrap:
        b.fail("bwrap not found in PATH")
    out = subprocess.run([bwrap] + BWRAP_ARGS + ["/bin/echo", marker], capture_output=True,
                         timeout=60)
    if out.returncode != 0 or marker.encode() not in out.stdout:
        b.fail(f"the bubblewrap reference does not work: {out.stderr.decode(errors='replace')}")

    def fresh():
        r = c.call("exec.run", {"fresh": True, "command": "true"})
        if r["exit_code"] != 0:
            b.fail(f"exec.run fresh true failed: {r}")

    def bw():
        subprocess.run([bwrap] + BWRAP_ARGS + ["/bin/true"], check=True)

    def create_destroy():
        sb = c.call("sandbox.create", {})["id"]
        c.call("sandbox.destroy", {"id": sb})

    pname = f"fresh, {PAUSE * 1000:.0f} ms pause before"
    res = run_rows([("exec.run fresh (back-to-back)", fresh, 0),
                    (f"exec.run {pname}", fresh, PAUSE),
                    ("bwrap ... /bin/true (subprocess)", bw, 0),
                    ("sandbox.create+destroy (no ws)", create_destroy, 0)], N)
    print_latency(f"latency: fresh sandboxes, {N} runs per row (+{WARMUP} warm-up), "
                  f"alternating blocks of {BLOCK}", res, "bwrap ... /bin/true (subprocess)",
                  "bwrap")
    return res, pname


def throughput(b, workers, seconds):
    """One thread per callable in @workers, each calling it in a loop for @seconds.
    Returns (commands, elapsed seconds)."""
    k = len(workers)
    counts = [0] * k
    errors = []
    start = threading.Barrier(k + 1)
    stop = threading.Event()

    def loop(i):
        start.wait()
        try:
            while not stop.is_set():
                workers[i]()
                counts[i] += 1
        except Exception as e:  # reported below; the run is then invalid
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(RPC_TIMEOUT)
    elapsed = time.perf_counter() - t0
    if errors:
        b.fail(f"throughput worker failed: {errors[0]!r}")
    return sum(counts), elapsed


def bench_throughput(b, shared_sb):
    """Per client count, the three variants take turns in slices of at most 1 s until each
    has run SECONDS, so a change in machine load hits them alike."""
    bash = shutil.which("bash")
    admin = Client(b.sock_path)
    slices = max(1, round(SECONDS))
    rows = []
    for k in (1, 2, 8):
        clients, sandboxes = [], []

        def connect():
            c = Client(b.sock_path)
            clients.append(c)
            return c

        def own_worker():
            c = connect()
            sb = admin.call("sandbox.create", {"workspace": make_workspace(b.tmp)})["id"]
            sandboxes.append(sb)
            return lambda: c.call("exec.run", {"sandbox": sb, "command": "true"})

        def shared_worker():
            c = connect()
            return lambda: c.call("exec.run", {"sandbox": shared_sb, "command": "true"})

        def plain_worker():
            return lambda: subprocess.run([bash, "-c", "true"], check=True)

        variants = [[own_worker() for _ in range(k)], [shared_worker() for _ in range(k)],
                    [plain_worker() for _ in range(k)]]
        totals = [[0, 0.0] for _ in variants]
        for _ in range(slices):
            for v, workers in enumerate(variants):
                n, el = throughput(b, workers, SECONDS / slices)
                totals[v][0] += n
                totals[v][1] += el
        rows.append((k, *[n / el for n, el in totals]))
        for c in clients:
            c.close()
        for sb in sandboxes:
            admin.call("sandbox.destroy", {"id": sb})
    admin.close()
    print(f"throughput: `true` in a loop, {SECONDS:g} s per cell (in {slices} turns), one "
          f"connection per client (commands/s)")
    print(f"  {'clients':>7} {'own sandbox each':>17} {'one shared':>11} {'bash -c true':>13}"
          f" {'own/bash':>9} {'shared/bash':>12}")
    for k, o, s_, p in rows:
        print(f"  {k:>7} {o:>17.1f} {s_:>11.1f} {p:>13.1f} {o / p:>8.2f}x {s_ / p:>11.2f}x")
    print()
    return rows


def versions():
    try:
        # safe.directory: as another user than the checkout's owner, git refuses otherwise.
        git = ["git", "-c", f"safe.directory={ROOT}", "-C", ROOT]
        commit = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no", "--", "src"],
                               capture_output=True, text=True, timeout=10).stdout
        if dirty.strip():
            commit += " (src/ has uncommitted changes)"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    try:
        bw = subprocess.run(["bwrap", "--version"], capture_output=True, text=True,
                            timeout=10).stdout.strip()
    except OSError:
        bw = "bwrap not found"
    return commit, bw


def main():
    if not os.access(CONCH, os.X_OK):
        die(f"conch binary '{CONCH}' not found or not executable (ninja -C build, or set "
            "CONCH_BIN)")
    b = Bench()

    def on_signal(signum, _frame):
        raise SystemExit(f"bench: interrupted by signal {signum}")

    def on_alarm(_signum, _frame):
        raise SystemExit(f"bench: error: the run took longer than BENCH_TIMEOUT={TIMEOUT} s")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIMEOUT)
    try:
        c = b.start_daemon()
        dpid = b.daemon.pid
        commit, bw = versions()
        load = os.getloadavg()
        print(f"kernel {platform.release()}, {os.cpu_count()} CPUs, load average "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, uid {os.getuid()}, {bw}, "
              f"python {platform.python_version()}")
        built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(CONCH).st_mtime))
        print(f"conch {commit}: {CONCH} (built {built}; daemon pid {dpid}, default pool)")
        print(f"N={N} per latency row, {SECONDS:g} s per throughput cell, {N_SANDBOXES} "
              f"sandboxes for memory{'  [BENCH_QUICK]' if QUICK else ''}")
        print()

        # Memory first, on a young daemon: the other phases grow its heap.
        per_rss = bench_memory(b, c, dpid)
        sb, live = bench_live(b, c)
        fresh, pname = bench_fresh(b, c)
        bench_throughput(b, sb)
        c.call("sandbox.destroy", {"id": sb})
        c.close()
        if b.daemon.poll() is not None:
            b.fail(f"the daemon exited during the run (status {b.daemon.returncode})")

        lr = statistics.median(live["exec.run true (live sandbox)"]) / statistics.median(
            live["bash -c true (subprocess)"])
        bw_med = statistics.median(fresh["bwrap ... /bin/true (subprocess)"])
        fb = statistics.median(fresh["exec.run fresh (back-to-back)"]) / bw_med
        fp = statistics.median(fresh[f"exec.run {pname}"]) / bw_med
        goals = [
            ("live exec.run <= 1.2x plain bash -c true", lr <= 1.2, f"{lr:.2f}x"),
            ("fresh exec.run <= 0.5x bubblewrap (back-to-back)", fb <= 0.5, f"{fb:.2f}x"),
            (f"fresh exec.run <= 0.5x bubblewrap ({PAUSE * 1000:.0f} ms pause, pool full)",
             fp <= 0.5, f"{fp:.2f}x"),
            ("daemon memory <= 2 MiB per idle sandbox (VmRSS)", per_rss <= 2.0,
             f"{per_rss * 1024:.0f} KiB"),
        ]
        print("goals")
        for name, met, val in goals:
            print(f"  {name:<62} {'MET' if met else 'NOT MET':<8} ({val})")
        all_met = all(m for _, m, _ in goals)
        return 2 if REQUIRE_GOAL and not all_met else 0
    except RpcError as e:
        b.fail(str(e))
    finally:
        signal.alarm(0)
        b.cleanup()


if __name__ == "__main__":
    sys.exit(main())
