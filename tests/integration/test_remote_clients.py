# test_remote_clients.py - the clients over the remote transport (issue 21): the Python client
# and the CLI (`conch --remote`) reach a real daemon through wsfixture.py, a stand-in for the
# gateway (wss on loopback, bearer token, one JSON-RPC message per WebSocket text message).
# TLS is verified (a wrong CA, a wrong hostname are refused), the token never shows in reprs
# or errors, and a dropped connection fails what was in flight and is dialed again after.
import asyncio
import os
import signal
import socket
import ssl
import sys
import threading
import time

import pytest

import subprocess

from conftest import CONCH_BIN, REPO, conch, descendants, proc_argv

sys.path.insert(0, str(REPO / "clients" / "python"))
pytest.importorskip("websockets")  # the fixture's gateway needs python3-websockets

from conch_client import AsyncSandbox, Client, ConnectionLost, Sandbox  # noqa: E402
from wsfixture import Gateway, free_port, make_certs  # noqa: E402

TOKEN = "tok-" + "s3cr3t" * 6


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    ca, crt, key = make_certs(str(d))
    _, wrong_name_crt, wrong_name_key = make_certs(str(d), names=("DNS:wrong.example",),
                                                   prefix="wrongname")
    other = d / "other"
    other.mkdir()
    other_ca, _, _ = make_certs(str(other))
    return {"ca": ca, "crt": crt, "key": key, "other_ca": other_ca,
            "wrong_name": (wrong_name_crt, wrong_name_key), "dir": str(d)}


@pytest.fixture
def gw(daemon, certs, tmp_path):
    g = Gateway(daemon.sock, certs["crt"], certs["key"], TOKEN, str(tmp_path))
    yield g
    g.stop()


@pytest.fixture
def client(gw, certs):
    c = Client.connect(url=gw.url, token=TOKEN, ca=certs["ca"], timeout=60)
    yield c
    c.close()


def test_exec_run_and_env_options(gw, certs, client, ws, monkeypatch):
    sb = Sandbox(client, client.sandbox_create(workspace=str(ws)))
    r = sb.run("echo hello from $((6*7))")
    assert r.exit_code == 0 and r.stdout == "hello from 42\n"
    # The same through the environment, the path /rpc implied.
    monkeypatch.setenv("CONCH_URL", gw.url)
    monkeypatch.setenv("CONCH_TOKEN", TOKEN)
    monkeypatch.setenv("CONCH_CA", certs["ca"])
    with Client.connect(timeout=60) as c2:
        ids = [s["id"] for s in c2.sandbox_list()]
        assert sb.id in ids
    with Sandbox.create(workspace=str(ws)) as sb2:
        assert sb2.run("echo via-env").stdout == "via-env\n"
    sb.destroy()


def test_fs_ops_and_big_messages(gw, client, ws):
    sb = Sandbox(client, client.sandbox_create(workspace=str(ws)))
    sb.write("a/b.txt", "one\ntwo\n")
    assert sb.read("a/b.txt") == "one\ntwo\n"
    assert sb.edit("a/b.txt", "two", "deux") == 1
    assert [e["name"] for e in sb.ls("a")] == ["b.txt"]
    # Several MiB each way, in fragmented messages (the client cuts at 1 MiB, the fixture at
    # 256 KiB).
    blob = os.urandom(5 << 20)
    sb.upload("big.bin", blob)
    assert sb.download("big.bin") == blob
    sb.destroy()
    assert "fs.copy_in" not in gw.methods() and "fs.copy_out" not in gw.methods()


def test_tool_call_answered_by_the_client(client, ws):
    sb = Sandbox(client, client.sandbox_create(workspace=str(ws)))
    seen = []

    def add(inp):
        seen.append(inp)
        return {"sum": inp["a"] + inp["b"]}

    sb.register_tool("add", add, "Add two numbers",
                     {"type": "object", "properties": {"a": {"type": "integer"},
                                                       "b": {"type": "integer"}}})
    r = sb.run("""tool_call add '{"a":2,"b":40}'""")
    assert r.exit_code == 0, r.text
    assert '"sum": 42' in r.stdout or '"sum":42' in r.stdout
    assert seen == [{"a": 2, "b": 40}]
    sb.destroy()


