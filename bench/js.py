#!/usr/bin/env python3
"""bench/js.py - JS sessions (js.eval) measured as a harness sees them, from a client of a real
`conch serve`, side by side in one run with @langchain/quickjs (QuickJS in WASM in Node,
bench/js_quickjs.mjs) when it is installed:
  * a new session's first eval (worker start inside the sandbox included; js.close after);
  * one eval (`n = n + 1`);
  * one tool call: an eval of 100 sequential `await tools.echo({i})`, less one eval, / 100
    (answered at once by the client, bench/bridge.py's Answerer);
  * an eval of 100 parallel tool calls (Promise.all).
Medians in ms, and conch / quickjs ratios. Goals (issue 17): <= 5 ms, <= 0.2 ms, <= 0.3 ms,
<= 5 ms.

With --cpu, also what each op costs the daemon and the session's worker (CPU time from
/proc/PID/stat, in clock ticks: take it over many ops) and how often each slept (voluntary
context switches) or was preempted: steadier than latency on a shared machine.

Usage: bench/js.py [--conch build/conch] [--rounds 200] [--quickjs DIR] [--cpu]
  DIR: a directory whose node_modules has @langchain/quickjs and @langchain/core
  (`npm install @langchain/quickjs@0.6.4 @langchain/core` there); default $CONCH_BENCH_QUICKJS.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bridge import Answerer  # noqa: E402


def timed(f):
    t = time.perf_counter()
    r = f()
    return (time.perf_counter() - t) * 1000, r


def conch_rows(c, sb, rounds):
    def ev(code, session="main"):
        r = c.call("js.eval", {"sandbox": sb, "session": session, "code": code, "timeout": 60})
        if not r["ok"]:
            raise SystemExit(f"js.py: eval failed: {r['text']}")
        return r

    first, _ = timed(lambda: ev("1", "first"))
    news = []
    for i in range(min(rounds, 50)):
        ms, _ = timed(lambda: ev("1", f"s{i}"))
        news.append(ms)
        c.call("js.close", {"sandbox": sb, "session": f"s{i}"})
    ev("var n = 0")
    evals = [timed(lambda: ev("n = n + 1"))[0] for _ in range(rounds)]
    seq, par = [], []
    for _ in range(5):
        ev("for (let i = 0; i < 100; i++) await tools.echo({ i }); 1")
        seq.append(timed(lambda: ev("for (let i = 0; i < 100; i++) await tools.echo({ i }); 1"))[0])
        par.append(timed(lambda: ev("(await Promise.all(Array.from({ length: 100 }, "
                                    "(_, i) => tools.echo({ i })))).length"))[0])
    e = statistics.median(evals)
    return {"first_ms": first, "new_session_ms": statistics.median(news), "eval_ms": e,
            "tool_call_ms": (statistics.median(seq) - e) / 100,
            "parallel100_ms": statistics.median(par)}


def quickjs_rows(d, rounds):
    nm = os.path.join(d, "node_modules")
    if not os.path.isdir(os.path.join(nm, "@langchain", "quickjs")):
        return None
    r = subprocess.run(["node", os.path.join(HERE, "js_quickjs.mjs"), str(rounds)],
                       env={**os.environ, "NODE_PATH": nm}, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        print(f"js.py: @langchain/quickjs run failed:\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def proc_cost(pid):
    """(CPU seconds, voluntary, nonvoluntary context switches) of @pid's threads."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    vol = nonvol = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    nonvol += int(line.split()[1])
    return cpu, vol, nonvol


