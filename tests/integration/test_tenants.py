# test_tenants.py - tenants in the daemon (issue 21): `conch serve --tokens FILE`,
# connection.auth on the unix socket, what a tenant's connection may see and reach (another
# tenant's ids answer exactly as unknown ones), the host paths and resources refused to it,
# quotas, failed authentications rate-limited and logged, the tokens file reloaded on SIGHUP
# and checked for its mode, ownership surviving a restart, and the token never in the log.
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import CONCH_BIN
from rpcclient import Client, RpcError

TOK_A = "alice-token-0123456789abcdef"
TOK_B = "bob-token-0123456789abcdef00"
TOK_ADMIN = "admin-token-0123456789abcdef"
TOK_Q = "quota-token-0123456789abcdef"


def write_tokens(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


TOKENS = (f"# tenants of the test\nalice {TOK_A}\nbob {TOK_B}\nadmin {TOK_ADMIN}\n"
          f"quota {TOK_Q} sandboxes=2 memory=256M disk=64M commands=1\n")


@pytest.fixture
def tenants(daemon_factory, tmp_path):
    """(daemon, tokens path, auth(token) -> an authenticated client)."""
    path = tmp_path / "tokens"
    write_tokens(path, TOKENS)
    d = daemon_factory(extra_args=["--tokens", str(path), "--pool", "0"])

    def auth(token, peer=None):
        c = d.client()
        p = {"token": token}
        if peer:
            p["peer"] = peer
        c.call("connection.auth", p)
        return c

    return d, path, auth


def err_of(c, method, params, timeout=30):
    with pytest.raises(RpcError) as ei:
        c.call(method, params, timeout=timeout)
    return ei.value


def whole_error(c, method, params, timeout=30):
    """The whole error object of the response (not only its code)."""
    resp = c.wait(c.request(method, params), timeout)
    assert "error" in resp, f"{method} {params}: expected an error, got {resp}"
    return resp["error"]


def test_wrong_token_then_good_token(tenants):
    d, _, auth = tenants
    c = d.client()
    e = whole_error(c, "connection.auth", {"token": "not-a-token-of-anyone-here"})
    assert e["code"] == -32020 and e["message"] == "unauthorized"
    assert e["data"]["code"] == "unauthorized"
    # an unknown token of a known length, a prefix of a good one: the same answer
    e2 = whole_error(c, "connection.auth", {"token": TOK_A[:-1] + "X"})
    assert e2 == e
    r = c.call("connection.auth", {"token": TOK_A})
    assert r == {"tenant": "alice", "admin": False}
    # once authenticated, for good: another token, good or bad, is refused alike (and not
    # counted); its own again is answered as the first time
    e = whole_error(c, "connection.auth", {"token": TOK_B})
    e2 = whole_error(c, "connection.auth", {"token": "not-a-token-of-anyone-here"})
    assert e["code"] == -32022 and e["data"]["code"] == "forbidden" and e == e2
    assert c.call("connection.auth", {"token": TOK_A}) == {"tenant": "alice", "admin": False}
    assert c.call("daemon.ping", {})["tenant"] == "alice"
    a = auth(TOK_ADMIN)
    assert a.call("daemon.ping", {})["tenant"] == "admin"
    # the admin sees all, but is a remote client too: no host paths
    e = err_of(a, "sandbox.create", {"workspace": "/tmp"})
    assert e.code == -32022


def test_no_tokens_file_auth_fails(daemon):
    c = daemon.client()
    e = err_of(c, "connection.auth", {"token": TOK_A})
    assert e.code == -32020 and e.message == "unauthorized"
    # the connection is still the owner's
    assert "pid" in c.call("daemon.ping", {})


def test_token_never_logged(tenants):
    d, _, auth = tenants
    auth(TOK_A)
    c = d.client()
    with pytest.raises(RpcError):
        c.call("connection.auth", {"token": TOK_B + "wrong", "peer": "10.0.0.9:5555"})
    time.sleep(0.2)
    log = d.log()
    assert "10.0.0.9:5555" in log and "authentication failed" in log
    # a peer is data: no line of its own in the log
    with pytest.raises(RpcError):
        c.call("connection.auth", {"token": "wrong-token-wrong-token", "peer": "p'\nFORGED line"})
    time.sleep(0.2)
    assert "\nFORGED" not in d.log() and "p??FORGED line" in d.log()
    for t in (TOK_A, TOK_B, TOK_ADMIN, TOK_Q, TOK_B + "wrong"):
        assert t not in log
        assert t[:16] not in log


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o610])
def test_bad_file_mode_refused(tmp_path, mode):
    path = tmp_path / "tokens"
    write_tokens(path, TOKENS, mode)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--tokens", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0
    assert "chmod 600" in p.stderr and str(path) in p.stderr
    assert TOK_A not in p.stderr


