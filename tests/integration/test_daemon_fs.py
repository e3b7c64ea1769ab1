# test_daemon_fs.py - the fs.* methods of `conch serve` (docs/PROTOCOL.md): each method's
# result and each error code, agreement with what commands in the sandbox see, binary
# round trips, and paths that must never leave /workspace (.., absolute, NUL, symlinks).
import base64
import hashlib
import os

import pytest

from rpcclient import RpcError

TEN_LINES = "".join(f"line{i}\n" for i in range(1, 11))


def expect_error(fn, code, data_code):
    with pytest.raises(RpcError) as ei:
        fn()
    assert (ei.value.code, ei.value.data_code) == (code, data_code), f"want {code}/{data_code}, got {ei.value}"
    return ei.value


def rel(p):
    """A returned path with the optional /workspace/ prefix removed."""
    if p.startswith("/workspace/"):
        return p[len("/workspace/"):]
    return p


def b64(b):
    return base64.b64encode(b).decode()


@pytest.fixture
def fsb(rpc, ws, sandbox):
    """(call, sandbox id): call(method, **params) adds the sandbox param."""
    (ws / "a.txt").write_text("alpha\nbeta\ngamma\n")
    (ws / "ten.txt").write_text(TEN_LINES)
    (ws / "x.py").write_text("def top():\n    return 1\n")
    (ws / "notes.txt").write_text("def not_python():\n")
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "b.py").write_text("import os\ndef helper():\n    pass\n")
    (ws / "sub" / "deep" / "c.py").write_text("# c\nDEF upper():\n")
    (ws / "sub" / "data.bin").write_bytes(b"def binary\x00\x01\x02\xff")
    os.symlink("a.txt", ws / "inlink")
    sb = sandbox()

    def call(method, **params):
        return rpc.call(method, {"sandbox": sb, **params})

    return call, sb


def sh(rpc, sb, cmd):
    r = rpc.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=60)
    assert r["exit_code"] == 0, r
    return r["stdout"]


# ---- fs.read --------------------------------------------------------------------------------


def test_read_text(fsb):
    call, _ = fsb
    r = call("fs.read", path="a.txt")
    assert r["content"] == "alpha\nbeta\ngamma\n", r
    assert r["offset"] == 0 and r["lines"] == 3 and r["total_lines"] == 3, r
    assert r["truncated"] is False and r["size"] == 17, r
    # the same file by its absolute sandbox path, and through a dir that stays inside
    assert call("fs.read", path="/workspace/a.txt")["content"] == r["content"]
    assert call("fs.read", path="sub/../a.txt")["content"] == r["content"]
    # a symlink that stays in the workspace is followed
    assert call("fs.read", path="inlink")["content"] == r["content"]


def test_read_offset_limit(fsb):
    call, _ = fsb
    r = call("fs.read", path="ten.txt", offset=2, limit=3)
    assert r["content"] == "line3\nline4\nline5\n", r
    assert r["offset"] == 2 and r["lines"] == 3 and r["total_lines"] == 10, r
    assert r["truncated"] is True, r
    r = call("fs.read", path="ten.txt", offset=8, limit=100)
    assert r["content"] == "line9\nline10\n" and r["lines"] == 2 and r["truncated"] is False, r


def test_read_base64(fsb):
    call, _ = fsb
    r = call("fs.read", path="sub/data.bin", encoding="base64")
    assert base64.b64decode(r["content"]) == b"def binary\x00\x01\x02\xff", r
    assert r["size"] == 14, r


def test_read_errors(fsb):
    call, _ = fsb
    expect_error(lambda: call("fs.read", path="missing.txt"), -32010, "file_not_found")
    expect_error(lambda: call("fs.read", path="sub"), -32012, "is_directory")
    expect_error(lambda: call("fs.read", path="a.txt/x"), -32014, "not_a_directory")
    for bad in ("a\x00b", ""):
        expect_error(lambda: call("fs.read", path=bad), -32013, "invalid_path")
    # paths reach the whole sandbox, as its user sees it: ".." climbs out of /workspace
    expect_error(lambda: call("fs.read", path="../x"), -32010, "file_not_found")
    for p in ("/etc/passwd", "/workspace/../etc/passwd", "nope/../../../etc/passwd", "sub/../../etc/passwd"):
        assert "agent:x:1000" in call("fs.read", path=p)["content"], p
    # but not what the sandbox's user may not read, nor anything of the host
    expect_error(lambda: call("fs.read", path="/etc/shadow"), -32010, "file_not_found")
    expect_error(lambda: call("fs.read", path="/proc/1/environ"), -32011, "permission_denied")


