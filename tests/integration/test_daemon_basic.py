# test_daemon_basic.py - `conch serve` basics over its JSON-RPC socket (docs/PROTOCOL.md):
# ping, the sandbox lifecycle, exec.run results (exit codes, stdin, env, cwd, timeouts,
# output caps with spill, streaming), state kept between commands, no process outliving its
# command, fresh sandboxes; and the CLI as a client of the daemon (ps, exec, rm).
import os
import time

import pytest

from conftest import CONCH_BIN, conch, unique_marker
from rpcclient import RpcError, wait_gone


def expect_error(fn, code, data_code=None):
    with pytest.raises(RpcError) as ei:
        fn()
    e = ei.value
    assert e.code == code, f"want {code}/{data_code}, got {e}"
    if data_code is not None:
        assert e.data_code == data_code, f"want {data_code}, got {e}"
    return e


def run(rpc, sb, command, rpc_timeout=60, **params):
    """exec.run; params are the method's (timeout= is the command's timeout)."""
    return rpc.call("exec.run", {"sandbox": sb, "command": command, **params}, timeout=rpc_timeout)


def last_line(text):
    return text.rstrip("\n").splitlines()[-1]


def test_ping(daemon, rpc):
    r = rpc.call("daemon.ping", {})
    assert isinstance(r["version"], str) and r["version"], r
    assert r["pid"] == daemon.pid, r
    # pre-built pool sandboxes (--pool) are not the client's: the count matches sandbox.list
    assert r["sandboxes"] == len(rpc.call("sandbox.list", {})["sandboxes"]) == 0, r
    # params may also be omitted
    assert rpc.call("daemon.ping")["pid"] == daemon.pid


def test_sandbox_lifecycle(daemon, rpc, ws):
    (ws / "hello.txt").write_text("hello from host\n")
    (ws / "sub").mkdir()
    (ws / "sub" / "x").write_text("x\n")
    n0 = rpc.call("daemon.ping")["sandboxes"]
    t0 = time.time()
    sb = rpc.call("sandbox.create", {"workspace": str(ws), "name": "lifecycle"})
    assert isinstance(sb["id"], str) and sb["id"], sb
    assert sb["state"] == "running", sb
    assert sb["workspace"] == str(ws), sb
    assert sb["mode"] == "overlay", sb
    assert sb["as_root"] is False, sb
    assert sb["name"] == "lifecycle", sb
    assert sb["commands"] == 0, sb
    assert t0 - 5 < sb["created_at"] < time.time() + 5, sb
    assert t0 - 5 < sb["last_used_at"] < time.time() + 5, sb

    sbs = rpc.call("sandbox.list", {})["sandboxes"]
    assert [s["id"] for s in sbs] == [sb["id"]], sbs
    assert rpc.call("daemon.ping")["sandboxes"] == n0 + 1

    r = run(rpc, sb["id"], "cat hello.txt sub/x; pwd")
    assert r["stdout"] == "hello from host\nx\n/workspace\n", r

    got = rpc.call("sandbox.get", {"id": sb["id"]})
    assert got["id"] == sb["id"] and got["state"] == "running", got
    assert got["commands"] == 1, got
    assert got["last_used_at"] >= sb["last_used_at"], got

    assert rpc.call("sandbox.destroy", {"id": sb["id"]}) == {"destroyed": True}
    expect_error(lambda: rpc.call("sandbox.get", {"id": sb["id"]}), -32002, "sandbox_not_found")
    expect_error(lambda: rpc.call("sandbox.destroy", {"id": sb["id"]}), -32002, "sandbox_not_found")
    expect_error(lambda: run(rpc, sb["id"], "true"), -32002, "sandbox_not_found")
    assert rpc.call("sandbox.list", {})["sandboxes"] == []
    assert rpc.call("daemon.ping")["sandboxes"] == n0
    # its upper dir and the rest of its state are gone from the state dir
    left = [os.path.join(dp, n) for dp, dns, fns in os.walk(daemon.state_dir) for n in dns + fns if sb["id"] in n]
    assert left == [], f"destroyed sandbox left state behind: {left}"
    # the host workspace is untouched
    assert sorted(os.listdir(ws)) == ["hello.txt", "sub"]


def test_sandbox_without_workspace(rpc):
    sb = rpc.call("sandbox.create", {})
    r = run(rpc, sb["id"], "pwd; ls -A /workspace | wc -l; echo x > f; cat f")
    assert r["exit_code"] == 0 and r["stdout"] == "/workspace\n0\nx\n", r
    rpc.call("sandbox.destroy", {"id": sb["id"]})


