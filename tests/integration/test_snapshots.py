# test_snapshots.py - workspace.snapshot / restore / snapshots / snapshot_delete and
# sandbox.fork (issue 18): a snapshot freezes the upper dir into a read-only layer, restore
# drops the changes made since and stacks the sandbox on the snapshot, a fork is a new
# sandbox on the same frozen layers. Lean: one daemon per test, each test checks much.
import json
import os

import pytest

from conftest import conch
from rpcclient import RpcError


def sh(c, sb, cmd):
    r = c.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=60)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def err_of(fn):
    with pytest.raises(RpcError) as ei:
        fn()
    return ei.value


def test_snapshot_restore_fork_delete_and_restart(daemon_factory, ws):
    (ws / "keep.txt").write_text("base\n")
    (ws / "gone.txt").write_text("to delete\n")
    (ws / "dir").mkdir()
    (ws / "dir" / "old.txt").write_text("old\n")
    host_before = sorted(os.listdir(ws))
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "name": "orig"})["id"]

    # State A: a file added, one changed, one deleted (a whiteout), a dir replaced by an
    # opaque one (rm -r then mkdir), a rename across the layers.
    sh(c, sb, "echo a > added.txt; echo changed > keep.txt; rm gone.txt; rm -r dir; "
              "mkdir dir; echo new > dir/new.txt; echo r > r1.txt")
    snap_a = c.call("workspace.snapshot", {"sandbox": sb, "name": "state-a"})
    assert snap_a["name"] == "state-a" and snap_a["parent"] is None and snap_a["depth"] == 1
    assert snap_a["size"] > 0 and snap_a["sandbox"] == sb, snap_a
    a = snap_a["id"]
    # The sandbox goes on, on its snapshot, with an empty upper: what it shows is unchanged.
    view_a = "a\nchanged\nnew\nabsent\nabsent\n"
    probe = ("cat added.txt keep.txt dir/new.txt; test -e gone.txt && echo present || echo absent; "
             "test -e dir/old.txt && echo present || echo absent")
    assert sh(c, sb, probe) == view_a
    assert c.call("sandbox.get", {"id": sb})["snapshot"] == a

    # State B, on top of A: more changes, including deleting what A added and renaming.
    sh(c, sb, "rm added.txt; echo b > b.txt; echo changed-again > keep.txt; mv r1.txt r2.txt")
    b = c.call("workspace.snapshot", {"sandbox": sb})["id"]
    sh(c, sb, "echo after-b > c.txt")
    assert c.call("workspace.snapshots", {"sandbox": sb})["snapshots"][-1]["parent"] == a

    # Restore A: B's and the later changes are gone, A's are back (whiteouts included).
    r = c.call("workspace.restore", {"sandbox": sb, "snapshot": "state-a"})
    assert r["snapshot"] == a
    assert sh(c, sb, probe) == view_a
    assert sh(c, sb, "ls") == "added.txt\ndir\nkeep.txt\nr1.txt\n"
    # ... and B is still there to go back to.
    c.call("workspace.restore", {"sandbox": sb, "snapshot": b})
    assert sh(c, sb, "ls; cat keep.txt") == "b.txt\ndir\nkeep.txt\nr2.txt\nchanged-again\n"

    # A fork of the sandbox: the source is snapshotted (implicitly), the fork starts there;
    # the two are independent both ways.
    f = c.call("sandbox.fork", {"sandbox": sb, "name": "forked"})
    fid = f["id"]
    assert f["name"] == "forked" and f["snapshot"] not in (None, a, b), f
    assert sh(c, fid, "ls") == "b.txt\ndir\nkeep.txt\nr2.txt\n"
    sh(c, sb, "echo in-orig > only-orig.txt; rm b.txt")
    sh(c, fid, "echo in-fork > only-fork.txt; echo fork-edit > keep.txt")
    assert sh(c, sb, "ls; cat keep.txt") == "dir\nkeep.txt\nonly-orig.txt\nr2.txt\nchanged-again\n"
    assert sh(c, fid, "ls; cat keep.txt") == "b.txt\ndir\nkeep.txt\nonly-fork.txt\nr2.txt\nfork-edit\n"

    # A snapshot of the fork, and a fork of that snapshot: three layers deep.
    fs = c.call("workspace.snapshot", {"sandbox": fid, "name": "fork-snap"})
    assert fs["parent"] == f["snapshot"] and fs["depth"] == 4, fs
    g = c.call("sandbox.fork", {"snapshot": "fork-snap"})["id"]
    assert sh(c, g, "cat only-fork.txt keep.txt; test -e only-orig.txt || echo no-orig") == \
        "in-fork\nfork-edit\nno-orig\n"
    sh(c, g, "echo g > g.txt")
    assert sh(c, fid, "test -e g.txt || echo no-g") == "no-g\n"

    # The host workspace is untouched by all of this.
    assert sorted(os.listdir(ws)) == host_before
    assert (ws / "keep.txt").read_text() == "base\n"

    # Deleting a snapshot others build on is refused, naming them; an unknown one is not found.
    e = err_of(lambda: c.call("workspace.snapshot_delete", {"snapshot": a}))
    assert e.data_code == "snapshot_in_use" and b in str(e), e
    e = err_of(lambda: c.call("workspace.snapshot_delete", {"snapshot": "fork-snap"}))
    assert e.data_code == "snapshot_in_use" and g in str(e), e
    e = err_of(lambda: c.call("workspace.snapshot_delete", {"snapshot": "snap-nope"}))
    assert e.data_code == "snapshot_not_found", e
    e = err_of(lambda: c.call("workspace.restore", {"sandbox": sb, "snapshot": "snap-nope"}))
    assert e.data_code == "snapshot_not_found", e
    # A leaf snapshot nobody stands on can go.
    leaf = c.call("workspace.snapshot", {"sandbox": g})["id"]
    c.call("workspace.restore", {"sandbox": g, "snapshot": fs["id"]})
    assert c.call("workspace.snapshot_delete", {"snapshot": leaf})["deleted"] is True
    assert not os.path.exists(os.path.join(d.state_dir, "layers", leaf))
    assert sh(c, g, "test -e g.txt || echo no-g") == "no-g\n"

    # Busy: a job running refuses a snapshot (named), unless forced.
    job = c.call("job.start", {"sandbox": sb, "command": "sleep 60"})["job_id"]
    e = err_of(lambda: c.call("workspace.snapshot", {"sandbox": sb}))
    assert e.data_code == "busy" and job in str(e), e
    e = err_of(lambda: c.call("workspace.restore", {"sandbox": sb, "snapshot": a}))
    assert e.data_code == "busy", e
    forced = c.call("workspace.snapshot", {"sandbox": sb, "force": True})["id"]
    w = c.call("job.wait", {"job_id": job, "timeout": 30})
    assert w["running"] is False, w

    # A daemon restart keeps the snapshots, the stacks and what each sandbox shows.
    listed = {s["id"] for s in c.call("workspace.snapshots", {})["snapshots"]}
    assert {a, b, fs["id"], forced} <= listed and leaf not in listed
    d.stop()
    d.start()
    c = d.client()
    assert {s["id"] for s in c.call("workspace.snapshots", {})["snapshots"]} == listed
    for x in (sb, fid, g):
        c.call("sandbox.start", {"id": x}, timeout=30)
    assert sh(c, sb, "ls") == "dir\nkeep.txt\nonly-orig.txt\nr2.txt\n"
    assert sh(c, fid, "cat only-fork.txt") == "in-fork\n"
    c.call("workspace.restore", {"sandbox": sb, "snapshot": a})
    assert sh(c, sb, probe) == view_a
    e = err_of(lambda: c.call("workspace.snapshot_delete", {"snapshot": a}))
    assert e.data_code == "snapshot_in_use", e

    # Bad input: no overlay workspace, a bad name, a fork of both or neither.
    ro = c.call("sandbox.create", {"workspace": str(ws), "mode": "ro"})["id"]
    e = err_of(lambda: c.call("workspace.snapshot", {"sandbox": ro}))
    assert "overlay" in str(e), e
    for bad in ("../x", ".", "..", "-x", "snap-1a2b3c4d", "a b", "a\nb"):
        e = err_of(lambda: c.call("workspace.snapshot", {"sandbox": sb, "name": bad}))
        assert e.data_code == "invalid_params", (bad, e)
    e = err_of(lambda: c.call("workspace.snapshot", {"sandbox": sb, "name": "state-a"}))
    assert "taken" in str(e), e
    e = err_of(lambda: c.call("sandbox.fork", {}))
    assert e.data_code == "invalid_params", e
    # Both: only a snapshot of that sandbox's (test_attack_today2 forks one that is).
    e = err_of(lambda: c.call("sandbox.fork", {"sandbox": ro, "snapshot": a}))
    assert e.data_code == "invalid_params" and e.data.get("param") == "snapshot", e
    # Some paths of a sandbox on a snapshot cannot be discarded (its upper alone is not them).
    e = err_of(lambda: c.call("workspace.discard", {"sandbox": sb, "paths": ["keep.txt"]}))
    assert "snapshot" in str(e), e
    assert (ws / "keep.txt").read_text() == "base\n"

    # The CLI verbs, by names.
    sock = ["--socket", d.sock]
    r = conch(["snapshot", *sock, "--name", "cli-snap", "orig"])
    assert r.rc == 0 and r.stdout.startswith("snap-"), r.describe()
    cli_snap = r.stdout.strip()
    r = conch(["fork", *sock, "--name", "cli-fork", "cli-snap"])
    assert r.rc == 0 and r.stdout.startswith("sb-"), r.describe()
    r = conch(["fork", *sock, "--json", "orig"])
    assert r.rc == 0 and json.loads(r.stdout)["snapshot"].startswith("snap-"), r.describe()
    r = conch(["restore", *sock, "orig", "state-a"])
    assert r.rc == 0 and r.stdout.strip() == a, r.describe()
    r = conch(["snapshots", *sock, "orig"])
    assert r.rc == 0 and "cli-snap" in r.stdout and "state-a" in r.stdout, r.describe()
    r = conch(["snapshots", *sock, "--delete", "state-a"])
    assert r.rc != 0 and "cannot be deleted" in r.stderr, r.describe()
    r = conch(["snapshots", *sock, "--json"])
    assert cli_snap in {x["id"] for x in json.loads(r.stdout)["snapshots"]}, r.describe()

    # Changes, diff and commit of a sandbox on snapshots: its layers and its upper together
    # against the host (state A, then one more change made after the restore).
    sh(c, sb, "echo later > later.txt")
    ch = {x["path"]: x["kind"] for x in c.call("workspace.changes", {"sandbox": sb})["changes"]}
    assert ch == {"added.txt": "added", "keep.txt": "modified", "gone.txt": "deleted",
                  "dir/old.txt": "deleted", "dir/new.txt": "added", "r1.txt": "added",
                  "later.txt": "added"}, ch
    diff = c.call("workspace.diff", {"sandbox": sb, "paths": ["keep.txt"]})["diff"]
    assert "-base" in diff and "+changed" in diff, diff
    c.call("workspace.commit", {"sandbox": sb})
    assert sorted(os.listdir(ws)) == ["added.txt", "dir", "keep.txt", "later.txt", "r1.txt"]
    assert (ws / "keep.txt").read_text() == "changed\n"
    assert os.listdir(ws / "dir") == ["new.txt"]
    assert c.call("workspace.changes", {"sandbox": sb})["changes"] == []
    assert sh(c, sb, probe) == view_a
    assert not os.path.exists(os.path.join(d.state_dir, "sandboxes", sb, "merged"))


