# test_sessions.py - sessions of `conch serve` over JSON-RPC (docs/PROTOCOL.md, session.*):
# a shell that remembers (cwd, env, functions, aliases, options, a venv), exit codes that no
# output can fake, stdin, exit/exec/set -e, timeouts that leave the session usable, queued and
# parallel commands, raw mode (output notifications, two clients, writer takeover, resize,
# scrollback), TIOCSTI refused on the session's pty, and the session's lifecycle.
import concurrent.futures
import re
import time

import pytest

from rpcclient import RpcError


@pytest.fixture
def session(rpc, sandbox):
    """open(**params) -> session id in a new sandbox (or params["sandbox"])."""

    def open_(**params):
        if "sandbox" not in params:
            params["sandbox"] = sandbox()
        return rpc.call("session.open", params, timeout=30)["session"]

    return open_


def run(rpc, sid, command, **kw):
    params = {"session": sid, "command": command, "timeout": kw.pop("timeout", 20), **kw}
    return rpc.call("session.run", params, timeout=120)


def out(r):
    return r["stdout"]


def test_state_persists_between_commands(rpc, session):
    sid = session()
    assert run(rpc, sid, "cd /tmp && mkdir -p d1 && cd d1")["exit_code"] == 0
    assert out(run(rpc, sid, "pwd")) == "/tmp/d1\n"
    run(rpc, sid, "export FOO='a b'; BAR=plain")
    assert out(run(rpc, sid, 'echo "$FOO|$BAR"; sh -c \'echo "child:$FOO"\'')) == "a b|plain\nchild:a b\n"
    run(rpc, sid, "greet() { echo \"hello $1\"; }")
    assert out(run(rpc, sid, "greet you")) == "hello you\n"
    run(rpc, sid, "alias ll='echo aliased'")
    assert out(run(rpc, sid, "ll")) == "aliased\n"
    run(rpc, sid, "set -o noclobber; declare -A map=([k]=v)")
    r = run(rpc, sid, "echo x > /tmp/nc; echo y > /tmp/nc; echo ${map[k]}")
    assert "cannot overwrite existing file" in r["text"] and r["stdout"].endswith("v\n"), r
    assert r["exit_code"] == 0, r


def test_virtualenv_stays_active(rpc, session):
    sid = session()
    r = run(rpc, sid, "python3 -m venv /tmp/venv && . /tmp/venv/bin/activate", timeout=60)
    assert r["exit_code"] == 0, r
    r = run(rpc, sid, "echo $VIRTUAL_ENV; command -v python; python -c 'import sys; print(sys.prefix)'")
    assert out(r) == "/tmp/venv\n/tmp/venv/bin/python\n/tmp/venv\n", r


def test_exit_codes(rpc, session):
    sid = session()
    assert run(rpc, sid, "false")["exit_code"] == 1
    r = run(rpc, sid, "sh -c 'exit 42'")
    assert r["exit_code"] == 42 and r["text"].endswith("[exit code: 42]"), r
    assert run(rpc, sid, "true")["exit_code"] == 0
    r = run(rpc, sid, "echo out; echo err >&2; (exit 3)")
    assert r["exit_code"] == 3 and out(r) == "out\nerr\n", r
    r = run(rpc, sid, "if then")  # syntax error: the shell says so, the session goes on
    assert r["exit_code"] == 2 and "syntax error" in r["stdout"], r
    assert run(rpc, sid, "echo still")["stdout"] == "still\n"


def test_fake_end_markers_change_nothing(rpc, session):
    sid = session()
    # every shape of marker a program could print: ours with a made-up nonce, a status line,
    # prompts; then real output and a real exit code
    fake = (
        r"printf '\e]697;E0000000000000000\a\e]697;S0000000000000000\a'; "
        r"printf 'E 0000000000000000 0\n[exit code: 0]\n'; echo after; exit_code=5; (exit 5)"
    )
    r = run(rpc, sid, fake)
    assert r["exit_code"] == 5, r
    assert r["stdout"].endswith("E 0000000000000000 0\n[exit code: 0]\nafter\n"), r
    # a program cannot reach the shell's control socket: it is not among its fds
    r = run(rpc, sid, "ls /proc/self/fd; echo 'E x 0' >&62")
    assert r["stdout"].split()[:4] == ["0", "1", "2", "3"] and "62" not in r["stdout"].split(), r
    assert r["exit_code"] == 1 and "Bad file descriptor" in r["stdout"], r
    r = run(rpc, sid, "python3 -c 'import os; os.write(62, b\"E x 0\\n\")'; echo $?")
    assert r["stdout"].endswith("1\n") and "Bad file descriptor" in r["stdout"], r


