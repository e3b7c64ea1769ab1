# test_session_forgery.py - nothing that runs in a session may change a command's reported
# exit status or end it early (issue 16, defect 5): not a program that reads the nonce from
# its shell's memory and copies the shell's control socket with pidfd_getfd, not a sourced
# file that redefines the reporter (or a function named `builtin` that rewrites it). Shell
# code that locks the reporter out breaks its own session: the result then says the status
# is unknown, never 0.
import re

import pytest

from test_sessions import run, session  # noqa: F401 (the fixture)

# A program run by the shell: every 16-hex-digit word in its parent shell's memory is a
# candidate nonce; every socket of the shell is copied with pidfd_getfd; a status line of
# every shape claiming 0 goes on each copy, and every end marker it could be on the terminal.
ATTACK = r"""
import ctypes, os, re, sys
ppid = os.getppid()
cands = set()
try:
    mem = open(f"/proc/{ppid}/mem", "rb", 0)
    maps = open(f"/proc/{ppid}/maps").read().splitlines()
except OSError:
    maps = []  # a fence of the kernel's: the attack goes on with what it has
for line in maps:
    f = line.split()
    if "r" not in f[1] or (len(f) > 5 and f[5] not in ("[heap]", "[stack]")):
        continue
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    try:
        mem.seek(lo)
        data = mem.read(hi - lo)
    except OSError:
        continue
    for m in re.finditer(rb"(?<![0-9a-f])[0-9a-f]{16}(?![0-9a-f])", data):
        cands.add(m.group(0).decode())
libc = ctypes.CDLL(None, use_errno=True)
socks = []
try:
    pidfd = os.pidfd_open(ppid)
    fds = os.listdir(f"/proc/{ppid}/fd")
except OSError:
    fds = []
for fd in fds:
    try:
        target = os.readlink(f"/proc/{ppid}/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:"):
        n = libc.syscall(438, pidfd, int(fd), 0)  # pidfd_getfd
        if n >= 0:
            socks.append(n)
print(f"read the shell's memory: {len(cands)} candidates; copied {len(socks)} sockets", flush=True)
for c in sorted(cands):
    for s in socks:
        for forged in (f"E {c} 0\n", f"E {c} x1 0\n", f"Y {c}\n"):
            try:
                os.write(s, forged.encode())
            except OSError:
                pass
    os.write(1, f"\x1b]697;E{c}\x07\x1b]697;E{c}.x1\x07".encode())
"""


def test_a_program_cannot_report_for_its_shell(rpc, session):  # noqa: F811
    sid = session()
    r = run(rpc, sid, "cat > /tmp/attack.py <<'EOF'\n" + ATTACK + "EOF\n")
    assert r["exit_code"] == 0, r
    r = run(rpc, sid, "python3 /tmp/attack.py; echo after-attack; false")
    # the attack went as far as the kernel let it (today: it reads the memory, copies the
    # socket); a kernel that refused it both has nothing to test here
    m = re.search(r"read the shell's memory: (\d+) candidates; copied (\d+) sockets", r["stdout"])
    assert m, r
    if (int(m.group(1)), int(m.group(2))) == (0, 0):
        pytest.skip("the kernel refused both the shell's memory and pidfd_getfd: no attack to make")
    assert int(m.group(2)) > 0, f"the attack copied no socket of the shell: it tried nothing\n{r}"
    # ... and the command was not ended early, nor its status changed
    assert "after-attack" in r["stdout"], r
    assert r["exit_code"] == 1 and r["shell_exited"] is False, r
    assert r.get("status_unknown") is False, r
    # the shell's own end still counts: exit 3 is 3
    r = run(rpc, sid, "python3 /tmp/attack.py; exit 3")
    assert r["exit_code"] == 3 and r["shell_exited"] is True, r
    # the session goes on with a new shell whose statuses are its own
    r = run(rpc, sid, "python3 /tmp/attack.py >/dev/null; (exit 7)")
    assert r["exit_code"] == 7 and r["new_shell"] is True, r


# What a malicious `venv/bin/activate` could hold: the reporter redefined (the old one read the
# nonce from $__conch_n), and a function named `builtin` that rewrites any status line to 0.
EVIL = r"""
__conch_e() {
  command builtin printf '\e]697;E%s\a' "$__conch_n" >/dev/tty
  command builtin printf 'E %s 0\n' "$__conch_n" >&62
  command builtin unset __conch_n __conch_c __conch_in
}
builtin() {
  if [[ $1 == printf && $2 == E* ]]; then
    local a=("${@:3}"); a[-1]=0
    command builtin printf "$2" "${a[@]}"
  else
    command builtin "$@"
  fi
}
unset PROMPT_COMMAND
trap 'exit 0' ERR
trap - ERR
"""


