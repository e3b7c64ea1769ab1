# test_attack_today3.py - an outside attack on fs.copy_in / fs.copy_out, store mounts and
# overlay mounts, and the spare JS worker, from a hostile command in a sandbox and a hostile
# caller. Two held not: fs.copy_in checked only that the sandbox was not over its disk
# limit, and each copy could then write up to the whole limit (the worker's RLIMIT_FSIZE):
# four at once, or one into a nearly full sandbox, passed the limit several times over; and
# the daemon opened the host path before it checked it was a regular file, so a link a
# sandbox swapped in (rw workspace) to a device or a FIFO was opened, which can act. The
# rest guard attacks that held.
import json
import os
import subprocess
import time

import pytest
from rpcclient import RpcError


def host_id(p):
    st = os.stat(p)
    return f"{st.st_dev}:{st.st_ino}"


def sh(c, sb, cmd):
    r = c.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=120)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def copy(c, method, sb, path, host):
    if method == "fs.copy_out" and not os.path.exists(host):
        open(host, "wb").close()
    return c.call(method, {"sandbox": sb, "path": path, "host_path": str(host),
                           "host_id": host_id(host)}, timeout=120)


def error(fn):
    with pytest.raises(RpcError) as ei:
        fn()
    return ei.value


# ---- what broke ------------------------------------------------------------------------------

def test_concurrent_copies_in_share_the_disk_limit(rpc, sandbox, tmp_path):
    sb = sandbox(disk=10 << 20)
    src = tmp_path / "s"
    src.write_bytes(os.urandom(8 << 20))
    ids, lines = [], b""
    for i in range(4):
        ids.append(rpc.new_id())
        lines += json.dumps({"jsonrpc": "2.0", "id": ids[-1], "method": "fs.copy_in", "params": {
            "sandbox": sb, "path": f"c{i}", "host_path": str(src),
            "host_id": host_id(src)}}).encode() + b"\n"
    rpc.send_raw(lines)  # one write: all four are asked for before any ends
    answers = [rpc.wait(i, timeout=120) for i in ids]
    done = [a for a in answers if "result" in a]
    big = [a for a in answers if a.get("error", {}).get("data", {}).get("code") == "too_large"]
    assert len(done) == 1 and len(big) == 3, answers
    assert "room" in big[0]["error"]["message"], big[0]
    assert len(sh(rpc, sb, "ls").split()) == 1


def test_a_copy_in_into_a_nearly_full_sandbox_is_too_large(rpc, sandbox, tmp_path):
    sb = sandbox(disk=10 << 20)
    src = tmp_path / "s"
    src.write_bytes(os.urandom(6 << 20))
    copy(rpc, "fs.copy_in", sb, "one", src)
    # more than the room left, whatever the last measurement saw: refused at once, nothing
    # written. (A copy that fits the limit but not the room left right after another copy
    # ended is refused only once a measurement or the ended copy's charge says so: CI's
    # ASan pass accepted one there twice in a row; left open, like the same gap after an
    # fs.delete.)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(12 << 20))
    e = error(lambda: copy(rpc, "fs.copy_in", sb, "two", big))
    assert e.data_code == "too_large" and "fs.delete" in e.message, e
    assert sh(rpc, sb, "ls") == "one\n"
    # room made: it fits again
    rpc.call("fs.delete", {"sandbox": sb, "path": "one"})
    assert copy(rpc, "fs.copy_in", sb, "two", src)["bytes_written"] == 6 << 20


def test_the_named_host_path_is_looked_at_before_it_is_opened(rpc, ws, sandbox, tmp_path):
    """The daemon opened host_path for reading or writing before it checked that it was a
    regular file: a sandbox with a rw workspace swaps the file its client will copy for a
    link to a device or a FIFO, and the daemon's open itself acts (arms a watchdog, wakes a
    FIFO's writer). Seen here through a FIFO whose writer waits in open()."""
    import threading
    sb = sandbox(mode="rw")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    woke = threading.Event()

    def writer():
        fd = os.open(fifo, os.O_WRONLY)  # returns once someone opens it for reading
        woke.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    sh(rpc, sb, "echo data > f")
    (ws / "f").unlink()
    os.symlink(fifo, ws / "f")  # the sandbox's swap, after the client's stat
    e = error(lambda: rpc.call("fs.copy_in", {"sandbox": sb, "path": "g",
                                              "host_path": str(ws / "f"), "host_id": "1:2"}))
    assert e.data_code == "invalid_params" and "regular" in e.message, e
    time.sleep(0.5)
    woken = woke.is_set()
    if not woken:  # let the writer go
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    t.join(5)
    assert not woken, "the daemon opened the FIFO it was asked to copy"