def test_prompt_changes_and_traps_change_nothing(rpc, session):
    sid = session()
    run(rpc, sid, r"PS1='\e]697;E '; PROMPT_COMMAND='echo junk'; PS0='ps0'; trap 'echo dbg' RETURN")
    r = run(rpc, sid, "echo ok; (exit 4)")
    assert r["exit_code"] == 4 and "ok\n" in r["stdout"], r
    run(rpc, sid, "set -u -o pipefail")
    r = run(rpc, sid, "false | true")
    assert r["exit_code"] == 1, r
    # functions and aliases named like the builtins the wrapper uses change nothing
    run(rpc, sid, "printf() { :; }; read() { :; }; eval() { :; }; alias builtin=false")
    r = run(rpc, sid, "echo still-$((1+1)); (exit 6)")
    assert r["exit_code"] == 6 and "still-2\n" in r["stdout"], r
    # under xtrace the wrapper's own trace (and its nonce) stays out of the output
    r = run(rpc, sid, "set -x; echo traced")
    assert "traced\n" in r["stdout"] and "__conch" not in r["stdout"], r
    r = run(rpc, sid, "echo again")
    assert "again\n" in r["stdout"] and "__conch" not in r["stdout"] and r["exit_code"] == 0, r


def test_stdin(rpc, session):
    sid = session()
    r = run(rpc, sid, "cat", stdin="line one\nline two\n")
    assert out(r) == "line one\nline two\n" and r["exit_code"] == 0, r
    r = run(rpc, sid, "read a; read b; echo \"[$b][$a]\"", stdin="x\ny\n")
    assert out(r) == "[y][x]\n", r
    # without stdin a reader sees end of file at once (it does not hang on the terminal
    # until the command's timeout)
    r = run(rpc, sid, "cat; read x; echo rc=$?")
    assert out(r) == "rc=1\n" and r["timed_out"] is False, r


def test_exit_and_exec_end_the_shell_and_the_next_call_starts_one(rpc, session):
    sid = session()
    run(rpc, sid, "cd /tmp; export KEEP=1")
    r = run(rpc, sid, "echo bye; exit 7")
    assert r["exit_code"] == 7 and r["shell_exited"] is True, r
    assert "bye" in r["stdout"], r
    r = run(rpc, sid, "pwd; echo ${KEEP:-unset}")
    assert r["new_shell"] is True and r["shell_exited"] is False, r
    assert out(r) == "/workspace\nunset\n", r
    assert run(rpc, sid, "true")["new_shell"] is False
    r = run(rpc, sid, "exec sh -c 'echo from-sh; exit 5'")
    assert r["exit_code"] == 5 and r["shell_exited"] is True and "from-sh" in out(r), r
    r = run(rpc, sid, "set -e; echo before; false; echo never")
    assert r["new_shell"] is True and r["exit_code"] == 1 and r["shell_exited"] is True, r
    assert "before" in out(r) and "never" not in out(r), r
    assert run(rpc, sid, "echo fine")["stdout"] == "fine\n"
    listed = {s["session"]: s for s in rpc.call("session.list", {})["sessions"]}
    assert listed[sid]["state"] == "running" and listed[sid]["shells"] == 4, listed


@pytest.mark.parametrize(
    "command",
    [
        "sleep 100",  # a program: SIGINT to its process group
        "trap '' INT; sleep 100",  # ignores SIGINT: SIGKILL after the grace
        "while :; do :; done",  # the shell itself is busy: SIGINT reaches it
        "sleep 100 | cat",
    ],
)
def test_timeout_interrupts_and_the_session_stays_usable(rpc, session, command):
    sid = session()
    run(rpc, sid, "cd /tmp; export MARK=kept")
    r = run(rpc, sid, command, timeout=0.5, grace=0.5)
    assert r["timed_out"] is True and r["session_usable"] is True and r["shell_exited"] is False, r
    assert r["exit_code"] == 124, r  # a timeout is 124, as for exec.run
    assert "[interrupted; the session is still usable]" in r["text"], r
    r = run(rpc, sid, "trap - INT; pwd; echo $MARK")
    assert out(r) == "/tmp\nkept\n" and r["timed_out"] is False and r["new_shell"] is False, r


