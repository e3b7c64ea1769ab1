# test_remote_e2e.py - conch's own clients through conch's own gateway (issue 21): the Python
# client, and the CLI (`conch --remote`), against `conch serve --listen ... --tokens`, with two
# tenants. test_remote.py drives the gateway with an independent client (python3-websockets);
# test_remote_clients.py drives the clients through a stand-in gateway (wsfixture.py); this
# file checks that the two real ends meet: the same URL, token and CA, a command, files both
# ways, a tool call answered by the client, and one tenant unable to reach another's sandbox.
import os
import sys

import pytest

from conftest import REPO, conch
from test_remote import TOK_ALICE, TOKEN, certs, remote_factory  # noqa: F401 (fixtures)

sys.path.insert(0, str(REPO / "clients" / "python"))
pytest.importorskip("websockets")  # test_remote's certificates and helpers need it

from conch_client import Client, Sandbox  # noqa: E402


@pytest.fixture
def remote(remote_factory):  # noqa: F811
    return remote_factory()


def test_python_client_through_the_gateway(remote):
    with Client.connect(url=remote.url, token=TOKEN, ca=remote.ca, timeout=60) as c:
        sb = Sandbox(c, c.sandbox_create())
        r = sb.run("echo remote $((6*7)) > out.txt; cat out.txt")
        assert r.exit_code == 0 and r.stdout == "remote 42\n", r.text
        sb.upload("in.bin", bytes(range(256)) * 4096)  # 1 MiB, several WebSocket fragments
        assert sb.download("in.bin") == bytes(range(256)) * 4096
        seen = []

        def add(inp):
            seen.append(inp)
            return {"sum": inp["a"] + inp["b"]}

        sb.register_tool("add", add, "Add two numbers",
                         {"type": "object", "properties": {"a": {"type": "integer"},
                                                           "b": {"type": "integer"}}})
        r = sb.run("""tool_call add '{"a":2,"b":40}'""")
        assert r.exit_code == 0 and '42' in r.stdout, r.text
        assert seen == [{"a": 2, "b": 40}]
        sb.destroy()


def test_cli_through_the_gateway_and_tenants_apart(remote, tmp_path):
    env = dict(os.environ, CONCH_URL=remote.url, CONCH_TOKEN=TOK_ALICE, CONCH_CA=remote.ca)
    r = conch(["create", "--name", "alices"], env=env)
    assert r.rc == 0, r.describe()
    sb = r.stdout.strip()
    r = conch(["exec", "alices", "--", "sh", "-c", "echo from alice"], env=env)
    assert r.rc == 0 and r.stdout == "from alice\n", r.describe()
    src = tmp_path / "f.txt"
    src.write_text("copied over wss\n")
    r = conch(["cp", str(src), "alices:/workspace/f.txt"], env=env)
    assert r.rc == 0, r.describe()
    r = conch(["exec", "alices", "--", "cat", "/workspace/f.txt"], env=env)
    assert r.rc == 0 and r.stdout == "copied over wss\n", r.describe()
    # The admin sees alice's sandbox; a connection of another token in alice's place does
    # not exist here, so: alice's own list holds it, and the admin's token reaches it.
    r = conch(["ps"], env=env)
    assert r.rc == 0 and "alices" in r.stdout, r.describe()
    admin = dict(env, CONCH_TOKEN=TOKEN)
    r = conch(["ps"], env=admin)
    assert r.rc == 0 and "alices" in r.stdout, r.describe()
    # A sandbox of the admin's is out of alice's reach, answered as a sandbox that is not.
    r = conch(["create", "--name", "admins"], env=admin)
    assert r.rc == 0, r.describe()
    theirs = conch(["exec", "admins", "--", "true"], env=env)
    nothing = conch(["exec", "no-such-sandbox", "--", "true"], env=env)
    assert theirs.rc == nothing.rc != 0, (theirs.describe(), nothing.describe())
    assert theirs.stderr.replace("admins", "X") == nothing.stderr.replace("no-such-sandbox", "X")
    r = conch(["ps"], env=env)
    assert "admins" not in r.stdout, r.describe()
    # A wrong token: refused before anything is said.
    r = conch(["ps"], env=dict(env, CONCH_TOKEN="not-a-token-of-anyone-0123"))
    assert r.rc != 0 and "not-a-token" not in r.stderr, r.describe()
    assert conch(["rm", sb], env=env).rc == 0
