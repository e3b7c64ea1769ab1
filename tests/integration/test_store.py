# test_store.py - store mounts (issue 18): a named store of files kept in SQLite under the
# daemon's state dir, seen inside a sandbox as an ordinary directory and written back after
# each command in one transaction; store.* on the host side and `conch store`. Each promise is
# tried: a round trip both ways, deletes, two sandboxes on one store (no lost update; the last
# writer wins and is recorded), a daemon killed in the middle of a write-back (the transaction
# happened or not), a restart keeps the store; and each fence is attacked: links, fifos and
# devices planted in the view are never stored or followed (a link planted where the host
# writes does not lead the daemon out of the view), bad names and paths, the size caps.
import os
import sqlite3
import threading
import time

import pytest

from conftest import conch, IS_ROOT
from rpcclient import RpcError

STORE = {"type": "store", "name": "mem", "target": "/memories"}


def mk(c, ws, *mounts, **extra):
    return c.call("sandbox.create", {"workspace": str(ws), "mounts": list(mounts or [STORE]),
                                     **extra}, timeout=30)["id"]


def sh(c, sb, script, **kw):
    r = c.call("exec.run", {"sandbox": sb, "command": script, **kw}, timeout=60)
    return r


def ls(c, store="mem", path=""):
    return {e["name"]: e for e in c.call("store.ls", {"store": store, "path": path})["entries"]}


def db_rows(state_dir, store="mem"):
    con = sqlite3.connect(f"file:{state_dir}/stores/{store}.db?mode=ro", uri=True)
    try:
        return {p: (k, d) for p, k, d in con.execute("SELECT path, kind, deleted FROM files")}
    finally:
        con.close()


def history(state_dir, store="mem"):
    con = sqlite3.connect(f"file:{state_dir}/stores/{store}.db?mode=ro", uri=True)
    try:
        return list(con.execute("SELECT path, op, writer, replaced FROM history ORDER BY seq"))
    finally:
        con.close()


def test_round_trip_and_deletes(daemon, ws):
    c = daemon.client()
    sb = mk(c, ws)
    r = sh(c, sb, "id -un; stat -c %U /memories; echo hello > /memories/note.md; "
                  "mkdir -p /memories/a/b; printf 'deep' > /memories/a/b/c.txt; "
                  "mkdir /memories/empty; chmod 600 /memories/note.md")
    assert r["exit_code"] == 0, r
    assert r["stdout"] == "agent\nagent\n", r
    rep = r["stores"][0]
    assert rep["name"] == "mem" and rep["target"] == "/memories" and "error" not in rep, rep
    assert rep["written"] == 5, rep  # note.md, a, a/b, a/b/c.txt, empty
    top = ls(c)
    assert set(top) == {"note.md", "a", "empty"}, top
    assert top["a"]["type"] == "dir" and top["note.md"]["mode"] == 0o600, top
    assert top["note.md"]["writer"] == sb
    got = c.call("store.read", {"store": "mem", "path": "/a/b/c.txt"})
    assert got["content"] == "deep" and got["encoding"] == "utf-8", got
    # Written on the host: in the view before the next command, binary content included.
    c.call("store.write", {"store": "mem", "path": "from-host/x.bin", "content": "AAEC/w==",
                           "encoding": "base64"})
    c.call("store.write", {"store": "mem", "path": "note.md", "content": "rewritten\n"})
    r = sh(c, sb, "od -An -tx1 /memories/from-host/x.bin; cat /memories/note.md")
    assert r["stdout"].split() == ["00", "01", "02", "ff", "rewritten"], r
    b = c.call("store.read", {"store": "mem", "path": "from-host/x.bin"})
    assert b["encoding"] == "base64" and b["content"] == "AAEC/w==", b
    # Deletes both ways: a file and a whole dir inside, a file on the host.
    r = sh(c, sb, "rm /memories/note.md; rm -r /memories/a")
    assert r["stores"][0]["deleted"] >= 2, r
    assert set(ls(c)) == {"empty", "from-host"}
    c.call("store.delete", {"store": "mem", "path": "from-host"})
    r = sh(c, sb, "ls -A /memories")
    assert r["stdout"].split() == ["empty"], r
    with pytest.raises(RpcError) as ei:
        c.call("store.read", {"store": "mem", "path": "note.md"})
    assert ei.value.data_code == "file_not_found"
    # A second sandbox (a later run) starts from what the store holds.
    sb2 = mk(c, ws)
    assert sh(c, sb2, "ls -A /memories")["stdout"] == "empty\n"
    stores = {s["name"]: s for s in c.call("store.list")["stores"]}
    assert stores["mem"]["entries"] == 1, stores
    # Jobs and session commands write back too.
    j = c.call("job.start", {"sandbox": sb, "command": "echo job > /memories/job.txt"})["job_id"]
    st = c.call("job.wait", {"job_id": j, "timeout": 30})
    assert st["stores"][0]["written"] == 1, st
    assert c.call("store.read", {"store": "mem", "path": "job.txt"})["content"] == "job\n"
    s = c.call("session.open", {"sandbox": sb})["session"]
    r = c.call("session.run", {"session": s, "command": "echo sess > /memories/sess.txt"},
               timeout=30)
    assert r["stores"][0]["written"] == 1, r
    assert c.call("store.read", {"store": "mem", "path": "sess.txt"})["content"] == "sess\n"


