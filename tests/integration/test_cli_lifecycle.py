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


def shell_session(d, cwd, *opts, keys=b"exit 0\r"):
    from ptydrive import drive
    return drive([CONCH_BIN, "shell", "--socket", d.sock, *opts], [(b"$ ", keys)], cwd=cwd)


def test_shell_removes_the_sandbox_it_made(d, tmp_path):
    out, rc = shell_session(d, tmp_path)
    assert rc == 0, out
    assert b"removed sandbox" in out, out
    assert json.loads(ok(cli(d, "ps", "--json")))["sandboxes"] == []


def test_shell_keep_keeps_it(d, tmp_path):
    out, rc = shell_session(d, tmp_path, "--keep")
    assert rc == 0, out
    assert len(json.loads(ok(cli(d, "ps", "--json")))["sandboxes"]) == 1


def test_shell_keeps_a_sandbox_holding_uncommitted_work(d, tmp_path):
    out, rc = shell_session(d, tmp_path, keys=b"echo work > new.txt; exit 0\r")
    assert rc == 0, out
    assert b"kept sandbox" in out and b"1 uncommitted change" in out, out
    [sb] = json.loads(ok(cli(d, "ps", "--json")))["sandboxes"]
    assert ok(cli(d, "changes", sb["id"])) == "A new.txt\n"
    assert not (tmp_path / "new.txt").exists()


def test_shell_in_a_named_sandbox_leaves_it_alone(d, tmp_path):
    ok(cli(d, "create", "--name", "dev"))
    from ptydrive import drive
    out, rc = drive([CONCH_BIN, "shell", "--socket", d.sock, "dev"], [(b"$ ", b"exit 0\r")])
    assert rc == 0 and b"removed" not in out, out
    assert len(json.loads(ok(cli(d, "ps", "--json")))["sandboxes"]) == 1


def test_ps_shows_what_runs_now(d):
    sid = ok(cli(d, "create", "--name", "dev")).strip()
    job = ok(cli(d, "exec", "-d", "dev", "--", "sleep", "30")).strip()
    assert job.startswith("job-"), job
    c = d.client()
    c.call("session.open", {"sandbox": sid})
    busy = subprocess.Popen([CONCH_BIN, "exec", "--socket", d.sock, "dev", "--", "bash", "-c",
                             "echo go; exec sleep 30"], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert busy.stdout.readline() == b"go\n"
        [sb] = json.loads(ok(cli(d, "ps", "--json")))["sandboxes"]
        assert sb["running"] == 2 and "exec sleep 30" in sb["current_command"], sb
        lines = ok(cli(d, "ps")).splitlines()
        head = lines[0].split()
        assert head[:7] == ["ID", "NAME", "STATE", "AGE", "JOBS", "SESS", "COMMAND"], lines
        row = lines[1].split()
        assert row[:6] == [sid, "dev", "running", row[3], "1", "1"], lines
        assert row[3][-1] in "smhd" and "'echo go; exec sleep 30'" in lines[1], lines
    finally:
        busy.kill()
        busy.wait()
    ok(cli(d, "rm", "dev"))


def test_logs_of_a_job(d):
    ok(cli(d, "create", "--name", "dev"))
    job = ok(cli(d, "exec", "-d", "dev", "--", "bash", "-c",
                 "echo one; sleep 1; echo two >&2; echo three")).strip()
    p = cli(d, "logs", "-f", job)
    assert p.returncode == 0 and p.stdout == b"one\nthree\n" and p.stderr == b"two\n", p
    p = cli(d, "logs", job)  # once it ended: the same, at once
    assert p.returncode == 0 and p.stdout == b"one\nthree\n" and p.stderr == b"two\n", p
    p = cli(d, "logs", "job-nosuch")
    assert p.returncode == 1 and b"job-nosuch" in p.stderr, p
    p = cli(d, "logs", "dev")
    assert p.returncode == 2 and b"neither a job" in p.stderr, p


def test_logs_of_a_session(d):
    sid = ok(cli(d, "create", "--name", "dev")).strip()
    c = d.client()
    ses = c.call("session.open", {"sandbox": sid})["session"]
    c.call("session.run", {"session": ses, "command": "echo hello-$((6*7))"})
    assert "hello-42" in ok(cli(d, "logs", ses))
    follow = subprocess.Popen([CONCH_BIN, "logs", "--socket", d.sock, "--follow", ses],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        c.call("session.run", {"session": ses, "command": "echo later-$((1+1))"})
        seen = b""
        deadline = time.monotonic() + 20
        while b"later-2" not in seen and time.monotonic() < deadline:
            r, _, _ = select.select([follow.stdout], [], [], 0.5)
            if r:
                seen += os.read(follow.stdout.fileno(), 4096)
        assert b"later-2" in seen, seen
        c.call("session.close", {"session": ses})
        assert follow.wait(timeout=20) == 0  # it ended: so does logs -f
    finally:
        if follow.poll() is None:
            follow.kill()