def test_runs_on_one_session_queue_in_order(rpc, session):
    sid = session()
    ids = [
        rpc.request("session.run", {"session": sid, "command": f"sleep 0.{3 - i}; echo n{i}"})
        for i in range(3)
    ]
    res = [rpc.wait(i, timeout=30)["result"] for i in ids]
    assert [out(r) for r in res] == ["n0\n", "n1\n", "n2\n"], res


def test_twenty_sessions_in_one_sandbox_run_in_parallel(rpc, sandbox, daemon):
    sb = sandbox()
    sids = [rpc.call("session.open", {"sandbox": sb}, timeout=30)["session"] for _ in range(20)]
    # each remembers its own state
    for i, sid in enumerate(sids):
        run(rpc, sid, f"N={i}")
    # A barrier, not a clock: each command announces itself with a file and waits until all
    # 20 have (60 s at most). Run one after the other, the first would wait alone, give up
    # and print "alone" instead of its number.
    barrier = ("mkdir -p /tmp/meet; touch /tmp/meet/$N; "
               "for i in $(seq 600); do [ $(ls /tmp/meet | wc -l) -ge 20 ] && break; sleep 0.1; done; "
               "if [ $(ls /tmp/meet | wc -l) -ge 20 ]; then echo $N; else echo alone; fi")
    ids = [rpc.request("session.run", {"session": sid, "command": barrier, "timeout": 100}) for sid in sids]
    res = [rpc.wait(i, timeout=120)["result"] for i in ids]
    assert [out(r) for r in res] == [f"{i}\n" for i in range(20)], res


def test_tiocsti_fails_on_the_session_pty(rpc, session):
    sid = session()
    code = (
        "import fcntl, termios, os\n"
        "fd = os.open('/dev/tty', os.O_RDWR)\n"
        "try:\n"
        "    fcntl.ioctl(fd, termios.TIOCSTI, b'x')\n"
        "    print('injected')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    r = run(rpc, sid, f"python3 -c \"{code}\"; readlink /proc/$$/fd/255")
    assert "refused 1" in out(r) and "injected" not in out(r), r
    assert re.search(r"^/dev/pts/\d+$", out(r), re.M), r  # a pty of the sandbox's own devpts


def outputs(client, sid, since=0):
    data = []
    for n in list(client.notifications):
        if n["method"] == "session.output" and n["params"]["session"] == sid:
            data.append((n["params"]["seq"], n["params"]["data"]))
    return "".join(d for s, d in sorted(data) if s >= since)


def test_raw_mode_two_clients_writer_takeover_resize_scrollback(rpc, session, daemon):
    sid = session()
    a = daemon.client()
    b = daemon.client()
    ra = a.call("session.attach", {"session": sid, "write": True})
    assert ra["you_write"] is True
    rb = b.call("session.attach", {"session": sid})
    assert rb["you_write"] is False
    a.call("session.write", {"session": sid, "data": "echo raw-$((6*7))\n"})
    a.wait_for(lambda: "raw-42" in outputs(a, sid), what="output to a")
    b.wait_for(lambda: "raw-42" in outputs(b, sid), what="output to b")
    # one writer at a time: b must take over explicitly, and a is told
    with pytest.raises(RpcError) as ei:
        b.call("session.write", {"session": sid, "data": "echo no\n"})
    assert ei.value.data_code == "not_writer", ei.value
    b.call("session.attach", {"session": sid, "write": True})
    a.wait_notification("session.writer", lambda p: p["session"] == sid and p["writer"] is False)
    b.call("session.write", {"session": sid, "data": "echo by-b\n"})
    a.wait_for(lambda: "by-b" in outputs(a, sid), what="b's command seen by a")
    with pytest.raises(RpcError):
        a.call("session.write", {"session": sid, "data": "echo no\n"})
    # resize reaches the program
    b.call("session.resize", {"session": sid, "rows": 33, "cols": 101})
    b.call("session.write", {"session": sid, "data": "stty size\n"})
    b.wait_for(lambda: "33 101" in outputs(b, sid), what="stty size")
    # a late client gets the scrollback, then live output
    c = daemon.client()
    rc = c.call("session.attach", {"session": sid})
    assert "raw-42" in rc["scrollback"] and "by-b" in rc["scrollback"], rc
    assert rc["next_seq"] == rc["seq"] + len(rc["scrollback"].encode()), rc
    # command mode output goes to attached clients too
    r = run(rpc, sid, "echo via-run")
    assert out(r) == "via-run\n", r
    c.wait_for(lambda: "via-run" in outputs(c, sid), what="session.run output seen by an attached client")
    # signal: interrupt what runs in the foreground
    b.call("session.write", {"session": sid, "data": "sleep 100; echo after-$((2+3))\n"})
    time.sleep(0.3)
    b.call("session.signal", {"session": sid, "signal": "INT"})
    b.call("session.write", {"session": sid, "data": "echo back-$((1+1))\n"})
    b.wait_for(lambda: "back-2" in outputs(b, sid), what="shell back after SIGINT")
    assert "after-5" not in outputs(b, sid)
    c.call("session.detach", {"session": sid})


