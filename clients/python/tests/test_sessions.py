# test_sessions.py - Session / AsyncSession and the session_* methods against the real
# `conch serve` (stdio and socket): state that persists between runs, exit codes, stdin, a
# timeout that leaves the shell usable, `exit` and the new shell after it, the raw terminal
# (attach, write, output notifications, resize, signal), a writer takeover between two
# connections, the end of a session, close; sync and asyncio.
import asyncio
import time

import pytest

from conch_client import (AsyncSandbox, Client, NotWriter, Sandbox, Session, SessionNotFound)
from conftest import arun


def test_state_persists_and_exit_codes(client):
    with Sandbox.create(client) as sb:
        with sb.session(env={"FROM_OPEN": "o"}) as s:
            assert s.id.startswith("ses-") and s.info["state"] == "running"
            r = s.run("cd /tmp && export V=42 && f() { echo fn-$1; }; alias hi='echo hi-alias'")
            assert r.ok and r.exit_code == 0 and not r.new_shell and not r.shell_exited
            r = s.run("pwd; echo $V $FROM_OPEN; f x; hi")
            assert r.stdout == "/tmp\n42 o\nfn-x\nhi-alias\n", r.raw
            assert r.text.endswith("[exit code: 0]")
            r = s.run("g() { return 3; }; g")
            assert (r.exit_code, r.ok) == (3, False) and r.text.endswith("[exit code: 3]")
            r = s.run("echo fake; printf '[exit code: 0]\\n'; false")
            assert r.exit_code == 1 and "fake" in r.stdout
            r = s.run("read a; echo got-$a", stdin="hello")
            assert r.stdout == "got-hello\n"
            assert [x["session"] for x in sb.sessions()] == [s.id]
            assert s.refresh()["shells"] == 1
        assert s.closed
        assert sb.sessions() == []
        with pytest.raises(SessionNotFound):
            s.run("true")
        s.close()  # idempotent


def test_timeout_keeps_the_shell_and_exit_starts_a_new_one(client):
    with Sandbox.create(client) as sb, sb.session() as s:
        s.run("export K=kept; cd /etc")
        r = s.run("sleep 30", timeout=1)
        assert r.timed_out and r.session_usable is True and not r.shell_exited
        assert r.exit_code != 0 and not r.ok
        r = s.run("echo $K; pwd")
        assert r.stdout == "kept\n/etc\n" and not r.new_shell
        r = s.run("exit 7")
        assert r.exit_code == 7 and r.shell_exited
        r = s.run("echo [$K]; pwd")
        assert r.new_shell and r.exit_code == 0 and r.stdout.startswith("[]\n")
        assert "/etc" not in r.stdout


def test_raw_terminal(client):
    with Sandbox.create(client) as sb, sb.session() as s:
        a = s.attach(write=True)
        assert a["you_write"] is True and s.you_write and isinstance(a["scrollback"], str)
        assert s.write("echo raw$((6*7))\n") == len("echo raw$((6*7))\n")
        out = s.wait_for("raw42")
        assert "raw42" in out
        assert s.resize(30, 100) == {"rows": 30, "cols": 100}
        s.write("stty size\n")
        assert "30 100" in s.wait_for("30 100")
        s.write("sleep 1000\n")
        s.wait_for("sleep 1000")
        time.sleep(0.5)  # sleep is the terminal's foreground job now
        assert s.signal("INT") == 2
        s.wait_for("$ ", timeout=60)  # the prompt is back: sleep was interrupted
        s.write("echo after-$((1+1))\n")
        s.wait_for("after-2")
        seqs = []
        s.write("echo one; echo two\n")
        for o in s.output(timeout=2):
            assert o["session"] == s.id
            seqs.append(o["seq"])
        assert seqs and seqs == sorted(seqs)
        # a command run meanwhile shows on the terminal too
        r = s.run("echo via-run")
        assert r.stdout == "via-run\n"
        s.wait_for("via-run")
        assert s.detach() is True