def test_exec_echo(rpc, sandbox):
    sb = sandbox()
    r = run(rpc, sb, "echo hi")
    assert r["stdout"] == "hi\n", r
    assert r["stderr"] == "", r
    assert r["exit_code"] == 0 and r["signal"] is None and r["timed_out"] is False, r
    assert r["error"] is None, r
    assert r["stdout_bytes"] == 3 and r["stdout_truncated"] is False and r["stdout_spill"] is None, r
    assert r["text"].endswith("[exit code: 0]"), r
    assert r["text"].startswith("hi\n"), r
    assert isinstance(r["duration_ms"], int) and r["duration_ms"] >= 0, r
    assert r["changes"] == [], r


def test_exec_stderr_in_text(rpc, sandbox):
    sb = sandbox()
    r = run(rpc, sb, "echo out; echo err >&2")
    assert r["stdout"] == "out\n" and r["stderr"] == "err\n", r
    t = r["text"]
    assert "out" in t and "err" in t and t.index("out") < t.index("err"), r
    assert t.endswith("[exit code: 0]"), r


def test_exec_nonzero_exit(rpc, sandbox):
    sb = sandbox()
    r = run(rpc, sb, "echo before; exit 3")
    assert r["exit_code"] == 3, r
    assert r["error"] is not None and r["error"]["kind"] == "command", r
    assert r["stdout"] == "before\n", r
    assert r["text"].endswith("[exit code: 3]"), r
    assert r["timed_out"] is False, r


def test_exec_killed_by_signal(rpc, sandbox):
    sb = sandbox()
    r = run(rpc, sb, "kill -KILL $$")
    assert r["signal"] == 9, r
    assert last_line(r["text"]).startswith("[killed by signal 9"), r


def test_exec_stdin(rpc, sandbox):
    sb = sandbox()
    r = run(rpc, sb, "cat; echo; wc -c", stdin="line one\nline two")
    assert r["stdout"] == "line one\nline two\n0\n", r
    # no stdin given: EOF at once (cat must not hang)
    r = run(rpc, sb, "cat; echo done", rpc_timeout=30, timeout=10)
    assert r["stdout"] == "done\n" and r["timed_out"] is False, r


def test_exec_env(rpc, ws, sandbox):
    sb = sandbox(env={"SB_VAR": "from-sandbox", "BOTH": "sandbox"})
    r = run(rpc, sb, 'echo "$SB_VAR|$CMD_VAR|$BOTH"', env={"CMD_VAR": "from-command", "BOTH": "command"})
    assert r["stdout"] == "from-sandbox|from-command|command\n", r
    # per-command env does not stick
    r = run(rpc, sb, 'echo "$SB_VAR|${CMD_VAR-unset}"')
    assert r["stdout"] == "from-sandbox|unset\n", r


def test_exec_cwd(rpc, ws, sandbox):
    (ws / "sub" / "deeper").mkdir(parents=True)
    sb = sandbox()
    assert run(rpc, sb, "pwd")["stdout"] == "/workspace\n"
    assert run(rpc, sb, "pwd", cwd="sub")["stdout"] == "/workspace/sub\n"
    assert run(rpc, sb, "pwd", cwd="/workspace/sub/deeper")["stdout"] == "/workspace/sub/deeper\n"
    assert run(rpc, sb, "pwd", cwd="/tmp")["stdout"] == "/tmp\n"
    # cwd does not persist between commands
    run(rpc, sb, "cd sub")
    assert run(rpc, sb, "pwd")["stdout"] == "/workspace\n"


def test_exec_timeout_with_grace(rpc, sandbox):
    sb = sandbox()
    m = unique_marker("tmo")
    t0 = time.monotonic()
    r = run(rpc, sb, f"trap '' TERM; echo go; exec -a {m} sleep 1000", rpc_timeout=120, timeout=0.5, grace=0.5)
    took = time.monotonic() - t0
    assert r["timed_out"] is True, r
    assert r["error"] is not None and r["error"]["kind"] == "timeout", r
    assert r["stdout"] == "go\n", r
    assert "timed out" in last_line(r["text"]), r
    assert took >= 0.5, f"took {took:.1f}s"  # it waited for its timeout (the 120 s wait catches a hang)
    assert r["signal"] == 9, r  # the command ignored SIGTERM: the grace's end killed it
    assert wait_gone(m) == []