def test_session_ends_with_its_sandbox_and_on_close(rpc, session, sandbox, daemon):
    sb = sandbox()
    sid = session(sandbox=sb)
    watcher = daemon.client()
    watcher.call("session.attach", {"session": sid})
    assert run(rpc, sid, "echo hi")["stdout"] == "hi\n"
    rpc.call("sandbox.destroy", {"id": sb}, timeout=30)
    p = watcher.wait_notification("session.ended", lambda p: p["session"] == sid)["params"]
    assert p["reason"], p
    listed = {s["session"]: s for s in rpc.call("session.list", {})["sessions"]}
    assert listed[sid]["state"] == "ended" and listed[sid]["reason"], listed
    with pytest.raises(RpcError):
        run(rpc, sid, "echo no")
    # close forgets it
    sid2 = session()
    w2 = daemon.client()
    w2.call("session.attach", {"session": sid2})
    rpc.call("session.close", {"session": sid2})
    w2.wait_notification("session.ended", lambda p: p["session"] == sid2 and "closed" in p["reason"])
    assert sid2 not in {s["session"] for s in rpc.call("session.list", {})["sessions"]}
    with pytest.raises(RpcError) as ei:
        run(rpc, sid2, "true")
    assert ei.value.data_code == "session_not_found"


def test_shell_exit_in_raw_mode_tells_clients(rpc, session, daemon):
    sid = session()
    w = daemon.client()
    w.call("session.attach", {"session": sid, "write": True})
    w.call("session.write", {"session": sid, "data": "exit 3\n"})
    p = w.wait_notification("session.ended", lambda p: p["session"] == sid)["params"]
    assert p["exit_code"] == 3 and "exited with code 3" in p["reason"], p


def test_idle_timeout_ends_the_session(rpc, session, daemon):
    sid = session(idle_timeout=1)
    w = daemon.client()
    w.call("session.attach", {"session": sid})
    p = w.wait_notification("session.ended", lambda p: p["session"] == sid, timeout=10)["params"]
    assert "idle" in p["reason"], p


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_sessions_listed_after_a_daemon_restart(daemon_factory, ws, how):
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    assert run(c, sid, "echo persisted-$((20+3))")["stdout"] == "persisted-23\n"
    ended = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    run(c, ended, "echo last-words; exit 4")
    if how == "sigterm":
        d.stop()
    else:
        time.sleep(2.5)  # the scrollback of a printing session is saved every 2 s
        d.kill9()
    d.start()
    c = d.client()
    listed = {s["session"]: s for s in c.call("session.list", {})["sessions"]}
    assert listed[sid]["state"] == "ended" and listed[sid]["sandbox"] == sb, listed
    assert listed[sid]["reason"], listed
    assert listed[ended]["state"] == "ended" and listed[ended]["exit_code"] == 4, listed
    a = c.call("session.attach", {"session": sid})
    assert "persisted-23" in a["scrollback"] and a["state"] == "ended", a
    assert "last-words" in c.call("session.attach", {"session": ended})["scrollback"]
    with pytest.raises(RpcError) as ei:
        run(c, sid, "true")
    assert ei.value.data_code == "session_ended", ei.value
    c.call("session.close", {"session": sid})
    assert sid not in {s["session"] for s in c.call("session.list", {})["sessions"]}
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