@pytest.mark.parametrize("text,why", [
    ("alice short\n", "a token is 16"),
    (f"alice {TOK_A}\nalice {TOK_B}\n", "given twice"),
    (f"alice {TOK_A}\nbob {TOK_A}\n", "has the token of tenant"),
    (f"alice {TOK_A} cpu=4\n", "unknown quota"),
    (f"alice {TOK_A} memory=lots\n", "memory=lots"),
    ("# nothing\n", "names no tenant"),
    (f"al/ice {TOK_A}\n", "tenant name"),
])
def test_bad_file_refused(tmp_path, text, why):
    path = tmp_path / "tokens"
    write_tokens(path, text)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--tokens", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0 and why in p.stderr, p.stderr
    assert TOK_A not in p.stderr and TOK_B not in p.stderr


def test_symlink_refused(tmp_path):
    real = tmp_path / "real"
    write_tokens(real, TOKENS)
    link = tmp_path / "tokens"
    os.symlink(real, link)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--tokens", str(link)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0 and "symlink" in p.stderr


def test_rate_limited_per_peer(tenants):
    d, _, auth = tenants
    c = d.client()
    for _ in range(10):
        e = err_of(c, "connection.auth", {"token": "x" * 20, "peer": "192.0.2.1:1"})
        assert e.code == -32020
    # the 11th, even with a good token: rate-limited
    e = err_of(c, "connection.auth", {"token": TOK_A, "peer": "192.0.2.1:1"})
    assert e.code == -32021 and e.data_code == "rate_limited"
    # another peer is not
    assert auth(TOK_A, peer="192.0.2.2:1").call("daemon.ping", {})["tenant"] == "alice"


def test_ipv6_peers_rate_limited_by_their_64(tenants):
    """The attack's finding: an IPv6 client spread its failures over the addresses of its /64
    (2^64 of them), each a peer of its own. A /64 counts as one peer now; the next /64 not."""
    d, _, auth = tenants
    c = d.client()
    for i in range(10):
        e = err_of(c, "connection.auth", {"token": "x" * 20, "peer": f"2001:db8:1:2::{i + 1:x}"})
        assert e.code == -32020
    e = err_of(c, "connection.auth", {"token": TOK_A, "peer": "2001:db8:1:2:ffff::9"})
    assert e.code == -32021 and e.data_code == "rate_limited", e
    assert auth(TOK_A, peer="2001:db8:1:3::1").call("daemon.ping", {})["tenant"] == "alice"


def test_sighup_reload(tenants, tmp_path):
    d, path, auth = tenants
    b = auth(TOK_B)
    old_a = auth(TOK_A)
    adm = auth(TOK_ADMIN)
    new_a = "alice-new-token-fedcba9876543210"
    write_tokens(path, f"alice {new_a}\nadmin {TOK_ADMIN}\n")
    os.kill(d.pid, signal.SIGHUP)

    def old_refused():
        c = Client.unix(d.sock)
        try:
            c.call("connection.auth", {"token": TOK_A, "peer": "reload-check"})
            return False
        except RpcError:
            return True
        finally:
            c.close()

    deadline = time.monotonic() + 30  # a reload is at once; a loaded machine waits
    while not old_refused():
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.1)
    assert auth(new_a).call("daemon.ping", {})["tenant"] == "alice"
    # bob is gone from the file, alice's token changed: their connections were closed; the
    # admin's token is the same: its connection stays
    b.wait_eof(timeout=30)
    old_a.wait_eof(timeout=30)
    assert adm.call("daemon.ping", {})["tenant"] == "admin"
    # a bad file on reload keeps the table in force, and says why
    write_tokens(path, f"alice {new_a}\n", 0o644)
    os.kill(d.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30  # a reload is at once; a loaded machine waits
    while "not reloaded" not in d.log():
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.1)
    assert auth(TOK_ADMIN).call("daemon.ping", {})["tenant"] == "admin"
    assert d.proc.poll() is None
    log = d.log()
    for t in (TOK_A, TOK_B, TOK_ADMIN, TOK_Q, new_a):
        assert t[:16] not in log


# ---- isolation ---------------------------------------------------------------------------

REPO_SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src", "daemon")


def table_methods():
    """Every method of the daemon's table (methods.c), so that a new one fails
    test_every_method_against_another_tenants_ids until it is covered here."""
    import re
    with open(os.path.join(REPO_SRC, "methods.c")) as f:
        return re.findall(r'^\s*\{"([a-z_.]+)", p_', f.read(), re.M)


