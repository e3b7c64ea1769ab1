# test_identity.py - who a sandbox is on the host. As root, each sandbox maps onto a block of
# host ids of its own, outside every /etc/subuid and /etc/subgid range, so a local user holding
# a subuid range (rootless podman's setup) cannot signal, read or redirect it, and sandboxes
# cannot reach each other; the daemon's state dir is private and nothing beneath it is followed
# through a link; the socket directory cannot be taken over by another user.
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import CONCH_BIN, IS_ROOT, host_pids_matching, proc_comm, proc_status, unique_marker

ATTACKER = "conchatk"  # holds subuid ranges, attacks
VICTIM = "conchvic"  # an ordinary user running conch (socket tests)
SUBID = ("/etc/subuid", "/etc/subgid")
# The range useradd gives the first user, and the first block of systemd's container range:
# conch must use neither while the attacker holds them.
ATTACKER_RANGES = (100000, 524288)
CONTAINER_FIRST, CONTAINER_END = 0x80000, 0x70000000


# ---- users -------------------------------------------------------------------------------


def _ensure_user(name):
    try:
        return pwd.getpwnam(name).pw_uid, False
    except KeyError:
        subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/bash", name], check=True)
        return pwd.getpwnam(name).pw_uid, True


def _drop_lines(path, pred):
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    keep = [l for l in lines if not pred(l.rstrip("\n"))]
    if keep != lines:
        with open(path, "w") as f:
            f.writelines(keep)


@pytest.fixture(scope="module")
def users():
    """The attacker (with /etc/subuid and /etc/subgid ranges at 100000 and 524288, in both
    the "name:start:count" and the "uid:start:count" forms) and a victim user. Removed, with
    their subid lines, at teardown."""
    if not IS_ROOT:
        pytest.skip("root_only: creates users and /etc/subuid entries")
    if not (shutil.which("newuidmap") and shutil.which("newgidmap") and shutil.which("unshare")):
        pytest.skip("needs newuidmap/newgidmap (Debian package uidmap: scripts/bootstrap installs it)")
    existed = {p: os.path.exists(p) for p in SUBID}
    auid, made_a = _ensure_user(ATTACKER)
    vuid, made_v = _ensure_user(VICTIM)
    added = {
        "/etc/subuid": [f"{ATTACKER}:{r}:65536" for r in ATTACKER_RANGES],
        "/etc/subgid": [f"{auid}:{r}:65536" for r in ATTACKER_RANGES],
    }
    for path, lines in added.items():
        with open(path, "a") as f:
            f.write("".join(l + "\n" for l in lines))
        os.chmod(path, 0o644)
    try:
        yield {"attacker": auid, "victim": vuid}
    finally:
        for name, made in ((ATTACKER, made_a), (VICTIM, made_v)):
            if made:
                subprocess.run(["userdel", name], capture_output=True)
        for path, lines in added.items():
            uid_prefixes = (f"{ATTACKER}:", f"{VICTIM}:", f"{auid}:", f"{vuid}:")
            _drop_lines(path, lambda l: l in lines or l.startswith(uid_prefixes))
            if not existed[path] and os.path.exists(path) and os.path.getsize(path) == 0:
                os.unlink(path)


# What the attacker tries, from a user namespace mapping its subuid range: each action
# reports "ok" or the errno name.
ATTACK = r"""
import errno, json, os, sys
res = []
for kind, arg in json.loads(sys.argv[1]):
    try:
        if kind == "kill":
            os.kill(arg, 0)
        elif kind == "list":
            os.listdir(arg)
        elif kind == "read":
            with open(arg, "rb") as f:
                f.read(1)
        elif kind == "write":
            os.close(os.open(arg, os.O_WRONLY | os.O_CREAT, 0o644))
        elif kind == "swap":
            os.rename(arg, arg + ".moved")
            os.symlink("/root", arg)
        res.append("ok")
    except OSError as e:
        res.append(errno.errorcode.get(e.errno, str(e.errno)))
print(json.dumps(res))
"""


