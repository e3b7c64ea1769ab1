# test_cli_lifecycle.py - sandboxes live as containers do: names are unique and sane,
# `conch start` brings back a sandbox a daemon restart stopped (its changes, limits and, as
# root, its host ids), `conch shell` without a sandbox removes the one it made unless --keep,
# `conch ps` shows what runs now, and `conch logs` shows a job's or a session's output.
import json
import os
import select
import subprocess
import time

import pytest

from conftest import CONCH_BIN


def cli(d, *args, timeout=60, input=None):
    verb, rest = args[0], list(args[1:])
    return subprocess.run([CONCH_BIN, verb, "--socket", d.sock, *rest], capture_output=True,
                          timeout=timeout, input=input, stdin=None if input else subprocess.DEVNULL)


def ok(p):
    assert p.returncode == 0, (p.args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout.decode()


@pytest.fixture
def d(daemon_factory):
    return daemon_factory(extra_args=["--pool", "0"])


def test_names_are_unique(d):
    sid = ok(cli(d, "create", "--name", "dev")).strip()
    p = cli(d, "create", "--name", "dev")
    assert p.returncode == 1 and b"'dev' is taken by sandbox " + sid.encode() in p.stderr, p
    assert b"conch rm" in p.stderr and b"sandbox.destroy" not in p.stderr, p
    # only one sandbox: every name-based verb still works
    assert [s["id"] for s in json.loads(ok(cli(d, "ps", "--json")))["sandboxes"]] == [sid]
    assert ok(cli(d, "exec", "dev", "--", "echo", "hi")) == "hi\n"
    # through the protocol too
    from rpcclient import RpcError
    with pytest.raises(RpcError) as ei:
        d.client().call("sandbox.create", {"name": "dev"})
    assert ei.value.data_code == "invalid_params" and ei.value.data.get("param") == "name"
    # the name is free again once the sandbox is gone
    ok(cli(d, "rm", "dev"))
    ok(cli(d, "create", "--name", "dev"))


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a b", "a/b", "x" * 65, "é", "a\nb", "a:b"])
def test_names_are_limited_to_a_sane_set(d, name):
    p = cli(d, "create", "--name", name)
    assert p.returncode != 0 and (b"letters, digits" in p.stderr or b"--name: empty" in p.stderr), p
    from rpcclient import RpcError
    with pytest.raises(RpcError) as ei:
        d.client().call("sandbox.create", {"name": name})
    assert ei.value.data.get("param") == "name", ei.value
    assert json.loads(ok(cli(d, "ps", "--json")))["sandboxes"] == []


@pytest.mark.parametrize("name", ["a", "dev-1", "A.b_c", "0" * 64])
def test_sane_names_are_taken(d, name):
    ok(cli(d, "create", "--name", name))


def test_start_brings_a_stopped_sandbox_back_with_its_changes(daemon_factory, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("orig\n")
    os.chmod(tmp_path, 0o755)
    d = daemon_factory(extra_args=["--pool", "1"])
    ok(cli(d, "create", "--name", "dev", "--workspace", str(ws), "--memory", "256M",
           "--env", "GREETING=hi"))
    ok(cli(d, "exec", "dev", "--", "bash", "-c", "echo changed > a.txt; mkdir d; echo z > d/z"))
    d.kill9()
    d.start()
    assert json.loads(ok(cli(d, "ps", "--json")))["sandboxes"][0]["state"] == "stopped"
    p = cli(d, "exec", "dev", "--", "true")
    assert p.returncode == 125 and b"conch start" in p.stderr, p
    assert ok(cli(d, "start", "dev")).strip().startswith("sb-")
    assert json.loads(ok(cli(d, "ps", "--json")))["sandboxes"][0]["state"] == "running"
    # its changes, its environment, and files it made are still its own to change
    out = ok(cli(d, "exec", "dev", "--", "bash", "-c",
                 "cat a.txt d/z; echo $GREETING; echo more >> d/z && echo appended"))
    assert out == "changed\nz\nhi\nappended\n", out
    assert (ws / "a.txt").read_text() == "orig\n"  # still uncommitted
    # its memory limit too
    p = cli(d, "exec", "dev", "--", "python3", "-c", "x = bytearray(400 << 20); print('no limit')")
    assert p.returncode != 0 and b"no limit" not in p.stdout, p
    # start on a running sandbox changes nothing
    ok(cli(d, "start", "dev"))
    assert ok(cli(d, "exec", "dev", "--", "cat", "a.txt")) == "changed\n"