def test_an_interactive_shell_is_written_back_when_it_ends(daemon, ws):
    c = daemon.client()
    sb = mk(c, ws)
    sid = c.call("session.open", {"sandbox": sb})["session"]
    c.call("session.attach", {"session": sid, "write": True})
    c.call("session.write", {"session": sid, "data": "echo typed > /memories/typed.txt; exit\n"})
    c.wait_notification("session.ended", lambda p: p["session"] == sid, timeout=30)

    def stored():
        try:
            return c.call("store.read", {"store": "mem", "path": "typed.txt"})["content"]
        except RpcError:
            return None
    c.wait_for(lambda: stored() == "typed\n", timeout=30, what="the shell's file in the store")


def test_cli_store_verbs(daemon, ws, tmp_path):
    c = daemon.client()
    sock = ["--socket", daemon.sock]
    r = conch(["create", *sock, "--workspace", str(ws), "--mount",
               "type=store,name=notes,target=/notes"])
    assert r.rc == 0, r.describe()
    sb = r.stdout.strip()
    src = tmp_path / "in.bin"
    src.write_bytes(bytes(range(256)))
    assert conch(["store", *sock, "put", "notes", "dir/in.bin", str(src)]).rc == 0
    r = conch(["store", *sock, "put", "notes", "stdin.txt"], input=b"from stdin\n")
    assert r.rc == 0, r.describe()
    r = conch(["exec", *sock, sb, "--", "sh", "-c", "cat /notes/stdin.txt; wc -c < /notes/dir/in.bin"])
    assert r.stdout == "from stdin\n256\n", r.describe()
    r = conch(["exec", *sock, sb, "--", "sh", "-c", "echo inside > /notes/made.txt"])
    assert r.rc == 0, r.describe()
    r = conch(["store", *sock, "cat", "notes", "made.txt"])
    assert r.rc == 0 and r.stdout == "inside\n", r.describe()
    r = conch(["store", *sock, "ls", "notes"])
    assert r.rc == 0 and [l.split()[-1] for l in r.stdout.splitlines()] == ["dir/", "made.txt", "stdin.txt"], r.describe()
    r = conch(["store", *sock, "--json", "list"])
    assert r.rc == 0 and '"notes"' in r.stdout, r.describe()
    assert conch(["store", *sock, "rm", "notes", "dir"]).rc == 0
    r = conch(["store", *sock, "cat", "notes", "dir/in.bin"])
    assert r.rc != 0 and "no 'dir/in.bin'" in r.stderr, r.describe()
    assert conch(["store", *sock, "frob"]).rc == 2
    assert conch(["store", *sock, "cat", "notes"]).rc == 2
    # conch run opens the daemon's store itself (its state dir given): the daemon sees it.
    r = conch(["run", "--no-daemon", "--state-dir", daemon.state_dir, "--workspace", str(ws),
               "--mount", "type=store,name=notes,target=/notes", "--", "sh", "-c",
               "echo r > /notes/run.txt"])
    assert r.rc == 0, r.describe()
    r = conch(["store", *sock, "cat", "notes", "run.txt"])
    assert r.rc == 0 and r.stdout == "r\n", r.describe()