def normalize(resp, pairs):
    """The response as JSON text with each (real, fake) id replaced by one placeholder."""
    import json
    text = json.dumps(resp.get("error", resp.get("result")), sort_keys=True)
    for i, (real, fake) in enumerate(pairs):
        text = text.replace(real, f"<ID{i}>").replace(fake, f"<ID{i}>")
    return text


def fake_of(real):
    return real[:-4] + ("zzzz" if not real.endswith("zzzz") else "yyyy")


@pytest.fixture
def two_tenants(tenants):
    """alice with a sandbox, a job, a session, a snapshot, a store; bob with a sandbox."""
    d, path, auth = tenants
    a, b = auth(TOK_A), auth(TOK_B)
    sa = a.call("sandbox.create", {"name": "mine",
                                   "mounts": [{"type": "store", "name": "mem", "target": "/mem"}]},
                timeout=60)["id"]
    sb = b.call("sandbox.create", {}, timeout=60)["id"]
    a.call("fs.write", {"sandbox": sa, "path": "/workspace/secret", "content": "alice's"})
    snap = a.call("workspace.snapshot", {"sandbox": sa, "name": "alice-snap"}, timeout=60)["id"]
    a.call("fs.write", {"sandbox": sa, "path": "/tmp/secret", "content": "alice's"})
    job = a.call("job.start", {"sandbox": sa, "command": "sleep 60"})["job_id"]
    ses = a.call("session.open", {"sandbox": sa})["session"]
    a.call("store.write", {"store": "mem", "path": "/note", "content": "alice's note"})
    return d, a, b, {"SB": sa, "JOB": job, "SES": ses, "SNAP": snap, "SNAPNAME": "alice-snap",
                     "BSB": sb}


def templates(ids):
    SB, JOB, SES, SNAP, BSB = ids["SB"], ids["JOB"], ids["SES"], ids["SNAP"], ids["BSB"]
    SNAPNAME = ids["SNAPNAME"]
    tool = [{"name": "t1", "description": "d", "input_schema": {"type": "object"}}]
    # (method, params); destructive ones last
    return [
        ("sandbox.get", {"id": SB}),
        ("sandbox.start", {"id": SB}),
        ("exec.run", {"sandbox": SB, "command": "cat /tmp/secret"}),
        ("exec.signal", {"sandbox": SB, "request_id": 1}),
        ("job.start", {"sandbox": SB, "command": "true"}),
        ("job.output", {"job_id": JOB}),
        ("job.wait", {"job_id": JOB, "timeout": 0.01}),
        ("job.list", {"sandbox": SB}),
        ("fs.read", {"sandbox": SB, "path": "/tmp/secret"}),
        ("fs.write", {"sandbox": SB, "path": "/tmp/x", "content": "bob"}),
        ("fs.edit", {"sandbox": SB, "path": "/tmp/secret", "old_string": "a", "new_string": "b"}),
        ("fs.ls", {"sandbox": SB, "path": "/tmp"}),
        ("fs.glob", {"sandbox": SB, "pattern": "*"}),
        ("fs.grep", {"sandbox": SB, "pattern": "alice"}),
        ("fs.upload", {"sandbox": SB, "files": [{"path": "/tmp/u", "content": "x"}]}),
        ("fs.download", {"sandbox": SB, "paths": ["/tmp/secret"]}),
        ("fs.copy_in", {"sandbox": SB, "path": "/tmp/c", "host_path": "/etc/hostname", "host_id": "x"}),
        ("fs.copy_out", {"sandbox": SB, "path": "/tmp/secret", "host_path": "/tmp/o", "host_id": "x"}),
        ("workspace.changes", {"sandbox": SB}),
        ("workspace.diff", {"sandbox": SB}),
        ("workspace.commit", {"sandbox": SB}),
        ("workspace.snapshots", {"sandbox": SB}),
        ("workspace.snapshot", {"sandbox": SB}),
        ("workspace.restore", {"sandbox": SB, "snapshot": SNAP}),
        ("workspace.restore", {"sandbox": BSB, "snapshot": SNAP}),
        ("workspace.restore", {"sandbox": BSB, "snapshot": SNAPNAME}),
        ("workspace.diff", {"sandbox": BSB, "since": SNAP}),
        ("workspace.changes", {"sandbox": BSB, "since": SNAPNAME}),
        ("sandbox.fork", {"snapshot": SNAPNAME}),
        ("sandbox.fork", {"sandbox": SB}),
        ("sandbox.fork", {"snapshot": SNAP}),
        ("sandbox.fork", {"sandbox": SB, "snapshot": SNAP}),
        ("tools.register", {"sandbox": SB, "tools": tool}),
        ("tools.unregister", {"sandbox": SB, "names": ["t1"]}),
        ("tools.list", {"sandbox": SB}),
        ("tools.trace", {"sandbox": SB}),
        ("tools.prompt", {"sandbox": SB}),
        ("agents.register", {"sandbox": SB, "agents": [{"name": "a1", "description": "d"}]}),
        ("agents.unregister", {"sandbox": SB, "names": ["a1"]}),
        ("session.open", {"sandbox": SB}),
        ("session.run", {"session": SES, "command": "cat /tmp/secret"}),
        ("session.write", {"session": SES, "data": "echo hi\n"}),
        ("session.attach", {"session": SES}),
        ("session.detach", {"session": SES}),
        ("session.resize", {"session": SES, "rows": 10, "cols": 20}),
        ("session.signal", {"session": SES}),
        ("session.list", {"sandbox": SB}),
        ("js.eval", {"sandbox": SB, "code": "1+1"}),
        ("js.reset", {"sandbox": SB}),
        ("js.list", {"sandbox": SB}),
        ("js.close", {"sandbox": SB}),
        ("network.log", {"sandbox": SB}),
        ("network.set", {"sandbox": SB, "net": "none"}),
        ("sandbox.lease", {"workspace": "/tmp"}),
        ("sandbox.release", {}),
        ("fs.delete", {"sandbox": SB, "path": "/tmp/secret"}),
        ("workspace.discard", {"sandbox": SB}),
        ("job.kill", {"job_id": JOB}),
        ("session.close", {"session": SES}),
        ("workspace.snapshot_delete", {"snapshot": SNAP}),
        ("sandbox.destroy", {"id": SB}),
    ]