def test_exec_output_cap_spills(daemon, rpc, sandbox):
    sb = sandbox()
    full = "".join(f"{i}\n" for i in range(1, 20001))
    r = run(rpc, sb, "seq 1 20000", max_output=1000)
    assert r["exit_code"] == 0, r
    assert r["stdout_truncated"] is True, r
    assert r["stdout_bytes"] == len(full), r
    assert len(r["stdout"].encode()) < 1000 + 400, len(r["stdout"])
    assert r["stdout"].startswith("1\n2\n"), r["stdout"][:50]
    shown = r["stdout_spill"]
    assert shown and shown.startswith("/run/conch/output/"), r
    assert shown in r["text"], f"text does not name the spill file {shown}:\n{r['text']}"
    # named where fs.* reads it; on the host it is in the sandbox's spill dir
    spill = os.path.join(daemon.state_dir, "sandboxes", sb, "spill", os.path.basename(shown))
    assert os.path.isfile(spill), f"spill file {spill} missing"
    with open(spill) as f:
        assert f.read() == full
    assert os.path.realpath(spill).startswith(os.path.realpath(daemon.state_dir) + "/"), (
        f"spill file {spill} is not under the state dir {daemon.state_dir}"
    )
    assert r["stderr_truncated"] is False and r["stderr_spill"] is None, r
    assert r["text"].endswith("[exit code: 0]"), r


def test_exec_stream(rpc, sandbox):
    sb = sandbox()
    req = rpc.request("exec.run", {"sandbox": sb, "command": "for i in 1 2 3 4; do echo line$i; sleep 0.1; done; echo err >&2", "stream": True})
    resp = rpc.wait(req, 30)
    r = resp["result"]
    assert r["stdout"] == "line1\nline2\nline3\nline4\n", r
    ours = [o[2] for o in rpc.order if o[0] == "notification" and o[1] == "exec.output" and o[2].get("request_id") == req]
    assert ours, f"no exec.output notifications: {rpc.notifications}"
    out = "".join(p["data"] for p in ours if p["stream"] == "stdout")
    err = "".join(p["data"] for p in ours if p["stream"] == "stderr")
    assert out == r["stdout"], ours
    assert err == "err\n", ours
    # every notification of this request came before its response
    pos_resp = rpc.order.index(("response", req))
    pos_last = max(i for i, o in enumerate(rpc.order) if o[0] == "notification" and o[1] == "exec.output" and o[2].get("request_id") == req)
    assert pos_last < pos_resp, rpc.order
    # streaming means while it runs: more than one chunk over 0.4 s
    assert len([p for p in ours if p["stream"] == "stdout"]) >= 2, ours


def test_no_stream_no_notifications(rpc, sandbox):
    sb = sandbox()
    run(rpc, sb, "echo quiet")
    assert [n for n in rpc.notifications if n["method"] == "exec.output"] == []


def test_state_persists_between_commands(rpc, ws, sandbox):
    sb = sandbox()
    r = run(rpc, sb, "echo persisted > state.txt; mkdir -p d; echo tmp > /tmp/t; export NOTKEPT=1")
    assert r["exit_code"] == 0, r
    r = run(rpc, sb, 'cat state.txt; ls -d d; cat /tmp/t; echo "${NOTKEPT-unset}"')
    assert r["stdout"] == "persisted\nd\ntmp\nunset\n", r
    # overlay: the host did not change
    assert not (ws / "state.txt").exists()


def test_background_process_killed_when_command_exits(rpc, sandbox):
    sb = sandbox()
    m = unique_marker("bg")
    # answered when the command ends (timed_out false), not when its timeout (100 s) would
    r = run(rpc, sb, f"(exec -a {m} sleep 1000) & echo started", rpc_timeout=120, timeout=100)
    assert r["stdout"] == "started\n", r
    assert r["timed_out"] is False and r["exit_code"] == 0, r
    assert wait_gone(m) == []
    # the sandbox still works after
    assert run(rpc, sb, "echo ok")["stdout"] == "ok\n"


def test_fresh_runs(rpc, ws):
    (ws / "host.txt").write_text("host\n")
    r = rpc.call("exec.run", {"fresh": True, "command": "ls /workspace/flag 2>/dev/null; echo one > /workspace/flag; echo tmp > /tmp/flag; echo ran"})
    assert r["stdout"] == "ran\n" and r["exit_code"] == 0, r
    r = rpc.call("exec.run", {"fresh": True, "command": "ls /workspace/flag /tmp/flag 2>/dev/null; echo ran2"})
    assert r["stdout"] == "ran2\n", f"a fresh run saw the previous one's files: {r}"
    assert rpc.call("sandbox.list", {})["sandboxes"] == []
    # with a workspace: the host dir is there, overlay keeps the host unchanged
    r = rpc.call("exec.run", {"fresh": True, "workspace": str(ws), "command": "cat host.txt; echo new > new.txt"})
    assert r["stdout"] == "host\n", r
    assert [c["path"] for c in r["changes"]] == ["new.txt"], r
    assert not (ws / "new.txt").exists()
    assert rpc.call("sandbox.list", {})["sandboxes"] == []


def test_exec_bad_sandbox_and_params(rpc):
    expect_error(lambda: rpc.call("exec.run", {"sandbox": "sb-nope", "command": "true"}), -32002, "sandbox_not_found")
    e = expect_error(lambda: rpc.call("exec.run", {"command": "true"}), -32602, "invalid_params")
    assert e.data.get("param") == "sandbox", e


