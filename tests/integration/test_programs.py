# test_programs.py - real programs behave inside the sandbox as on a normal machine:
# interpreters, git, a C compiler, pipelines, stdin, env, exit codes, signals, and the
# text-mode output a user reads.
import hashlib
import os

import pytest

from conftest import conch


def test_python(run):
    r = run(["--", "python3", "-c", "import sys; print(6 * 7); print('err', file=sys.stderr)"])
    assert r.rc == 0 and r.j["exit_code"] == 0 and r.j["error"] is None, r.describe()
    assert r.out == "42\n" and r.err == "err\n"
    assert r.j["stdout_bytes"] == 3 and r.j["stderr_bytes"] == 4
    assert r.j["signal"] is None and r.j["timed_out"] is False
    assert isinstance(r.j["duration_ms"], int) and r.j["duration_ms"] >= 0
    assert isinstance(r.j["usage"]["cpu_ms"], int) and r.j["usage"]["max_rss_kb"] > 0, r.j["usage"]


def test_git(sh, ws):
    r = sh(
        "set -e; git init -q; echo hello > a.txt; git add a.txt; "
        "git -c user.email=agent@example.com -c user.name=Agent commit -q -m first; "
        "git log --oneline | wc -l; git status --porcelain | wc -l; git log --format=%ae",
        "--commit",
    )
    assert r.rc == 0, r.describe()
    assert r.out == "1\n0\nagent@example.com\n", r.describe()
    paths = {c["path"] for c in r.j["changes"]}
    assert "a.txt" in paths and (".git" in paths or any(p.startswith(".git/") for p in paths)), paths
    assert (ws / ".git" / "HEAD").exists()


def test_gcc_hello(sh):
    r = sh(
        "set -e; printf '#include <stdio.h>\\nint main(void){puts(\"hello from c\");return 0;}\\n' > hello.c; "
        "cc -O2 -o hello hello.c; ./hello; gcc --version | head -1 >&2",
        timeout=90,
    )
    assert r.rc == 0, r.describe()
    assert r.out == "hello from c\n", r.describe()
    assert {c["path"] for c in r.j["changes"]} == {"hello.c", "hello"}, r.j["changes"]


def test_long_pipeline(sh):
    r = sh(
        "seq 1 100000 | sort -rn | sort -n | uniq | awk '{s+=$1} END {printf \"%.0f\\n\", s}' "
        "| sed 's/^/sum=/' | tr a-z A-Z | grep -E '^SUM=' | cat | head -1 | tail -1"
    )
    assert r.rc == 0 and r.out == "SUM=5000050000\n", r.describe()


def test_stdin_passes_through(run):
    r = run(["--", "cat"], input=b"hello stdin\n")
    assert r.rc == 0 and r.out == "hello stdin\n", r.describe()


def test_large_stdin(run):
    data = os.urandom(3_000_000)
    r = run(["--", "sha256sum"], input=data, timeout=60)
    assert r.rc == 0 and r.out.split()[0] == hashlib.sha256(data).hexdigest(), r.describe()


def test_no_stdin_gives_eof(run):
    r = run(["--", "bash", "-c", "cat; echo eof"])
    assert r.rc == 0 and r.out == "eof\n", r.describe()


def test_env_option(run):
    r = run(["--env", "FOO=bar baz", "--env", "EMPTY=", "--env", "EQ=a=b", "--",
             "bash", "-c", 'printf "%s|%s|%s|%s\\n" "$FOO" "${EMPTY-unset}" "$EQ" "$HOME"'])
    assert r.rc == 0 and r.out == "bar baz||a=b|/home/agent\n", r.describe()


def test_env_overrides_default(run):
    r = run(["--env", "LANG=C", "--", "bash", "-c", "echo $LANG"])
    assert r.rc == 0 and r.out == "C\n", r.describe()