def test_a_sourced_file_cannot_change_later_statuses(rpc, session):  # noqa: F811
    sid = session()
    r = run(rpc, sid, "cat > /tmp/activate <<'EOF'\n" + EVIL + "EOF\n")
    assert r["exit_code"] == 0, r
    r = run(rpc, sid, ". /tmp/activate; echo sourced")
    assert "sourced" in r["stdout"], r
    r = run(rpc, sid, "false")
    assert r["exit_code"] == 1, r
    assert r.get("status_unknown") is False, r
    r = run(rpc, sid, "echo out; sh -c 'exit 42'")
    assert r["exit_code"] == 42 and r["stdout"] == "out\n", r
    # no builtin can be disabled any more (nor a loadable loaded): `enable` is gone
    r = run(rpc, sid, "enable -n printf builtin; printf 'x\\n'; false")
    assert r["exit_code"] == 1 and r["stdout"].endswith("x\n"), r
    # a status line printed or written by the command itself is output, not a status
    r = run(rpc, sid, "printf 'E x 0\\n'; echo 'E x x1 0' >&2; (exit 5)")
    assert r["exit_code"] == 5 and "E x 0\n" in r["stdout"], r
    # the session still works, and its state persists
    assert run(rpc, sid, "cd /tmp; X=1")["exit_code"] == 0
    r = run(rpc, sid, "echo $PWD $X")
    assert r["exit_code"] == 0 and r["stdout"] == "/tmp 1\n", r


@pytest.mark.parametrize(
    "lock, at_once",
    [
        ("builtin() { :; }; readonly -f builtin", True),
        ("readonly POSIXLY_CORRECT", True),
        ("declare -r __conch_c=x __conch_in=y", False),
    ],
)
def test_a_locked_out_reporter_makes_the_status_unknown(rpc, session, lock, at_once):  # noqa: F811
    sid = session()
    r = run(rpc, sid, lock, timeout=10)
    if not at_once:
        # the lock itself reports (its status was sent before it took hold); the next cannot
        assert r["exit_code"] == 0 and r.get("status_unknown") is False, r
        r = run(rpc, sid, "echo ran; true", timeout=10)
        assert "ran" not in r["stdout"], r
    # never a status of 0 that nobody reported: the result says it does not know
    assert r["exit_code"] != 0 and r.get("status_unknown") is True, r
    assert "[the exit status is unknown:" in r["text"], r
    # the broken shell is replaced: the next command has a status again
    r = run(rpc, sid, "echo fresh; (exit 4)", timeout=10)
    assert r["exit_code"] == 4 and r["stdout"] == "fresh\n", r
    assert r["new_shell"] is True and r["status_unknown"] is False, r


def test_a_program_cannot_rewrite_the_typed_line_with_readline(rpc, sandbox):
    """Found by the outside attack: the daemon types the line that runs a command and reports
    its status, and a program that wrote `"$?": "0"` to ~/.inputrc made readline rewrite it:
    every later command of every shell of the sandbox reported 0. A .bashrc that binds the
    same macro (sourced shell code an agent's tools plausibly write) must not either."""
    sb = sandbox()
    prog = "import os\nopen(os.path.expanduser('~/.inputrc'), 'w').write('\"$?\": \"0\"\\n')\n"
    r = rpc.call("exec.run", {"sandbox": sb, "command": "python3 -", "stdin": prog}, timeout=60)
    assert r["exit_code"] == 0, r
    r = rpc.call("exec.run", {"sandbox": sb, "command":
                              "echo 'bind \"\\\"\\$?\\\": \\\"0\\\"\" 2>/dev/null; INPUTRC=~/.inputrc' >> ~/.bashrc"},
                 timeout=60)
    assert r["exit_code"] == 0, r
    sid = rpc.call("session.open", {"sandbox": sb}, timeout=60)["session"]
    for cmd, want in (("false", 1), ("(exit 7)", 7), ("ls /nonexistent", 2)):
        r = rpc.call("session.run", {"session": sid, "command": cmd, "timeout": 30}, timeout=60)
        assert r["exit_code"] == want, (cmd, r)
        assert not r.get("status_unknown"), r
