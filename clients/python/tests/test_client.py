# test_client.py - the sync Client and Sandbox against the real `conch serve`, over
# --stdio and over a socket: every method family, streaming, errors, binary and big files,
# 50 concurrent commands, and the Sandbox lifecycle.
import os
import threading
import time

import pytest

from conch_client import (AmbiguousMatch, Client, ConchError, ConnectionLost, FileNotFound,
                          InvalidParams, InvalidPath, IsADirectory, JobNotFound, MethodNotFound,
                          NotADirectory, RunResult, Sandbox, SandboxNotFound, StringNotFound,
                          default_socket_path)
from conftest import serve_args


@pytest.fixture
def sb(client):
    s = Sandbox(client, client.sandbox_create(name="pytest"))
    yield s
    if not s.destroyed:
        s.destroy()


def test_ping(client):
    r = client.ping()
    assert r["version"] and isinstance(r["pid"], int) and r["pid"] > 0


def test_sandbox_lifecycle(client, ws):
    info = client.sandbox_create(workspace=ws, name="life", env={"FOO": "bar"})
    sid = info["id"]
    assert info["state"] == "running" and info["workspace"] == ws and info["name"] == "life"
    assert client.sandbox_get(sid)["id"] == sid
    assert sid in [s["id"] for s in client.sandbox_list()]
    assert client.exec_run(sid, "echo $FOO")["stdout"] == "bar\n"
    assert client.sandbox_destroy(sid) == {"destroyed": True}
    with pytest.raises(SandboxNotFound) as ei:
        client.sandbox_get(sid)
    assert ei.value.code == -32002 and ei.value.data_code == "sandbox_not_found"
    assert sid in ei.value.message


def test_exec_run_changes_false_skips_the_list(client, ws):
    sid = client.sandbox_create(workspace=ws)["id"]
    try:
        r = client.exec_run(sid, "echo new > made.txt")
        assert [c["path"] for c in r["changes"]] == ["made.txt"] and r["changes_total"] == 1
        r = client.exec_run(sid, "echo again >> made.txt; cat made.txt", changes=False)
        assert r["stdout"] == "new\nagain\n" and r["exit_code"] == 0
        assert (r["changes"], r["changes_total"], r["changes_truncated"]) == ([], 0, False)
        # The changes are still there, only not listed: the next default run lists them.
        assert [c["path"] for c in client.exec_run(sid, "true")["changes"]] == ["made.txt"]
        with pytest.raises(InvalidParams):
            client.exec_run(sid, "true", changes="no")
    finally:
        client.sandbox_destroy(sid)


def test_exec_run_shell(client):
    sid = client.sandbox_create()["id"]
    try:
        cmd = 'echo $0; [ -n "$BASH_VERSION" ] && echo bash || echo not bash'
        assert client.exec_run(sid, cmd)["stdout"] == "/bin/bash\nbash\n"
        assert client.exec_run(sid, cmd, shell="bash")["stdout"] == "/bin/bash\nbash\n"
        r = client.exec_run(sid, cmd, shell="sh")
        assert (r["stdout"], r["exit_code"]) == ("/bin/sh\nnot bash\n", 0)
        with pytest.raises(InvalidParams) as ei:
            client.exec_run(sid, "true", shell="zsh")
        assert ei.value.data.get("param") == "shell"
    finally:
        client.sandbox_destroy(sid)


