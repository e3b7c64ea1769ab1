#!/usr/bin/env python3
"""bench/remote.py - the remote transport (issue 21) against the unix socket, on loopback.

1. One command (`exec.run` of `true` in a started sandbox) and one `daemon.ping`, over
   wss://127.0.0.1:PORT/rpc (through the gateway process) and over the daemon's unix socket,
   alternated, one request at a time: medians and the ratio wss / unix (goal: <= 1.3x for the
   command).
2. 100 remote clients at once, each running 100 `exec.run` one after the other in a sandbox
   of its own: failures, p50 and p99 latency, wall time; then the same over the unix socket.

Both clients are asyncio (python3-websockets 10.4 for wss, asyncio streams for the unix
socket), so the difference is the transport: TLS, WebSocket framing and the gateway's hop.
Certificates are made with the openssl CLI in a temporary directory.

Usage: bench/remote.py [--rounds N] [--clients N] [--per-client N]   (CONCH_BIN: the binary)
"""
import argparse
import asyncio
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

import websockets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCH = os.environ.get("CONCH_BIN") or os.path.join(REPO, "build", "conch")
TOKEN = "bench-token-0123456789abcdef0123"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "key.pem", "-out", "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)


class Unix:
    def __init__(self, r, w):
        self.r, self.w, self.next_id = r, w, 0

    @classmethod
    async def connect(cls, path):
        r, w = await asyncio.open_unix_connection(path, limit=1 << 26)
        return cls(r, w)

    async def call(self, method, params=None):
        self.next_id += 1
        rid = self.next_id
        self.w.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                 "params": params or {}}, separators=(",", ":")).encode() + b"\n")
        while True:
            msg = json.loads(await self.r.readline())
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def close(self):
        self.w.close()


class Wss:
    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    @classmethod
    async def connect(cls, url, ctx):
        ws = await websockets.connect(url, ssl=ctx, max_size=80 << 20, open_timeout=60,
                                      extra_headers={"Authorization": f"Bearer {TOKEN}"})
        return cls(ws)

    async def call(self, method, params=None):
        self.next_id += 1
        rid = self.next_id
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                       "params": params or {}}, separators=(",", ":")))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def close(self):
        await self.ws.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def compare(sock, url, ctx, rounds):
    u = await Unix.connect(sock)
    w = await Wss.connect(url, ctx)
    sb = (await u.call("sandbox.create", {}))["id"]
    rows = {}
    for name, method, params in (("daemon.ping", "daemon.ping", {}),
                                 ("exec.run true", "exec.run", {"sandbox": sb, "command": "true"})):
        tu, tw = [], []
        for _ in range(10):
            await u.call(method, params)
            await w.call(method, params)
        for _ in range(rounds):
            t = time.perf_counter()
            await u.call(method, params)
            tu.append(time.perf_counter() - t)
            t = time.perf_counter()
            await w.call(method, params)
            tw.append(time.perf_counter() - t)
        rows[name] = (statistics.median(tu), statistics.median(tw))
    await u.call("sandbox.destroy", {"id": sb})
    await u.close()
    await w.close()
    return rows


async def many(sock, url, ctx, clients, per_client, transport="wss"):
    u = await Unix.connect(sock)
    sbs = [(await u.call("sandbox.create", {}))["id"] for _ in range(clients)]
    lat, failures = [], []

    async def one(i):
        try:
            w = await (Wss.connect(url, ctx) if transport == "wss" else Unix.connect(sock))
        except Exception as e:  # noqa: BLE001 - a failure to count, whatever it is
            failures.append(f"connect: {e!r}")
            return
        for _ in range(per_client):
            t = time.perf_counter()
            try:
                r = await w.call("exec.run", {"sandbox": sbs[i], "command": "echo ok"})
                if r["stdout"] != "ok\n":
                    failures.append(f"output {r['stdout']!r}")
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))
            lat.append(time.perf_counter() - t)
        await w.close()

    t0 = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(clients)])
    wall = time.perf_counter() - t0
    for sb in sbs:
        await u.call("sandbox.destroy", {"id": sb})
    await u.close()
    return lat, failures, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-client", type=int, default=100)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="conch-bench-remote-")
    make_certs(d)
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write(f"admin {TOKEN}\n")
    os.chmod(tokens, 0o600)
    sock, port = os.path.join(d, "conch.sock"), free_port()
    log = open(os.path.join(d, "daemon.log"), "wb")
    proc = subprocess.Popen([CONCH, "serve", "--socket", sock, "--state-dir", os.path.join(d, "state"),
                             "--pool", "0", "--max-sandboxes", str(a.clients + 8),
                             "--listen", f"127.0.0.1:{port}", "--tls-cert", os.path.join(d, "cert.pem"),
                             "--tls-key", os.path.join(d, "key.pem"), "--tokens", tokens],
                            stdout=log, stderr=log)
    ctx = ssl.create_default_context(cafile=os.path.join(d, "cert.pem"))
    url = f"wss://127.0.0.1:{port}/rpc"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                asyncio.run(Wss.connect(url, ctx)).ws.transport.abort()
                break
            except (OSError, websockets.exceptions.InvalidStatusCode):
                if time.monotonic() > deadline or proc.poll() is not None:
                    sys.exit(f"the gateway did not come up; see {d}/daemon.log")
                time.sleep(0.1)
        print(f"conch: {CONCH}")
        rows = asyncio.run(compare(sock, url, ctx, a.rounds))
        print(f"\n1. one request at a time, {a.rounds} rounds, medians")
        print(f"{'request':<16}{'unix':>10}{'wss':>10}{'ratio':>8}")
        for name, (tu, tw) in rows.items():
            print(f"{name:<16}{tu * 1e3:>8.3f}ms{tw * 1e3:>8.3f}ms{tw / tu:>7.2f}x")
        print(f"\n2. {a.clients} clients x {a.per_client} exec.run (echo ok), each in its own sandbox")
        for transport in ("wss", "unix"):
            lat, failures, wall = asyncio.run(many(sock, url, ctx, a.clients, a.per_client, transport))
            print(f"{transport:<5} requests {len(lat)}, failures {len(failures)}, wall {wall:.1f} s, "
                  f"{len(lat) / wall:.0f}/s, p50 {pct(lat, 50) * 1e3:.1f} ms, p99 {pct(lat, 99) * 1e3:.1f} ms, "
                  f"max {max(lat) * 1e3:.1f} ms")
            for f in failures[:5]:
                print("  failure:", f)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