def test_run_waits_for_a_program_typed_in_raw_mode(rpc, session, daemon):
    sid = session()
    w = daemon.client()
    w.call("session.attach", {"session": sid, "write": True})
    # the typed program leaves a mark when it ends: a command run before that (typed into it)
    # finds none
    w.call("session.write", {"session": sid, "data": "sleep 0.7; touch /tmp/typed-done\n"})
    time.sleep(0.2)
    r = run(rpc, sid, "[ -e /tmp/typed-done ] && echo after")
    assert out(r) == "after\n", r
    # a program that holds the terminal longer: the command is refused, not typed into it
    w.call("session.write", {"session": sid, "data": "sleep 100\n"})
    time.sleep(0.2)
    with pytest.raises(RpcError) as ei:
        # answered after the daemon's 2 s wait, from a timer; the program holds the terminal
        # for 100 s, and an answer that waited for the loop's next event came only then
        rpc.call("session.run", {"session": sid, "command": "echo never"}, timeout=60)
    assert ei.value.data_code == "session_busy", ei.value
    w.call("session.signal", {"session": sid, "signal": "INT"})
    assert out(run(rpc, sid, "echo back")) == "back\n"


def test_result_lists_workspace_changes(rpc, session):
    sid = session()
    r = run(rpc, sid, "echo hi > /workspace/made-in-session.txt")
    assert [c["path"] for c in r["changes"]] == ["made-in-session.txt"], r
    assert r["changes_total"] == 1, r


def test_writer_that_leaves_frees_the_keyboard_and_utf8_survives(rpc, session, daemon):
    sid = session()
    a = daemon.client()
    a.call("session.attach", {"session": sid, "write": True})
    a.close()
    b = daemon.client()
    b.call("session.attach", {"session": sid})
    b.call("session.write", {"session": sid, "data": "python3 -c 'print(\"é\" * 150000 + \"|end\")'\n"})
    b.wait_for(lambda: "é|end" in outputs(b, sid), timeout=20, what="long UTF-8 line")
    text = outputs(b, sid)
    assert "\ufffd" not in text, "a character split between two reads was mangled"
    assert "é" * 150000 in text


def test_large_paste_is_queued_not_blocking(rpc, session, daemon):
    sid = session()
    w = daemon.client()
    w.call("session.attach", {"session": sid, "write": True})
    # Nothing reads the terminal until the file go exists, which the test makes only once
    # session.write has answered: a write that waited for the terminal to take the paste
    # would wait for ever (its answer times out).
    w.call("session.write", {"session": sid, "data": "stty -echo; until [ -e /workspace/go ]; do sleep 0.05; done; "
                                                     "cat > /tmp/pasted; stty echo\n"})
    time.sleep(0.3)
    paste = ("y" * 999 + "\n") * 100  # 100 KB: far more than the terminal's input queue
    w.call("session.write", {"session": sid, "data": paste + "\x04"}, timeout=60)
    # meanwhile the daemon answers others
    assert rpc.call("session.list", {}, timeout=60)["sessions"]
    sb = [s for s in rpc.call("session.list", {})["sessions"] if s["session"] == sid][0]["sandbox"]
    rpc.call("fs.write", {"sandbox": sb, "path": "go", "content": ""})
    deadline = time.monotonic() + 20
    while True:
        r = run(rpc, sid, "wc -c < /tmp/pasted")
        if r["stdout"].strip() == "100000" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r["stdout"].strip() == "100000", r


def test_closing_the_control_channel_ends_the_shell_at_once(rpc, session):
    sid = session()
    # the command runs with fd 62 closed, so `exec 62>&-` changes nothing; shell code that
    # hunts down the shell's saved copy of the socket and closes it ends the shell
    assert run(rpc, sid, "exec 62>&-; echo x")["shell_exited"] is False
    assert run(rpc, sid, "echo y")["new_shell"] is False
    close_all = 'for f in /proc/$$/fd/*; do [[ $(readlink $f) == socket:* ]] && eval "exec ${f##*/}>&-"; done; echo closed'
    r = run(rpc, sid, close_all, timeout=30)
    assert r["timed_out"] is False, r  # it ended at once, not at its timeout
    # (bash may also give up by itself when it cannot restore its fds)
    assert r["shell_exited"] is True and "[the shell exited:" in r["text"], r
    assert run(rpc, sid, "echo new")["new_shell"] is True
