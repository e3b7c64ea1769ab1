# test_sessions_tmux.py - the real `conch shell`, `conch attach` and `conch sessions` driven as
# a person would, in tmux (send-keys, capture-pane): a shell that remembers, resize reaching
# the program, detach (Ctrl-\ Ctrl-\) and re-attach with scrollback, two terminals on one
# session, a writer takeover, and the shell's exit status.
import os
import shutil
import subprocess
import time
import uuid

import pytest

from conftest import CONCH_BIN

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    def __init__(self):
        self.server = f"conch-{uuid.uuid4().hex[:10]}"

    def tmux(self, *args, check=True):
        return subprocess.run(["tmux", "-L", self.server, "-f", "/dev/null", *args],
                              capture_output=True, text=True, check=check, timeout=20)

    def start(self, name, command, cols=100, rows=30):
        self.tmux("new-session", "-d", "-s", name, "-x", str(cols), "-y", str(rows), command)
        self.tmux("set-option", "-t", name, "remain-on-exit", "on")

    def keys(self, name, *keys):
        self.tmux("send-keys", "-t", name, *keys)

    def line(self, name, text):
        self.tmux("send-keys", "-t", name, "-l", text)
        self.tmux("send-keys", "-t", name, "Enter")

    def screen(self, name):
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", name).stdout

    def wait(self, name, text, timeout=15):
        deadline = time.monotonic() + timeout
        while True:
            s = self.screen(name)
            if text in s:
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not on {name}'s screen within {timeout}s:\n{s}")
            time.sleep(0.1)

    def kill(self):
        self.tmux("kill-server", check=False)


@pytest.fixture
def tm():
    t = Tmux()
    yield t
    t.kill()


def conch_cmd(daemon, *args):
    # the exit status is printed after conch returns, and the pane stays
    inner = " ".join([CONCH_BIN, *args[:1], "--socket", daemon.sock, *args[1:]])
    return f"sh -c '{inner}; echo CONCH-EXIT=$?; sleep 600'"


def session_ids(daemon):
    out = subprocess.run([CONCH_BIN, "sessions", "--socket", daemon.sock], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode == 0, out
    return [l.split()[0] for l in out.stdout.splitlines()[1:] if l.strip()], out.stdout


def test_shell_remembers_resizes_detaches_and_reattaches(daemon, rpc, sandbox, tm):
    sb = sandbox()
    tm.start("a", conch_cmd(daemon, "shell", sb))
    tm.wait("a", "$ ")
    tm.line("a", "cd /tmp && export GREETING=hi-there")
    tm.line("a", "echo \"$GREETING in $PWD\"")
    tm.wait("a", "hi-there in /tmp")
    # resize reaches the program
    tm.tmux("resize-window", "-t", "a", "-x", "111", "-y", "33")
    time.sleep(0.3)
    tm.line("a", "stty size")
    tm.wait("a", "33 111")
    ids, listing = session_ids(daemon)
    assert len(ids) == 1 and sb in listing, listing
    sid = ids[0]
    # detach: the session goes on
    tm.keys("a", "C-\\")
    tm.keys("a", "C-\\")
    s = tm.wait("a", "CONCH-EXIT=0")
    assert f"detached from session {sid}" in s, s
    ids, listing = session_ids(daemon)
    assert ids == [sid] and "running" in listing, listing
    # re-attach elsewhere: the scrollback is replayed, the state is there
    tm.start("b", conch_cmd(daemon, "attach", sid))
    tm.wait("b", "hi-there in /tmp")  # from the scrollback
    tm.line("b", "echo \"again $GREETING $((40+2))\"")
    tm.wait("b", "again hi-there 42")
    # the shell's exit status is conch's
    tm.line("b", "exit 3")
    tm.wait("b", "CONCH-EXIT=3")


def test_two_terminals_and_a_takeover(daemon, rpc, sandbox, tm):
    sb = sandbox()
    tm.start("a", conch_cmd(daemon, "shell", sb))
    tm.wait("a", "$ ")
    sid = session_ids(daemon)[0][0]
    tm.start("w", conch_cmd(daemon, "attach", "--read-only", sid))
    time.sleep(0.5)
    tm.line("a", "echo shared-$((3*5))")
    tm.wait("a", "shared-15")
    tm.wait("w", "shared-15")  # the watcher sees it too
    # the watcher's keys go nowhere
    tm.line("w", "echo from-watcher-$((2*2))")
    time.sleep(0.5)
    assert "from-watcher-4" not in tm.screen("a")
    # a third terminal takes over: the first is told, and its keys stop reaching the shell
    tm.start("t", conch_cmd(daemon, "attach", sid))
    tm.wait("a", "another client took over")
    tm.line("t", "echo taken-$((6*6))")
    tm.wait("a", "taken-36")
    tm.line("a", "echo from-a-$((7*7))")
    time.sleep(0.5)
    assert "from-a-49" not in tm.screen("t")
    tm.line("t", "exit")
    tm.wait("t", "CONCH-EXIT=0")
    tm.wait("a", "CONCH-EXIT=0")
    tm.wait("w", "CONCH-EXIT=0")


def test_shell_without_sandbox_creates_one_over_the_cwd(daemon, tmp_path, tm):
    (tmp_path / "marker.txt").write_text("in the workspace\n")
    inner = f"cd {tmp_path} && {CONCH_BIN} shell --socket {daemon.sock}; echo CONCH-EXIT=$?; sleep 600"
    tm.start("a", f"sh -c '{inner}'")
    s = tm.wait("a", "$ ")
    assert "sandbox sb-" in s, s
    tm.line("a", "cat /workspace/marker.txt; exit 5")
    s = tm.wait("a", "CONCH-EXIT=5")
    assert "in the workspace" in s, s
    sb = [w for w in s.split() if w.startswith("sb-")][0]
    subprocess.run([CONCH_BIN, "rm", "--socket", daemon.sock, sb], capture_output=True, timeout=30)