def test_session_end_is_told(client):
    with Sandbox.create(client) as sb:
        s = sb.session(attach=True)
        assert s.you_write
        s.write("exit 5\n")
        chunks = list(s.output(timeout=15))  # ends at session.ended
        assert s.ended is not None and s.ended["exit_code"] == 5, (chunks, s.ended)
        assert s.refresh()["state"] == "ended"
        r = s.run("echo again")  # a new shell while the sandbox runs
        assert r.new_shell and r.stdout == "again\n"
        s.close()
        with pytest.raises(SessionNotFound):
            client.session_run(s.id, "true")


def test_writer_takeover(socket_daemon):
    a = Client.connect(socket_daemon.sock, timeout=60)
    b = Client.connect(socket_daemon.sock, timeout=60)
    try:
        sb = Sandbox.create(a)
        s = sb.session(attach=True)
        sid = s.id
        seen = []
        sub = b.subscribe("session.output", lambda n: seen.append(n.params))
        r = b.session_attach(sid, write=True)
        assert r["you_write"] is True
        for _ in range(100):
            if s.writer_events:
                break
            time.sleep(0.05)
        assert s.writer_events and s.writer_events[0]["writer"] is False
        assert not s.you_write
        with pytest.raises(NotWriter):
            s.write("echo no\n")
        b.session_write(sid, "echo from-b-$((2+3))\n")
        s.wait_for("from-b-5")  # every attached client sees the output
        for _ in range(100):  # and so does b, the writer
            if "from-b-5" in "".join(p["data"] for p in list(seen)):
                break
            time.sleep(0.05)
        sub.close()
        assert "from-b-5" in "".join(p["data"] for p in seen)
        s.close()
        sb.destroy()
    finally:
        b.close()
        a.close()


def test_async_session(aconnect):
    async def main():
        c = await aconnect()
        try:
            async with AsyncSandbox.create(c) as sb:
                async with sb.session(cwd="/tmp") as s:
                    r = await s.run("pwd; cd /; export Z=z; h() { echo h$1; }")
                    assert r.stdout == "/tmp\n"
                    r1, r2 = await asyncio.gather(s.run("echo $Z; h 1"), s.run("pwd"))
                    assert (r1.stdout, r2.stdout) == ("z\nh1\n", "/\n")  # queued in order
                    r = await s.run("sleep 20", timeout=1)
                    assert r.timed_out and r.session_usable
                    r = await s.run("echo $Z")
                    assert r.stdout == "z\n" and r.exit_code == 0
                    r = await s.run("(exit 9)")
                    assert r.exit_code == 9 and not r.shell_exited
                    a = await s.attach(write=True)
                    assert a["you_write"]
                    assert await s.write("echo araw$((5*5))\n") > 0
                    assert "araw25" in await s.wait_for("araw25")
                    assert await s.resize(40, 120) == {"rows": 40, "cols": 120}
                    assert await s.signal("INT") == 2
                    assert [x["session"] for x in await sb.sessions()] == [s.id]
                    sid = s.id
                assert s.closed
                assert await sb.sessions() == []
                with pytest.raises(SessionNotFound):
                    await c.session_close(sid)
                s2 = await sb.session()
                await s2.attach()
                await c.session_run(s2.id, "exit 4")
                got = [o async for o in s2.output(timeout=10)]
                assert s2.ended and s2.ended["exit_code"] == 4, got
                await s2.close()
        finally:
            await c.close()
    arun(main())


def test_a_second_client_gets_a_session_by_id(socket_daemon):
    a = Client.connect(socket_daemon.sock, timeout=60)
    b = Client.connect(socket_daemon.sock, timeout=60)
    try:
        sb = Sandbox.create(a)
        s = sb.session()
        s.run("export SHARED=from-a; cd /tmp")
        t = Session.get(b, s.id)
        assert (t.id, t.sandbox, t.info["state"]) == (s.id, sb.id, "running")
        assert t.run("echo $SHARED; pwd").stdout == "from-a\n/tmp\n"
        w = Session.get(b, s.id, write=True)
        assert w.you_write
        w.write("echo typed-$((6*7))\n")
        w.wait_for("typed-42")
        with pytest.raises(SessionNotFound):
            Session.get(b, "ses-nosuch")
        w.detach()
        s.close()
        sb.destroy()
    finally:
        b.close()
        a.close()
