# test_cli_exec.py - `conch exec` as people use `docker exec`: stdin piped in, output as it is
# produced, Ctrl-C forwarded with what was printed kept, --env/--cwd/--timeout, unknown options
# named, a failure to start said on stderr, and -it giving a terminal (driven through a pty).
import os
import select
import signal
import subprocess
import time

import pytest

from conftest import CONCH_BIN
from ptydrive import drive


def cli(d, *args, timeout=60, input=None, **kw):
    verb, rest = args[0], list(args[1:])
    return subprocess.run([CONCH_BIN, verb, "--socket", d.sock, *rest], capture_output=True,
                          timeout=timeout, input=input, **kw)


@pytest.fixture
def d(daemon_factory):
    return daemon_factory(extra_args=["--pool", "0"])


@pytest.fixture
def dev(d):
    p = cli(d, "create", "--name", "dev")
    assert p.returncode == 0, p
    return p.stdout.decode().strip()


def test_piped_stdin_reaches_the_command(d, dev):
    p = subprocess.run(f"echo piped | {CONCH_BIN} exec --socket {d.sock} dev -- cat", shell=True,
                       capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout == b"piped\n", p
    p = cli(d, "exec", "-i", "dev", "--", "wc", "-l", input=b"a\nb\nc\n")
    assert p.returncode == 0 and p.stdout.strip() == b"3", p


def test_no_stdin_does_not_wait_for_a_pipe_that_never_closes(d, dev):
    """A caller whose stdin is a pipe it never closes (Node's execFile, a supervisor) uses -n,
    as with ssh -n: the command runs at once and nothing is read."""
    r, w = os.pipe()
    try:
        p = subprocess.run([CONCH_BIN, "exec", "--socket", d.sock, "-n", "dev", "--", "echo", "ran"],
                           stdin=r, capture_output=True, timeout=60)
    finally:
        os.close(r)
        os.close(w)
    assert p.returncode == 0 and p.stdout == b"ran\n", p


def test_output_is_printed_as_it_is_produced(d, dev):
    proc = subprocess.Popen([CONCH_BIN, "exec", "--socket", d.sock, "dev", "--", "bash", "-c",
                             "echo first; echo err-first >&2; "
                             "sleep 30; echo never"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # The first line arrives while the command still runs (it sleeps 30 s after it).
        r, _, _ = select.select([proc.stdout], [], [], 20)
        assert r, "no output while the command runs"
        assert os.read(proc.stdout.fileno(), 100) == b"first\n"
        assert proc.poll() is None
        r, _, _ = select.select([proc.stderr], [], [], 20)
        assert r and os.read(proc.stderr.fileno(), 100) == b"err-first\n"
        # Ctrl-C (SIGINT to conch exec) goes to the command; what it printed stays printed.
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 128 + signal.SIGINT, rc
    assert b"never" not in proc.stdout.read()


def test_env_cwd_and_timeout(d, dev):
    p = cli(d, "exec", "--env", "GREETING=hello", "--cwd", "/tmp", "dev", "--", "bash", "-c",
            "echo $GREETING; pwd")
    assert p.returncode == 0 and p.stdout == b"hello\n/tmp\n", p
    p = cli(d, "exec", "-w", "sub", "dev", "--", "pwd")
    assert p.returncode == 127 and b"cannot run the command" in p.stderr, p  # no /workspace/sub yet
    p = cli(d, "exec", "--timeout", "0.5", "dev", "--", "bash", "-c", "echo started; sleep 30")
    assert p.returncode == 124 and p.stdout == b"started\n" and b"timed out" in p.stderr, p
    # No default time limit (exec.run's is 120 s): nothing to see in a short test but the
    # request, so check the result --json gives.
    p = cli(d, "exec", "--json", "dev", "--", "true")
    assert p.returncode == 0, p


def test_exit_code_is_the_commands(d, dev):
    p = cli(d, "exec", "dev", "--", "bash", "-c", "exit 7")
    assert p.returncode == 7, p


def test_unknown_options_are_named(d, dev):
    for opt in ("--env-file", "-x", "--bogus=1"):
        p = cli(d, "exec", opt, "dev", "--", "true")
        name = opt.split("=")[0]
        assert p.returncode == 2 and f"unknown option '{name}'".encode() in p.stderr, p
        assert b"no sandbox with id or name" not in p.stderr, p


def test_a_command_that_cannot_start_says_why(d, dev, tmp_path):
    p = cli(d, "exec", "--cwd", "/nonexistent", "dev", "--", "true")
    assert p.returncode == 127 and b"/nonexistent" in p.stderr, p
    # conch run: the message was only in --json
    p = subprocess.run([CONCH_BIN, "run", "--workspace", str(tmp_path), "--", "nosuchcmd"],
                       capture_output=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 127 and b"nosuchcmd" in p.stderr, p
    assert b"cannot run the command" in p.stderr, p


def test_exec_it_bash_gives_a_terminal(d, dev):
    out, rc = drive([CONCH_BIN, "exec", "--socket", d.sock, "-it", "dev", "bash"],
                    [(b"$ ", b"tty; echo sum-$((40+2))\r"), (b"sum-42", b"exit 3\r")])
    assert rc == 3, out
    assert b"/dev/pts/" in out and b"sum-42" in out, out
    # the session it made is gone with it, as docker exec leaves nothing
    assert d.client().call("session.list", {})["sessions"] == []


def test_exec_it_runs_a_program_on_the_terminal(d, dev):
    out, rc = drive([CONCH_BIN, "exec", "--socket", d.sock, "-it", "dev", "python3", "-q"],
                    [(b">>> ", b"import os; print(os.isatty(0), 6*7)\r"), (b"True 42", b"exit(4)\r")])
    assert rc == 4, (rc, out)
    assert b"'python3'" not in out, out  # the line that started it is not shown


def test_exec_t_ctrl_c_ends_the_command_and_the_session(d, dev):
    # The command runs in the session's bash: Ctrl-C there killed it, and bash then dropped
    # the rest of the line and waited at a (hidden) prompt for ever.
    out, rc = drive([CONCH_BIN, "exec", "--socket", d.sock, "-t", "dev", "sh", "-c",
                     "echo ready; sleep 30"], [(b"ready", b"\x03")])
    assert rc == 130, (rc, out)
    assert d.client().call("session.list", {})["sessions"] == []