def test_read_too_large(rpc, fsb):
    call, sb = fsb
    sh(rpc, sb, "head -c 11M /dev/zero | tr '\\0' 'a' > big.txt")
    e = expect_error(lambda: call("fs.read", path="big.txt"), -32017, "too_large")
    assert isinstance(e.data.get("limit"), int) and e.data["limit"] >= 10 << 20, e


def test_symlinks_resolve_inside_the_sandbox_never_on_the_host(rpc, ws, fsb):
    call, sb = fsb
    # planted on the host before the sandbox: an absolute link and a relative one that climbs out
    os.symlink("/etc/hostname", ws / "abs_link")
    os.symlink("../../../../../../etc/passwd", ws / "rel_link")
    os.symlink("/", ws / "root_link")
    # they lead where they lead inside the sandbox (its /etc, its /), as for a command
    for p in ("rel_link", "root_link/etc/passwd"):
        assert call("fs.read", path=p)["content"] == sh(rpc, sb, "cat /etc/passwd"), p
    assert call("fs.read", path="abs_link")["content"] == sh(rpc, sb, "cat /etc/hostname")
    # and one made inside the sandbox by a command
    sh(rpc, sb, "ln -s /etc/hostname made_link; ln -s .. up")
    assert call("fs.read", path="made_link")["content"] == sh(rpc, sb, "cat /etc/hostname")
    assert "agent:x:1000" in call("fs.read", path="up/etc/passwd")["content"]
    # writes through such links land inside the sandbox where its user may write, else fail
    expect_error(lambda: call("fs.write", path="made_link", content="x"), -32011, "permission_denied")
    call("fs.write", path="root_link/tmp/conchit-escape", content="x")
    assert sh(rpc, sb, "cat /tmp/conchit-escape") == "x"
    assert not os.path.exists("/tmp/conchit-escape")


# ---- fs.write / fs.edit ---------------------------------------------------------------------


def test_write(rpc, ws, fsb):
    call, sb = fsb
    r = call("fs.write", path="new.txt", content="héllo\n")
    assert r["bytes_written"] == len("héllo\n".encode()) and r["created"] is True, r
    r = call("fs.write", path="new.txt", content="second\n")
    assert r["created"] is False and r["bytes_written"] == 7, r
    r = call("fs.write", path="/workspace/deep/er/f.txt", content="nested\n")
    assert r["created"] is True, r
    assert sh(rpc, sb, "cat new.txt deep/er/f.txt") == "second\nnested\n"
    r = call("fs.write", path="bin.dat", content=b64(b"\x00\xff\x10"), encoding="base64")
    assert r["bytes_written"] == 3, r
    assert sh(rpc, sb, "od -An -tx1 bin.dat").split() == ["00", "ff", "10"]
    # overlay: the host has none of it
    assert not (ws / "new.txt").exists() and not (ws / "deep").exists()
    # and a command's write is visible to fs.read
    sh(rpc, sb, "echo from-cmd > cmd.txt")
    assert call("fs.read", path="cmd.txt")["content"] == "from-cmd\n"


def test_write_errors(fsb):
    call, _ = fsb
    expect_error(lambda: call("fs.write", path="sub", content="x"), -32012, "is_directory")
    expect_error(lambda: call("fs.write", path="a.txt/x", content="x"), -32014, "not_a_directory")
    for bad in ("a\x00b", ""):
        expect_error(lambda: call("fs.write", path=bad, content="x"), -32013, "invalid_path")
    # outside /workspace: where the sandbox's user may write (its /tmp), not elsewhere
    for bad in ("../x", "/etc/x", "/usr/x"):
        expect_error(lambda: call("fs.write", path=bad, content="x"), -32011, "permission_denied")
    call("fs.write", path="/tmp/x", content="in tmp")
    assert call("fs.read", path="/tmp/x")["content"] == "in tmp"


