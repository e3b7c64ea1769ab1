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

Usage: bench/js.py [--conch build/conch] [--rounds 200] [--quickjs DIR]
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
        print(json.dumps({"conch": mine, "quickjs": ref}))
    finally:
        d.terminate()
        d.wait(10)


if __name__ == "__main__":
    main()