# ---- what held -------------------------------------------------------------------------------

def test_copy_in_honours_readonly_and_hidden_rules(rpc, ws, sandbox, tmp_path):
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text("orig\n")
    (ws / ".env").write_text("TOKEN=s3cr3t\n")
    sb = sandbox(readonly=[".git/hooks"], hidden=[".env"])
    src = tmp_path / "payload"
    src.write_bytes(b"evil\n")
    for dest in (".git/hooks/pre-commit", ".git/hooks/new", ".env", "/workspace/.env"):
        e = error(lambda: copy(rpc, "fs.copy_in", sb, dest, src))
        assert e.data_code in ("permission_denied", "invalid_path"), (dest, e)
    out = tmp_path / "out"
    e = error(lambda: copy(rpc, "fs.copy_out", sb, ".env", out))
    assert e.data_code in ("permission_denied", "invalid_path", "file_not_found"), e
    assert b"s3cr3t" not in out.read_bytes()
    assert sh(rpc, sb, "cat .git/hooks/pre-commit") == "orig\n"
    assert rpc.call("workspace.changes", {"sandbox": sb})["changes"] == [] or all(
        ch.get("skip") for ch in rpc.call("workspace.changes", {"sandbox": sb})["changes"])
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == "orig\n"


def test_copy_out_of_proc_gives_nothing_of_the_daemon(rpc, sandbox, tmp_path):
    sb = sandbox(env={"MARK": "x"})
    os.environ["CONCH_ATTACK3_SECRET"] = "daemon-side"  # not the daemon's, but a canary
    for p in ("/proc/self/environ", "/proc/1/environ", "/proc/self/mem", "/proc/self/maps",
              "/proc/self/cmdline", "/proc/kcore"):
        out = tmp_path / "o"
        try:
            copy(rpc, "fs.copy_out", sb, p, out)
        except RpcError:
            pass
        data = out.read_bytes()
        assert b"CONCH_STATE" not in data and str(tmp_path).encode() not in data, (p, data[:200])
        out.unlink()


def test_copy_into_overlay_and_store_mounts_stays_there(daemon, ws, tmp_path):
    c = daemon.client()
    src_dir = tmp_path / "data"
    src_dir.mkdir()
    (src_dir / "keep.txt").write_text("keep\n")
    sb = c.call("sandbox.create", {"workspace": str(ws), "mounts": [
        {"type": "overlay", "source": str(src_dir), "target": "/data"},
        {"type": "store", "name": "mem3", "target": "/memories"}]}, timeout=30)["id"]
    payload = tmp_path / "payload"
    payload.write_bytes(b"evil\n")
    for dest in ("/data/keep.txt", "/data/new.txt", "/memories/x"):
        try:
            copy(c, "fs.copy_in", sb, dest, payload)
        except RpcError:
            pass
    assert sorted(os.listdir(src_dir)) == ["keep.txt"]
    assert (src_dir / "keep.txt").read_text() == "keep\n"
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


DEEP = "d=/memories; for i in $(seq 3000); do d=$d/a; done; mkdir -p $d && echo x > $d/f; echo ok"


def test_a_very_deep_tree_in_a_store_view_is_no_crash(daemon, ws):
    """3000 levels in a store's view: the write-back stores what its paths' cap allows and
    skips the rest; the daemon lives on (a tree too deep to measure counts as full)."""
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "mounts": [
        {"type": "store", "name": "deep", "target": "/memories"}]}, timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": DEEP}, timeout=120)
    rep = r["stores"][0]
    assert "error" not in rep and rep["skipped"] + rep["refused"] >= 1, rep
    assert c.call("daemon.ping", {})
    assert c.call("store.ls", {"store": "deep"})["entries"][0]["name"] == "a"
    c.call("sandbox.destroy", {"id": sb}, timeout=60)
    assert c.call("daemon.ping", {})