def swap(params, ids):
    """@params with each id replaced by its fake."""
    import json
    text = json.dumps(params)
    for real in ids.values():
        text = text.replace(real, fake_of(real))
    return json.loads(text)


def test_every_method_against_another_tenants_ids(two_tenants):
    d, a, b, ids = two_tenants
    covered = {m for m, _ in templates(ids)}
    # no id to aim at: checked by the tests below
    covered |= {"daemon.ping", "connection.auth", "sandbox.create", "sandbox.list",
                "store.list", "store.ls", "store.read", "store.write", "store.delete"}
    missing = set(table_methods()) - covered
    assert not missing, f"methods not tried against another tenant's ids: {missing}"
    pairs = [(real, fake_of(real)) for k, real in ids.items() if k != "BSB"]
    for method, params in templates(ids):
        real = b.wait(b.request(method, params), 60)
        fake = b.wait(b.request(method, swap({k: v for k, v in params.items()},
                                             {k: v for k, v in ids.items() if k != "BSB"})), 60)
        assert normalize(real, pairs) == normalize(fake, pairs), \
            f"{method} {params}: another tenant's id answers {real}, an unknown one {fake}"
        if "result" in real:
            # only lists may answer, and they must be empty of alice's
            import json
            assert not any(v in json.dumps(real["result"]) for k, v in ids.items() if k != "BSB"), \
                f"{method}: {real}"
    # alice's things are untouched
    assert a.call("sandbox.get", {"id": ids["SB"]})["state"] == "running"
    assert a.call("fs.read", {"sandbox": ids["SB"], "path": "/tmp/secret"})["content"] == "alice's"
    assert a.call("job.output", {"job_id": ids["JOB"]})["running"]
    assert any(s["session"] == ids["SES"] for s in a.call("session.list", {})["sessions"])
    assert any(s["id"] == ids["SNAP"] for s in a.call("workspace.snapshots", {})["snapshots"])
    assert not b.call("fs.ls", {"sandbox": ids["BSB"], "path": "/tmp"}).get("entries") or \
        all(e.get("name") != "secret" for e in b.call("fs.ls", {"sandbox": ids["BSB"], "path": "/tmp"})["entries"])


def test_lists_filtered(two_tenants):
    d, a, b, ids = two_tenants
    la = [s["id"] for s in a.call("sandbox.list", {})["sandboxes"]]
    lb = [s["id"] for s in b.call("sandbox.list", {})["sandboxes"]]
    assert ids["SB"] in la and ids["BSB"] not in la
    assert lb == [ids["BSB"]]
    assert b.call("job.list", {})["jobs"] == []
    assert [j["job_id"] for j in a.call("job.list", {})["jobs"]] == [ids["JOB"]]
    assert b.call("session.list", {})["sessions"] == []
    assert b.call("workspace.snapshots", {})["snapshots"] == []
    assert b.call("daemon.ping", {})["sandboxes"] == 1
    assert "state_dir" not in b.call("daemon.ping", {})
    # the owner's connection and the admin see both, each with its tenant
    owner = d.client()
    by_id = {s["id"]: s for s in owner.call("sandbox.list", {})["sandboxes"]}
    assert by_id[ids["SB"]]["tenant"] == "alice" and by_id[ids["BSB"]]["tenant"] == "bob"
    adm = d.client()
    adm.call("connection.auth", {"token": TOK_ADMIN})
    assert {ids["SB"], ids["BSB"]} <= {s["id"] for s in adm.call("sandbox.list", {})["sandboxes"]}
    assert adm.call("sandbox.get", {"id": ids["SB"]})["tenant"] == "alice"