def test_run_results(sb):
    r = sb.run("echo out; echo err >&2; exit 3")
    assert isinstance(r, RunResult)
    assert (r.exit_code, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    assert r.error["kind"] == "command" and r.text.endswith("[exit code: 3]")
    assert r.tool_calls == [] and r.raw["stdout_bytes"] == 4
    r = sb.run("pwd; echo $X; cat", env={"X": "y"}, cwd="/tmp", stdin="from stdin")
    assert r.ok and r.stdout == "/tmp\ny\nfrom stdin"
    r = sb.run("sleep 5", timeout=0.3)
    assert r.timed_out and r.error["kind"] == "timeout" and not r.ok


def test_streaming_output(client, sb):
    chunks = []
    r = sb.run("for i in 1 2 3; do echo line $i; sleep 0.05; done; echo bad >&2",
               on_output=lambda stream, data: chunks.append((stream, data)))
    assert r.exit_code == 0
    out = "".join(d for s, d in chunks if s == "stdout")
    err = "".join(d for s, d in chunks if s == "stderr")
    assert out == "line 1\nline 2\nline 3\n" == r.stdout and err == "bad\n"
    assert len(chunks) >= 2


def test_run_fresh(client):
    r = client.exec_run(None, "id -un; echo $HOME", fresh=True)
    assert r["exit_code"] == 0 and r["stdout"].endswith("\n")


def test_jobs(client, sb):
    exited = client.subscribe("job.exited")
    job = sb.start("echo tick; sleep 0.2; echo tock >&2; exit 4")
    assert job.job_id.startswith("job-")
    w = job.wait(10)
    assert w["running"] is False and w["exit_code"] == 4
    o = job.output()
    assert o["stdout"] == "tick\n" and o["stderr"] == "tock\n" and o["stdout_offset"] == 5
    assert job.output(stdout_offset=2)["stdout"] == "ck\n"
    assert job.job_id in [j["job_id"] for j in sb.jobs()]
    n = exited.get(timeout=10)
    assert n.params["job_id"] == job.job_id and n.params["exit_code"] == 4
    long = sb.start("sleep 30")
    assert long.kill("KILL") == {"killed": True}
    w = long.wait(10)
    assert w["running"] is False and w["signal"] == 9
    with pytest.raises(JobNotFound):
        client.job_wait("job-nope", 1)


def test_fs(client, sb):
    assert sb.write("a/b/c.txt", "one\ntwo\nthree\n") == {"bytes_written": 14, "created": True}
    assert sb.read("a/b/c.txt") == "one\ntwo\nthree\n"
    assert sb.read("/workspace/a/b/c.txt", offset=1, limit=1) == "two\n"
    r = client.fs_read(sb.id, "a/b/c.txt", limit=1)
    assert r["truncated"] is True and r["total_lines"] == 3
    assert sb.edit("a/b/c.txt", "two", "TWO") == 1
    with pytest.raises(StringNotFound):
        sb.edit("a/b/c.txt", "nothere", "x")
    sb.write("dup.txt", "x x x")
    with pytest.raises(AmbiguousMatch) as ei:
        sb.edit("dup.txt", "x", "y")
    assert ei.value.occurrences == 3
    assert sb.edit("dup.txt", "x", "y", replace_all=True) == 3
    assert sb.read("dup.txt") == "y y y"
    names = [e["name"] for e in sb.ls()]
    assert names == sorted(names) and "a" in names and "dup.txt" in names
    assert sb.ls("a/b")[0]["type"] == "f"
    assert sb.glob("**/*.txt") == ["/workspace/a/b/c.txt", "/workspace/dup.txt"]
    m = sb.grep("TW+O")
    assert m == [{"path": "/workspace/a/b/c.txt", "line": 2, "text": "TWO"}]
    assert sb.grep("two", ignore_case=True, glob="*.txt")[0]["line"] == 2
    assert sb.grep("y y", fixed_string=True)[0]["path"] == "/workspace/dup.txt"
    sb.delete("dup.txt")
    with pytest.raises(FileNotFound) as ei:
        sb.read("dup.txt")
    assert ei.value.code == -32010 and ei.value.kind == "usage"
    with pytest.raises(IsADirectory):
        sb.read("a")
    with pytest.raises(IsADirectory):
        sb.delete("a")
    sb.delete("a", recursive=True)
    sb.write("f", "x")
    with pytest.raises(NotADirectory):
        sb.ls("f")
    with pytest.raises(InvalidPath):
        sb.read("bad\x00name")  # fs.* reach the whole sandbox: only malformed paths are invalid


def test_binary_and_upload_download(sb):
    data = bytes(range(256)) * 4 + b"\x00\x00\xff"
    sb.upload("bin/blob", data)
    assert sb.download("bin/blob") == data
    assert sb.run("wc -c < bin/blob").stdout.strip() == str(len(data))
    sb.write("raw.bin", b"\x00\x01\xfe\xff")
    assert sb.download("raw.bin") == b"\x00\x01\xfe\xff"
    res = sb.upload_many({"m/1": b"one", "m/2": b"\x00two"})
    assert res == {"m/1": None, "m/2": None}
    got = sb.download_many(["m/1", "m/2", "missing"])
    assert got["m/1"] == b"one" and got["m/2"] == b"\x00two"
    assert isinstance(got["missing"], FileNotFound)
    with pytest.raises(FileNotFound):
        sb.download("missing")


def test_big_file(sb):
    data = os.urandom(8 << 20)  # 8 MiB of random bytes, ~11 MiB of base64 each way
    t0 = time.time()
    sb.upload("big.bin", data)
    back = sb.download("big.bin")
    took = time.time() - t0
    assert back == data
    assert sb.run("sha256sum big.bin").stdout.split()[0] == __import__("hashlib").sha256(data).hexdigest()
    print(f"8 MiB upload+download: {took:.2f} s")


def test_workspace_changes_and_diff_since_a_snapshot(client, ws):
    with Sandbox.create(client, workspace=ws) as sb:
        sb.write("hello.txt", "at the snapshot\n")
        snap = client.workspace_snapshot(sb.id, name="py-since-" + sb.id)
        sb.write("hello.txt", "after\n")
        sb.write("later.txt", "later\n")
        ch = {c["path"]: c["kind"] for c in sb.changes(since=snap["id"])}
        assert ch == {"hello.txt": "modified", "later.txt": "added"}
        # Against the host, hello.txt is modified and src/ untouched, as before.
        assert {c["path"] for c in sb.changes()} == {"hello.txt", "later.txt"}
        d = sb.diff(since=snap["name"])
        assert "-at the snapshot\n+after" in d and "-hello" not in d
        assert "later" not in sb.diff(["hello.txt"], since=snap["id"])
        page = client.workspace_changes(sb.id, since=snap["id"], limit=1)
        assert page["changes_total"] == 2 and len(page["changes"]) == 1
        r = client.workspace_diff(sb.id, ["later.txt"], since=snap["id"])
        assert [f["path"] for f in r["files"]] == ["later.txt"]
        with pytest.raises(ConchError) as ei:
            sb.changes(since="no-such-snapshot")
        assert ei.value.code == -32602 and "no-such-snapshot" in str(ei.value)


def test_workspace(client, ws):
    with Sandbox.create(client, workspace=ws) as sb:
        sb.write("hello.txt", "hello\nthere\n")
        sb.write("new.txt", "fresh\n")
        sb.run("rm src/main.py")
        ch = {c["path"]: c["kind"] for c in sb.changes()}
        assert ch == {"hello.txt": "modified", "new.txt": "added", "src/main.py": "deleted"}
        d = sb.diff()
        assert "+there" in d and "-world" in d and "+++ b/new.txt" in d
        assert "+fresh" in sb.diff(["new.txt"]) and "there" not in sb.diff(["new.txt"])
        r = sb.commit(["new.txt"])
        assert r["committed"] == ["new.txt"]
        assert open(os.path.join(ws, "new.txt")).read() == "fresh\n"
        assert sorted(sb.discard()) == ["hello.txt", "src/main.py"]
        assert sb.changes() == []
        assert sb.read("hello.txt") == "hello\nworld\n"
    assert os.path.exists(os.path.join(ws, "src", "main.py"))


def test_sandbox_context_manager_commit_keep_and_failure(client, ws):
    with Sandbox.create(client, workspace=ws, on_exit="commit") as sb:
        sb.write("committed.txt", "yes\n")
    assert open(os.path.join(ws, "committed.txt")).read() == "yes\n"
    with pytest.raises(SandboxNotFound):
        client.sandbox_get(sb.id)  # destroyed on exit
    with pytest.raises(RuntimeError):
        with Sandbox.create(client, workspace=ws, on_exit="commit") as sb2:
            sb2.write("not-committed.txt", "no\n")
            raise RuntimeError("the agent failed")
    assert not os.path.exists(os.path.join(ws, "not-committed.txt"))
    with Sandbox.create(client, workspace=ws, keep=True) as sb3:
        sb3.write("kept.txt", "k")
    assert client.sandbox_get(sb3.id)["state"] == "running"
    assert not os.path.exists(os.path.join(ws, "kept.txt"))
    assert Sandbox(client, {"id": sb3.id}).read("kept.txt") == "k"
    client.sandbox_destroy(sb3.id)


def test_errors(client, sb):
    with pytest.raises(MethodNotFound) as ei:
        client.call("no.such", {})
    assert ei.value.code == -32601 and ei.value.kind == "usage"
    with pytest.raises(InvalidParams) as ei:
        client.exec_run(sb.id, "true", timeout=-1)
    assert ei.value.param == "timeout" and ei.value.code == -32602
    with pytest.raises(InvalidParams):
        client.call("exec.run", {"sandbox": sb.id, "command": 5})
    with pytest.raises(SandboxNotFound):
        client.exec_run("sb-missing", "true")
    # the client is still fine afterwards
    assert sb.run("echo ok").stdout == "ok\n"


def meet(n, where, i):
    """A command that announces itself in the sandbox's /tmp/@where and waits until @n have
    (60 s at most), then prints @i; alone (run one after the other) it prints "alone"."""
    return (f"mkdir -p /tmp/{where}; touch /tmp/{where}/{i}; "
            f"for t in $(seq 600); do [ $(ls /tmp/{where} | wc -l) -ge {n} ] && break; sleep 0.1; done; "
            f"if [ $(ls /tmp/{where} | wc -l) -ge {n} ]; then echo {i}; else echo alone; fi")


def test_fifty_concurrent_runs(client, sb):
    results = [None] * 50
    errors = []

    def one(i):
        try:
            results[i] = sb.run(meet(50, "meet50", i), timeout=100)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    # all 50 met at the barrier: they ran at once (run in turn, the first says "alone")
    assert errors == []
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(50)]