def worker_pid(daemon_pid):
    """The host pid of the one live JS worker of a session under @daemon_pid."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    kids = {}
    for line in out.splitlines()[1:]:
        pid, ppid, args = line.split(None, 2)
        kids.setdefault(int(ppid), []).append((int(pid), args))
    todo, found = [daemon_pid], []
    while todo:
        for pid, args in kids.get(todo.pop(), []):
            todo.append(pid)
            if args.startswith("conch-js-worker"):
                found.append(pid)
    return found[0] if len(found) == 1 else None


def cpu_rows(c, sb, daemon_pid):
    def ev(code):
        r = c.call("js.eval", {"sandbox": sb, "session": "cpu", "code": code, "timeout": 60})
        if not r["ok"]:
            raise SystemExit(f"js.py: eval failed: {r['text']}")
    ev("var n = 0")
    w = worker_pid(daemon_pid)
    if not w:
        print("js.py: --cpu: the session's worker was not found", file=sys.stderr)
        return
    print(f"{'per op (--cpu)':36} {'daemon ms':>10} {'worker ms':>10} {'d sleeps':>9} "
          f"{'d preempt':>9} {'w sleeps':>9}")
    for label, code, n in [
            ("one eval", "n = n + 1", 3000),
            ("100 sequential tool calls", "for (let i = 0; i < 100; i++) await tools.echo({ i }); 1",
             50),
            ("100 parallel tool calls", "(await Promise.all(Array.from({ length: 100 }, "
             "(_, i) => tools.echo({ i })))).length", 100)]:
        d0, w0 = proc_cost(daemon_pid), proc_cost(w)
        for _ in range(n):
            ev(code)
        d1, w1 = proc_cost(daemon_pid), proc_cost(w)
        print(f"{label:36} {(d1[0] - d0[0]) * 1000 / n:10.3f} {(w1[0] - w0[0]) * 1000 / n:10.3f} "
              f"{(d1[1] - d0[1]) / n:9.2f} {(d1[2] - d0[2]) / n:9.2f} {(w1[1] - w0[1]) / n:9.2f}")


ROWS = [("first eval of the first session", "first_ms", None),
        ("a new session's first eval", "new_session_ms", 5),
        ("one eval", "eval_ms", 0.2),
        ("one tool call (sequential)", "tool_call_ms", 0.3),
        ("100 parallel tool calls", "parallel100_ms", 5)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conch", default=os.path.join(HERE, "..", "build", "conch"))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--quickjs", default=os.environ.get("CONCH_BENCH_QUICKJS", ""))
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="conch-bench-js-")
    sock = os.path.join(base, "conch.sock")
    ws = os.path.join(base, "ws")
    os.mkdir(ws)
    log = open(os.path.join(base, "daemon.log"), "w")
    d = subprocess.Popen([os.path.abspath(a.conch), "serve", "--socket", sock, "--state-dir",
                          os.path.join(base, "state")], stderr=log)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = Answerer(sock)
        sb = c.call("sandbox.create", {"workspace": ws, "max_tool_calls": 1000})["id"]
        c.call("tools.register", {"sandbox": sb, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
        mine = conch_rows(c, sb, a.rounds)
        ref = quickjs_rows(a.quickjs, a.rounds) if a.quickjs else None
        print(f"{'row (median ms)':36} {'conch':>9} {'quickjs':>9} {'ratio':>7}  goal")
        for label, key, goal in ROWS:
            q = ref[key] if ref else None
            print(f"{label:36} {mine[key]:9.3f} " + (f"{q:9.3f} {mine[key] / q:7.2f}" if q else f"{'-':>9} {'-':>7}") +
                  (f"  <= {goal}" if goal else ""))
        if a.cpu:  # in a sandbox of their own: one session, one worker
            c.call("sandbox.destroy", {"id": sb})
            sb = c.call("sandbox.create", {"workspace": ws, "max_tool_calls": 1000})["id"]
            c.call("tools.register", {"sandbox": sb, "tools": [{"name": "echo", "input_schema": {"type": "object"}}]})
            cpu_rows(c, sb, d.pid)
        print(json.dumps({"conch": mine, "quickjs": ref}))
    finally:
        d.terminate()
        d.wait(10)


if __name__ == "__main__":
    main()