def test_stores_per_tenant(two_tenants):
    d, a, b, ids = two_tenants
    assert a.call("store.read", {"store": "mem", "path": "/note"})["content"] == "alice's note"
    assert [s["name"] for s in a.call("store.list", {})["stores"]] == ["mem"]
    assert b.call("store.list", {})["stores"] == []
    e = err_of(b, "store.read", {"store": "mem", "path": "/note"})
    e2 = err_of(b, "store.read", {"store": "mez", "path": "/note"})
    assert e.code == e2.code and e.message.replace("mem", "X") == e2.message.replace("mez", "X")
    # bob's own "mem" is another store, and so is the owner's
    b.call("store.write", {"store": "mem", "path": "/note", "content": "bob's note"})
    owner = d.client()
    owner.call("store.write", {"store": "mem", "path": "/note", "content": "owner's note"})
    assert a.call("store.read", {"store": "mem", "path": "/note"})["content"] == "alice's note"
    assert b.call("store.read", {"store": "mem", "path": "/note"})["content"] == "bob's note"
    assert owner.call("store.read", {"store": "mem", "path": "/note"})["content"] == "owner's note"
    # alice's sandbox mounts alice's store
    r = a.call("exec.run", {"sandbox": ids["SB"], "command": "cat /mem/note"}, timeout=60)
    assert r["stdout"] == "alice's note"
    # a store mount of bob's sandbox is bob's
    sb2 = b.call("sandbox.create", {"mounts": [{"type": "store", "name": "mem", "target": "/mem"}]},
                 timeout=60)["id"]
    r = b.call("exec.run", {"sandbox": sb2, "command": "cat /mem/note"}, timeout=60)
    assert r["stdout"] == "bob's note"


HOST_REFUSALS = [
    ("sandbox.create", {"workspace": "/tmp"}, "'workspace'"),
    ("sandbox.create", {"rootfs": "/"}, "'rootfs'"),
    ("sandbox.create", {"mounts": [{"type": "bind", "source": "/etc", "target": "/h"}]}, "bind"),
    ("sandbox.create", {"mounts": ["type=bind,source=/etc,target=/h"]}, "bind"),
    ("sandbox.create", {"mounts": ["target=/h,type=bind,source=/etc"]}, "bind"),
    ("sandbox.create", {"mounts": ["type=tmpfs,target=/h,type=bind,source=/etc"]}, "bind"),
    ("sandbox.create", {"mounts": [{"type": "overlay", "source": "/etc", "target": "/h"}]}, "overlay"),
    ("sandbox.create", {"sockets": [{"host": "/run/x.sock", "target": "/run/x.sock"}]}, "'sockets'"),
    ("sandbox.create", {"net": "host"}, "net \"host\""),
    ("exec.run", {"fresh": True, "command": "true"}, "fresh"),
    ("exec.run", {"workspace": "/tmp", "command": "true"}, "'workspace'"),
    ("sandbox.lease", {"workspace": "/tmp"}, "sandbox.lease"),
    ("sandbox.release", {}, "sandbox.release"),
]


@pytest.mark.parametrize("method,params,what", HOST_REFUSALS)
def test_host_paths_refused(tenants, method, params, what):
    d, _, auth = tenants
    a = auth(TOK_A)
    e = err_of(a, method, params)
    assert e.code == -32022 and e.data_code == "forbidden", e
    assert what in e.message and "tenant" in e.message
    assert a.call("sandbox.list", {})["sandboxes"] == []