def test_sandbox_create_spawns_private_daemon(conch_bin, state_dir):
    with Sandbox.create(conch_bin=conch_bin, state_dir=state_dir) as sb:
        assert sb.owns_client and sb.run("echo private").stdout == "private\n"
        proc = sb.client.process
    assert sb.client.closed
    assert proc.wait(10) == 0  # the private daemon exited when the sandbox closed


def test_conch_bin_from_env(conch_bin, state_dir, monkeypatch):
    monkeypatch.setenv("CONCH_BIN", conch_bin)
    with Client.spawn(state_dir=state_dir, serve_args=serve_args()) as c:
        assert c.ping()["pid"] == c.process.pid
    with pytest.raises(ConnectionLost):
        c.ping()
    from conch_client import find_conch_bin
    monkeypatch.delenv("CONCH_BIN")
    monkeypatch.setenv("PATH", os.path.dirname(conch_bin) + os.pathsep + os.environ["PATH"])
    assert find_conch_bin() == conch_bin
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConnectionLost) as ei:
        Client.spawn(state_dir=state_dir)
    assert "CONCH_BIN" in ei.value.message


def test_connect_to_the_default_socket(conch_bin, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("as root the default socket is /run/conch/conch.sock, shared with others")
    import subprocess
    import tempfile
    rt = tempfile.mkdtemp(prefix="cc-rt-")
    os.chmod(rt, 0o700)
    monkeypatch.delenv("CONCH_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", rt)
    p = subprocess.Popen([conch_bin, "serve", "--state-dir", os.path.join(rt, "state"),
                          *serve_args()], stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while not os.path.exists(default_socket_path()) and time.time() < deadline:
            time.sleep(0.02)
        assert default_socket_path() == os.path.join(rt, "conch", "conch.sock")
        with Client.connect() as c:
            assert c.ping()["pid"] == p.pid
    finally:
        p.terminate()
        p.wait(20)
        import shutil
        shutil.rmtree(rt, ignore_errors=True)


def test_daemon_exit_fails_pending_calls(conch_bin, state_dir):
    c = Client.spawn(conch_bin, state_dir=state_dir, serve_args=serve_args())
    sid = c.sandbox_create()["id"]
    box = {}

    def waiting():
        try:
            c.exec_run(sid, "sleep 30")
        except ConchError as e:
            box["e"] = e
    th = threading.Thread(target=waiting)
    th.start()
    time.sleep(0.5)
    c.process.kill()
    th.join(20)
    assert isinstance(box.get("e"), ConnectionLost)
    c.close()


def test_default_socket_path(monkeypatch):
    monkeypatch.delenv("CONCH_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    if os.geteuid() == 0:
        assert default_socket_path() == "/run/conch/conch.sock"
    else:
        assert default_socket_path() == "/run/user/1234/conch/conch.sock"
        monkeypatch.delenv("XDG_RUNTIME_DIR")
        assert default_socket_path() == f"/tmp/conch-{os.getuid()}/conch.sock"
    monkeypatch.setenv("CONCH_SOCKET", "/x/y.sock")
    assert default_socket_path() == "/x/y.sock"


def test_connect_refuses_missing_and_foreign_sockets(tmp_path):
    with pytest.raises(ConnectionLost) as ei:
        Client.connect(str(tmp_path / "none.sock"))
    assert "none.sock" in ei.value.message
    if os.geteuid() != 0:
        pytest.skip("making a socket owned by another user needs root")
    import socket
    p = str(tmp_path / "foreign.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(p)
    s.listen()
    os.chown(p, 65534, 65534)
    try:
        with pytest.raises(ConnectionLost) as ei:
            Client.connect(p)
        assert "owned by uid 65534" in ei.value.message
    finally:
        s.close()


def test_message_too_large_is_answered_not_hung(conch_bin, state_dir):
    # the request's id goes before its params, so the daemon can name it in its answer
    with Client.spawn(conch_bin, state_dir=state_dir,
                      serve_args=serve_args() + ["--max-message", "1048576"], timeout=60) as c:
        sb = Sandbox(c, c.sandbox_create())
        from conch_client import MessageTooLarge
        with pytest.raises(MessageTooLarge) as ei:
            sb.write("big.txt", "x" * (2 << 20))
        assert ei.value.code == -32600 and ei.value.data.get("limit") == 1048576
        assert sb.run("echo still fine").stdout == "still fine\n"


def test_block_error_is_not_masked_when_the_daemon_is_gone(conch_bin, state_dir):
    c = Client.spawn(conch_bin, state_dir=state_dir, serve_args=serve_args())
    with pytest.raises(KeyError):
        with Sandbox.create(c, on_exit="discard"):
            c.process.kill()
            c.process.wait()
            raise KeyError("the caller's own error")
    c.close()
    c = Client.spawn(conch_bin, state_dir=state_dir, serve_args=serve_args())
    with pytest.raises(ConnectionLost):  # without a block error, the failure shows
        with Sandbox.create(c):
            c.process.kill()
            c.process.wait()
    c.close()


def test_store_methods(client):
    name = f"py-{os.getpid()}-{time.time_ns()}"
    info = client.sandbox_create(mounts=[{"type": "store", "name": name, "target": "/mem"}])
    try:
        r = client.exec_run(info["id"], "mkdir -p /mem/d && echo inside > /mem/d/f")
        assert r["stores"][0]["written"] == 2 and r["stores"][0]["name"] == name
        assert client.store_read(name, "d/f")["content"] == "inside\n"
        client.store_write(name, "host.bin", "AAE=", encoding="base64", mode=0o600)
        got = client.store_read(name, "host.bin")
        assert (got["content"], got["encoding"], got["mode"]) == ("AAE=", "base64", 0o600)
        assert client.exec_run(info["id"], "od -An -tx1 /mem/host.bin")["stdout"].split() == ["00", "01"]
        assert [e["name"] for e in client.store_ls(name)["entries"]] == ["d", "host.bin"]
        client.store_delete(name, "d")
        assert [e["name"] for e in client.store_ls(name)["entries"]] == ["host.bin"]
        assert name in [s["name"] for s in client.store_list()["stores"]]
        with pytest.raises(FileNotFound):
            client.store_read(name, "d/f")
        with pytest.raises(InvalidPath):
            client.store_read(name, "../x")
    finally:
        client.sandbox_destroy(info["id"])
