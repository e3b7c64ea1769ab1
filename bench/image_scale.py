#!/usr/bin/python3
"""bench/image_scale.py - what an idle sandbox costs in the conch image, as in a pod: starts
`conch serve --pool 0` in the image deploy/build-image made (podman, runc, the narrow options
of tests/integration/test_image.py), creates sandboxes without a workspace (what a remote
tenant gets: no host paths) up to each step of BENCH_STEPS (default 1,10,100,300), and at
each step measures the total PSS of the container's processes (its conch daemon and every
process below it) and the PSS per sandbox; the last two steps' difference divided by their
sandbox counts is the cost of one more idle sandbox, without the daemon's own. Prints a
table; see docs/KUBERNETES.md ("How it scales").

Environment: BENCH_IMAGE (default localhost/conch:latest), BENCH_STEPS. Run as root.
"""

import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid

from rpc import Client  # bench/rpc.py
from scale import KiB, settle, total_pss  # bench/scale.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.environ.get("BENCH_IMAGE", "localhost/conch:latest")
STEPS = [int(x) for x in os.environ.get("BENCH_STEPS", "1,10,100,300").split(",")]


def main():
    base = tempfile.mkdtemp(prefix="conch-image-scale-")
    for d in ("state", "run", "tmp"):
        os.mkdir(os.path.join(base, d))
        os.chmod(os.path.join(base, d), 0o1777)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(soft, hard, 65536)
    name = f"conch-bench-{uuid.uuid4().hex[:8]}"
    seccomp = os.path.join(ROOT, "deploy", "seccomp", "conch.json")
    subprocess.run(["podman", "run", "--runtime", "runc", "--ulimit", f"nofile={n}:{n}",
                    "--ulimit", "nproc=16384:16384", "--pids-limit", "-1", "--cap-drop", "ALL",
                    "--security-opt", "no-new-privileges", "--security-opt", f"seccomp={seccomp}",
                    "--security-opt", "unmask=/proc/*", "--read-only", "-d", "--name", name,
                    "-v", f"{base}/state:/var/lib/conch", "-v", f"{base}/run:/run/conch",
                    "-v", f"{base}/tmp:/tmp", IMAGE, "serve", "--socket",
                    "/run/conch/sock/conch.sock", "--state-dir", "/var/lib/conch/state",
                    "--pool", "0", "--idle-timeout", "0", "--max-sandboxes",
                    str(max(STEPS) + 8)], check=True, stdout=subprocess.DEVNULL)
    try:
        sock = os.path.join(base, "run", "sock", "conch.sock")
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        pid = int(subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", name],
                                 capture_output=True, text=True, check=True).stdout)
        c = Client(sock, timeout=120)
        made, rows = [], []
        for step in STEPS:
            while len(made) < step:
                made.append(c.call("sandbox.create", {})["id"])
            settle(pid, 1 + 3 * len(made))
            pss, nprocs = total_pss(pid)
            rows.append((step, pss, nprocs))
            print(f"  {step:5d} sandboxes: {pss / KiB:8.1f} MiB PSS in {nprocs} processes "
                  f"({pss / step:6.0f} KiB each)", flush=True)
        if len(rows) >= 2:
            (s0, p0, _), (s1, p1, _) = rows[-2], rows[-1]
            print(f"one more idle sandbox: {(p1 - p0) / (s1 - s0):.0f} KiB PSS "
                  f"(steps {s0} -> {s1})")
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "10", name], stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", base])


if __name__ == "__main__":
    sys.exit(main())