def test_host_paths_refused_on_own_sandbox(tenants):
    d, _, auth = tenants
    a = auth(TOK_A)
    sa = a.call("sandbox.create", {}, timeout=60)["id"]
    for method, params, what in [
        ("workspace.commit", {"sandbox": sa}, "workspace.commit"),
        ("fs.copy_in", {"sandbox": sa, "path": "/tmp/c", "host_path": "/etc/hostname",
                        "host_id": "x"}, "fs.copy_in"),
        ("fs.copy_out", {"sandbox": sa, "path": "/etc/hostname", "host_path": "/tmp/o",
                         "host_id": "x"}, "fs.copy_out"),
        ("network.set", {"sandbox": sa, "net": "host"}, "net \"host\""),
    ]:
        e = err_of(a, method, params)
        assert e.code == -32022 and what in e.message, e
    # what is a tenant's works
    assert a.call("exec.run", {"sandbox": sa, "command": "echo ok"}, timeout=60)["stdout"] == "ok\n"
    a.call("sandbox.create", {"mounts": [{"type": "tmpfs", "target": "/scratch"}], "net": "none"},
           timeout=60)


def test_quotas(tenants):
    d, _, auth = tenants
    q = auth(TOK_Q)
    # no memory/disk given: each gets its share of the quota (256M / 2 sandboxes)
    s1 = q.call("sandbox.create", {}, timeout=60)["id"]
    e = err_of(q, "sandbox.create", {"memory": 200 << 20})
    assert e.code == -32004 and e.data_code == "limit" and "quota memory=256M" in e.message
    e = err_of(q, "sandbox.create", {"memory": 64 << 20, "disk": 100 << 20})
    assert e.code == -32004 and "quota disk=64M" in e.message
    s2 = q.call("sandbox.create", {"memory": 64 << 20, "disk": 16 << 20}, timeout=60)["id"]
    e = err_of(q, "sandbox.create", {"memory": 16 << 20, "disk": 1 << 20})
    assert e.code == -32004 and "quota sandboxes=2" in e.message
    # a fork is a sandbox too
    e = err_of(q, "sandbox.fork", {"sandbox": s2}, timeout=60)
    assert e.code == -32004 and "quota sandboxes=2" in e.message, e
    job = q.call("job.start", {"sandbox": s1, "command": "sleep 60"})["job_id"]
    e = err_of(q, "exec.run", {"sandbox": s2, "command": "true"})
    assert e.code == -32004 and "quota commands=1" in e.message
    e = err_of(q, "job.start", {"sandbox": s2, "command": "true"})
    assert e.code == -32004 and "quota commands=1" in e.message
    q.call("job.kill", {"job_id": job, "signal": "KILL"})
    q.call("job.wait", {"job_id": job, "timeout": 30}, timeout=40)
    assert q.call("exec.run", {"sandbox": s2, "command": "echo ok"}, timeout=60)["stdout"] == "ok\n"
    q.call("sandbox.destroy", {"id": s2}, timeout=60)
    q.call("sandbox.create", {"memory": 64 << 20, "disk": 16 << 20}, timeout=60)
    # its stores' caps count against its disk quota too (a store outlives its sandboxes)
    e = err_of(q, "store.write", {"store": "big", "path": "/f", "content": "x"})
    assert e.code == -32004 and "quota disk=" in e.message, e
    q.call("sandbox.destroy", {"id": s1}, timeout=60)
    e = err_of(q, "sandbox.create", {"memory": 16 << 20, "disk": 1 << 20, "mounts": [
        {"type": "store", "name": "s1", "target": "/s", "size": 100 << 20}]}, timeout=60)
    assert e.code == -32004 and "quota disk=" in e.message, e
    q.call("sandbox.create", {"memory": 16 << 20, "disk": 1 << 20, "mounts": [
        {"type": "store", "name": "s1", "target": "/s", "size": 40 << 20}]}, timeout=60)
    e = err_of(q, "store.write", {"store": "s2", "path": "/f", "content": "x"})
    assert e.code == -32004 and "quota disk=" in e.message, e
    assert q.call("store.write", {"store": "s1", "path": "/f", "content": "x"})
    # others are not held to quota's quotas
    a = auth(TOK_A)
    for _ in range(3):
        a.call("sandbox.create", {}, timeout=60)


