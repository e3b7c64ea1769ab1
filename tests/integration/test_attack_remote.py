# test_attack_remote.py - holes found attacking the remote transport, tenants and conch mcp
# --listen from outside (issue 21): what a tenant's connection (a remote client, authenticated
# with connection.auth) could reach of the daemon's host (its loopback services, its state
# dir's paths), hold past its quotas (tmpfs memory, snapshots on disk and without end), and
# what a client without a token could do (hold conch mcp's bodies' budget; reach a gateway
# meant for loopback from the network). Runs as root and as an unprivileged user (the tmpfs
# bound matters most there: rlimits bound no tmpfs).
import http.server
import json
import os
import subprocess
import threading

import pytest

from rpcclient import RpcError

TOK_A = "alice-token-0123456789abcdef"
TOK_Q = "quota-token-0123456789abcdef"
TOK_D = "disk-token-0123456789abcdef00"
TOKENS = f"alice {TOK_A}\nquota {TOK_Q} sandboxes=2 memory=256M\ndisk {TOK_D} disk=64M\n"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"a service of the daemon's host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def host_service():
    """An HTTP server on the host's loopback: a service of the daemon's host, not the tenant's."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.fixture
def tenant_daemon(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    hosts = tmp_path / "hosts"
    # a name of the tenant's choosing that resolves into the host's networks (as a public name
    # it controls could, or "localhost", or a cloud's metadata name)
    hosts.write_text("127.0.0.1 intranet.test\n")
    return daemon_factory(extra_args=["--pool", "0", "--tokens", str(tokens),
                                      "--net-hosts", str(hosts)])


# Every way a command may ask the proxy for the host's loopback service, as one JSON object
# of {name: http status} ("000": no answer).
PROBE = r'''
import json, subprocess, sys
P = int(sys.argv[1])
out = {}
for name, url in (("ip", f"http://127.0.0.1:{P}/"), ("name", f"http://intranet.test:{P}/"),
                  ("v6mapped", f"http://[::ffff:127.0.0.1]:{P}/")):
    p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--noproxy", "",
                        "-x", "http://127.0.0.1:3128", url], capture_output=True, text=True,
                       timeout=60)
    out[name] = p.stdout
print(json.dumps(out))
'''

RULES = ["127.0.0.1:{p}", "intranet.test:{p}", "[::ffff:127.0.0.1]:{p}"]


def probe(rpc, sb, port):
    r = rpc.call("exec.run", {"sandbox": sb, "command": f"python3 -c '{PROBE}' {port}",
                              "timeout": 120}, timeout=150)
    assert r["exit_code"] == 0, r
    return json.loads(r["stdout"])


def test_a_tenants_allow_rules_reach_no_address_of_the_hosts_networks(tenant_daemon,
                                                                      host_service):
    """A rule naming an internal address exactly (127.0.0.1:P, a name resolving to it) lets
    the owner's sandbox reach the host's loopback (the owner's machine, the owner's choice),
    but a tenant brings no resource of the daemon's host: its sandbox's proxy refuses every
    internal address, by rule at create, by network.set later, and in its forks (the host's
    loopback services; in a pod, the cloud's metadata address 169.254.169.254)."""
    d, port = tenant_daemon, host_service
    rules = [r.format(p=port) for r in RULES]
    owner = d.client()
    mine = owner.call("sandbox.create", {"allow": rules})["id"]
    assert set(probe(owner, mine, port).values()) == {"200"}

    a = d.client()
    assert a.call("connection.auth", {"token": TOK_A})["tenant"] == "alice"
    sb = a.call("sandbox.create", {"allow": rules})["id"]
    got = probe(a, sb, port)
    assert got == {"ip": "403", "name": "403", "v6mapped": "403"}, got
    log = a.call("network.log", {"sandbox": sb})["records"]
    assert log and not any(rec["allowed"] and not rec.get("error") and rec.get("bytes_in")
                           for rec in log), log
    # rules given later, and a fork's copy of them
    sb2 = a.call("sandbox.create", {"allow": ["example.invalid"]})["id"]
    a.call("network.set", {"sandbox": sb2, "allow": rules})
    assert set(probe(a, sb2, port).values()) == {"403"}
    fork = a.call("sandbox.fork", {"sandbox": sb})["id"]
    assert set(probe(a, fork, port).values()) == {"403"}
    # and a refusal says why, naming no rule to add (none would help)
    r = a.call("exec.run", {"sandbox": sb, "command": "curl -sS --noproxy '' -x "
                            f"http://127.0.0.1:3128 http://127.0.0.1:{port}/"}, timeout=60)
    assert "tenant" in r["stdout"] and "internal address" in r["stdout"], r
    with pytest.raises(RpcError):
        a.call("sandbox.get", {"id": mine})


@pytest.mark.skipif(os.geteuid() != 0, reason="adds an address to the host's loopback")
def test_the_hosts_own_public_address_is_internal_too(daemon_factory, tmp_path):
    """The attack's leftover: the proxy refused the host's private networks but not its own
    public addresses, where a host serves what it serves on its loopback. 198.51.100.77
    (TEST-NET-2, public by class) is given to the host's lo for the test: a tenant's sandbox
    must not reach a service there, even by a rule naming it; the owner's reaches it only by a
    rule naming it exactly, not by a wildcard whose name resolves there."""
    addr = "198.51.100.77"
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{addr} public.test\n")
    d = daemon_factory(extra_args=["--pool", "0", "--tokens", str(tokens),
                                   "--net-hosts", str(hosts)])
    subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", "lo"], check=True)
    srv = None
    try:
        srv = http.server.ThreadingHTTPServer((addr, 0), _Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        port = srv.server_address[1]

        def fetch(rpc, sb, host):
            r = rpc.call("exec.run", {"sandbox": sb, "command": "curl -sS -o /dev/null -w "
                                      f"%{{http_code}} --noproxy '' -x http://127.0.0.1:3128 "
                                      f"http://{host}:{port}/"}, timeout=60)
            return r["stdout"]

        owner = d.client()
        wide = owner.call("sandbox.create", {"allow": ["*.test"]})["id"]
        assert fetch(owner, wide, "public.test") == "403"
        exact = owner.call("sandbox.create", {"allow": [f"{addr}:{port}"]})["id"]
        assert fetch(owner, exact, addr) == "200"
        a = d.client()
        a.call("connection.auth", {"token": TOK_A})
        sb = a.call("sandbox.create", {"allow": [f"{addr}:{port}", "public.test"]})["id"]
        assert fetch(a, sb, addr) == "403"
        assert fetch(a, sb, "public.test") == "403"
    finally:
        if srv:
            srv.shutdown()
        subprocess.run(["ip", "addr", "del", f"{addr}/32", "dev", "lo"], check=False)


def test_a_tenants_tmpfs_mounts_stay_within_its_memory_quota(tenant_daemon):
    """Tmpfs mounts are memory. /tmp was held to half the sandbox's memory limit, but a
    tenant's `mounts` of type tmpfs (the kind it may have) kept their size: 8 of 8 GiB under
    a 256M quota. Without a memory cgroup (the unprivileged daemon's rlimits) nothing else
    bounded them, so a tenant filled the host's RAM past its quota; with one, a full mount
    kept the sandbox's cgroup out of memory for good. Together they now hold at most half."""
    d = tenant_daemon
    q = d.client()
    q.call("connection.auth", {"token": TOK_Q})
    sb = q.call("sandbox.create", {"mounts": [{"type": "tmpfs", "target": f"/d{i}", "size": "8g"}
                                              for i in range(8)]})["id"]
    # its memory: the quota's share, 128M
    r = q.call("exec.run", {"sandbox": sb, "command": "df -B1 --output=size /d0 /d1 /d2 /d3 "
                            "/d4 /d5 /d6 /d7 | tail -n +2"}, timeout=60)
    sizes = [int(x) for x in r["stdout"].split()]
    assert len(sizes) == 8, r
    assert sum(sizes) <= (64 << 20) + 8 * (64 << 10), sizes
    # and what is written there stops at that
    r = q.call("exec.run", {"sandbox": sb, "command": "for i in 0 1 2 3 4 5 6 7; do "
                            "for j in 1 2 3 4 5 6; do head -c 8M /dev/zero > /d$i/f$j 2>/dev/null;"
                            " done; done; du -scB1 /d0 /d1 /d2 /d3 /d4 /d5 /d6 /d7 | tail -1",
                            "timeout": 120}, timeout=150)
    assert int(r["stdout"].split()[0]) <= (64 << 20) + 8 * (64 << 10), r


def test_a_tenants_snapshots_stay_within_its_disk_quota(tenant_daemon):
    """A snapshot freezes a sandbox's changes into a layer of the daemon's and resets what the
    sandbox's disk limit counts; the layer outlives the sandbox. So 20M written, snapshot,
    again and again, filled the daemon's disk past a 64M disk quota (120M after six rounds,
    and on after the sandbox was destroyed). The tenant's snapshots now add up to at most its
    quota (give or take what one measurement has not seen yet), and deleting one makes room."""
    d = tenant_daemon
    t = d.client()
    t.call("connection.auth", {"token": TOK_D})
    sb = t.call("sandbox.create", {"disk": 48 << 20})["id"]
    refused = None
    for i in range(6):
        r = t.call("exec.run", {"sandbox": sb, "command": f"head -c 20M /dev/urandom > f{i}",
                                "timeout": 60}, timeout=90)
        assert r["exit_code"] == 0, r
        try:
            t.call("workspace.snapshot", {"sandbox": sb}, timeout=60)
        except RpcError as e:
            refused = e
            break
    assert refused is not None, "six snapshots of 20M each under a 64M disk quota"
    assert refused.code == -32004 and "quota disk" in refused.message, refused
    snaps = t.call("workspace.snapshots", {})["snapshots"]
    assert sum(s["size"] for s in snaps) <= (64 + 20) << 20, snaps
    # a fork from the sandbox snapshots it first: refused alike
    with pytest.raises(RpcError) as ei:
        t.call("sandbox.fork", {"sandbox": sb}, timeout=60)
    assert ei.value.code == -32004
    # the snapshots outlive the sandbox, and still count
    t.call("sandbox.destroy", {"id": sb}, timeout=60)
    sb = t.call("sandbox.create", {"disk": 48 << 20})["id"]
    # refused at once, or (the new sandbox's 20M not yet measured when the snapshot came: a
    # loaded machine) at the next one
    refused = None
    for i in range(2):
        t.call("exec.run", {"sandbox": sb, "command": f"head -c 20M /dev/urandom > g{i}"},
               timeout=90)
        try:
            t.call("workspace.snapshot", {"sandbox": sb}, timeout=60)
        except RpcError as e:
            refused = e
            break
    assert refused is not None and refused.code == -32004, refused
    # room made: the snapshot is taken (the sandbox goes first: it may stand on a snapshot
    # taken above, which could then not be deleted)
    t.call("sandbox.destroy", {"id": sb}, timeout=60)
    for s in t.call("workspace.snapshots", {})["snapshots"][::-1]:
        t.call("workspace.snapshot_delete", {"snapshot": s["id"]}, timeout=60)
    sb = t.call("sandbox.create", {"disk": 48 << 20})["id"]
    t.call("exec.run", {"sandbox": sb, "command": "head -c 20M /dev/urandom > h"}, timeout=90)
    assert t.call("workspace.snapshot", {"sandbox": sb}, timeout=60)["size"] >= 20 << 20


def test_a_tenant_keeps_a_bounded_number_of_snapshots(tenant_daemon, tmp_path):
    """An empty snapshot is a rename, 0 bytes: a tenant took hundreds a second, without end,
    and every snapshot, fork and restore (anyone's) reads every layer's record on the daemon's
    loop: at 6,000 a snapshot held the loop for 78 ms, and the figure grows with the count.
    A tenant now keeps at most 1,000; deleting one makes room."""
    d = tenant_daemon
    a = d.client()
    a.call("connection.auth", {"token": TOK_A})
    sb = a.call("sandbox.create", {})["id"]
    # in batches of 100 requests (one line each), answered in order by the sandbox's queue
    refused = []
    for _ in range(11):
        batch = [a.request("workspace.snapshot", {"sandbox": sb}) for _ in range(100)]
        for rid in batch:
            resp = a.wait(rid, 300)
            if "error" in resp:
                refused.append(resp["error"])
        if refused:
            break
    assert refused, "1,100 snapshots kept by one tenant"
    assert refused[0]["code"] == -32004 and "1000 snapshots" in refused[0]["message"], refused[0]
    snaps = a.call("workspace.snapshots", {}, timeout=120)["snapshots"]
    assert len(snaps) == 1000
    # the owner's are not the tenant's to count
    owner = d.client()
    (tmp_path / "ws").mkdir()
    mine = owner.call("sandbox.create", {"workspace": str(tmp_path / "ws")})["id"]
    owner.call("workspace.snapshot", {"sandbox": mine}, timeout=60)
    a.call("sandbox.destroy", {"id": sb}, timeout=60)
    a.call("workspace.snapshot_delete", {"snapshot": snaps[-1]["id"]}, timeout=60)
    sb = a.call("sandbox.create", {})["id"]
    a.call("workspace.snapshot", {"sandbox": sb}, timeout=60)


def test_a_tenants_snapshots_name_no_path_of_the_daemon(tenant_daemon, tmp_path):
    """sandbox.get hides a tenant's workspace (a directory of the daemon's state dir), but its
    snapshots showed it: `"workspace": "<state>/tenant-workspaces/alice"`."""
    d = tenant_daemon
    a = d.client()
    a.call("connection.auth", {"token": TOK_A})
    sb = a.call("sandbox.create", {})["id"]
    snap = a.call("workspace.snapshot", {"sandbox": sb}, timeout=60)
    fork = a.call("sandbox.fork", {"sandbox": sb}, timeout=60)
    listed = a.call("workspace.snapshots", {})["snapshots"]
    for obj in (snap, fork, *listed, a.call("sandbox.get", {"id": fork["id"]})):
        assert str(d.state_dir) not in json.dumps(obj) and "tenant-workspaces" not in json.dumps(obj), obj
    # the owner's keep theirs
    (tmp_path / "ws").mkdir()
    owner = d.client()
    mine = owner.call("sandbox.create", {"workspace": str(tmp_path / "ws")})["id"]
    assert owner.call("workspace.snapshot", {"sandbox": mine}, timeout=60)["workspace"] == str(tmp_path / "ws")


@pytest.fixture
def mcp_server(tenant_daemon, tmp_path):
    """conch mcp --listen (default --max-body, 32M) in front of the tenants' daemon:
    (port, ssl context)."""
    import re
    import ssl
    import subprocess
    import time

    from conftest import CONCH_BIN
    from wsfixture import make_certs

    ca, cert, key = make_certs(str(tmp_path))
    errf = open(tmp_path / "mcp.log", "w+")
    p = subprocess.Popen([CONCH_BIN, "mcp", "--listen", "127.0.0.1:0", "--tls-cert", cert,
                          "--tls-key", key, "--socket", tenant_daemon.sock],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf)
    port = None
    deadline = time.monotonic() + 30
    while port is None and time.monotonic() < deadline:
        errf.seek(0)
        m = re.search(r"https://127\.0\.0\.1:(\d+)/mcp", errf.read())
        port = int(m.group(1)) if m else None
        assert p.poll() is None, open(errf.name).read()
        time.sleep(0.05)
    assert port, "conch mcp --listen did not start"
    yield port, ssl.create_default_context(cafile=ca)
    p.terminate()
    p.wait(timeout=30)
    errf.close()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}}