def test_a_very_deep_tree_in_an_overlay_mount_never_writes_past_its_source(daemon, ws, tmp_path):
    c = daemon.client()
    src = tmp_path / "data"
    src.mkdir()
    try:
        sb = c.call("sandbox.create", {"workspace": str(ws), "mounts": [
            {"type": "overlay", "source": str(src), "target": "/data"}]}, timeout=30)["id"]
        c.call("exec.run", {"sandbox": sb, "command": DEEP.replace("/memories", "/data")},
               timeout=120)
        try:
            c.call("workspace.commit", {"sandbox": sb, "mount": "/data"}, timeout=120)
        except RpcError:
            pass
        assert c.call("daemon.ping", {})
        assert os.listdir(tmp_path) == ["data"] or sorted(os.listdir(tmp_path)) == sorted(
            p for p in os.listdir(tmp_path) if p in ("data", "ws")), os.listdir(tmp_path)
        assert os.listdir(src) in ([], ["a"])
        c.call("sandbox.destroy", {"id": sb}, timeout=60)
    finally:
        subprocess.run(["rm", "-rf", str(src)], check=False)


def test_proc_fd_links_never_reach_the_lent_host_file(rpc, sandbox, tmp_path):
    """The copy worker holds the host fd: a path (or a planted link) through /proc/self/fd
    must not reopen it, for writing in a copy in or reading in a copy out."""
    sb = sandbox()
    sh(rpc, sb, "for i in 0 1 2 3 4 5 6 7 8 9; do ln -s /proc/self/fd/$i l$i; done; "
                "ln -s /proc/self/fd dl")
    src = tmp_path / "src"
    src.write_bytes(b"HOST-ORIGINAL\n")
    out = tmp_path / "out"
    for i in range(10):
        for p in (f"l{i}", f"dl/{i}", f"/proc/self/fd/{i}", f"/proc/thread-self/fd/{i}"):
            with pytest.raises(RpcError):
                copy(rpc, "fs.copy_in", sb, p, src)
            assert src.read_bytes() == b"HOST-ORIGINAL\n", p
            out.write_bytes(b"OUT\n")
            try:
                copy(rpc, "fs.copy_out", sb, p, out)
            except RpcError:
                assert out.read_bytes() in (b"OUT\n", b""), p


def test_a_host_link_in_an_overlay_source_replaced_inside_is_not_followed_on_commit(
        daemon, ws, tmp_path):
    c = daemon.client()
    src, victim = tmp_path / "data", tmp_path / "victim"
    src.mkdir()
    victim.mkdir()
    (victim / "keep").write_text("keep\n")
    os.symlink(victim, src / "sub")
    os.symlink(victim / "keep", src / "flink")
    sb = c.call("sandbox.create", {"workspace": str(ws), "mounts": [
        {"type": "overlay", "source": str(src), "target": "/data"}]}, timeout=30)["id"]
    sh(c, sb, "rm /data/sub && mkdir /data/sub && echo pwned > /data/sub/keep && "
              "echo pwned > /data/sub/new; rm /data/flink; echo pwned > /data/flink")
    # and a dir the host swaps for a link to the victim after the command made it
    sh(c, sb, "mkdir /data/late && echo pwned > /data/late/keep")
    os.symlink(victim, src / "late")
    try:
        c.call("workspace.commit", {"sandbox": sb, "mount": "/data"}, timeout=60)
    except RpcError:
        pass
    assert sorted(os.listdir(victim)) == ["keep"]
    assert (victim / "keep").read_text() == "keep\n"
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


def test_store_names_never_meet_the_state_dirs_files(daemon):
    c = daemon.client()
    names = ("state", "stores", "cap", "cap.db", "a.db-wal", "x..y")
    for i, n in enumerate(names):
        c.call("store.write", {"store": n, "path": "f", "content": f"v{i}"})
    for i, n in enumerate(names):
        assert c.call("store.read", {"store": n, "path": "f"})["content"] == f"v{i}", n
    assert sorted(s["name"] for s in c.call("store.list")["stores"]) == sorted(names)
    # the daemon's own database is not one of them, and still its own
    assert c.call("daemon.ping", {})
    assert os.path.exists(os.path.join(daemon.state_dir, "state.db"))