def test_write_ro_sandbox_denied(rpc, ws, sandbox):
    (ws / "a.txt").write_text("ro\n")
    sb = sandbox(mode="ro")
    with pytest.raises(RpcError) as ei:
        rpc.call("fs.write", {"sandbox": sb, "path": "a.txt", "content": "changed"})
    assert (ei.value.code, ei.value.data_code) == (-32011, "permission_denied"), ei.value
    with pytest.raises(RpcError) as ei:
        rpc.call("fs.write", {"sandbox": sb, "path": "new.txt", "content": "x"})
    assert (ei.value.code, ei.value.data_code) == (-32011, "permission_denied"), ei.value
    assert rpc.call("fs.read", {"sandbox": sb, "path": "a.txt"})["content"] == "ro\n"
    assert (ws / "a.txt").read_text() == "ro\n" and not (ws / "new.txt").exists()


def test_edit(rpc, fsb):
    call, sb = fsb
    assert call("fs.edit", path="a.txt", old_string="beta", new_string="BETA")["occurrences"] == 1
    assert sh(rpc, sb, "cat a.txt") == "alpha\nBETA\ngamma\n"
    call("fs.write", path="dup.txt", content="x y x z x\n")
    e = expect_error(lambda: call("fs.edit", path="dup.txt", old_string="x", new_string="Q"), -32016, "ambiguous_match")
    assert e.data.get("occurrences") == 3, e
    assert call("fs.read", path="dup.txt")["content"] == "x y x z x\n"
    assert call("fs.edit", path="dup.txt", old_string="x", new_string="Q", replace_all=True)["occurrences"] == 3
    assert call("fs.read", path="dup.txt")["content"] == "Q y Q z Q\n"
    expect_error(lambda: call("fs.edit", path="a.txt", old_string="nothere", new_string="x"), -32015, "string_not_found")
    expect_error(lambda: call("fs.edit", path="missing", old_string="a", new_string="b"), -32010, "file_not_found")
    expect_error(lambda: call("fs.edit", path="sub", old_string="a", new_string="b"), -32012, "is_directory")
    # multi-line old_string
    assert call("fs.edit", path="a.txt", old_string="alpha\nBETA\n", new_string="")["occurrences"] == 1
    assert call("fs.read", path="a.txt")["content"] == "gamma\n"


# ---- fs.ls / fs.glob / fs.grep --------------------------------------------------------------


def test_ls(fsb):
    call, _ = fsb
    for r in (call("fs.ls"), call("fs.ls", path="/workspace")):
        names = [e["name"] for e in r["entries"]]
        assert names == sorted(names), names
        assert set(names) == {"a.txt", "ten.txt", "x.py", "notes.txt", "sub", "inlink"}, names
        ent = {e["name"]: e for e in r["entries"]}
        assert ent["a.txt"]["type"] == "f" and ent["a.txt"]["size"] == 17, ent
        assert ent["a.txt"]["mode"] == "0644", ent
        assert rel(ent["a.txt"]["path"]) == "a.txt", ent
        assert ent["sub"]["type"] == "d", ent
        assert ent["inlink"]["type"] == "l", ent
        assert isinstance(ent["a.txt"]["mtime"], (int, float)) and ent["a.txt"]["mtime"] > 1e9, ent
    r = call("fs.ls", path="sub")
    assert [e["name"] for e in r["entries"]] == ["b.py", "data.bin", "deep"], r
    assert rel(r["entries"][0]["path"]) == "sub/b.py", r


def test_ls_errors(fsb):
    call, _ = fsb
    expect_error(lambda: call("fs.ls", path="a.txt"), -32014, "not_a_directory")
    expect_error(lambda: call("fs.ls", path="nodir"), -32010, "file_not_found")
    assert "passwd" in [e["name"] for e in call("fs.ls", path="/etc")["entries"]]
    assert "workspace" in [e["name"] for e in call("fs.ls", path="..")["entries"]]


