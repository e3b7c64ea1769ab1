#!/usr/bin/env python3
"""bench/network.py - the allow mode's proxy against direct loopback, as a command sees it.

One run, side by side, with a `conch serve` started for it (`--net-hosts` pointing
registry.test at a loopback server of this script):
  * throughput: curl inside a sandbox downloads N bytes from a loopback server, through the
    proxy (allow mode, plain HTTP and a CONNECT tunnel) and directly (host mode: the same
    sandbox and curl, no proxy: the reference);
  * latency: a Python loop inside the sandbox makes R requests for a small body, each on a new
    connection (what pip and npm do per file at worst), through the proxy and directly; the
    median per request, and what the proxy adds.
A second reference, when tinyproxy is installed (Debian's tinyproxy-bin, which scripts/bootstrap
installs): the same host-mode sandbox's curl through tinyproxy on the host, a well-known
HTTP proxy with no policy: what any proxy costs on this path.
Goals (issue 19): >= 80% of direct throughput, <= 0.2 ms added to a request. Beside the
ratios, the daemon's CPU time per GB proxied (user + system, from /proc): the proxy's own
cost, which moves far less than the ratios with the machine's load.

Usage: bench/network.py [--conch build/conch] [--bytes 1000000000] [--requests 300]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CHUNK = b"x" * (1 << 20)


def serve(sock):
    """A minimal HTTP/1.1 server: GET /N answers N bytes, then closes."""
    def one(c):
        with c:
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = c.recv(4096)
                if not d:
                    return
                buf += d
            n = int(buf.split(b" ", 2)[1].strip(b"/") or b"0")
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n)
            mv = memoryview(CHUNK)
            while n > 0:
                k = min(n, len(CHUNK))
                c.sendall(mv[:k])
                n -= k

    while True:
        c, _ = sock.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()


LATENCY = r'''
import socket, statistics, sys, time
port, proxied, n = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
times = []
for i in range(n):
    t = time.perf_counter()
    if proxied:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"GET http://registry.test:%d/64 HTTP/1.1\r\nHost: registry.test\r\n\r\n" % port)
    else:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /64 HTTP/1.1\r\nHost: registry.test\r\n\r\n")
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    assert data.endswith(b"x" * 64), data[:200]
    times.append(time.perf_counter() - t)
print(statistics.median(times) * 1000)
'''


def cpu_seconds(pid):
    """User + system CPU time of process @pid so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_tinyproxy(tmp, server_port):
    """tinyproxy on a free loopback port, allowed to CONNECT to @server_port; (process, port),
    or (None, 0) when it is not installed."""
    exe = shutil.which("tinyproxy")
    if not exe:
        return None, 0
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    conf = os.path.join(tmp, "tinyproxy.conf")
    with open(conf, "w") as f:
        f.write(f"Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 64\nAllow 127.0.0.1\n"
                f"ConnectPort {server_port}\nLogLevel Critical\n")
    p = subprocess.Popen([exe, "-d", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    p.kill()
    return None, 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conch", default=os.path.join(os.path.dirname(__file__), "..", "build", "conch"))
    ap.add_argument("--bytes", type=int, default=1_000_000_000)
    ap.add_argument("--requests", type=int, default=300)
    a = ap.parse_args()
    conch = os.path.abspath(a.conch)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)
    port = srv.getsockname()[1]
    threading.Thread(target=serve, args=(srv,), daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="conch-bench-net-")
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 registry.test\n")
    sock = os.path.join(tmp, "conch.sock")
    tp, tp_port = start_tinyproxy(tmp, port)
    d = subprocess.Popen([conch, "serve", "--socket", sock, "--state-dir", os.path.join(tmp, "state"),
                          "--pool", "0", "--net-hosts", hosts], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)

        def create(*args):
            return subprocess.run([conch, "create", "--socket", sock, *args], check=True,
                                  capture_output=True, text=True).stdout.strip()

        def run(sb, *cmd, stdin=None):
            p = subprocess.run([conch, "exec", "--socket", sock, "-i" if stdin else "-n", sb, "--", *cmd],
                               input=stdin, capture_output=True, text=True, timeout=600)
            if p.returncode:
                sys.exit(f"{cmd}: {p.stderr}")
            return p.stdout

        allow = create("--allow", f"registry.test:{port}")
        host = create("--net", "host")
        url = f"http://registry.test:{port}/{a.bytes}"
        curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}"]
        rows = []
        direct = float(run(host, *curl, "--resolve", f"registry.test:{port}:127.0.0.1", url))
        c0 = cpu_seconds(d.pid)
        proxied = float(run(allow, *curl, url))
        c1 = cpu_seconds(d.pid)
        tunnel = float(run(allow, *curl, "--proxytunnel", url))
        c2 = cpu_seconds(d.pid)
        gb = a.bytes / 1e9
        for name, v in [("direct (host mode)", direct), ("proxy, HTTP", proxied),
                        ("proxy, CONNECT tunnel", tunnel)]:
            rows.append((name, v))
        ref = {}
        if tp:
            via = ["--resolve", f"registry.test:{port}:127.0.0.1", "-x", f"http://127.0.0.1:{tp_port}"]
            ref["http"] = float(run(host, *curl, *via, f"http://127.0.0.1:{port}/{a.bytes}"))
            ref["connect"] = float(run(host, *curl, *via, "--proxytunnel", f"http://127.0.0.1:{port}/{a.bytes}"))
            rows.append(("tinyproxy, HTTP (ref.)", ref["http"]))
            rows.append(("tinyproxy, CONNECT (ref.)", ref["connect"]))
        print(f"throughput, {a.bytes} bytes from a loopback server:")
        for name, v in rows:
            print(f"  {name:24s} {v / 1e6:9.1f} MB/s  {v / direct * 100:6.1f}% of direct")
        print(f"  daemon CPU per GB proxied: HTTP {(c1 - c0) / gb:.3f} s, CONNECT {(c2 - c1) / gb:.3f} s")
        lat_direct = float(run(host, "python3", "-", str(port), "0", str(a.requests), stdin=LATENCY))
        lat_proxy = float(run(allow, "python3", "-", str(port), "1", str(a.requests), stdin=LATENCY))
        print(f"latency, median of {a.requests} requests, each on a new connection:")
        print(f"  direct (host mode)       {lat_direct:7.3f} ms")
        print(f"  proxy                    {lat_proxy:7.3f} ms  (+{lat_proxy - lat_direct:.3f} ms)")
        print(json.dumps({"throughput_ratio_http": round(proxied / direct, 3),
                          "throughput_ratio_connect": round(tunnel / direct, 3),
                          "added_latency_ms": round(lat_proxy - lat_direct, 3),
                          "daemon_cpu_s_per_gb_http": round((c1 - c0) / gb, 3),
                          "daemon_cpu_s_per_gb_connect": round((c2 - c1) / gb, 3),
                          **{f"tinyproxy_ratio_{k}": round(v / direct, 3) for k, v in ref.items()}}))
    finally:
        if tp:
            tp.kill()
            tp.wait()
        d.terminate()
        d.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
