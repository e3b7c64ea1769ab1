# test_since.py - workspace.changes / workspace.diff {since: <snapshot>} (issue 18): the
# changes made after one of the sandbox's own snapshots, compared with the workspace as it
# was at that snapshot (not with the host dir), and the refusal of a snapshot that is not in
# the sandbox's chain. Also the CLI's --since.
import json
import os

import pytest

from conftest import conch
from rpcclient import RpcError


def sh(c, sb, cmd):
    r = c.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=60)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def changes(c, sb, since=None):
    p = {"sandbox": sb}
    if since is not None:
        p["since"] = since
    r = c.call("workspace.changes", p)
    return {ch["path"]: (ch["kind"], ch["type"]) for ch in r["changes"]}


def diff(c, sb, since, paths=None):
    p = {"sandbox": sb, "since": since}
    if paths:
        p["paths"] = paths
    return c.call("workspace.diff", p)


def err_of(fn):
    with pytest.raises(RpcError) as ei:
        fn()
    return ei.value


def test_changes_and_diff_since_a_snapshot(daemon_factory, ws):
    (ws / "host.txt").write_text("host\n")
    (ws / "host-del.txt").write_text("host gone\n")
    (ws / "hostdir").mkdir()
    (ws / "hostdir" / "h1.txt").write_text("h1\n")
    (ws / "hostdir" / "h2.txt").write_text("h2\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]

    # Layer A (two levels down once B is taken): files added, one changed, a dir made.
    sh(c, sb, "echo a1 > a1.txt; echo a2 > a2.txt; echo 'one\ntwo\nthree' > lines.txt; "
              "echo changed-in-a > host.txt; mkdir adir; echo x > adir/x.txt; echo y > adir/y.txt")
    a = c.call("workspace.snapshot", {"sandbox": sb, "name": "snap-a"})["id"]
    # Nothing since A yet.
    assert changes(c, sb, "snap-a") == {}
    assert diff(c, sb, a)["files"] == []

    # Layer B on A.
    sh(c, sb, "echo b > b.txt; echo 'one\nTWO\nthree' > lines.txt; rm a2.txt")
    b = c.call("workspace.snapshot", {"sandbox": sb, "name": "snap-b"})["id"]

    # Live changes on B: added, modified (a file of A, a file of the host), deleted (a file
    # A added, a host file, a file B added), a dir of A replaced by a file, a host dir
    # replaced by a new dir (opaque), deleted and re-created with the same content.
    sh(c, sb, "echo live > live.txt; echo a1-live >> a1.txt; echo host-live > host-del.txt; "
              "rm b.txt; rm -r adir; echo now-a-file > adir; rm -r hostdir; mkdir hostdir; "
              "echo n > hostdir/n.txt; rm lines.txt; printf 'one\\nTWO\\nthree\\n' > lines.txt")

    # Since B: only the live changes, against the view at B.
    got = changes(c, sb, "snap-b")
    assert got == {
        "live.txt": ("added", "f"),
        "a1.txt": ("modified", "f"),
        "host-del.txt": ("modified", "f"),
        "b.txt": ("deleted", "f"),
        "adir": ("type_changed", "f"),
        "hostdir/h1.txt": ("deleted", "f"),
        "hostdir/h2.txt": ("deleted", "f"),
        "hostdir/n.txt": ("added", "f"),
    }, got
    # lines.txt was deleted and re-created with the content it had at B: no change.
    assert "lines.txt" not in got

    # Since A, two levels down: B's changes and the live ones together, against A's view.
    got = changes(c, sb, a)
    assert got == {
        "live.txt": ("added", "f"),
        "a1.txt": ("modified", "f"),
        "a2.txt": ("deleted", "f"),
        "lines.txt": ("modified", "f"),
        "host-del.txt": ("modified", "f"),
        "adir": ("type_changed", "f"),
        "hostdir/h1.txt": ("deleted", "f"),
        "hostdir/h2.txt": ("deleted", "f"),
        "hostdir/n.txt": ("added", "f"),
    }, got
    # b.txt was added and deleted after A: no change since A.
    assert "b.txt" not in got

    # Without since: against the host, as before.
    plain = changes(c, sb)
    assert plain["a1.txt"] == ("added", "f") and plain["host.txt"] == ("modified", "f")
    assert "b.txt" not in plain and plain["adir"] == ("added", "f")

    # The diffs show the view at the snapshot on the "a" side.
    dd = diff(c, sb, "snap-b", ["a1.txt", "b.txt", "host-del.txt"])
    files = {f["path"]: f for f in dd["files"]}
    assert "-a1\n" not in files["a1.txt"]["diff"] and "+a1-live\n" in files["a1.txt"]["diff"]
    assert "-b\n" in files["b.txt"]["diff"] and "+++ /dev/null" in files["b.txt"]["diff"]
    assert "-host gone\n" in files["host-del.txt"]["diff"]
    assert "+host-live\n" in files["host-del.txt"]["diff"]
    dl = diff(c, sb, a, ["lines.txt"])
    assert "-two\n" in dl["diff"] and "+TWO\n" in dl["diff"], dl
    # The whole diff since B covers all its changes.
    dall = diff(c, sb, b)
    assert sorted(f["path"] for f in dall["files"]) == sorted(changes(c, sb, b))

    # Paging works with since.
    r = c.call("workspace.changes", {"sandbox": sb, "since": a, "limit": 2})
    assert len(r["changes"]) == 2 and r["changes_total"] == 9 and r["next_offset"] == 2

    # After a restore to A: the changes since A are those made after the restore; B is no
    # longer in the chain.
    c.call("workspace.restore", {"sandbox": sb, "snapshot": a})
    assert changes(c, sb, a) == {}
    sh(c, sb, "rm a1.txt; echo again > r.txt")
    assert changes(c, sb, a) == {"a1.txt": ("deleted", "f"), "r.txt": ("added", "f")}
    e = err_of(lambda: changes(c, sb, "snap-b"))
    assert e.code == -32602 and e.data.get("param") == "since", e
    assert "snap-b" in e.message and "chain" in e.message, e.message

    # The host dir is never touched by any of this.
    assert (ws / "host.txt").read_text() == "host\n"
    assert sorted(p.name for p in ws.iterdir()) == ["host-del.txt", "host.txt", "hostdir"]


def test_since_refuses_what_is_not_in_the_chain(daemon_factory, ws, tmp_path):
    (ws / "f.txt").write_text("f\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    other = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    sh(c, other, "echo o > o.txt")
    theirs = c.call("workspace.snapshot", {"sandbox": other, "name": "theirs"})["id"]
    # A sandbox with no snapshot: every since is refused.
    for bad in ("theirs", theirs, "no-such-snap", "snap-00000000"):
        e = err_of(lambda: changes(c, sb, bad))
        assert e.code == -32602 and e.data.get("param") == "since", (bad, e)
        assert bad in e.message, e.message
    # Malformed since values.
    for bad in ("", 7, ["x"], {"a": 1}, "x" * 200):
        e = err_of(lambda: c.call("workspace.diff", {"sandbox": sb, "since": bad}))
        assert e.code == -32602 and e.data.get("param") == "since", (bad, e)
    # Its own snapshot works; another sandbox's is still refused; a deleted one is unknown.
    sh(c, sb, "echo mine > mine.txt")
    mine = c.call("workspace.snapshot", {"sandbox": sb, "name": "mine"})["id"]
    assert changes(c, sb, mine) == {}
    e = err_of(lambda: changes(c, sb, theirs))
    assert e.code == -32602 and "theirs" in e.message or theirs in e.message
    snap2 = c.call("workspace.snapshot", {"sandbox": other})["id"]
    c.call("sandbox.destroy", {"id": other})
    c.call("workspace.snapshot_delete", {"snapshot": snap2})
    e = err_of(lambda: changes(c, sb, snap2))
    assert e.code == -32602 and snap2 in e.message
    # A fork stands on the snapshot it was made from: since that snapshot is allowed there.
    f = c.call("sandbox.fork", {"snapshot": mine})["id"]
    sh(c, f, "echo forked > forked.txt; rm mine.txt")
    assert changes(c, f, "mine") == {"forked.txt": ("added", "f"), "mine.txt": ("deleted", "f")}
    # ... and the source's changes since it are its own.
    assert changes(c, sb, "mine") == {}


def test_cli_changes_and_diff_since(daemon_factory, ws):
    (ws / "f.txt").write_text("one\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "name": "clisb"})["id"]
    sh(c, sb, "echo two > f.txt")
    c.call("workspace.snapshot", {"sandbox": sb, "name": "s1"})
    sh(c, sb, "echo three > f.txt; echo n > new.txt")
    sock = ["--socket", d.sock]
    r = conch(["changes", *sock, "--since", "s1", "--json", "clisb"])
    assert r.rc == 0, r.raw_stderr.decode()
    got = {ch["path"]: ch["kind"] for ch in json.loads(r.raw_stdout.decode())["changes"]}
    assert got == {"f.txt": "modified", "new.txt": "added"}
    r = conch(["diff", *sock, "--since", "s1", "clisb"])
    assert r.rc == 0, r.raw_stderr.decode()
    assert "-two\n+three\n" in r.raw_stdout.decode() and "-one" not in r.raw_stdout.decode(), r.raw_stdout.decode()
    r = conch(["changes", *sock, "--since=nope", "clisb"])
    assert r.rc != 0 and "nope" in r.raw_stderr.decode(), (r.raw_stdout.decode(), r.raw_stderr.decode())


def test_since_follows_no_symlink_the_sandbox_plants(daemon_factory, ws):
    # After the snapshot the sandbox replaces a dir of the view with a symlink to /etc and
    # plants links to host files: the changes since list the links as links, and the diff
    # shows their targets, never the files they point to; nothing outside is read or written.
    (ws / "conf").mkdir()
    (ws / "conf" / "a.txt").write_text("a\n")
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)})["id"]
    sh(c, sb, "mkdir keep; echo k > keep/k.txt")
    s = c.call("workspace.snapshot", {"sandbox": sb})["id"]
    sh(c, sb, "rm -r conf; ln -s /etc conf; rm -r keep; ln -s /etc/passwd keep; "
              "mkdir deep; ln -s /etc/shadow deep/s; ln -s ../../../../etc deep/up")
    got = changes(c, sb, s)
    assert got == {
        "conf": ("type_changed", "l"),
        "keep": ("type_changed", "l"),
        "deep": ("added", "d"),
        "deep/s": ("added", "l"),
        "deep/up": ("added", "l"),
    }, got
    dd = diff(c, sb, s)
    files = {f["path"]: f["diff"] for f in dd["files"]}
    assert "+/etc/passwd" in files["keep"] and "root:" not in dd["diff"], dd["diff"]
    assert "-k\n" in dd["diff"] or "k.txt" not in dd["diff"]
    assert "+/etc/shadow" in files["deep/s"]
    # The state dir holds none of the temporary dirs afterwards.
    sbdir = os.path.join(d.state_dir, "sandboxes", sb)
    assert not [n for n in os.listdir(sbdir) if n.startswith("since-")], os.listdir(sbdir)