def test_glob(fsb):
    call, _ = fsb
    r = call("fs.glob", pattern="**/*.py")
    assert sorted(rel(p) for p in r["paths"]) == ["sub/b.py", "sub/deep/c.py", "x.py"], r
    assert r["truncated"] is False
    r = call("fs.glob", pattern="*.txt")
    assert sorted(rel(p) for p in r["paths"]) == ["a.txt", "notes.txt", "ten.txt"], r
    r = call("fs.glob", pattern="sub/*")
    assert sorted(rel(p) for p in r["paths"]) == ["sub/b.py", "sub/data.bin", "sub/deep"], r
    r = call("fs.glob", pattern="?.p[xy]")
    assert sorted(rel(p) for p in r["paths"]) == ["x.py"], r
    r = call("fs.glob", pattern="*.py", path="sub")
    assert sorted(rel(p) for p in r["paths"]) == ["sub/b.py"], r
    r = call("fs.glob", pattern="**/*", max_results=2)
    assert len(r["paths"]) == 2 and r["truncated"] is True, r
    assert call("fs.glob", pattern="*.nothing")["paths"] == []
    assert "/etc/passwd" in call("fs.glob", pattern="*", path="/etc")["paths"]
    # details: what fs.ls says of each match, in the same order as paths
    assert "entries" not in call("fs.glob", pattern="sub/*")
    r = call("fs.glob", pattern="sub/*", details=True)
    assert [e["path"] for e in r["entries"]] == r["paths"], r
    ls = {e["path"]: e for e in call("fs.ls", path="sub")["entries"]}
    for e in r["entries"]:
        assert (e["type"], e["size"], e["mtime"]) == (ls[e["path"]]["type"], ls[e["path"]]["size"],
                                                      ls[e["path"]]["mtime"]), (e, ls)
    assert {rel(e["path"]): e["type"] for e in r["entries"]} == {"sub/b.py": "f", "sub/data.bin": "f",
                                                                 "sub/deep": "d"}, r
    expect_error(lambda: call("fs.glob", pattern="*", details="yes"), -32602, "invalid_params")


def test_grep(fsb):
    call, _ = fsb
    r = call("fs.grep", pattern="^def [a-z_]+\\(", glob="*.py")
    got = {(rel(m["path"]), m["line"], m["text"]) for m in r["matches"]}
    assert ("x.py", 1, "def top():") in got, r
    assert not any(p == "notes.txt" for p, _, _ in got), r
    assert r["truncated"] is False
    r = call("fs.grep", pattern="def [a-z]+")
    paths = {rel(m["path"]) for m in r["matches"]}
    assert {"x.py", "notes.txt", "sub/b.py"} <= paths, r
    assert "sub/data.bin" not in paths, f"binary file not skipped: {r}"
    assert "sub/deep/c.py" not in paths, r
    r = call("fs.grep", pattern="def upper", ignore_case=True)
    assert [(rel(m["path"]), m["line"]) for m in r["matches"]] == [("sub/deep/c.py", 2)], r
    call("fs.write", path="re.txt", content="a.b\naxb\n")
    r = call("fs.grep", pattern="a.b", fixed_string=True, path="re.txt")
    assert [(m["line"], m["text"]) for m in r["matches"]] == [(1, "a.b")], r
    r = call("fs.grep", pattern="a.b", path="re.txt")
    assert [m["line"] for m in r["matches"]] == [1, 2], r
    r = call("fs.grep", pattern="line", path="ten.txt", max_matches=3)
    assert len(r["matches"]) == 3 and r["truncated"] is True, r
    r = call("fs.grep", pattern="import", path="sub")
    assert [(rel(m["path"]), m["line"]) for m in r["matches"]] == [("sub/b.py", 1)], r
    assert any(m["path"] == "/etc/passwd" for m in call("fs.grep", pattern="^agent:", path="/etc")["matches"])


# ---- fs.delete / upload / download ----------------------------------------------------------