def test_async_client(gw, certs, ws):
    async def main():
        async with AsyncSandbox.create(url=gw.url, token=TOKEN, ca=certs["ca"],
                                       workspace=str(ws)) as sb:
            r = await sb.run("echo async $((6*7))")
            assert r.stdout == "async 42\n"
            blob = os.urandom(3 << 20)
            await sb.upload("b.bin", blob)
            assert await sb.download("b.bin") == blob
            assert TOKEN not in repr(sb.client._reader)
    asyncio.run(main())
    assert "fs.copy_in" not in gw.methods() and "fs.copy_out" not in gw.methods()


def test_wrong_ca_refused(gw, certs):
    with pytest.raises(ConnectionLost) as e:
        Client.connect(url=gw.url, token=TOKEN, ca=certs["other_ca"])
    assert "certificate" in str(e.value) and TOKEN not in str(e.value)
    # No CA at all: the system's CAs do not know the test CA either.
    with pytest.raises(ConnectionLost, match="certificate"):
        Client.connect(url=gw.url, token=TOKEN)


def test_wrong_hostname_refused(daemon, certs, tmp_path):
    crt, key = certs["wrong_name"]
    g = Gateway(daemon.sock, crt, key, TOKEN, str(tmp_path))
    try:
        with pytest.raises(ConnectionLost) as e:
            Client.connect(url=g.url, token=TOKEN, ca=certs["ca"])
        assert "certificate" in str(e.value) and "127.0.0.1" in str(e.value)
        # By name too (the certificate is for wrong.example, not localhost).
        with pytest.raises(ConnectionLost, match="(?i)hostname mismatch"):
            Client.connect(url=g.url.replace("127.0.0.1", "localhost"), token=TOKEN,
                           ca=certs["ca"])
    finally:
        g.stop()


def test_wrong_or_no_token_and_secrets_kept(gw, certs, client):
    with pytest.raises(ConnectionLost, match="401") as e:
        Client.connect(url=gw.url, token=TOKEN + "x", ca=certs["ca"])
    assert TOKEN not in str(e.value) and TOKEN not in repr(e.value)
    with pytest.raises(ConnectionLost, match="no token"):
        Client.connect(url=gw.url, ca=certs["ca"])
    assert TOKEN not in repr(client) and TOKEN not in repr(client._t)
    assert TOKEN not in repr(vars(client._t))
    # The token in the URL or a cleartext scheme is refused before anything is sent.
    with pytest.raises(ValueError, match="wss"):
        Client.connect(url=gw.url.replace("wss:", "ws:"), token=TOKEN)
    with pytest.raises(ValueError, match="token"):
        Client.connect(url=gw.url.replace("wss://", f"wss://u:{TOKEN}@"))


