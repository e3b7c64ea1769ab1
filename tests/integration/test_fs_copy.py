# test_fs_copy.py - fs.copy_in / fs.copy_out (issue 20, point 8): whole files between a host
# path the client names and a sandbox path, copied by a fenced file worker from a host fd the
# daemon opened and lent it. Identical bytes both ways (100 MiB, sparse and binary), the
# path rules of fs.write / fs.read (a symlink planted in the workspace leads inside the
# sandbox, never to the host), the disk limit, and host files of the wrong kind or not the one
# the client named refused with a clear error.
import hashlib
import os
import socket
import stat

import pytest
from rpcclient import RpcError


def host_id(p):
    st = os.stat(p)
    return f"{st.st_dev}:{st.st_ino}"


def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def sh(rpc, sb, cmd):
    r = rpc.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=120)
    assert r["exit_code"] == 0, r
    return r["stdout"]


def copy_in(rpc, sb, path, host):
    return rpc.call("fs.copy_in", {"sandbox": sb, "path": path, "host_path": str(host),
                                   "host_id": host_id(host)}, timeout=120)


def copy_out(rpc, sb, path, host):
    open(host, "wb").close()
    return rpc.call("fs.copy_out", {"sandbox": sb, "path": path, "host_path": str(host),
                                    "host_id": host_id(host)}, timeout=120)


def error(fn):
    with pytest.raises(RpcError) as ei:
        fn()
    return ei.value


def test_100_mib_of_sparse_binary_content_goes_in_and_comes_back_identical(rpc, sandbox, tmp_path):
    sb = sandbox()
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        # random bytes, a NUL run, a hole in the middle and data after it: 100 MiB in all
        f.write(os.urandom(30 << 20))
        f.write(b"\0" * (5 << 20))
        f.seek(90 << 20)
        f.write(os.urandom(10 << 20))
    assert os.path.getsize(src) == 100 << 20
    r = copy_in(rpc, sb, "dir/big.bin", src)
    assert r == {"bytes_written": 100 << 20, "created": True}, r
    # the command inside sees the same bytes
    assert sh(rpc, sb, "sha256sum dir/big.bin").split()[0] == sha(src)
    out = tmp_path / "back.bin"
    out.write_bytes(b"old content, longer than nothing")
    out_id = host_id(out)
    r = rpc.call("fs.copy_out", {"sandbox": sb, "path": "/workspace/dir/big.bin",
                                 "host_path": str(out), "host_id": out_id}, timeout=120)
    assert r == {"size": 100 << 20}, r
    assert sha(out) == sha(src)
    # replacing an existing file keeps its mode; the copy is atomic (no temporary left)
    sh(rpc, sb, "chmod 640 dir/big.bin")
    small = tmp_path / "small"
    small.write_bytes(b"\x00\xff binary\n")
    assert copy_in(rpc, sb, "dir/big.bin", small) == {"bytes_written": 10, "created": False}
    assert sh(rpc, sb, "stat -c %a dir/big.bin; ls -A dir") == "640\nbig.bin\n"
    # an empty file both ways
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert copy_in(rpc, sb, "e", empty)["bytes_written"] == 0
    assert copy_out(rpc, sb, "e", tmp_path / "e.out") == {"size": 0}