def test_mcp_bodies_of_no_session_cannot_hold_the_servers_budget(mcp_server):
    """conch mcp --listen buffers request bodies up to 4 x --max-body (128M) at once and
    answers 503 past that; the token of a request of no session (an initialize) is only
    checked with the daemon once its body is in. So four clients with no token at all,
    each sending 32M slowly, had every other request answered 503 (sessions' included). A
    request of no session now has at most 64 KiB of body (413 past it), and those together a
    quarter of the budget."""
    import http.client
    import socket

    port, ctx = mcp_server

    def post(body, sid=None, token=TOK_A):
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
        h = {"Content-Type": "application/json", "Accept": "application/json",
             "Authorization": f"Bearer {token}"}
        if sid:
            h["Mcp-Session-Id"] = sid
        c.request("POST", "/mcp", body=json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        r.read()
        c.close()
        return r.status, r.getheader("Mcp-Session-Id")

    st, sid = post(INIT)
    assert st == 200 and sid
    size = 32 << 20
    holders, refused = [], set()
    for i in range(4):
        t = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                            server_hostname="127.0.0.1")
        holders.append(t)
        t.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer nobody\r\n"
                  b"Content-Type: application/json\r\nAccept: application/json\r\n"
                  b"Content-Length: " + str(size).encode() + b"\r\n\r\n")
        try:
            t.sendall(b" " * (size - 100))  # all but the end: the body stays pending
        except OSError:
            refused.add(i)  # answered and closed while it sent
    try:
        assert post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid=sid)[0] == 200
        assert post(INIT)[0] == 200
        for i, t in enumerate(holders):
            t.settimeout(5)
            try:
                if b" 413 " in t.recv(4096):
                    refused.add(i)
            except OSError:
                pass
        assert len(refused) == 4, "32M bodies of no session were taken in"
    finally:
        for t in holders:
            t.close()