def test_bad_handshake_answer_refused(certs, tmp_path):
    """A server that says 101 without proving it read our key (Sec-WebSocket-Accept) is no
    WebSocket server: the Python client and the CLI refuse it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs["crt"], certs["key"])
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    url = f"wss://127.0.0.1:{srv.getsockname()[1]}"

    def serve():
        for _ in range(2):
            c, _ = srv.accept()
            try:
                with ctx.wrap_socket(c, server_side=True) as s:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += s.recv(4096)
                    s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                              b"Connection: Upgrade\r\nSec-WebSocket-Accept: "
                              b"dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
                    s.settimeout(5)
                    s.recv(10)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ConnectionLost, match="Sec-WebSocket-Accept"):
            Client.connect(url=url, token=TOKEN, ca=certs["ca"])
        r = conch(["--remote", url, "ps"], env=dict(os.environ, CONCH_TOKEN=TOKEN,
                                                    CONCH_CA=certs["ca"]))
        assert r.rc != 0 and "ACCEPT" in r.stderr.upper(), r.describe()
    finally:
        srv.close()


def test_reconnect_after_drop(gw, client, ws):
    sb = Sandbox(client, client.sandbox_create(workspace=str(ws)))
    errors = []
    started = threading.Event()

    def long_call():
        try:
            sb.run("echo started; sleep 30", on_output=lambda stream, data: started.set())
        except ConnectionLost as e:
            errors.append(e)

    t = threading.Thread(target=long_call)
    t.start()
    assert started.wait(20)
    gw.drop()
    t.join(30)
    assert not t.is_alive()
    assert len(errors) == 1 and "connection lost" in str(errors[0])
    # The next request dials again; the sandbox is still there.
    assert sb.run("echo back").stdout == "back\n"
    client.sandbox_destroy(sb.id)


def test_pings_answered(daemon, certs, tmp_path, ws):
    """A gateway that pings every 0.2 s and drops a client silent for 0.2 s: a command of 2 s
    runs to its end through the Python client and the CLI, who answer every ping."""
    g = Gateway(daemon.sock, certs["crt"], certs["key"], TOKEN, str(tmp_path),
                ping_interval=0.2)
    try:
        with Client.connect(url=g.url, token=TOKEN, ca=certs["ca"], timeout=60) as c:
            sb = Sandbox(c, c.sandbox_create(workspace=str(ws), name="pinged"))
            assert sb.run("sleep 2; echo done").stdout == "done\n"
            r = conch(["--remote", g.url, "exec", "pinged", "sh", "-c", "sleep 2; echo cli"],
                      env=cli_env(g, certs))
            assert r.rc == 0 and r.stdout == "cli\n", r.describe()
            sb.destroy()
    finally:
        g.stop()


def test_reconnect_bounded(daemon, certs, tmp_path):
    port = free_port()
    g = Gateway(daemon.sock, certs["crt"], certs["key"], TOKEN, str(tmp_path), port=port)
    c = Client.connect(url=g.url, token=TOKEN, ca=certs["ca"], timeout=60)
    try:
        assert isinstance(c.sandbox_list(), list)
        g.stop()
        deadline = time.time() + 10
        while c._t is not None and time.time() < deadline:
            time.sleep(0.05)
        with pytest.raises(ConnectionLost, match="tries to reconnect failed"):
            c.sandbox_list()
        # The gateway comes back on the same port: the client reaches it again.
        g = Gateway(daemon.sock, certs["crt"], certs["key"], TOKEN, str(tmp_path), port=port)
        assert isinstance(c.sandbox_list(), list)
    finally:
        c.close()
        g.stop()


def test_tenants_through_the_remote_transport(daemon_factory, certs, tmp_path):
    """The fixture as the real gateway: each connection's token goes to the daemon's
    connection.auth. A tenant reaches its own sandboxes only; another tenant's id is not
    found; an unknown token is a 401 before the upgrade (Python client and CLI)."""
    from conch_client import SandboxNotFound
    tokens = tmp_path / "tokens"
    tokens.write_text("alice tok-alice-" + "a" * 24 + "\nbob tok-bob-" + "b" * 24 + "\n")
    tokens.chmod(0o600)
    d = daemon_factory(extra_args=["--tokens", str(tokens), "--pool", "0"])
    g = Gateway(d.sock, certs["crt"], certs["key"], None, str(tmp_path), daemon_auth=True)
    alice_tok, bob_tok = "tok-alice-" + "a" * 24, "tok-bob-" + "b" * 24
    try:
        with Client.connect(url=g.url, token=alice_tok, ca=certs["ca"], timeout=60) as a, \
                Client.connect(url=g.url, token=bob_tok, ca=certs["ca"], timeout=60) as b:
            sb = Sandbox(a, a.sandbox_create(name="alices"))
            assert sb.run("echo mine").stdout == "mine\n"
            assert [s["id"] for s in b.sandbox_list()] == []
            with pytest.raises(SandboxNotFound):
                b.sandbox_get(sb.id)
            env = dict(os.environ, CONCH_CA=certs["ca"], CONCH_TOKEN=bob_tok)
            r = conch(["--remote", g.url, "exec", sb.id, "true"], env=env)
            assert r.rc != 0 and "no sandbox with id or name" in r.stderr, r.describe()
            r = conch(["--remote", g.url, "ps", "--json"], env=dict(env, CONCH_TOKEN=alice_tok))
            assert r.rc == 0 and sb.id in r.stdout, r.describe()
            sb.destroy()
        with pytest.raises(ConnectionLost, match="401"):
            Client.connect(url=g.url, token="tok-nobody-" + "c" * 24, ca=certs["ca"])
        r = conch(["--remote", g.url, "ps"], env=dict(os.environ, CONCH_CA=certs["ca"],
                                                      CONCH_TOKEN="tok-nobody"))
        assert r.rc != 0 and "401" in r.stderr, r.describe()
    finally:
        g.stop()


# ---- the CLI ------------------------------------------------------------------------------

def cli_env(gw, certs, **extra):
    env = dict(os.environ, CONCH_TOKEN=TOKEN, CONCH_CA=certs["ca"])
    env.pop("CONCH_URL", None)
    env.update(extra)
    return env


def test_cli_remote_ps_exec_cp(gw, certs, ws, tmp_path):
    env = cli_env(gw, certs)
    r = conch(["--remote", gw.url, "create", "--name", "rem", "--workspace", str(ws)], env=env)
    assert r.rc == 0, r.describe()
    r = conch(["ps", "--remote", gw.url], env=env)
    assert r.rc == 0 and "rem" in r.stdout, r.describe()
    r = conch(["exec", "rem", "--", "sh", "-c", "echo remote $((40+2))"],
              env=dict(env, CONCH_URL=gw.url))
    assert r.rc == 0 and r.stdout == "remote 42\n", r.describe()
    src = tmp_path / "in.txt"
    src.write_text("copied\n")
    r = conch(["--remote", gw.url, "cp", str(src), "rem:/workspace/in.txt"], env=env)
    assert r.rc == 0, r.describe()
    r = conch(["--remote", gw.url, "exec", "rem", "cat", "/workspace/in.txt"], env=env)
    assert r.rc == 0 and r.stdout == "copied\n", r.describe()
    # A file of several MiB each way (in chunks: the daemon's host is not ours).
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 << 20))
    r = conch(["--remote", gw.url, "cp", str(big), "rem:big.bin"], env=env)
    assert r.rc == 0, r.describe()
    r = conch(["--remote", gw.url, "cp", "rem:big.bin", str(tmp_path / "back.bin")], env=env)
    assert r.rc == 0 and (tmp_path / "back.bin").read_bytes() == big.read_bytes(), r.describe()
    seen = gw.methods()
    assert "fs.write" in seen and "fs.read" in seen, seen
    assert "fs.copy_in" not in seen and "fs.copy_out" not in seen, seen
    r = conch(["--remote", gw.url, "rm", "rem"], env=env)
    assert r.rc == 0, r.describe()


def gone(pid):
    """The process exited (a zombie, or reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_cli_remote_connection_is_a_process_of_its_own(gw, certs, ws):
    """--remote's WebSocket is conch-remote __connect, a child of the verb: the token is not in
    its arguments, it carries the verb's stream both ways, and it ends once the verb ended."""
    env = cli_env(gw, certs)
    r = conch(["--remote", gw.url, "create", "--name", "brg", "--workspace", str(ws)], env=env)
    assert r.rc == 0, r.describe()
    p = subprocess.Popen([CONCH_BIN, "--remote", gw.url, "exec", "brg", "--", "sh", "-c",
                          "until [ -e /tmp/go ]; do sleep 0.05; done; echo got it"], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        bridge = None
        deadline = time.monotonic() + 30
        while bridge is None and time.monotonic() < deadline:
            for pid in descendants(p.pid):
                argv = proc_argv(pid) or []
                if argv[1:2] == ["__connect"]:
                    bridge = (pid, argv)
            time.sleep(0.05)
        assert bridge, "no conch-remote __connect under the verb"
        assert not any(TOKEN in a for a in bridge[1]), bridge[1]
        r = conch(["--remote", gw.url, "exec", "brg", "touch", "/tmp/go"], env=env)
        assert r.rc == 0, r.describe()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and out == b"got it\n", (p.returncode, out, err)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 30
    while not gone(bridge[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(bridge[0]), "conch-remote __connect outlived its verb"
    assert conch(["--remote", gw.url, "rm", "brg"], env=env).rc == 0


def test_cli_remote_ctrl_c_reaches_the_command(gw, certs, ws):
    """Ctrl-C at a terminal signals the verb's whole process group, its connection process
    too: the connection must outlive it so that the verb can send it on (exec.signal)."""
    env = cli_env(gw, certs)
    r = conch(["--remote", gw.url, "create", "--name", "sigr", "--workspace", str(ws)], env=env)
    assert r.rc == 0, r.describe()
    p = subprocess.Popen([CONCH_BIN, "--remote", gw.url, "exec", "sigr", "--", "bash", "-c",
                          "trap 'echo trapped; exit 7' INT; echo ready; sleep 60 & wait"],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline() == b"ready\n"
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 7 and out == b"trapped\n", (p.returncode, out, err)
    assert conch(["--remote", gw.url, "rm", "sigr"], env=env).rc == 0


def test_cli_remote_refusals(gw, certs, tmp_path):
    env = cli_env(gw, certs)
    r = conch(["--remote", gw.url, "ps"], env=dict(env, CONCH_TOKEN="nope"))
    assert r.rc != 0 and "401" in r.stderr and "nope" not in r.stderr, r.describe()
    r = conch(["--remote", gw.url, "ps"], env=dict(env, CONCH_CA=str(tmp_path / "none.pem")))
    assert r.rc != 0 and "none.pem" in r.stderr, r.describe()
    other = cli_env(gw, certs)
    other["CONCH_CA"] = certs["other_ca"]
    r = conch(["--remote", gw.url, "ps"], env=other)
    assert r.rc != 0 and "certificate" in r.stderr, r.describe()
    # The token from a file (never on the command line); a file others can read is refused.
    tf = tmp_path / "token"
    tf.write_text(TOKEN + "\n")
    tf.chmod(0o600)
    env.pop("CONCH_TOKEN")
    r = conch(["--remote", gw.url, "--token-file", str(tf), "ps"], env=env)
    assert r.rc == 0, r.describe()
    r = conch(["ps", "--remote", gw.url, "--token-file", str(tf)], env=env)
    assert r.rc == 0, r.describe()
    tf.chmod(0o644)
    r = conch(["--remote", gw.url, "--token-file", str(tf), "ps"], env=env)
    assert r.rc != 0 and "readable" in r.stderr, r.describe()
    r = conch(["--remote", gw.url, "--token", TOKEN, "ps"], env=env)
    assert r.rc != 0 and TOKEN not in r.stderr, r.describe()


def test_cli_run_stays_local(gw, certs, ws):
    r = conch(["--remote", gw.url, "run", "--workspace", str(ws), "--", "true"],
              env=cli_env(gw, certs))
    assert r.rc != 0 and "remote" in r.stderr, r.describe()


def test_cli_remote_wrong_hostname(daemon, certs, tmp_path):
    crt, key = certs["wrong_name"]
    g = Gateway(daemon.sock, crt, key, TOKEN, str(tmp_path))
    try:
        r = conch(["--remote", g.url, "ps"], env=cli_env(g, certs))
        assert r.rc != 0 and "certificate" in r.stderr, r.describe()
        r = conch(["--remote", g.url.replace("127.0.0.1", "localhost"), "ps"],
                  env=cli_env(g, certs))
        assert r.rc != 0 and "hostname mismatch" in r.stderr, r.describe()
    finally:
        g.stop()