def test_sessions_and_js_evals_count_as_commands(tenants):
    """The attack's finding: quota commands=N held exec.run and job.start only, while a
    tenant's sessions (a shell each) and JS evals ran beside them without limit."""
    d, _, auth = tenants
    q = auth(TOK_Q)
    sb = q.call("sandbox.create", {}, timeout=60)["id"]
    se = q.call("session.open", {"sandbox": sb}, timeout=60)["session"]
    e = err_of(q, "exec.run", {"sandbox": sb, "command": "true"})
    assert e.code == -32004 and "quota commands=1" in e.message, e
    e = err_of(q, "session.open", {"sandbox": sb})
    assert e.code == -32004 and "quota commands=1" in e.message, e
    e = err_of(q, "js.eval", {"sandbox": sb, "code": "1"})
    assert e.code == -32004 and "quota commands=1" in e.message, e
    q.call("session.close", {"session": se}, timeout=60)
    assert q.call("js.eval", {"sandbox": sb, "code": "40 + 2"}, timeout=60)["value"] == 42
    # An eval in flight holds the one command: started on a second connection, it spins for
    # 8 s while this one's exec.run is refused.
    q2 = auth(TOK_Q)
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("r", q2.call(
        "js.eval", {"sandbox": sb, "code": "const t = Date.now(); while (Date.now() - t < 8000) {} 7"},
        timeout=120)))
    t.start()
    try:
        deadline = time.monotonic() + 6
        refused = None
        while time.monotonic() < deadline:
            try:
                q.call("exec.run", {"sandbox": sb, "command": "true"}, timeout=60)
            except Exception as ex:  # noqa: BLE001 - the refusal is what we wait for
                refused = ex
                break
            time.sleep(0.2)
    finally:
        t.join(120)
    assert refused is not None and "quota commands=1" in str(refused), refused
    assert done.get("r", {}).get("value") == 7, done
    assert q.call("exec.run", {"sandbox": sb, "command": "echo ok"}, timeout=60)["stdout"] == "ok\n"


def test_restart_keeps_ownership(tenants):
    d, _, auth = tenants
    a, b = auth(TOK_A), auth(TOK_B)
    sa = a.call("sandbox.create", {"name": "kept"}, timeout=60)["id"]
    d.stop()
    d.start()
    a, b = auth(TOK_A), auth(TOK_B)
    assert [s["id"] for s in a.call("sandbox.list", {})["sandboxes"]] == [sa]
    assert b.call("sandbox.list", {})["sandboxes"] == []
    e = whole_error(b, "sandbox.start", {"id": sa})
    e2 = whole_error(b, "sandbox.start", {"id": fake_of(sa)})
    assert e["code"] == -32002 and e == {**e2, "message": e2["message"].replace(fake_of(sa), sa)}
    a.call("sandbox.start", {"id": sa}, timeout=60)
    assert a.call("exec.run", {"sandbox": sa, "command": "echo back"}, timeout=60)["stdout"] == "back\n"
    assert d.client().call("sandbox.get", {"id": sa})["tenant"] == "alice"


def test_names_per_tenant(tenants):
    d, _, auth = tenants
    a, b = auth(TOK_A), auth(TOK_B)
    a.call("sandbox.create", {"name": "same"}, timeout=60)
    # bob's namespace of names is his own: alice's "same" is neither visible nor in the way
    b.call("sandbox.create", {"name": "same"}, timeout=60)
    e = err_of(a, "sandbox.create", {"name": "same"})
    assert e.code == -32602


def test_batch_after_auth_is_the_tenants(tenants):
    """A batch holding connection.auth then other requests: those after it are the
    tenant's, refusals and all."""
    d, _, auth = tenants
    owner = d.client()
    mine = owner.call("sandbox.create", {}, timeout=60)["id"]
    c = d.client()
    c.send([
        {"jsonrpc": "2.0", "id": 1, "method": "connection.auth", "params": {"token": TOK_A}},
        {"jsonrpc": "2.0", "id": 2, "method": "sandbox.create", "params": {"workspace": "/tmp"}},
        {"jsonrpc": "2.0", "id": 3, "method": "sandbox.get", "params": {"id": mine}},
        {"jsonrpc": "2.0", "id": 4, "method": "sandbox.lease", "params": {"workspace": "/tmp"}},
    ])
    by_id = {r["id"]: r for r in c.wait_batch(timeout=30)}
    assert by_id[1]["result"]["tenant"] == "alice"
    assert by_id[2]["error"]["code"] == -32022
    assert by_id[3]["error"]["code"] == -32002
    assert by_id[4]["error"]["code"] == -32022


def test_tenant_snapshots_and_forks_are_its_own(two_tenants):
    d, a, b, ids = two_tenants
    a.call("job.kill", {"job_id": ids["JOB"], "signal": "KILL"})
    a.call("session.close", {"session": ids["SES"]})
    f1 = a.call("sandbox.fork", {"snapshot": ids["SNAP"], "name": "f1"}, timeout=60)
    f2 = a.call("sandbox.fork", {"sandbox": ids["SB"], "force": True}, timeout=60)
    for f in (f1, f2):
        assert f["tenant"] == "alice" and f.get("workspace") is None
        r = a.call("exec.run", {"sandbox": f["id"], "command": "cat /workspace/secret"}, timeout=60)
        assert r["stdout"] == "alice's"
        e = whole_error(b, "sandbox.get", {"id": f["id"]})
        assert e["code"] == -32002
    # restoring her own snapshot works; bob's sandbox cannot stand on it (tested above)
    a.call("fs.write", {"sandbox": f1["id"], "path": "/workspace/secret", "content": "changed"})
    a.call("workspace.restore", {"sandbox": f1["id"], "snapshot": ids["SNAP"]}, timeout=60)
    assert a.call("fs.read", {"sandbox": f1["id"], "path": "/workspace/secret"})["content"] == "alice's"
    # the tenant's workspace holds nothing: what she wrote is in her sandboxes' upper dirs
    tws = os.path.join(d.state_dir, "tenant-workspaces", "alice")
    assert os.listdir(tws) == []