def attack(outer, inner, actions):
    """Run @actions as host uid/gid outer+inner: the attacker maps its subuid range at @outer
    onto 0..65535 of a new user namespace (with newuidmap, as rootless podman does) and
    becomes @inner there."""
    argv = ["runuser", "-u", ATTACKER, "--", "unshare", "--user",
            f"--map-users={outer},0,65536", f"--map-groups={outer},0,65536",
            "--setuid", str(inner), "--setgid", str(inner), "--",
            "/usr/bin/python3", "-c", ATTACK, json.dumps(actions)]
    p = subprocess.run(argv, capture_output=True, timeout=30, cwd="/")
    assert p.returncode == 0, p
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def attack_all(actions):
    """{(outer, inner): [result per action]} for both attacker ranges, as their root and
    as the uid conch's agent (1000) had inside."""
    return {(o, i): attack(o, i, actions) for o in ATTACKER_RANGES for i in (0, 1000)}


def harness_works(outer, inner):
    """The attack can succeed: a host process running as outer+inner is signalable by it."""
    hid = outer + inner
    p = subprocess.Popen(["setpriv", f"--reuid={hid}", f"--regid={hid}", "--clear-groups", "sleep", "60"])
    try:
        time.sleep(0.1)
        return attack(outer, inner, [["kill", p.pid]]) == ["ok"]
    finally:
        p.kill()
        p.wait()


# ---- host-side views of sandboxes ------------------------------------------------------------


def children(pid):
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def wardens_of(pid):
    """Children of @pid that are PID 1 of a pid namespace of their own (sandbox wardens)."""
    found = []
    for c in children(pid):
        ns = (proc_status(c) or {}).get("NSpid", "").split()
        if len(ns) > 1 and ns[-1] == "1":
            found.append(c)
    return found


def id_map(pid, which="uid"):
    with open(f"/proc/{pid}/{which}_map") as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


def block_of(warden):
    """(base, count) of a root-mode sandbox's map, checked to be one line, uid = gid."""
    um, gm = id_map(warden, "uid"), id_map(warden, "gid")
    assert um == gm, (um, gm)
    assert len(um) == 1 and um[0][0] == 0, um
    return um[0][1], um[0][2]


def subid_ranges():
    rs = []
    for path in SUBID:
        try:
            with open(path) as f:
                for line in f:
                    parts = line.strip().split(":")
                    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                        rs.append((int(parts[1]), int(parts[2]), f"{path}: {line.strip()}"))
        except FileNotFoundError:
            pass
    return rs


def overlaps(a, n, b, m):
    return a < b + m and b < a + n