def test_a_restacked_sandbox_gets_a_spare_js_worker_of_the_new_workspace(daemon, ws):
    from conftest import titled_descendants
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    sh(c, sb, "echo v1 > f")
    assert c.call("js.eval", {"sandbox": sb, "session": "a", "code": "readFile('f')"},
                  timeout=60)["value"] == "v1\n"
    deadline = time.monotonic() + 30
    while not titled_descendants(daemon.pid, b"conch-js-spare") and time.monotonic() < deadline:
        time.sleep(0.05)
    c.call("js.close", {"sandbox": sb, "session": "a"})
    c.call("workspace.snapshot", {"sandbox": sb, "name": "s1"}, timeout=60)
    sh(c, sb, "echo v2 > f")
    r = c.call("js.eval", {"sandbox": sb, "session": "b",
                           "code": "writeFile('g', 'js'); readFile('f')"}, timeout=60)
    assert r["value"] == "v2\n", r
    assert sh(c, sb, "cat g") == "js"
    c.call("js.close", {"sandbox": sb, "session": "b"})
    c.call("workspace.restore", {"sandbox": sb, "snapshot": "s1"}, timeout=60)
    r = c.call("js.eval", {"sandbox": sb, "session": "c",
                           "code": "writeFile('h', 'c'); readFile('f')"}, timeout=60)
    assert r["value"] == "v1\n", r
    assert sh(c, sb, "ls") == "f\nh\n"
    # nothing a JS worker wrote reached the frozen snapshot
    f = c.call("sandbox.fork", {"snapshot": "s1"}, timeout=60)["id"]
    assert sh(c, f, "ls; cat f") == "f\nv1\n"
    for i in (f, sb):
        c.call("sandbox.destroy", {"id": i}, timeout=30)


def test_copy_in_never_writes_through_a_read_only_workspace_or_bind(daemon, ws, tmp_path):
    c = daemon.client()
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "keep").write_text("keep\n")
    (ws / "keep").write_text("keep\n")
    src = tmp_path / "src"
    src.write_bytes(b"evil\n")
    sb = c.call("sandbox.create", {"workspace": str(ws), "mode": "ro", "mounts": [
        {"type": "bind", "source": str(ro), "target": "/opt/ro"}]}, timeout=30)["id"]
    for p in ("/opt/ro/keep", "/opt/ro/new", "keep", "/workspace/new"):
        e = error(lambda: copy(c, "fs.copy_in", sb, p, src))
        assert e.data_code == "permission_denied", (p, e)
    assert copy(c, "fs.copy_in", sb, "/tmp/x", src)["bytes_written"] == 5  # its own /tmp
    assert sorted(os.listdir(ro)) == ["keep"] and (ro / "keep").read_text() == "keep\n"
    assert sorted(os.listdir(ws)) == ["keep"] and (ws / "keep").read_text() == "keep\n"
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


def test_a_spare_js_worker_keeps_the_sandboxs_path_rules(daemon, ws):
    from conftest import titled_descendants
    (ws / ".env").write_text("TOKEN=s3cr3t\n")
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "hidden": [".env"]}, timeout=30)["id"]
    code = "readFile('.env')"
    r = c.call("js.eval", {"sandbox": sb, "session": "a", "code": code}, timeout=60)
    assert "s3cr3t" not in json.dumps(r), r
    deadline = time.monotonic() + 30
    while not titled_descendants(daemon.pid, b"conch-js-spare") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert titled_descendants(daemon.pid, b"conch-js-spare")
    r = c.call("js.eval", {"sandbox": sb, "session": "b", "code": code}, timeout=60)
    assert "s3cr3t" not in json.dumps(r) and "Permission denied" in json.dumps(r), r
    r = c.call("js.eval", {"sandbox": sb, "session": "b",
                           "code": "try { writeFile('.env', 'x'); 'wrote' } catch (e) { 'no' }"},
               timeout=60)
    assert (ws / ".env").read_text() == "TOKEN=s3cr3t\n"
    c.call("sandbox.destroy", {"id": sb}, timeout=30)


def test_an_overlay_mount_may_not_show_a_rules_path_uncovered(daemon, ws):
    (ws / ".env").write_text("TOKEN=s3cr3t\n")
    (ws / "secrets").mkdir()
    (ws / "secrets" / "key").write_text("s3cr3t\n")
    (ws / ".git" / "hooks").mkdir(parents=True)
    c = daemon.client()
    for src, mode in ((ws, "overlay"), (ws, "rw"), (ws / "secrets", "overlay"),
                      (ws / ".git", "overlay"), (ws.parent, "overlay")):
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), "mode": mode,
                                      "hidden": [".env", "secrets"], "readonly": [".git/hooks"],
                                      "mounts": [{"type": "overlay", "source": str(src),
                                                  "target": "/data"}]}, timeout=30)
        assert ei.value.data_code == "invalid_params", (src, ei.value)
