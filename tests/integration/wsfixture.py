# wsfixture.py - a stand-in for conch's remote gateway in the clients' tests: wss on loopback
# (python3-websockets + ssl), `Authorization: Bearer TOKEN` checked before the upgrade (401:
# against one token, or with --daemon-auth by the daemon's connection.auth, as the gateway),
# each WebSocket text message forwarded as one line to a real daemon's unix socket and each
# line back as one message (docs/PROTOCOL.md, "Remote"). SIGUSR1 drops every connection
# (the clients' reconnect tests); --ping-interval N pings every N s and drops a client that
# does not answer with a pong within N s. Also: make_certs() (a CA and server certs made
# with the openssl CLI). The same tests can later be pointed at the real gateway.
#
#   python3 wsfixture.py --socket SOCK --cert CRT --key KEY --token-file F [--port N]
# prints "PORT\n" on stdout once listening.
import argparse
import asyncio
import http
import json
import os
import re
import signal
import socket
import subprocess
import sys

FRAGMENT = 256 << 10


def make_certs(d, names=("IP:127.0.0.1", "DNS:localhost"), prefix="server", ca=None):
    """A CA (d/ca.crt, d/ca.key; unless @ca=(crt, key) is given) and a server cert signed by
    it for the subjectAltNames @names: returns (ca_crt, crt, key)."""
    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True)
    if ca is None:
        ca = (os.path.join(d, "ca.crt"), os.path.join(d, "ca.key"))
        if not os.path.exists(ca[0]):
            run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                "/CN=conch test CA", "-keyout", ca[1], "-out", ca[0],
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    crt, key, csr = (os.path.join(d, f"{prefix}.{e}") for e in ("crt", "key", "csr"))
    ext = os.path.join(d, f"{prefix}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=conch test server",
        "-keyout", key, "-out", csr)
    run("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-days", "2", "-extfile", ext, "-out", crt)
    return ca[0], crt, key


async def serve(args, token):
    import ssl

    import websockets

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(args.cert, args.key)
    conns = set()
    log = open(args.log, "a") if args.log else None

    async def upstream(given, peer):
        """A daemon connection authenticated as @given's tenant (connection.auth), or the
        HTTP status that refuses it."""
        r, w = await asyncio.open_unix_connection(args.socket, limit=1 << 27)
        req = {"jsonrpc": "2.0", "id": 0, "method": "connection.auth",
               "params": {"token": given, "peer": peer}}
        w.write(json.dumps(req).encode() + b"\n")
        ans = json.loads(await r.readline() or b"{}")
        if "result" in ans:
            return (r, w), None
        w.close()
        code = (ans.get("error") or {}).get("code")
        return None, (http.HTTPStatus.TOO_MANY_REQUESTS if code == -32021 else
                      http.HTTPStatus.UNAUTHORIZED)

    class Proto(websockets.WebSocketServerProtocol):
        async def process_request(self, path, headers):
            if path.split("?")[0] == "/healthz":
                return http.HTTPStatus.OK, [], b"ok\n"
            if path.split("?")[0] != "/rpc":
                return http.HTTPStatus.NOT_FOUND, [], b"not found\n"
            auth = headers.get("Authorization", "")
            given = auth[7:] if auth.startswith("Bearer ") else ""
            if args.daemon_auth and given:
                peer = "%s:%d" % self.transport.get_extra_info("peername")[:2]
                self.upstream, status = await upstream(given, peer)
                if status is None:
                    return None
            elif not args.daemon_auth and given == token:
                return None
            return http.HTTPStatus.UNAUTHORIZED, [("WWW-Authenticate", "Bearer")], \
                b"unauthorized\n"

    async def handler(ws, path):
        conns.add(ws)
        up = getattr(ws, "upstream", None)
        r, w = up or await asyncio.open_unix_connection(args.socket, limit=1 << 27)

        async def down():
            while line := await r.readline():
                text = line.rstrip(b"\n").decode()
                if len(text) > FRAGMENT:  # a fragmented message, as a gateway may send
                    text = [text[i:i + FRAGMENT] for i in range(0, len(text), FRAGMENT)]
                await ws.send(text)
            await ws.close()
        t = asyncio.ensure_future(down())
        try:
            async for msg in ws:
                if log:
                    m = re.search(r'"method"\s*:\s*"([^"]*)"', msg[:4096])
                    if m:
                        log.write(m.group(1) + "\n")
                        log.flush()
                w.write((msg if isinstance(msg, bytes) else msg.encode()) + b"\n")
                await w.drain()
        except websockets.ConnectionClosed:
            pass
        finally:
            conns.discard(ws)
            t.cancel()
            w.close()

    def drop():
        for ws in list(conns):
            ws.transport.abort()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, drop)
    async with websockets.serve(handler, "127.0.0.1", args.port, ssl=ctx, max_size=64 << 20,
                                create_protocol=Proto, compression=None,
                                ping_interval=args.ping_interval,
                                ping_timeout=args.ping_interval) as srv:
        port = srv.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--token-file", help="the one token accepted (unless --daemon-auth)")
    ap.add_argument("--daemon-auth", action="store_true",
                    help="as the real gateway: each connection's token goes to the daemon's "
                         "connection.auth (conch serve --tokens), its tenant's from then on")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", help="append the method of each client message to this file")
    ap.add_argument("--ping-interval", type=float, default=20,
                    help="ping every N s; a client that does not answer within N s is dropped")
    args = ap.parse_args()
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    asyncio.run(serve(args, token))


# Debian's python3 is the one with python3-websockets.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class Gateway:
    """The fixture run as a child process in front of the daemon at @sock."""

    def __init__(self, sock, cert, key, token, workdir, port=0, ping_interval=20,
                 daemon_auth=False):
        """@token: the one token accepted; None with @daemon_auth: the daemon's tokens."""
        tf = os.path.join(workdir, "fixture.token")
        self.log = os.path.join(workdir, f"fixture-{os.getpid()}-{id(self)}.methods")
        with open(tf, "w") as f:
            f.write(token or "")
        self.proc = subprocess.Popen(
            [PYTHON, __file__,
             "--socket", sock, "--cert", cert, "--key", key, "--token-file", tf,
             "--port", str(port), "--ping-interval", str(ping_interval), "--log", self.log]
            + (["--daemon-auth"] if daemon_auth else []),
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        if not line.strip():
            self.proc.wait(10)
            raise RuntimeError("wsfixture did not start")
        self.port = int(line)
        self.url = f"wss://127.0.0.1:{self.port}"

    def methods(self):
        """The methods the clients called through this gateway so far."""
        try:
            with open(self.log) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def drop(self):
        """Drop every connection open now."""
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


if __name__ == "__main__":
    main()