def wait_for(pred, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def sleeper(marker):
    """Host pid of the `sleep` whose argv[0] is @marker."""

    def find():
        for p in host_pids_matching(marker):
            if proc_comm(p) == "sleep":
                return p
        return None

    return wait_for(find, what=f"sleeper {marker}")


class RunSandbox:
    """A `conch run` holding a sandbox open with a sleeper; its warden and host ids."""

    def __init__(self, ws, script="true"):
        self.marker = unique_marker("id")
        self.p = subprocess.Popen(
            [CONCH_BIN, "run", "--workspace", str(ws), "--", "bash", "-c",
             f"{script}; exec -a {self.marker} sleep 60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.sleeper = sleeper(self.marker)
        self.warden = wait_for(lambda: wardens_of(self.p.pid), what="warden")[0]

    def close(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.communicate()


def assert_all_refused(results, allowed=("EPERM", "EACCES")):
    bad = {k: v for k, v in results.items() if any(x not in allowed for x in v)}
    assert not bad, f"a subuid holder got through (outer, inner): results: {bad}"


def daemon_sandbox(d, ws, script):
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": script})
    assert r["exit_code"] == 0, r
    marker = unique_marker("idd")
    c.call("job.start", {"sandbox": sb, "command": f"exec -a {marker} sleep 60"})
    return c, sb, sleeper(marker)


# ---- defect 3: a subuid holder against root's sandboxes ---------------------------------------


@pytest.mark.root_only
def test_subuid_holder_cannot_signal_conch_run(users, ws):
    assert harness_works(100000, 0) and harness_works(524288, 1000), "the attack harness has no power"
    s = RunSandbox(ws, "echo secret > s.txt")
    try:
        base, count = block_of(s.warden)
        assert count == 65536
        assert int(proc_status(s.sleeper)["Uid"].split()[0]) == base + 1000
        results = attack_all([["kill", s.warden], ["kill", s.sleeper]])
        assert_all_refused(results, ("EPERM",))
        assert s.p.poll() is None and proc_status(s.sleeper) is not None
    finally:
        s.close()


@pytest.mark.root_only
def test_subuid_holder_cannot_reach_daemon_sandbox(users, daemon_factory, ws):
    d = daemon_factory(extra_args=["--pool", "0"])
    c, sb, sleep_pid = daemon_sandbox(d, ws, "echo secret > s.txt")
    warden = wait_for(lambda: wardens_of(d.pid), what="warden")[0]
    upper = os.path.join(d.state_dir, "sandboxes", sb, "upper")
    assert os.path.isfile(os.path.join(upper, "s.txt"))
    actions = [
        ["kill", warden],
        ["kill", sleep_pid],
        ["list", d.state_dir],
        ["list", upper],
        ["read", os.path.join(upper, "s.txt")],
        ["write", os.path.join(upper, "planted")],
        ["swap", upper],
    ]
    results = attack_all(actions)
    assert_all_refused(results)
    # nothing planted, nothing swapped, the sandbox still works
    assert not os.path.islink(upper) and os.path.isdir(upper)
    assert [x["path"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]] == ["s.txt"]
    assert c.call("exec.run", {"sandbox": sb, "command": "cat s.txt"})["stdout"] == "secret\n"


# ---- defect 3: blocks of their own ----------------------------------------------------------


@pytest.mark.root_only
def test_concurrent_sandboxes_get_distinct_blocks_outside_subuid(users, daemon_factory, tmp_path):
    wss = []
    for i in range(4):
        w = tmp_path / f"ws{i}"
        w.mkdir()
        wss.append(w)
    runs = [RunSandbox(wss[0]), RunSandbox(wss[1])]
    try:
        d = daemon_factory(extra_args=["--pool", "0"])
        daemon_sandbox(d, wss[2], "true")
        daemon_sandbox(d, wss[3], "true")
        wardens = [r.warden for r in runs] + wait_for(
            lambda: (lambda w: w if len(w) == 2 else None)(wardens_of(d.pid)), what="2 wardens")
        blocks = [block_of(w) for w in wardens]
        sub = subid_ranges()
        assert any(s[0] == 524288 for s in sub), sub
        for i, (base, n) in enumerate(blocks):
            assert n == 65536
            assert CONTAINER_FIRST <= base and base + n <= CONTAINER_END, blocks
            for s, m, line in sub:
                assert not overlaps(base, n, s, m), f"block {base}+{n} overlaps {line}"
            for base2, n2 in blocks[i + 1:]:
                assert not overlaps(base, n, base2, n2), f"two sandboxes share host ids: {blocks}"
    finally:
        for r in runs:
            r.close()


@pytest.mark.root_only
def test_sandboxes_cannot_signal_each_other(tmp_path):
    # Pid namespaces hide one sandbox's pids from another, but a pid can be learnt (a shared
    # workspace, a log). What the kernel checks is the host ids: a process holding sandbox
    # B's host ids (its root or its agent) must not be able to signal sandbox A's.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = RunSandbox(tmp_path / "a"), RunSandbox(tmp_path / "b")
    try:
        base_b, _ = block_of(b.warden)
        for inner in (0, 1000):
            hid = base_b + inner
            r = subprocess.run(
                ["setpriv", f"--reuid={hid}", f"--regid={hid}", "--clear-groups", "/usr/bin/python3", "-c",
                 ATTACK, json.dumps([["kill", a.warden], ["kill", a.sleeper], ["kill", b.sleeper]])],
                capture_output=True, timeout=30, cwd="/")
            res = json.loads(r.stdout)
            # B's own ids reach B's agent (the check has power), never A's processes
            assert res[:2] == ["EPERM", "EPERM"], (inner, res)
            if inner == 1000:
                assert res[2] == "ok", res
    finally:
        a.close()
        b.close()


@pytest.mark.root_only
def test_discard_restart_keeps_the_sandboxs_block(daemon_factory, ws):
    # The upper dir's files belong to the sandbox's host ids: a restart (workspace.discard)
    # must come back on the same block, or the agent would find its own files unwritable.
    d = daemon_factory(extra_args=["--pool", "0"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    c.call("exec.run", {"sandbox": sb, "command": "echo 1 > keep; echo 2 > drop"})
    before = block_of(wait_for(lambda: wardens_of(d.pid), what="warden")[0])
    c.call("workspace.discard", {"sandbox": sb, "paths": ["drop"]})
    after = block_of(wait_for(lambda: wardens_of(d.pid), what="warden")[0])
    assert before == after
    r = c.call("exec.run", {"sandbox": sb, "command": "echo 3 >> keep && cat keep && ls"})
    assert r["exit_code"] == 0 and r["stdout"] == "1\n3\nkeep\n", r


# ---- defect 3: the state dir --------------------------------------------------------------


def test_state_dir_is_private(daemon_factory, tmp_path):
    # an existing state dir from an older conch (0711) is closed up too
    d = daemon_factory(extra_args=["--pool", "0"], start=False)
    state = Path(d.state_dir)  # under the daemon's dir, which its fixture cleans up
    (state / "sandboxes").mkdir(parents=True)
    os.chmod(state, 0o711)
    os.chmod(state / "sandboxes", 0o711)
    d.start()
    for p in (state, state / "sandboxes", state / "spill"):
        st = os.lstat(p)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, (p, oct(st.st_mode))
        assert st.st_uid == os.geteuid()
    # and sandboxes still reach their upper dirs (through their staged mounts)
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(tmp_path)})["id"]
    assert c.call("exec.run", {"sandbox": sb, "command": "echo hi > f; cat f"})["stdout"] == "hi\n"


def test_state_dir_of_another_owner_refused(tmp_path):
    if not IS_ROOT:
        pytest.skip("root_only: needs a directory owned by another uid")
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, 65534, 65534)
    p = subprocess.run([CONCH_BIN, "serve", "--pool", "0", "--socket", str(tmp_path / "s.sock"),
                        "--state-dir", str(state)], capture_output=True, timeout=20)
    assert p.returncode != 0
    assert str(state) in p.stderr.decode() and "owned by uid 65534" in p.stderr.decode(), p.stderr


def test_discard_does_not_follow_a_swapped_upper(daemon_factory, ws, tmp_path):
    # Whoever could write in the sandbox's state dir could swap `upper` for a link; then
    # workspace.discard (which empties upper) must fail, not empty what the link points to.
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "precious").write_text("keep me")
    d = daemon_factory(extra_args=["--pool", "0"])
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    c.call("exec.run", {"sandbox": sb, "command": "echo x > f"})
    upper = os.path.join(d.state_dir, "sandboxes", sb, "upper")
    os.rename(upper, upper + ".real")
    os.symlink(str(victim), upper)
    try:
        from rpcclient import RpcError

        for method in ("workspace.discard", "workspace.changes", "workspace.commit"):
            with pytest.raises(RpcError) as e:
                c.call(method, {"sandbox": sb})
            assert (victim / "precious").exists(), f"{method} followed the link and emptied {victim}"
            assert "symbolic link" in e.value.message, e.value
        assert (victim / "precious").read_text() == "keep me"
        assert sorted(os.listdir(ws)) == []
    finally:
        os.unlink(upper)
        os.rename(upper + ".real", upper)
    assert [x["path"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]] == ["f"]


# ---- defect 11: the socket directory --------------------------------------------------------


@pytest.fixture
def bin_copy(tmp_path_factory):
    """conch where other users can run it."""
    d = tempfile.mkdtemp(prefix="conchit-idbin-", dir="/tmp")
    os.chmod(d, 0o755)
    dst = os.path.join(d, "conch")
    shutil.copy(CONCH_BIN, dst)
    os.chmod(dst, 0o755)
    yield dst
    shutil.rmtree(d, ignore_errors=True)


def as_user(user, argv, timeout=20):
    """Run @argv as @user without XDG_RUNTIME_DIR; on timeout its whole session is killed
    (runuser's child would outlive runuser) and TimeoutExpired raised."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    full = ["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]
    p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(full, p.returncode, out, err)


FAKE_DAEMON = r"""
import json, os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o777)
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    f = c.makefile("rwb")
    try:
        req = json.loads(f.readline())
        sb = {"id": "sb-forged", "state": "running", "mode": "overlay", "commands": 7, "workspace": "/forged"}
        f.write(json.dumps({"jsonrpc": "2.0", "id": req.get("id"), "result": {"sandboxes": [sb]}}).encode() + b"\n")
        f.flush()
    except Exception:
        pass
    c.close()
"""


class FakeDaemon:
    """The attacker answering on @path as if it were conch's daemon."""

    def __init__(self, path):
        self.p = subprocess.Popen(["runuser", "-u", ATTACKER, "--", "/usr/bin/python3", "-c", FAKE_DAEMON, path],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd="/")
        line = self.p.stdout.readline()
        assert line.strip() == b"ready", (line, self.p.stderr.read() if self.p.poll() is not None else "")

    def close(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.communicate()


@pytest.fixture
def victim_dir(users):
    """/tmp/conch-<victim uid>: the victim's default socket dir (no XDG_RUNTIME_DIR);
    removed before and after."""
    path = f"/tmp/conch-{users['victim']}"
    shutil.rmtree(path, ignore_errors=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim_state(users):
    """A state dir the victim owns (pytest's tmp_path is not reachable by other users)."""
    d = tempfile.mkdtemp(prefix="conchit-vstate-", dir="/tmp")
    os.chown(d, users["victim"], users["victim"])
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.root_only
def test_serve_refuses_socket_dir_made_by_another_user(users, bin_copy, victim_dir, victim_state):
    subprocess.run(["runuser", "-u", ATTACKER, "--", "mkdir", victim_dir], check=True)
    os.chmod(victim_dir, 0o777)
    try:
        p = as_user(VICTIM, [bin_copy, "serve", "--pool", "0", "--state-dir", victim_state],
                    timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"conch serve started in {victim_dir}, a directory another user made")
    err = p.stderr.decode()
    assert p.returncode != 0 and victim_dir in err and "owned by uid" in err, err
    assert not os.path.exists(os.path.join(victim_dir, "conch.sock"))


@pytest.mark.root_only
def test_client_refuses_socket_dir_made_by_another_user(users, bin_copy, victim_dir):
    subprocess.run(["runuser", "-u", ATTACKER, "--", "mkdir", "-m", "0755", victim_dir], check=True)
    fake = FakeDaemon(os.path.join(victim_dir, "conch.sock"))
    try:
        p = as_user(VICTIM, [bin_copy, "ps"])
    finally:
        fake.close()
    out, err = p.stdout.decode(), p.stderr.decode()
    assert "sb-forged" not in out, f"conch ps believed another user's socket:\n{out}"
    assert p.returncode != 0 and victim_dir in err and "owned by uid" in err, err


@pytest.mark.root_only
def test_client_refuses_another_users_socket_in_sticky_dir(users, bin_copy):
    path = f"/tmp/{unique_marker('idsock')}.sock"
    fake = FakeDaemon(path)
    try:
        p = as_user(VICTIM, [bin_copy, "ps", "--socket", path])
        q = subprocess.run([CONCH_BIN, "ps", "--socket", path], capture_output=True, timeout=20)
    finally:
        fake.close()
        if os.path.exists(path):
            os.unlink(path)
    for r in (p, q):
        assert "sb-forged" not in r.stdout.decode(), r
        assert r.returncode != 0 and path in r.stderr.decode() and "planted" in r.stderr.decode(), r


@pytest.mark.root_only
def test_own_private_socket_dir_works(users, bin_copy, victim_dir, victim_state):
    state = victim_state
    env = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent"]
    d = subprocess.Popen(["runuser", "-u", VICTIM, "--", *env, bin_copy, "serve", "--pool", "0",
                          "--state-dir", state], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, cwd="/")
    try:
        sock = os.path.join(victim_dir, "conch.sock")
        wait_for(lambda: os.path.exists(sock), what=f"{sock}")
        st = os.stat(victim_dir)
        assert st.st_uid == users["victim"] and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
        p = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(as_user(VICTIM, [bin_copy, "ps"])),
                     what="conch ps")
        assert p.stdout.decode().startswith("ID"), p
    finally:
        os.killpg(d.pid, signal.SIGTERM)
        try:
            d.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(d.pid, signal.SIGKILL)
            d.communicate()