@pytest.mark.parametrize("code", [1, 3, 42, 255])
def test_exit_code_propagates(sh, code):
    r = sh(f"echo before; exit {code}")
    assert r.rc == code and r.j["exit_code"] == code, r.describe()
    assert r.kind == "command", r.describe()
    assert r.j["signal"] is None and r.out == "before\n"


@pytest.mark.parametrize("sig,num", [("KILL", 9), ("TERM", 15), ("SEGV", 11)])
def test_signal_propagates(sh, sig, num):
    r = sh(f"kill -{sig} $$")
    assert r.rc == 128 + num, r.describe()
    assert r.j["exit_code"] == 128 + num and r.j["signal"] == num, r.describe()
    assert r.j["timed_out"] is False


def test_command_not_found(run):
    r = run(["--", "conch-no-such-program-xyz"])
    assert r.rc in (126, 127), r.describe()
    assert r.j["error"] is not None, r.describe()


def test_exec_directly_no_shell(run):
    # CMD is exec'd as is: shell syntax in an argument reaches the program untouched
    r = run(["--", "echo", "$HOME", "a;b", "*"])
    assert r.rc == 0 and r.out == "$HOME a;b *\n", r.describe()


def test_invalid_utf8_replaced(sh):
    r = sh("printf 'ok \\377\\376 end\\n'")
    assert r.rc == 0, r.describe()
    assert r.out == "ok \ufffd\ufffd end\n" or r.out == "ok \ufffd end\n", repr(r.out)
    assert r.j["stdout_bytes"] == 10


def test_text_mode_summary(ws, run):
    (ws / "old.txt").write_text("old\n")
    (ws / "mod.txt").write_text("a\n")
    r = run(["--", "bash", "-c", "echo live-out; echo live-err >&2; echo hi > new.txt; rm old.txt; echo b >> mod.txt"],
            json_mode=False)
    assert r.rc == 0, r.describe()
    assert r.stdout == "live-out\n", r.describe()
    err = r.stderr
    assert err.startswith("live-err\n"), r.describe()
    assert "conch: 3 changes in /workspace:" in err, err
    lines = [l.strip() for l in err.splitlines()]
    assert "A new.txt" in lines and "D old.txt" in lines and "M mod.txt" in lines, err
    assert "conch: changes discarded (run with --commit to apply them)" in err, err
    assert not (ws / "new.txt").exists()


def test_text_mode_commit_and_quiet(ws, run):
    r = run(["--commit", "--", "bash", "-c", "echo hi > new.txt"], json_mode=False)
    assert r.rc == 0, r.describe()
    assert "A new.txt" in r.stderr and f"conch: changes committed to {ws}" in r.stderr, r.describe()
    assert (ws / "new.txt").read_text() == "hi\n"
    r = run(["--quiet", "--", "bash", "-c", "echo x > other.txt; echo out"], json_mode=False)
    assert r.rc == 0 and r.stdout == "out\n", r.describe()
    assert "other.txt" not in r.stderr and "changes" not in r.stderr, r.describe()


def test_text_mode_exit_status(run):
    r = run(["--", "bash", "-c", "exit 5"], json_mode=False)
    assert r.rc == 5, r.describe()


def test_json_is_single_line(run):
    r = run(["--", "bash", "-c", "printf 'a\\nb\\n'"])
    assert r.raw_stdout.count(b"\n") <= 1, r.describe()
    assert r.out == "a\nb\n"


def test_many_runs_are_independent(ws, sh):
    # a file made in /tmp or $HOME by one run is gone in the next
    r1 = sh("echo one > /tmp/persist; echo one > $HOME/persist")
    r2 = sh("ls /tmp/persist $HOME/persist 2>&1; echo rc=$?")
    assert r1.rc == 0
    assert "rc=2" in r2.out, r2.describe()


def test_conch_version():
    r = conch(["--version"])
    assert r.rc == 0 and r.stdout.startswith("conch "), r.describe()
