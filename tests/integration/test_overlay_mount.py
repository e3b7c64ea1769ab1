# test_overlay_mount.py - overlay mounts of a host directory (issue 18): sandbox.create
# "mounts": [{"type": "overlay", "source", "target"}] (conch create --mount type=overlay,...).
# The sandbox sees the host dir and writes; its writes go to an upper dir the daemon keeps
# (<state>/sandboxes/<id>/m<i>), the host dir is untouched until workspace.commit with
# "mount": target. Each promise is tried (write, delete, rename inside; the host untouched;
# changes and diff listed; commit applies them; kept across a restart) and each fence attacked:
# a link planted in the upper does not lead the commit out of the host dir, a source swapped
# for another dir is refused a commit, the sources a bind may not have are refused, conch run
# refuses the type beside a ro or rw workspace (test_run_mounts.py has the rest of conch run's),
# the workspace's ro and rw modes stay what they were.
import os

import pytest

from conftest import conch
from rpcclient import RpcError


def host_dir(tmp_path, name="data"):
    d = tmp_path / name
    d.mkdir()
    (d / "keep.txt").write_text("keep\n")
    (d / "gone.txt").write_text("gone\n")
    (d / "old.txt").write_text("old\n")
    (d / "sub").mkdir()
    (d / "sub" / "a.txt").write_text("a\n")
    os.chmod(tmp_path, 0o755)
    return d


def snapshot_of(d):
    out = {}
    for root, dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = None if os.path.islink(p) else open(p).read()
        for x in dirs:
            out[os.path.relpath(os.path.join(root, x), d) + "/"] = None
    return out


def mk(c, ws, src, **extra):
    return c.call("sandbox.create", {"workspace": str(ws), "mounts": [
        {"type": "overlay", "source": str(src), "target": "/data"}], **extra}, timeout=30)["id"]


def sh(c, sb, script):
    r = c.call("exec.run", {"sandbox": sb, "command": script}, timeout=60)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def changes(c, sb, mount="/data"):
    r = c.call("workspace.changes", {"sandbox": sb, "mount": mount})
    return {ch["path"]: ch["kind"] for ch in r["changes"]}


@pytest.mark.parametrize("as_root", [False, True])
def test_writes_stay_in_the_upper_until_commit(daemon, ws, tmp_path, as_root):
    c = daemon.client()
    src = host_dir(tmp_path)
    before = snapshot_of(src)
    sb = mk(c, ws, src, as_root=as_root)
    out = sh(c, sb, "cat /data/keep.txt; echo new > /data/new.txt; rm /data/gone.txt; "
                    "mv /data/old.txt /data/renamed.txt; echo changed >> /data/sub/a.txt; "
                    "mkdir /data/d; echo x > /data/d/x; echo ws > /workspace/w.txt; "
                    "grep ' /data ' /proc/mounts")
    assert out.startswith("keep\n"), out
    mnt = out.splitlines()[-1]
    assert " overlay " in mnt and "nosuid" in mnt and "nodev" in mnt, mnt
    # The host dir is untouched.
    assert snapshot_of(src) == before
    got = changes(c, sb)
    assert got == {"new.txt": "added", "gone.txt": "deleted", "old.txt": "deleted",
                   "renamed.txt": "added", "sub/a.txt": "modified", "d": "added",
                   "d/x": "added"}, got
    # The workspace's own changes are its own.
    ws_ch = {ch["path"] for ch in c.call("workspace.changes", {"sandbox": sb})["changes"]}
    assert ws_ch == {"w.txt"}, ws_ch
    d = c.call("workspace.diff", {"sandbox": sb, "mount": "/data", "paths": ["sub/a.txt"]})
    assert "+changed" in d["diff"], d
    # A commit of some paths, then of the rest.
    c.call("workspace.commit", {"sandbox": sb, "mount": "/data", "paths": ["new.txt"]})
    assert (src / "new.txt").read_text() == "new\n"
    assert (src / "gone.txt").exists()
    c.call("workspace.commit", {"sandbox": sb, "mount": "/data"})
    assert not (src / "gone.txt").exists() and not (src / "old.txt").exists()
    assert (src / "renamed.txt").read_text() == "old\n"
    assert (src / "sub" / "a.txt").read_text() == "a\nchanged\n"
    assert (src / "d" / "x").read_text() == "x\n"
    assert changes(c, sb) == {}
    assert not (ws / "w.txt").exists()  # the workspace was not committed with it
    # The upper is kept across a restart.
    sh(c, sb, "echo after > /data/after.txt")
    daemon.kill9()
    daemon.start()
    c = daemon.client()
    assert changes(c, sb) == {"after.txt": "added"}  # stopped: read from the kept upper
    c.call("sandbox.start", {"id": sb}, timeout=30)
    assert sh(c, sb, "cat /data/after.txt") == "after\n"
    assert changes(c, sb) == {"after.txt": "added"}
    assert not (src / "after.txt").exists()