# ---- the CLI as a client --------------------------------------------------------------------


def test_cli_ps_exec_rm(daemon, rpc, ws):
    sb = rpc.call("sandbox.create", {"workspace": str(ws), "name": "cli-test"})["id"]
    r = conch(["ps", "--socket", daemon.sock], timeout=30)
    assert r.rc == 0, r.describe()
    assert sb in r.stdout, r.describe()

    r = conch(["exec", "--socket", daemon.sock, sb, "--", "echo", "hi"], timeout=30)
    assert r.rc == 0, r.describe()
    assert r.stdout == "hi\n", r.describe()

    r = conch(["exec", "--socket", daemon.sock, sb, "--", "bash", "-c", "echo x > f.txt; exit 5"], timeout=30)
    assert r.rc == 5, r.describe()
    # the CLI ran in the same sandbox as the RPC client sees
    assert run(rpc, sb, "cat f.txt")["stdout"] == "x\n"

    r = conch(["rm", "--socket", daemon.sock, sb], timeout=30)
    assert r.rc == 0, r.describe()
    assert rpc.call("sandbox.list", {})["sandboxes"] == []
    r = conch(["exec", "--socket", daemon.sock, sb, "--", "true"], timeout=30)
    assert r.rc != 0, r.describe()


def test_cli_no_daemon(tmp_path):
    from rpcclient import serve_available

    ok, why = serve_available(CONCH_BIN)
    if not ok:
        pytest.skip(f"daemon not available: {why}")
    r = conch(["ps", "--socket", str(tmp_path / "none.sock")], timeout=30)
    assert r.rc != 0, r.describe()
    assert "none.sock" in r.stderr, r.describe()


def _daemon_socket_inodes(sock):
    """Inodes of the daemon's listening socket and of its accepted connections: the unix
    sockets bound to its path, per /proc/net/unix."""
    inodes = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7] == sock:
                inodes.add(parts[6])
    return inodes


def _descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    st = f.read()
            except OSError:
                continue
            children.setdefault(int(st[st.rindex(b")") + 2:].split()[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def test_daemon_sockets_not_inherited_by_sandboxes(daemon, rpc, ws):
    # A sandbox process holding the daemon's listening socket or a client's connection
    # keeps a dead daemon's socket accepting, and keeps clients from seeing EOF.
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    other = daemon.client()
    other.call("daemon.ping")
    rpc.call("job.start", {"sandbox": sb, "command": "sleep 1000"})
    rpc.call("exec.run", {"fresh": True, "command": "true"})
    inodes = _daemon_socket_inodes(daemon.sock)
    assert len(inodes) >= 3, inodes  # listener + our two connections
    leaks = []
    for p in _descendants(daemon.pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                t = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("socket:[") and t[8:-1] in inodes:
                leaks.append((p, fd, t))
    assert leaks == [], f"sandbox-side processes hold the daemon's sockets (pid, fd, socket): {leaks}"


@pytest.mark.root_only
def test_state_dir_under_private_parent(daemon_factory, ws):
    # as root, a state dir below a 0700 directory (say /root/.local/state) must work: the
    # sandbox's mapped users cannot search it, so conch may not rely on them reaching it
    d = daemon_factory(start=False)
    os.chmod(d.base, 0o700)
    d.start()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "echo hi > f; cat f"})
    assert r["stdout"] == "hi\n", r
    assert [x["path"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]] == ["f"]


@pytest.mark.root_only
def test_the_daemons_mount_table_does_not_grow_with_its_sandboxes(daemon_factory, tmp_path):
    """As root the daemon stages each sandbox's workspace and upper dir as binds in its own
    mount namespace for the warden to take; they stayed there for the sandbox's life, so with
    1,000 sandboxes every new warden's clone copied 2,000 mounts (creation 4.5x slower at
    1,000 than at one). They go once the warden reported its setup."""
    d = daemon_factory(extra_args=("--pool", "0"))
    c = d.client()

    def mounts():
        with open(f"/proc/{d.pid}/mountinfo") as f:
            return len(f.read().splitlines())

    ws = tmp_path / "w"
    ws.mkdir()
    first = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    before = mounts()
    ids = [c.call("sandbox.create", {"workspace": str(ws)})["id"] for _ in range(8)]
    assert mounts() <= before, f"{mounts() - before} more mounts in the daemon's namespace for 8 sandboxes"
    # and they all still work, the workspace included
    (ws / "seen.txt").write_text("x\n")
    for sb in [first, *ids]:
        r = c.call("exec.run", {"sandbox": sb, "command": "cat seen.txt; echo new > n.txt"})
        assert r["stdout"] == "x\n" and [ch["path"] for ch in r["changes"]] == ["n.txt"], r