def test_a_symlink_planted_in_the_workspace_never_reaches_the_host(rpc, ws, sandbox, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    os.symlink(str(outside), ws / "link")
    os.symlink(str(outside / "secret"), ws / "secret_link")
    sb = sandbox()
    src = tmp_path / "payload"
    src.write_bytes(b"planted\n")
    # the links resolve inside the sandbox, where that path does not exist
    e = error(lambda: copy_in(rpc, sb, "link/planted", src))
    assert e.data_code in ("file_not_found", "permission_denied", "invalid_path"), e
    assert not (outside / "planted").exists()
    e = error(lambda: copy_out(rpc, sb, "secret_link", tmp_path / "got"))
    assert e.data_code in ("file_not_found", "permission_denied", "invalid_path"), e
    assert (tmp_path / "got").read_bytes() == b""
    for bad in ("../escape", "/workspace/../../escape"):
        with pytest.raises(RpcError):
            copy_in(rpc, sb, bad, src)
    assert not (ws.parent / "escape").exists()
    # a NUL in the path is refused, not cut short
    e = error(lambda: rpc.call("fs.copy_in", {"sandbox": sb, "path": "a\0/../../x",
                                              "host_path": str(src), "host_id": host_id(src)}))
    assert e.data_code in ("invalid_path", "invalid_params"), e


def test_a_file_past_the_disk_limit_is_too_large_and_leaves_nothing(rpc, sandbox, tmp_path):
    sb = sandbox(disk=1 << 20)
    src = tmp_path / "big"
    src.write_bytes(os.urandom(4 << 20))
    e = error(lambda: copy_in(rpc, sb, "big.bin", src))
    assert e.data_code == "too_large", e
    assert "limit" not in e.data, e  # not the per-request cap: the disk's
    assert sh(rpc, sb, "ls -A") == ""
    assert rpc.call("workspace.changes", {"sandbox": sb})["changes"] == []


def test_host_files_of_the_wrong_kind_are_refused(rpc, sandbox, tmp_path):
    sb = sandbox()
    sh(rpc, sb, "echo hi > f")

    def refused(host, hid, param="host_path", method="fs.copy_in"):
        e = error(lambda: rpc.call(method, {"sandbox": sb, "path": "f", "host_path": host,
                                            "host_id": hid}, timeout=30))
        assert e.data_code == "invalid_params" and e.data.get("param") == param, e
        return e

    d = tmp_path / "adir"
    d.mkdir()
    for m in ("fs.copy_in", "fs.copy_out"):
        msg = refused(str(d), host_id(d), method=m).message
        assert "not a regular file" in msg or "Is a directory" in msg, msg
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    refused(str(tmp_path / "sock"), host_id(tmp_path / "sock"))
    sock.close()
    # a FIFO with no writer: refused at once, the daemon's loop never waits on it
    os.mkfifo(tmp_path / "fifo")
    for m in ("fs.copy_in", "fs.copy_out"):
        refused(str(tmp_path / "fifo"), host_id(tmp_path / "fifo"), method=m)
    refused("relative/path", "1:2")
    refused(str(tmp_path / "missing"), "1:2")
    # a file that is not the one the client named (another host's daemon sees other files)
    f = tmp_path / "real"
    f.write_bytes(b"x")
    e = refused(str(f), "1:2", param="host_id")
    assert "another filesystem" in e.message, e
    # the sandbox's file is untouched by every refusal
    assert sh(rpc, sb, "cat f") == "hi\n"


def test_the_sandbox_side_errors_are_those_of_fs_read(rpc, sandbox, tmp_path):
    sb = sandbox()
    sh(rpc, sb, "mkdir d; mkfifo p")
    out = tmp_path / "o"
    assert error(lambda: copy_out(rpc, sb, "nope", out)).data_code == "file_not_found"
    assert error(lambda: copy_out(rpc, sb, "d", out)).data_code == "is_directory"
    assert error(lambda: copy_out(rpc, sb, "p", out)).data_code == "io_error"
    src = tmp_path / "s"
    src.write_bytes(b"s")
    assert error(lambda: copy_in(rpc, sb, "d", src)).data_code == "is_directory"
    # a read-only place inside the sandbox
    assert error(lambda: copy_in(rpc, sb, "/etc/x", src)).data_code == "permission_denied"


def test_stdio_daemon_copies_too(daemon_factory, ws, tmp_path):
    d = daemon_factory(stdio=True)
    rpc = d.client()
    sb = rpc.call("sandbox.create", {"workspace": str(ws)}, timeout=30)["id"]
    src = tmp_path / "s"
    src.write_bytes(os.urandom(3 << 20))
    copy_in(rpc, sb, "s", src)
    copy_out(rpc, sb, "s", tmp_path / "o")
    assert sha(tmp_path / "o") == sha(src)
    rpc.call("sandbox.destroy", {"id": sb}, timeout=30)


@pytest.mark.user_only
def test_a_host_file_the_client_may_not_read_or_write_is_refused(rpc, sandbox, tmp_path):
    """The daemon opens the host file as its uid, the client's: what the client may not read
    (a write-only file, for an upload) or write (a read-only one, for a download) it refuses."""
    sb = sandbox()
    sh(rpc, sb, "echo inside > f")
    wo, ro = tmp_path / "wo", tmp_path / "ro"
    wo.write_bytes(b"secret")
    ro.write_bytes(b"keep")
    os.chmod(wo, 0o200)
    os.chmod(ro, 0o400)
    for method, f in (("fs.copy_in", wo), ("fs.copy_out", ro)):
        e = error(lambda: rpc.call(method, {"sandbox": sb, "path": "f", "host_path": str(f),
                                            "host_id": host_id(f)}))
        assert e.data_code == "invalid_params" and e.data.get("param") == "host_path", e
        assert "Permission denied" in e.message, e
    assert ro.read_bytes() == b"keep"
    assert sh(rpc, sb, "cat f") == "inside\n"


def test_a_workspace_file_above_the_disk_limit_is_too_large_to_copy_out(rpc, ws, sandbox, tmp_path):
    """The worker's file size limit is the sandbox's disk limit, and it bounds the host file a
    copy out writes: a host workspace file larger than that is too_large (read in chunks)."""
    big = os.urandom(3 << 20)
    (ws / "big.bin").write_bytes(big)
    sb = sandbox(disk=1 << 20)
    e = error(lambda: copy_out(rpc, sb, "big.bin", tmp_path / "o"))
    assert e.data_code == "too_large" and "in chunks" in e.message, e
    r = rpc.call("fs.read", {"sandbox": sb, "path": "big.bin", "encoding": "base64",
                             "offset": 0, "length": 1 << 20})
    assert r["size"] == len(big)


def test_at_most_four_transfers_per_sandbox_run_at_once(rpc, sandbox, tmp_path):
    """Each transfer holds a forked worker and a host fd: past 4 at once in one sandbox the
    request is refused as busy (the clients then move the file in chunks), never queued
    without bound."""
    import json
    sb = sandbox()
    src = tmp_path / "s"
    src.write_bytes(os.urandom(8 << 20))
    ids, lines = [], b""
    for i in range(6):
        ids.append(rpc.new_id())
        lines += json.dumps({"jsonrpc": "2.0", "id": ids[-1], "method": "fs.copy_in", "params": {
            "sandbox": sb, "path": f"c{i}", "host_path": str(src),
            "host_id": host_id(src)}}).encode() + b"\n"
    rpc.send_raw(lines)  # one write: the daemon reads all six before any copy ends
    answers = [rpc.wait(i, timeout=120) for i in ids]
    busy = [a for a in answers if a.get("error", {}).get("data", {}).get("code") == "busy"]
    done = [a for a in answers if "result" in a]
    assert len(busy) == 2 and len(done) == 4, answers
    # once they ended, a transfer runs again
    assert copy_in(rpc, sb, "again", src)["bytes_written"] == 8 << 20