def test_delete(rpc, ws, fsb):
    call, sb = fsb
    assert call("fs.delete", path="a.txt") == {"deleted": True}
    expect_error(lambda: call("fs.read", path="a.txt"), -32010, "file_not_found")
    assert sh(rpc, sb, "ls a.txt 2>/dev/null || echo gone") == "gone\n"
    assert (ws / "a.txt").exists(), "overlay delete reached the host"
    expect_error(lambda: call("fs.delete", path="a.txt"), -32010, "file_not_found")
    expect_error(lambda: call("fs.delete", path="sub"), -32012, "is_directory")  # no recursive
    assert sh(rpc, sb, "ls sub/b.py") == "sub/b.py\n"
    assert call("fs.delete", path="sub", recursive=True) == {"deleted": True}
    expect_error(lambda: call("fs.ls", path="sub"), -32010, "file_not_found")
    for bad in ("/workspace/..", "/", "a\x00b", ""):
        expect_error(lambda: call("fs.delete", path=bad, recursive=True), -32013, "invalid_path")
    expect_error(lambda: call("fs.delete", path="../x", recursive=True), -32010, "file_not_found")
    expect_error(lambda: call("fs.delete", path="/etc/passwd"), -32011, "permission_denied")
    # the workspace root itself cannot be deleted
    with pytest.raises(RpcError):
        call("fs.delete", path="/workspace", recursive=True)
    assert sh(rpc, sb, "ls -d /workspace") == "/workspace\n"
    # deleting a symlink deletes the link, not its target
    call("fs.write", path="t.txt", content="target\n")
    sh(rpc, sb, "ln -s t.txt l")
    call("fs.delete", path="l")
    assert call("fs.read", path="t.txt")["content"] == "target\n"


def test_upload_download_binary(rpc, fsb):
    call, sb = fsb
    blob = bytes(range(256)) * 64 + b"\x00tail"
    r = call("fs.upload", files=[
        {"path": "up/blob.bin", "content": b64(blob)},
        {"path": "../escape.bin", "content": b64(b"x")},
        {"path": "small.txt", "content": b64(b"small\n")},
    ])
    res = r["results"]
    assert len(res) == 3 and rel(res[0]["path"]) == "up/blob.bin" and rel(res[2]["path"]) == "small.txt", r
    assert not res[0].get("error") and not res[2].get("error"), r
    assert res[1]["error"]["code"] == "permission_denied", r  # "/escape.bin": the root is read-only
    # the sandbox sees exactly those bytes
    out = sh(rpc, sb, "sha256sum up/blob.bin | cut -d' ' -f1; cat small.txt")
    assert out == hashlib.sha256(blob).hexdigest() + "\nsmall\n"
    r = call("fs.download", paths=["up/blob.bin", "missing.bin", "small.txt", "sub"])
    files = r["files"]
    assert len(files) == 4, r
    assert base64.b64decode(files[0]["content"]) == blob
    assert files[1]["error"]["code"] == "file_not_found" and files[1].get("content") is None, r
    assert base64.b64decode(files[2]["content"]) == b"small\n"
    assert files[3]["error"]["code"] == "is_directory", r


def test_unknown_sandbox(rpc):
    expect_error(lambda: rpc.call("fs.read", {"sandbox": "sb-nope", "path": "a"}), -32002, "sandbox_not_found")
    expect_error(lambda: rpc.call("fs.ls", {"sandbox": "sb-nope"}), -32002, "sandbox_not_found")


def test_write_past_the_disk_limit_is_too_large_and_leaves_nothing(rpc, ws, sandbox):
    """fs.write of a file larger than the sandbox's disk limit (RLIMIT_FSIZE of the file
    worker) used to kill the worker with SIGXFSZ: internal_error, and a temporary
    .conch-write-* file left in the workspace for a commit to carry to the host."""
    sb = sandbox(disk=1 << 20)
    with pytest.raises(RpcError) as ei:
        rpc.call("fs.write", {"sandbox": sb, "path": "big.bin", "content": "x" * (4 << 20)})
    assert ei.value.data_code == "too_large", ei.value
    left = rpc.call("exec.run", {"sandbox": sb, "command": "ls -A"})["stdout"]
    assert left == "", left
    changes = rpc.call("workspace.changes", {"sandbox": sb})["changes"]
    assert changes == [], changes
