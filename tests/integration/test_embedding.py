# test_embedding.py - conch as a harness embeds it: several `conch serve --stdio` side by
# side with no options, what a --stdio daemon does when its client goes away, oversize lines
# answered by their id wherever it is, and what a command's result tells a model.
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import CONCH_BIN, IS_ROOT, unique_marker
from rpcclient import Client, RpcError, pids_matching, serve_available, wait_gone


@pytest.fixture
def serve_ok():
    ok, why = serve_available(CONCH_BIN)
    if not ok:
        pytest.skip(f"daemon not available: {why}")


@pytest.fixture
def state_home(tmp_path):
    """An $XDG_STATE_HOME of the test's own (an ordinary user's default state dir is under
    it; root's is /var/lib/conch whatever the environment)."""
    d = tmp_path / "xdg-state"
    d.mkdir()
    os.chmod(tmp_path, 0o711)
    return d


class Stdio:
    """One `conch serve --stdio ARGS` with no --state-dir unless ARGS give one."""

    def __init__(self, args=(), env_home=None):
        env = dict(os.environ)
        if env_home is not None:
            env["XDG_STATE_HOME"] = str(env_home)
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([CONCH_BIN, "serve", "--stdio", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env,
                                     start_new_session=True)
        self.c = Client.stdio(self.proc)

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close(self, timeout=20):
        """EOF on stdin; returns the exit status."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)


def test_stdio_instances_run_side_by_side_without_options(serve_ok, state_home, tmp_path):
    """Two `conch serve --stdio` started at the same moment, each with a sandbox running
    commands, 20 times: none refuses, none disturbs the other, each state dir goes away."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("shared\n")
    failures = []

    def agent(k, i, out):
        s = Stdio(env_home=state_home)
        try:
            ping = s.c.call("daemon.ping", {}, timeout=20)
            sb = s.c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
            for j in range(3):
                r = s.c.call("exec.run", {"sandbox": sb, "command": f"echo {k}-{j} > out.txt; cat f.txt out.txt"},
                             timeout=30)
                assert r["exit_code"] == 0 and r["stdout"] == f"shared\n{k}-{j}\n", r
            s.c.call("fs.write", {"sandbox": sb, "path": "w.txt", "content": k}, timeout=30)
            assert s.c.call("fs.read", {"sandbox": sb, "path": "w.txt"}, timeout=30)["content"] == k
            out[k] = ping["state_dir"]
            rc = s.close()
            assert rc == 0, f"exit {rc}"
            assert not os.path.exists(ping["state_dir"]), f"{ping['state_dir']} left behind"
        except BaseException as e:  # noqa: BLE001 - collected and reported below
            failures.append(f"round {i} agent {k}: {e!r}\n{s.stderr()}")
            s.close(5)

    for i in range(20):
        out = {}
        ts = [threading.Thread(target=agent, args=(k, i, out)) for k in ("a", "b")]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        if failures:
            break
        assert out["a"] != out["b"], out
    assert not failures, "\n".join(failures)
    assert sorted(p.name for p in ws.iterdir()) == ["f.txt"]


def test_a_second_daemon_on_an_explicit_state_dir_is_refused_and_the_first_keeps_running(
        serve_ok, tmp_path):
    st = tmp_path / "state"
    a = Stdio(["--state-dir", str(st)])
    try:
        sb = a.c.call("sandbox.create", {}, timeout=30)["id"]
        m = unique_marker("lock")
        job = a.c.call("job.start", {"sandbox": sb, "command": f"exec -a {m} sleep 100"})["job_id"]
        deadline = time.monotonic() + 15
        while not pids_matching(m) and time.monotonic() < deadline:
            time.sleep(0.05)
        b = subprocess.run([CONCH_BIN, "serve", "--stdio", "--state-dir", str(st)], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=30)
        assert b.returncode != 0 and b"in use by another conch daemon" in b.stderr, b
        assert a.c.call("sandbox.get", {"id": sb})["state"] == "running"
        assert a.c.call("job.list", {"sandbox": sb})["jobs"][0]["running"] is True
        assert pids_matching(m), "the first daemon's job was killed"
        assert a.c.call("job.kill", {"job_id": job, "signal": "KILL"})["killed"]
    finally:
        assert a.close() == 0, a.stderr()


def test_stdio_defaults_no_pool_no_idle_timeout_nothing_left_stopped(serve_ok, tmp_path):
    st = tmp_path / "state"
    a = Stdio(["--state-dir", str(st)])
    sb = a.c.call("sandbox.create", {}, timeout=30)["id"]
    time.sleep(0.5)
    # no pool sandboxes: the only warden is this sandbox's
    wardens = [p for p in pids_matching(str(st)) if p != a.proc.pid]
    assert a.c.call("daemon.ping", {})["sandboxes"] == 1
    n_children = subprocess.run(["pgrep", "-P", str(a.proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(n_children) == 1, (n_children, wardens)
    assert a.close() == 0, a.stderr()
    # the client went away: its sandbox is destroyed, not left `stopped` for the next daemon
    b = Stdio(["--state-dir", str(st)])
    try:
        assert b.c.call("sandbox.list", {})["sandboxes"] == []
        with pytest.raises(RpcError) as ei:
            b.c.call("sandbox.get", {"id": sb})
        assert ei.value.data_code == "sandbox_not_found"
        assert not os.path.exists(st / "sandboxes" / sb)
    finally:
        assert b.close() == 0, b.stderr()


def test_stdio_sandbox_has_no_idle_timeout_by_default(serve_ok, tmp_path):
    a = Stdio(["--state-dir", str(tmp_path / "state")])
    try:
        sb = a.c.call("sandbox.create", {}, timeout=30)
        # the daemon default (3600 s) would be visible as the sandbox's idle timeout
        info = a.c.call("sandbox.get", {"id": sb["id"]})
        assert info["idle_timeout"] == 0, info
    finally:
        assert a.close() == 0, a.stderr()


def test_closing_stdin_kills_the_command_in_flight_and_answers_it(serve_ok, tmp_path):
    a = Stdio(["--state-dir", str(tmp_path / "state")])
    sb = a.c.call("sandbox.create", {}, timeout=30)["id"]
    m = unique_marker("eof")
    rid = a.c.request("exec.run", {"sandbox": sb, "command": f"exec -a {m} sleep 100"})
    deadline = time.monotonic() + 15
    while not pids_matching(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_matching(m)
    a.proc.stdin.close()
    resp = a.c.wait(rid, 15)  # answered on stdout before the daemon exits
    assert resp["error"]["data"]["code"] == "sandbox_stopped", resp
    assert a.proc.wait(15) == 0, a.stderr()
    assert wait_gone(m) == []
    assert "stdin closed" in a.stderr(), a.stderr()


def test_oversize_line_is_answered_by_its_id_after_params(serve_ok, tmp_path):
    a = Stdio(["--state-dir", str(tmp_path / "state"), "--max-message", "4096"])
    try:
        for rid in (a.c.new_id(), "after-params", None):
            line = json.dumps({"jsonrpc": "2.0", "method": "daemon.ping",
                               "params": {"pad": "x" * 10000, "id": 99, "s": "}\"{"}, "id": rid}).encode() + b"\n"
            a.c.send_raw(line[:6000])
            time.sleep(0.1)
            a.c.send_raw(line[6000:])
            resp = a.c.wait_reply(rid if isinstance(rid, int) else None, 10)
            assert resp["id"] == rid and resp["error"]["data"]["code"] == "message_too_large", resp
        assert a.c.call("daemon.ping", {})["version"]
    finally:
        assert a.close() == 0, a.stderr()


def test_text_keeps_nul_bytes_and_its_exit_line(serve_ok, tmp_path):
    a = Stdio(["--state-dir", str(tmp_path / "state")])
    try:
        sb = a.c.call("sandbox.create", {}, timeout=30)["id"]
        r = a.c.call("exec.run", {"sandbox": sb, "command": "printf 'a\\0b\\n'; printf 'e\\0f\\1' >&2; exit 3"})
        assert r["stdout"] == "a\0b\n" and r["stderr"] == "e\0f\1", r
        assert r["text"] == "a\u2400b\ne\u2400f\1\n[exit code: 3]", r["text"]
    finally:
        assert a.close() == 0, a.stderr()


def test_a_timeout_is_exit_code_124_over_json_rpc_and_from_the_cli(serve_ok, daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--pool", "0"])
    c = d.client()
    sb = c.call("sandbox.create", {}, timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "sleep 10", "timeout": 0.3, "grace": 0.2}, timeout=30)
    assert r["timed_out"] is True and r["exit_code"] == 124 and r["signal"] == 15, r
    assert r["text"].endswith("[timed out; exit code: 124]"), r["text"]
    assert r["error"]["kind"] == "timeout", r
    # a command that ignores SIGTERM is killed after the grace: still 124
    r = c.call("exec.run", {"sandbox": sb, "command": "trap '' TERM; sleep 10", "timeout": 0.3, "grace": 0.2},
               timeout=30)
    assert r["timed_out"] is True and r["exit_code"] == 124 and r["signal"] == 9, r
    p = subprocess.run([CONCH_BIN, "run", "--json", "--workspace", str(tmp_path), "--timeout", "0.3", "--",
                        "sleep", "10"], capture_output=True, timeout=60)
    assert p.returncode == 124 and json.loads(p.stdout)["exit_code"] == 124, p


@pytest.mark.user_only
def test_gc_removes_the_private_state_dir_of_a_killed_stdio_daemon(serve_ok, state_home):
    # (root's default state dir is /var/lib/conch, which a test must not garbage-collect)
    dead = Stdio(env_home=state_home)
    live = Stdio(env_home=state_home)
    try:
        dead_dir = dead.c.call("daemon.ping", {})["state_dir"]
        live_dir = live.c.call("daemon.ping", {})["state_dir"]
        dead.c.call("sandbox.create", {}, timeout=30)
        live.c.call("sandbox.create", {}, timeout=30)
        os.kill(dead.proc.pid, 9)
        dead.proc.wait(10)
        assert os.path.isdir(dead_dir)
        env = dict(os.environ, XDG_STATE_HOME=str(state_home))
        p = subprocess.run([CONCH_BIN, "gc"], capture_output=True, env=env, timeout=60)
        assert p.returncode == 0, p
        assert not os.path.exists(dead_dir), os.listdir(dead_dir)
        assert os.path.isdir(live_dir)
        assert live.c.call("sandbox.list", {})["sandboxes"][0]["state"] == "running"
    finally:
        dead.close(5)
        assert live.close() == 0, live.stderr()
    assert not os.path.exists(live_dir)


def test_spilled_output_is_readable_through_fs_and_goes_with_its_sandbox(serve_ok, tmp_path):
    import base64
    st = tmp_path / "state"
    a = Stdio(["--state-dir", str(st)])
    try:
        sb = a.c.call("sandbox.create", {}, timeout=30)["id"]
        r = a.c.call("exec.run", {"sandbox": sb, "command": "seq 1 200000; echo done >&2", "max_output": 1000})
        spill = r["stdout_spill"]
        assert r["stdout_truncated"] and spill.startswith("/run/conch/output/conch-stdout-"), r
        assert f"full output in {spill}" in r["text"] and r["text"].endswith("[exit code: 0]"), r["text"][-300:]
        assert str(st) not in r["text"], "the text names a host path"
        got = a.c.call("fs.read", {"sandbox": sb, "path": spill, "offset": 199998, "limit": 10})
        assert got["content"] == "199999\n200000\n" and got["total_lines"] == 200000, got
        whole = a.c.call("fs.download", {"sandbox": sb, "paths": [spill]})["files"][0]
        assert base64.b64decode(whole["content"]) == b"".join(b"%d\n" % i for i in range(1, 200001))
        names = [e["path"] for e in a.c.call("fs.ls", {"sandbox": sb, "path": "/run/conch/output"})["entries"]]
        assert spill in names, names
        m = a.c.call("fs.grep", {"sandbox": sb, "path": "/run/conch/output", "pattern": "^123456$"})["matches"]
        assert m == [{"path": spill, "line": 123456, "text": "123456"}], m
        for method, params in (("fs.write", {"path": spill, "content": "x"}),
                               ("fs.delete", {"path": spill}),
                               ("fs.edit", {"path": spill, "old_string": "1", "new_string": "2"})):
            with pytest.raises(RpcError) as ei:
                a.c.call(method, {"sandbox": sb, **params})
            assert ei.value.data_code == "permission_denied", (method, ei.value)
        with pytest.raises(RpcError) as ei:
            a.c.call("fs.read", {"sandbox": sb, "path": "/run/conch/output/../../../../etc/passwd"})
        assert ei.value.data_code == "invalid_path", ei.value
        host_dir = st / "sandboxes" / sb
        assert any((host_dir / "spill").iterdir())
        a.c.call("sandbox.destroy", {"id": sb}, timeout=30)
        assert not host_dir.exists(), list(host_dir.rglob("*"))
    finally:
        assert a.close() == 0, a.stderr()
    p = subprocess.run([CONCH_BIN, "gc", "--state-dir", str(st)], capture_output=True, timeout=60)
    assert p.returncode == 0 and not any((st / "spill").iterdir()), p


@pytest.mark.parametrize("as_root", [False, True])
def test_fs_reaches_the_whole_sandbox_and_deepagents_offload_dirs_are_writable(serve_ok, tmp_path, as_root):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    a = Stdio(["--state-dir", str(tmp_path / "state")])
    try:
        sb = a.c.call("sandbox.create", {"workspace": str(ws), "as_root": as_root}, timeout=30)["id"]
        big = "".join(f"line {i} of a big tool result\n" for i in range(20000))
        for d in ("/large_tool_results", "/conversation_history"):
            r = a.c.call("fs.write", {"sandbox": sb, "path": f"{d}/call_abc", "content": big})
            assert r["bytes_written"] == len(big), r
            got = a.c.call("fs.read", {"sandbox": sb, "path": f"{d}/call_abc", "offset": 100, "limit": 2})
            assert got["content"] == "line 100 of a big tool result\nline 101 of a big tool result\n", got
            assert [e["name"] for e in a.c.call("fs.ls", {"sandbox": sb, "path": d})["entries"]] == ["call_abc"]
            r = a.c.call("exec.run", {"sandbox": sb, "command": f"wc -l < {d}/call_abc; echo x >> {d}/call_abc"})
            assert r["stdout"] == "20000\n", r
        # the whole sandbox as its user sees it, resolved inside it
        assert a.c.call("fs.read", {"sandbox": sb, "path": "/etc/hostname"})["content"]
        assert a.c.call("fs.grep", {"sandbox": sb, "pattern": "^line 19999 ", "path": "/large_tool_results"})["matches"]
        a.c.call("fs.write", {"sandbox": sb, "path": "/tmp/t.txt", "content": "t"})
        assert a.c.call("exec.run", {"sandbox": sb, "command": "cat /tmp/t.txt"})["stdout"] == "t"
        for bad in ("/etc/x", "/usr/bin/x", "/x"):
            with pytest.raises(RpcError) as ei:
                a.c.call("fs.write", {"sandbox": sb, "path": bad, "content": "x"})
            assert ei.value.data_code == "permission_denied", (bad, ei.value)
        # none of it is a workspace change, and the host saw none of it
        assert a.c.call("workspace.changes", {"sandbox": sb})["changes"] == []
        assert sorted(p.name for p in ws.iterdir()) == ["a.txt"]
        assert not os.path.exists("/large_tool_results/call_abc")
    finally:
        assert a.close() == 0, a.stderr()


def test_one_file_cap_and_chunked_reads_and_writes(serve_ok, tmp_path):
    import base64
    import hashlib
    a = Stdio(["--state-dir", str(tmp_path / "state")])
    try:
        sb = a.c.call("sandbox.create", {}, timeout=30)["id"]
        cap = 10 << 20
        eleven = os.urandom(11 << 20)
        # one request may not carry more than one may read back
        r = a.c.call("fs.upload", {"sandbox": sb, "files": [{"path": "big.bin", "content": base64.b64encode(eleven).decode()}]},
                     timeout=60)
        assert r["results"][0]["error"]["code"] == "too_large", r
        with pytest.raises(RpcError) as ei:
            a.c.call("fs.write", {"sandbox": sb, "path": "big.bin", "encoding": "base64",
                                  "content": base64.b64encode(eleven).decode()}, timeout=60)
        assert ei.value.data_code == "too_large" and "append" in ei.value.message, ei.value
        # in chunks: append, then read back by byte ranges
        step = 4 << 20
        for i in range(0, len(eleven), step):
            r = a.c.call("fs.write", {"sandbox": sb, "path": "big.bin", "encoding": "base64", "append": i > 0,
                                      "content": base64.b64encode(eleven[i:i + step]).decode()}, timeout=60)
            assert r["bytes_written"] == len(eleven[i:i + step]) and r["created"] == (i == 0), r
        sha = a.c.call("exec.run", {"sandbox": sb, "command": "sha256sum big.bin"})["stdout"].split()[0]
        assert sha == hashlib.sha256(eleven).hexdigest()
        with pytest.raises(RpcError) as ei:
            a.c.call("fs.read", {"sandbox": sb, "path": "big.bin", "encoding": "base64"}, timeout=60)
        assert ei.value.data_code == "too_large" and "offset and length" in ei.value.message, ei.value
        got, off = b"", 0
        while True:
            r = a.c.call("fs.read", {"sandbox": sb, "path": "big.bin", "encoding": "base64", "offset": off,
                                     "length": 3 << 20}, timeout=60)
            chunk = base64.b64decode(r["content"])
            assert r["offset"] == off and r["length"] == len(chunk) and r["size"] == len(eleven), {k: v for k, v in r.items() if k != "content"}
            got += chunk
            off += len(chunk)
            if r["eof"]:
                break
        assert got == eleven
        # a whole read is at most the cap; past the end is empty and eof
        r = a.c.call("fs.read", {"sandbox": sb, "path": "big.bin", "encoding": "base64", "offset": 1, "length": cap})
        assert r["length"] == cap, r["length"]
        r = a.c.call("fs.read", {"sandbox": sb, "path": "big.bin", "encoding": "base64", "offset": len(eleven) + 5})
        assert r["content"] == "" and r["eof"] is True, r
        with pytest.raises(RpcError) as ei:
            a.c.call("fs.read", {"sandbox": sb, "path": "big.bin", "length": 10})
        assert ei.value.data_code == "invalid_params", ei.value
        # text append
        a.c.call("fs.write", {"sandbox": sb, "path": "log.txt", "content": "one\n", "append": True})
        a.c.call("fs.write", {"sandbox": sb, "path": "log.txt", "content": "two\n", "append": True})
        assert a.c.call("fs.read", {"sandbox": sb, "path": "log.txt"})["content"] == "one\ntwo\n"
    finally:
        assert a.close() == 0, a.stderr()