def test_two_sandboxes_no_lost_update(daemon, ws):
    c = daemon.client()
    a, b = mk(c, ws), mk(c, ws)
    # Interleaved: each sees the other's files after the other's command.
    sh(c, a, "echo a1 > /memories/a1")
    r = sh(c, b, "cat /memories/a1; echo b1 > /memories/b1")
    assert r["stdout"] == "a1\n", r
    r = sh(c, a, "cat /memories/b1; echo a2 > /memories/a2")
    assert r["stdout"] == "b1\n", r
    # Concurrent: both write many files at once, and one file in common.
    c2 = daemon.client()
    results = {}

    def run(client, sb, tag):
        results[tag] = client.call("exec.run", {"sandbox": sb, "command":
                                   f"for i in $(seq 40); do echo {tag}$i > /memories/{tag}$i; done; "
                                   f"echo {tag} > /memories/shared"}, timeout=60)

    ta = threading.Thread(target=run, args=(c, a, "x"))
    tb = threading.Thread(target=run, args=(c2, b, "y"))
    ta.start(); tb.start(); ta.join(); tb.join()
    assert results["x"]["exit_code"] == 0 and results["y"]["exit_code"] == 0, results
    names = set(ls(c))
    for tag in "xy":
        assert {f"{tag}{i}" for i in range(1, 41)} <= names, sorted(names)
    assert {"a1", "a2", "b1", "shared"} <= names
    shared = c.call("store.read", {"store": "mem", "path": "shared"})
    assert shared["content"] in ("x\n", "y\n")
    winner = a if shared["content"] == "x\n" else b
    assert shared["writer"] == winner
    # The same file changed in both before either wrote back: the later write-back wins and
    # the history records whose change it replaced.
    sh(c, a, "echo base > /memories/conflict")
    assert sh(c, b, "cat /memories/conflict")["stdout"] == "base\n"
    ja = c.call("job.start", {"sandbox": a, "command": "echo from-a > /memories/conflict; sleep 1"})["job_id"]
    r = sh(c, b, "sleep 0.3; echo from-b > /memories/conflict")
    c.call("job.wait", {"job_id": ja, "timeout": 30})
    assert c.call("store.read", {"store": "mem", "path": "conflict"})["content"] == "from-a\n"
    h = [x for x in history(daemon.state_dir) if x[0] == "conflict"]
    assert h[-1][1:] == ("write", a, b), h
    # b's view is brought up to date (its own change was written back already).
    assert sh(c, b, "cat /memories/conflict")["stdout"] == "from-a\n"


def test_planted_links_and_specials_are_not_stored(daemon, ws):
    c = daemon.client()
    sb = mk(c, ws)
    r = sh(c, sb, "cd /memories && ln -s /etc/passwd link && ln -s /etc etc-link && mkfifo fifo && "
                  "mkdir real && echo ok > real/f && ln real/f hard && echo done")
    assert r["stdout"] == "done\n", r
    rep = r["stores"][0]
    assert rep["skipped"] == 3 and "error" not in rep, rep
    assert set(ls(c)) == {"real", "hard"}, ls(c)
    assert c.call("store.read", {"store": "mem", "path": "hard"})["content"] == "ok\n"
    # The host writes beneath a name the sandbox made a link to /etc: nothing is written
    # through it (on the host, or in the sandbox's /etc).
    c.call("store.write", {"store": "mem", "path": "etc-link/conch-pwned", "content": "x"})
    assert not os.path.exists("/etc/conch-pwned")
    r = sh(c, sb, "ls /etc/conch-pwned 2>&1; readlink /memories/etc-link")
    assert "No such file" in r["stdout"] and r["stdout"].endswith("/etc\n"), r
    # A dir swapped for a link after it was materialised: the files beneath are gone from
    # the view (deleted), and the link is not followed when they are written again.
    c.call("store.write", {"store": "mem", "path": "d/inner", "content": "v1"})
    r = sh(c, sb, "rm -r /memories/d && ln -s /etc /memories/d && echo swapped")
    assert r["stdout"] == "swapped\n"
    c.call("store.write", {"store": "mem", "path": "d/passwd", "content": "pwned"})
    with open("/etc/passwd") as f:
        assert "pwned" not in f.read()
    assert sh(c, sb, "cat /etc/passwd | grep -c pwned")["stdout"] == "0\n"
    # The view is its own mount: nothing outside it can be hard-linked in, and the store's
    # database (the daemon's state dir) is nowhere inside.
    r = sh(c, sb, "ln /etc/passwd /memories/p 2>&1 | grep -c 'Invalid cross-device link'; "
                  "find / -xdev \\( -name 'mem.db*' -o -name state.db \\) 2>/dev/null | wc -l; "
                  "for m in $(awk '{print $2}' /proc/self/mounts); do find $m -maxdepth 3 "
                  "-name 'mem.db*' 2>/dev/null; done | wc -l")
    assert r["stdout"] == "1\n0\n0\n", r