def test_deep_stack_is_squashed(daemon_factory, ws):
    """Past overlayfs's bound (32 layers) the new snapshot is the whole stack squashed into
    one layer, which shows exactly what the stack showed: files, deletions of host files,
    a directory replaced, and the older snapshots still restorable."""
    (ws / "host.txt").write_text("host\n")
    (ws / "hostdir").mkdir()
    (ws / "hostdir" / "x").write_text("x\n")
    (ws / "del-me").write_text("d\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    snaps = []
    for i in range(34):
        cmd = f"echo {i} > f{i % 5}.txt; echo {i} > counter"
        if i == 3:
            cmd += "; rm del-me"
        if i == 7:
            cmd += "; rm -r hostdir; mkdir hostdir; echo y > hostdir/y"
        if i == 9:
            cmd += "; rm f1.txt"
        sh(c, sb, cmd)
        snaps.append(c.call("workspace.snapshot", {"sandbox": sb}))
    depths = [s["depth"] for s in snaps]
    assert max(depths) <= 32, depths
    assert depths[32] == 1 and snaps[32]["parent"] is None, snaps[32]
    want = "33\nf0.txt f1.txt f2.txt f3.txt f4.txt host.txt hostdir\ny\n"
    probe = "cat counter; echo $(ls | grep -v counter); ls hostdir"
    assert sh(c, sb, probe) == want
    sh(c, sb, "test ! -e del-me && test ! -e hostdir/x")
    # Each older snapshot still shows its own state.
    c.call("workspace.restore", {"sandbox": sb, "snapshot": snaps[8]["id"]})
    assert sh(c, sb, "cat counter; ls hostdir; test -e del-me || echo no-del") == "8\ny\nno-del\n"
    c.call("workspace.restore", {"sandbox": sb, "snapshot": snaps[2]["id"]})
    assert sh(c, sb, "cat counter; ls hostdir; cat del-me") == "2\nx\nd\n"
    c.call("workspace.restore", {"sandbox": sb, "snapshot": snaps[33]["id"]})
    assert sh(c, sb, probe) == want


def test_snapshot_without_a_restart_when_nothing_runs(daemon_factory, ws):
    """A snapshot (and a restore) of a sandbox where nothing runs swaps its overlay in place: the sandbox is not restarted (its /tmp stays), its persistent file
    workers are replaced, and what is written after it lands above the snapshot, never in it.
    With a command running, a forced snapshot still restarts the sandbox."""
    (ws / "f.txt").write_text("host\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    sh(c, sb, "echo one > f.txt; echo kept > /tmp/t; chmod 750 /workspace")
    # A persistent file worker holds /workspace as its cwd: it must not survive the snapshot.
    c.call("fs.write", {"sandbox": sb, "path": "/workspace/w.txt", "content": "fs-one\n"})
    s1 = c.call("workspace.snapshot", {"sandbox": sb})["id"]
    assert sh(c, sb, "cat /tmp/t f.txt w.txt; stat -c %a /workspace") == "kept\none\nfs-one\n750\n"
    assert c.call("fs.read", {"sandbox": sb, "path": "/workspace/w.txt"})["content"] == "fs-one\n"
    # After it: through a command and through a (new) file worker.
    sh(c, sb, "echo two > f.txt")
    c.call("fs.write", {"sandbox": sb, "path": "/workspace/w.txt", "content": "fs-two\n"})
    fork = c.call("sandbox.fork", {"snapshot": s1})["id"]
    assert sh(c, fork, "cat f.txt w.txt") == "one\nfs-one\n"
    r = c.call("workspace.restore", {"sandbox": sb, "snapshot": s1})
    assert r["snapshot"] == s1
    assert sh(c, sb, "cat /tmp/t f.txt w.txt") == "kept\none\nfs-one\n"
    assert c.call("fs.read", {"sandbox": sb, "path": "/workspace/w.txt"})["content"] == "fs-one\n"
    # A job running: refused, then forced (a restart: /tmp is new).
    job = c.call("job.start", {"sandbox": sb, "command": "sleep 60"})
    e = err_of(lambda: c.call("workspace.snapshot", {"sandbox": sb}))
    assert e.data["code"] == "busy", e.data
    c.call("workspace.snapshot", {"sandbox": sb, "force": True}, timeout=30)
    assert sh(c, sb, "test -e /tmp/t && echo kept || echo new; cat f.txt") == "new\none\n"
    assert job


def test_a_process_left_by_a_command_cannot_write_into_a_snapshot(daemon_factory, ws):
    """A command that leaves a writer behind (a background loop holding a workspace file open
    for writing) ends with it: once its exec.run is answered nothing of it is left to write
    through the overlay that a snapshot then freezes (nor into the new one)."""
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    sh(c, sb, "(exec 3>>/workspace/log.txt; while :; do echo x >&3; sleep 0.005; done) "
              "</dev/null >/dev/null 2>&1 & sleep 0.1")
    snap = c.call("workspace.snapshot", {"sandbox": sb})["id"]
    fork = c.call("sandbox.fork", {"snapshot": snap})["id"]
    first = sh(c, fork, "wc -l < log.txt")
    live = sh(c, sb, "wc -l < log.txt")
    import time
    time.sleep(0.3)
    assert sh(c, fork, "wc -l < log.txt") == first
    assert sh(c, sb, "wc -l < log.txt") == live == first
    assert int(first) > 0


def test_snapshot_after_js_replaces_the_spare_worker(daemon_factory, ws):
    """A sandbox that ran JS keeps a spare JS worker (its cwd and Landlock rule in the old
    /workspace) after its sessions close: a snapshot without a restart ends it, and the next
    eval (a new worker) reads and writes the new stack, never the snapshot."""
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    ev = lambda code: c.call("js.eval", {"sandbox": sb, "code": code}, timeout=60)
    ev("await writeFile('/workspace/j.txt', 'one'); 1")
    c.call("js.close", {"sandbox": sb, "session": "default"})
    sh(c, sb, "echo kept > /tmp/t")
    snap = c.call("workspace.snapshot", {"sandbox": sb})["id"]
    t = c.call("exec.run", {"sandbox": sb, "command": "cat /tmp/t"}, timeout=60)
    assert t["stdout"] == "kept\n", (t, d.log())  # no restart (the log says why, if one)
    r = ev("const t = await readFile('j.txt'); await writeFile('j.txt', 'two'); t.trim()")
    assert "one" in json.dumps(r), r
    assert sh(c, sb, "cat j.txt") == "two"
    fork = c.call("sandbox.fork", {"snapshot": snap})["id"]
    assert sh(c, fork, "cat j.txt") == "one"