def listeners(port):
    """The local addresses listening on TCP @port in this network namespace, as text."""
    import socket
    import struct

    found = []
    for fam, path in ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6")):
        with open(path) as f:
            for line in f.readlines()[1:]:
                local, st = line.split()[1], line.split()[3]
                addr, p = local.split(":")
                if st != "0A" or int(p, 16) != port:
                    continue
                raw = bytes.fromhex(addr)
                # the kernel prints each 32-bit word in host order
                raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0])
                               for i in range(0, len(raw), 4))
                found.append(socket.inet_ntop(fam, raw))
    return found


def test_listen_on_loopback_is_served_on_loopback_only(daemon_factory, tmp_path):
    """`conch serve --listen 127.0.0.1:PORT` served the gateway on every interface (`*:PORT`,
    an IPv6 wildcard socket): a daemon its operator meant to reach only from this machine (or
    through a local proxy) was open to the network."""
    import socket
    import time
    import urllib.request

    from wsfixture import make_certs

    ca, cert, key = make_certs(str(tmp_path))
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon_factory(extra_args=["--pool", "0", "--tokens", str(tokens), "--listen",
                               f"127.0.0.1:{port}", "--tls-cert", cert, "--tls-key", key])
    ctx = __import__("ssl").create_default_context(cafile=ca)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx,
                                        timeout=5) as r:
                assert r.read().strip() == b"ok"
            break
        except OSError:
            assert time.monotonic() < deadline, "the gateway never answered"
            time.sleep(0.1)
    assert listeners(port) == ["127.0.0.1"], listeners(port)
