# test_daemon_recovery.py - `conch serve` killed with SIGKILL mid-command: the sandbox's
# processes must die with it, and a daemon restarted on the same --state-dir must still
# know the sandbox (state "stopped") with its uncommitted workspace changes, which can be
# committed; commands on it are refused with sandbox_stopped. And `conch gc` runs.
import threading
import time

import pytest

from conftest import CONCH_BIN, conch, unique_marker
from rpcclient import RpcError, pids_matching, wait_gone


def expect_stopped(fn):
    with pytest.raises(RpcError) as ei:
        fn()
    assert (ei.value.code, ei.value.data_code) == (-32005, "sandbox_stopped"), ei.value


def test_kill9_then_restart(daemon_factory, ws):
    (ws / "orig.txt").write_text("orig\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "name": "survivor"})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "echo persisted > kept.txt; mkdir -p sub; echo deep > sub/d.txt"})
    assert r["exit_code"] == 0, r
    m = unique_marker("k9")
    out = {}

    def long_command():
        try:
            out["r"] = c.call("exec.run", {"sandbox": sb, "command": f"(exec -a {m}-bg sleep 30) & exec -a {m} sleep 30"}, timeout=60)
        except Exception as e:  # noqa: BLE001 - the connection dies with the daemon
            out["e"] = e

    t = threading.Thread(target=long_command)
    t.start()
    deadline = time.monotonic() + 10
    while len(pids_matching(m)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids_matching(m)) >= 2, "the command did not start"

    d.kill9()
    left = wait_gone(m)
    assert left == [], f"sandbox processes outlived the daemon: {left}"
    t.join(10)
    assert "r" not in out, f"a result arrived from a killed daemon: {out}"
    assert not (ws / "kept.txt").exists()

    d.start()
    c = d.client()
    sbs = c.call("sandbox.list", {})["sandboxes"]
    assert [(s["id"], s["state"]) for s in sbs] == [(sb, "stopped")], sbs
    assert sbs[0]["name"] == "survivor" and sbs[0]["workspace"] == str(ws), sbs
    assert c.call("sandbox.get", {"id": sb})["state"] == "stopped"
    ch = {x["path"]: x["kind"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]}
    assert ch.get("kept.txt") == "added" and ch.get("sub/d.txt") == "added", ch
    diff = c.call("workspace.diff", {"sandbox": sb})["diff"]
    assert "+persisted" in diff.splitlines(), diff

    expect_stopped(lambda: c.call("exec.run", {"sandbox": sb, "command": "true"}))
    expect_stopped(lambda: c.call("job.start", {"sandbox": sb, "command": "true"}))
    expect_stopped(lambda: c.call("fs.read", {"sandbox": sb, "path": "orig.txt"}))

    r = c.call("workspace.commit", {"sandbox": sb, "paths": ["kept.txt"]})
    assert r["committed"] == ["kept.txt"], r
    assert (ws / "kept.txt").read_text() == "persisted\n"
    assert not (ws / "sub").exists()
    assert sorted(x["path"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]) == ["sub", "sub/d.txt"]
    assert sorted(c.call("workspace.discard", {"sandbox": sb})["discarded"]) == ["sub", "sub/d.txt"]

    assert c.call("sandbox.destroy", {"id": sb}) == {"destroyed": True}
    assert c.call("sandbox.list", {})["sandboxes"] == []
    assert (ws / "kept.txt").read_text() == "persisted\n" and (ws / "orig.txt").read_text() == "orig\n"
    # new sandboxes work on the restarted daemon
    sb2 = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    assert c.call("exec.run", {"sandbox": sb2, "command": "cat kept.txt"})["stdout"] == "persisted\n"


def test_restart_after_kill9_twice(daemon_factory, ws):
    # a daemon killed again right after restarting still recovers the same sandbox
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    c.call("exec.run", {"sandbox": sb, "command": "echo a > a.txt"})
    d.kill9()
    d.start()
    d.client().call("daemon.ping")
    d.kill9()
    d.start()
    c = d.client()
    assert [(s["id"], s["state"]) for s in c.call("sandbox.list", {})["sandboxes"]] == [(sb, "stopped")]
    assert [x["path"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]] == ["a.txt"]


def test_gc_cli(daemon_factory, ws):
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    c.call("exec.run", {"sandbox": sb, "command": "echo x > x.txt"})
    d.kill9()
    r = conch(["gc", "--state-dir", d.state_dir], timeout=60)
    assert r.rc == 0, r.describe()
    assert not (ws / "x.txt").exists()
    # the state dir is still usable afterwards
    d.start()
    assert "version" in d.client().call("daemon.ping")


def test_gc_cli_empty_state_dir(tmp_path):
    from rpcclient import serve_available

    ok, why = serve_available(CONCH_BIN)
    if not ok:
        pytest.skip(f"daemon not available: {why}")
    r = conch(["gc", "--state-dir", str(tmp_path / "state")], timeout=60)
    assert r.rc == 0, r.describe()