def test_planted_link_does_not_escape_on_commit(daemon, ws, tmp_path):
    c = daemon.client()
    src = host_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)
    sb = mk(c, ws, src)
    # A link to a dir outside the host dir, then a file written "through" it by name: the
    # overlay keeps it a link in the upper; a commit must not follow it out.
    sh(c, sb, f"ln -s {outside} /data/esc; rm /data/sub/a.txt; rmdir /data/sub; "
              f"ln -s {outside} /data/sub")
    upper = os.path.join(str(daemon.state_dir), "sandboxes", sb, "m0", "upper")
    assert os.path.islink(os.path.join(upper, "sub"))
    try:
        c.call("workspace.commit", {"sandbox": sb, "mount": "/data"})
    except RpcError:
        pass
    assert os.listdir(outside) == []
    # Whatever was applied, a link lands as a link, never as what it points to.
    for p in ("esc", "sub"):
        q = src / p
        assert not q.exists() or q.is_symlink(), p
    # A file planted in the upper beneath a link (as the host could, not the sandbox).
    os.makedirs(os.path.join(upper, "real"), exist_ok=True)
    try:
        os.symlink(str(outside), os.path.join(upper, "real", "l"))
    except FileExistsError:
        pass
    try:
        c.call("workspace.commit", {"sandbox": sb, "mount": "/data"})
    except RpcError:
        pass
    assert os.listdir(outside) == []


def test_swapped_source_is_refused(daemon, ws, tmp_path):
    c = daemon.client()
    src = host_dir(tmp_path)
    sb = mk(c, ws, src)
    sh(c, sb, "echo new > /data/new.txt")
    other = tmp_path / "other"
    other.mkdir()
    os.rename(src, tmp_path / "moved")
    os.symlink(other, src)
    with pytest.raises(RpcError) as e:
        c.call("workspace.commit", {"sandbox": sb, "mount": "/data"})
    assert "no longer the directory" in str(e.value), e.value
    assert os.listdir(other) == []


def test_bad_requests_and_sources(daemon, ws, tmp_path):
    c = daemon.client()
    src = host_dir(tmp_path)
    sb = mk(c, ws, src)
    for params, word in (({"mount": "/nope"}, "no overlay mount"),
                         ({"mount": "/data\u0000x"}, "no overlay mount"),
                         ({"mount": 5}, "string"),
                         ({"mount": "/data", "since": "x"}, "since")):
        with pytest.raises(RpcError) as e:
            c.call("workspace.changes", {"sandbox": sb, **params})
        assert word in str(e.value), e.value
    with pytest.raises(RpcError) as e:  # not there yet: never the workspace's by mistake
        c.call("workspace.discard", {"sandbox": sb, "mount": "/data"})
    assert "mount" in str(e.value), e.value
    link = tmp_path / "shadow"
    link.symlink_to("/etc/shadow")
    for bad, word in ((str(link), "not a directory"), ("/proc/self", "kernel"),
                      (str(daemon.state_dir), "state"), ("relative", "absolute")):
        with pytest.raises(RpcError) as e:
            c.call("sandbox.create", {"workspace": str(ws), "mounts": [
                {"type": "overlay", "source": bad, "target": "/data"}]}, timeout=30)
        assert word in str(e.value).lower(), (bad, e.value)