def test_bad_names_and_paths(daemon, ws):
    c = daemon.client()
    for bad in ("../x", ".hidden", "a/b", "", "x" * 65, "-x", "a b", "ü"):
        with pytest.raises(RpcError) as ei:
            c.call("store.ls", {"store": bad})
        assert ei.value.data_code == "invalid_params", (bad, ei.value)
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), "mounts": [
                {"type": "store", "name": bad, "target": "/m"}]})
        assert ei.value.data_code == "invalid_params", (bad, ei.value)
    c.call("store.write", {"store": "mem", "path": "ok", "content": "1"})
    for bad in ("../x", "a/../../x", "./x", "a\nb", "x" * 300, "/".join(["d"] * 600)):
        with pytest.raises(RpcError) as ei:
            c.call("store.write", {"store": "mem", "path": bad, "content": "x"})
        assert ei.value.data_code == "invalid_path", (bad, ei.value)
    for bad, why in (({"type": "store", "target": "/m"}, "name"),
                     ({"type": "store", "name": "m", "target": "/m", "source": "/tmp"}, "source"),
                     ({"type": "store", "name": "m", "target": "/workspace/m"}, "/workspace"),
                     ({"type": "store", "name": "m", "target": "/m", "size": 10}, "size"),
                     ({"type": "tmpfs", "name": "m", "target": "/m"}, "name")):
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), "mounts": [bad]})
        assert ei.value.data_code == "invalid_params" and why in ei.value.message, (bad, ei.value)
    with pytest.raises(RpcError) as ei:
        c.call("store.ls", {"store": "never-made"})
    assert ei.value.data_code == "file_not_found"
    with pytest.raises(RpcError) as ei:
        c.call("store.write", {"store": "mem", "path": "x", "content": "!!", "encoding": "base64"})
    assert ei.value.data_code == "invalid_params"
    with pytest.raises(RpcError) as ei:
        c.call("store.read", {"store": "mem", "path": ""})
    assert ei.value.data_code == "is_directory"
    with pytest.raises(RpcError) as ei:
        c.call("store.ls", {"store": "mem", "path": "ok"})
    assert ei.value.data_code == "not_a_directory"
    # A name with control characters made inside is not stored (and not a crash).
    sb = mk(c, ws)
    r = sh(c, sb, "touch \"/memories/bad$(printf '\\001')name\"; echo x > /memories/good")
    assert r["stores"][0]["refused"] == 1 and "good" in ls(c), r