def test_snapshot_names_are_per_tenant(two_tenants):
    """The attack's finding: snapshot names were unique daemon-wide, so a tenant learned from
    "taken" that another tenant had used a name. Now each tenant has its own names; a name
    reaches its own tenant's snapshot only."""
    d, a, b, ids = two_tenants
    b.call("fs.write", {"sandbox": ids["BSB"], "path": "/workspace/secret", "content": "bob's"})
    bsnap = b.call("workspace.snapshot", {"sandbox": ids["BSB"], "name": ids["SNAPNAME"]},
                   timeout=60)["id"]
    assert bsnap != ids["SNAP"]
    # each sees its own under the name, and the other's not at all
    for c, mine, other in ((a, ids["SNAP"], bsnap), (b, bsnap, ids["SNAP"])):
        listed = [s["id"] for s in c.call("workspace.snapshots", {})["snapshots"]]
        assert mine in listed and other not in listed, listed
    f = b.call("sandbox.fork", {"snapshot": ids["SNAPNAME"]}, timeout=60)
    r = b.call("exec.run", {"sandbox": f["id"], "command": "cat /workspace/secret"}, timeout=60)
    assert r["stdout"] == "bob's"
    b.call("fs.write", {"sandbox": f["id"], "path": "/workspace/secret", "content": "x"})
    b.call("workspace.restore", {"sandbox": f["id"], "snapshot": ids["SNAPNAME"]}, timeout=60)
    assert b.call("fs.read", {"sandbox": f["id"], "path": "/workspace/secret"})["content"] == "bob's"
    # a name is still unique within a tenant
    e = whole_error(b, "workspace.snapshot", {"sandbox": ids["BSB"], "name": ids["SNAPNAME"]})
    assert "taken" in e["message"], e
    # deleting by name deletes one's own
    b.call("sandbox.destroy", {"id": f["id"]}, timeout=60)
    b.call("sandbox.destroy", {"id": ids["BSB"]}, timeout=60)
    b.call("workspace.snapshot_delete", {"snapshot": ids["SNAPNAME"]}, timeout=60)
    listed = [s["id"] for s in a.call("workspace.snapshots", {})["snapshots"]]
    assert ids["SNAP"] in listed, listed


def test_a_tenants_fork_is_never_served_from_the_pool(daemon_factory, tmp_path):
    """With a pool, the owner's forks may be served from it (test_fork_pool.py); a tenant's
    is built, so that it is recorded as the tenant's and its quotas hold. (A guard: the pool
    path also refuses a tenant's workspace, which lies in the state dir; forkpool.c's fits()
    says so outright.)"""
    path = tmp_path / "tokens"
    write_tokens(path, TOKENS)
    d = daemon_factory(extra_args=["--tokens", str(path), "--pool", "2"])
    a = d.client()
    a.call("connection.auth", {"token": TOK_A})
    q = d.client()
    q.call("connection.auth", {"token": TOK_Q})
    b = d.client()
    b.call("connection.auth", {"token": TOK_B})
    sb = a.call("sandbox.create", {}, timeout=60)["id"]
    a.call("exec.run", {"sandbox": sb, "command": "echo alice > /workspace/f"}, timeout=60)
    deadline = time.monotonic() + 60  # the pool ready to serve a fork
    while d.client().call("daemon.ping", {})["pool_ready"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    f = a.call("sandbox.fork", {"sandbox": sb, "force": True}, timeout=60)
    assert f["tenant"] == "alice" and not f.get("from_pool"), f
    assert whole_error(b, "sandbox.get", {"id": f["id"]})["code"] == -32002
    assert f["id"] in [s["id"] for s in a.call("sandbox.list", {})["sandboxes"]]
    # the quota tenant: two sandboxes at most, forks included, pool or not
    s1 = q.call("sandbox.create", {}, timeout=60)["id"]
    q.call("sandbox.fork", {"sandbox": s1, "force": True}, timeout=60)
    e = err_of(q, "sandbox.fork", {"sandbox": s1, "force": True}, timeout=60)
    assert e.code == -32004 and "sandboxes" in str(e), e