def test_workspace_modes_unaffected(daemon, ws, tmp_path):
    c = daemon.client()
    src = host_dir(tmp_path)
    (ws / "f").write_text("ws\n")
    os.chmod(ws, 0o777)
    sb = mk(c, ws, src, mode="ro")
    out = sh(c, sb, "echo x > /workspace/f 2>/dev/null && echo wrote || echo ro; "
                    "echo y > /data/y && echo data-ok")
    assert out == "ro\ndata-ok\n", out
    assert changes(c, sb) == {"y": "added"}
    assert not (src / "y").exists()
    sb2 = mk(c, ws, src, mode="rw")
    assert sh(c, sb2, "echo live > /workspace/live; echo z > /data/z; echo ok") == "ok\n"
    assert (ws / "live").read_text() == "live\n"  # rw: straight to the host
    assert not (src / "z").exists()  # the overlay mount: not until its commit
    assert changes(c, sb2) == {"z": "added"}
    c.call("workspace.commit", {"sandbox": sb2, "mount": "/data"})
    assert (src / "z").read_text() == "z\n"


def test_conch_run_overlay_needs_overlay_mode(ws, tmp_path):
    # conch run takes the type (test_run_mounts.py): its changes follow the workspace's, so
    # a workspace that keeps none (ro, rw) is refused it.
    src = host_dir(tmp_path)
    r = conch(["run", "--no-daemon", "--workspace", ws, "--mode", "ro", "--mount",
               f"type=overlay,source={src},target=/data", "--", "true"])
    assert r.rc == 2, r.describe()
    assert "--mode overlay" in r.stderr, r.describe()


def test_cli_create_changes_commit(daemon, ws, tmp_path):
    src = host_dir(tmp_path)

    def cli(*args):
        r = conch([args[0], "--socket", daemon.sock, *args[1:]])
        assert r.rc == 0, r.describe()
        return r.stdout

    sid = cli("create", "--workspace", ws, "--mount",
              f"type=overlay,source={src},target=/data").strip()
    cli("exec", sid, "--", "bash", "-c", "echo n > /data/n.txt; rm /data/keep.txt")
    assert cli("changes", "--mount", "/data", sid) == "D keep.txt\nA n.txt\n"
    assert cli("changes", sid) == ""
    assert "+n" in cli("diff", "--mount", "/data", sid, "n.txt")
    assert (src / "keep.txt").exists()
    assert "committed n.txt" in cli("commit", "--mount", "/data", sid, "n.txt")
    assert (src / "n.txt").read_text() == "n\n" and (src / "keep.txt").exists()
    cli("commit", "--mount", "/data", sid)
    assert not (src / "keep.txt").exists()
    r = conch(["changes", "--socket", daemon.sock, "--mount", "/nope", sid])
    assert r.rc != 0 and "no overlay mount" in r.stderr, r.describe()


def test_snapshots_and_forks_leave_it_alone(daemon, ws, tmp_path):
    # Not snapshotted: a snapshot and a restore keep the mount's upper as it is; a fork starts
    # with an empty one (the host dir as it is); a destroy removes it.
    c = daemon.client()
    src = host_dir(tmp_path)
    sb = mk(c, ws, src)
    sh(c, sb, "echo 1 > /data/one")
    snap = c.call("workspace.snapshot", {"sandbox": sb}, timeout=30)["id"]
    sh(c, sb, "echo 2 > /data/two")
    c.call("workspace.restore", {"sandbox": sb, "snapshot": snap, "force": True}, timeout=30)
    assert changes(c, sb) == {"one": "added", "two": "added"}
    fork = c.call("sandbox.fork", {"sandbox": sb}, timeout=30)["id"]
    assert changes(c, fork) == {}
    assert sh(c, fork, "ls /data") == "gone.txt\nkeep.txt\nold.txt\nsub\n"
    c.call("sandbox.destroy", {"id": sb}, timeout=30)
    assert not os.path.exists(os.path.join(str(daemon.state_dir), "sandboxes", sb))
    assert sorted(os.listdir(src)) == ["gone.txt", "keep.txt", "old.txt", "sub"]


def test_writes_count_against_the_disk_budget(daemon, ws, tmp_path):
    # Its upper lies on the state dir's disk: the sandbox's disk limit covers it (before, a
    # command wrote there without bound).
    c = daemon.client()
    src = host_dir(tmp_path)
    sb = mk(c, ws, src, disk=8 << 20)
    r = c.call("exec.run", {"sandbox": sb, "timeout": 60, "command":
                            "for i in $(seq 40); do head -c 1M /dev/zero > /data/f$i; done; "
                            "sleep 20; echo survived"}, timeout=90)
    assert "survived" not in r["stdout"], r
    assert r["error"] and r["error"]["kind"] == "limit" and "disk" in r["error"]["message"], r
    assert not (src / "f1").exists()