def test_size_caps(daemon, ws):
    c = daemon.client()
    small = {"type": "store", "name": "small", "target": "/s", "size": "1m"}
    sb = mk(c, ws, small)
    # One file over the cap: refused, the rest written.
    r = sh(c, sb, "head -c 1200000 /dev/zero > /s/big; echo x > /s/fine")
    rep = r["stores"][0]
    assert rep["refused"] == 1 and rep["first_skipped"] == "big" and "error" not in rep, rep
    assert set(ls(c, "small")) == {"fine"}
    # A stored file grown past the cap: refused, and what the store has of it stays.
    r = sh(c, sb, "rm /s/big; head -c 1200000 /dev/zero > /s/fine")
    assert r["stores"][0]["refused"] == 1 and r["stores"][0]["deleted"] == 0, r
    assert c.call("store.read", {"store": "small", "path": "fine"})["content"] == "x\n"
    sh(c, sb, "echo x > /s/fine")
    # Together over the cap: the whole write-back is refused, nothing of it written, and
    # written once room is made.
    r = sh(c, sb, "for i in 1 2 3; do head -c 400000 /dev/zero > /s/p$i; done")
    rep = r["stores"][0]
    assert "over its cap" in rep.get("error", ""), rep
    assert set(ls(c, "small")) == {"fine"}
    r = sh(c, sb, "rm /s/p3")
    assert "error" not in r["stores"][0], r
    assert set(ls(c, "small")) == {"fine", "p1", "p2"}
    with pytest.raises(RpcError) as ei:
        c.call("store.write", {"store": "small", "path": "h", "content": "x" * 400000})
    assert ei.value.data_code == "limit", ei.value
    assert {s["name"]: s for s in c.call("store.list")["stores"]}["small"]["max_bytes"] == 1 << 20


def test_crash_during_write_back(daemon_factory, ws, monkeypatch):
    # A pause after each entry stored (a test hook) holds the transaction open for ~3 s.
    monkeypatch.setenv("CONCH_TEST_STORE_PAUSE_MS", "30")
    d = daemon_factory()
    c = d.client()
    sb = mk(c, ws)
    c.request("exec.run", {"sandbox": sb,
                           "command": "for i in $(seq 100); do echo $i > /memories/f$i; done"})
    view = f"{d.state_dir}/sandboxes/{sb}/stores/0"
    deadline = time.time() + 30
    while not os.path.exists(f"{view}/f100") and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the command has ended; its write-back is under way
    d.kill9()
    rows = db_rows(d.state_dir)
    assert not any(p.startswith("f") for p in rows), sorted(rows)  # none of it happened
    monkeypatch.delenv("CONCH_TEST_STORE_PAUSE_MS")
    d.start()
    c = d.client()
    assert ls(c) == {}
    c.call("sandbox.start", {"id": sb}, timeout=30)
    r = sh(c, sb, "ls /memories | wc -l; echo again > /memories/again")
    assert r["stdout"] == "0\n" and "error" not in r["stores"][0], r
    assert c.call("store.read", {"store": "mem", "path": "again"})["content"] == "again\n"


def test_restart_keeps_the_store(daemon_factory, ws):
    d = daemon_factory()
    c = d.client()
    sb = mk(c, ws)
    sh(c, sb, "mkdir -p /memories/k && echo kept > /memories/k/v")
    d.stop()
    d.start()
    c = d.client()
    assert c.call("store.read", {"store": "mem", "path": "k/v"})["content"] == "kept\n"
    c.call("sandbox.start", {"id": sb}, timeout=30)
    assert sh(c, sb, "cat /memories/k/v")["stdout"] == "kept\n"
    f = c.call("sandbox.fork", {"sandbox": sb})["id"]
    assert sh(c, f, "cat /memories/k/v; echo f > /memories/from-fork")["stdout"] == "kept\n"
    assert "from-fork" in ls(c)


def test_view_counts_against_the_disk_limit(daemon, ws):
    # Between two write-backs the view lies on the state dir's disk: many files there are
    # stopped by the sandbox's disk limit, as the workspace's changes are.
    c = daemon.client()
    sb = mk(c, ws, disk=4 << 20)
    r = sh(c, sb, "for i in $(seq 60); do head -c 500000 /dev/zero > /memories/f$i || exit 3; "
                  "sleep 0.05; done; echo all-written", timeout=60)
    assert "all-written" not in r["stdout"], r
    assert r["error"]["kind"] == "limit" and "disk limit" in r["error"]["message"], r
    # What was there when it was stopped is written back, within the store's caps.
    assert "error" not in r["stores"][0] and r["stores"][0]["written"] >= 1, r
