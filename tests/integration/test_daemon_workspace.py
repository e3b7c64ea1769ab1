# test_daemon_workspace.py - workspace.* of `conch serve` (docs/PROTOCOL.md): the changes a
# sandbox made to its overlay workspace, their unified diff, committing some paths to the
# host while the rest stay pending, discarding the rest, and the sandbox after a commit.
import pytest

from conftest import tree_state
from rpcclient import RpcError


def sh(rpc, sb, cmd):
    r = rpc.call("exec.run", {"sandbox": sb, "command": cmd}, timeout=60)
    assert r["exit_code"] == 0, r
    return r


def changes(rpc, sb):
    return {c["path"]: c for c in rpc.call("workspace.changes", {"sandbox": sb})["changes"]}


@pytest.fixture
def wsb(rpc, ws, sandbox):
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    (ws / "b.txt").write_text("delete me\n")
    (ws / "keep.txt").write_text("keep\n")
    (ws / "d").mkdir()
    (ws / "d" / "in.txt").write_text("in\n")
    sb = sandbox()
    before = tree_state(ws)
    sh(rpc, sb, "sed -i 's/two/TWO/' a.txt; rm b.txt; echo new > c.txt; "
                "printf '\\000\\001\\002bin\\377' > blob.bin; echo more > d/more.txt")
    return sb, before


def test_changes(rpc, ws, wsb):
    sb, before = wsb
    ch = changes(rpc, sb)
    got = {p: c["kind"] for p, c in ch.items()}
    assert got == {"a.txt": "modified", "b.txt": "deleted", "c.txt": "added", "blob.bin": "added", "d/more.txt": "added"}, ch
    assert ch["c.txt"]["type"] == "f" and ch["c.txt"]["size"] == 4 and ch["c.txt"]["mode"] == "0644", ch
    assert tree_state(ws) == before, "host changed without a commit"


def test_changes_empty_at_start(rpc, ws, sandbox):
    (ws / "f").write_text("x\n")
    sb = sandbox()
    assert rpc.call("workspace.changes", {"sandbox": sb})["changes"] == []
    sh(rpc, sb, "cat f > /dev/null; echo t > /tmp/t")
    assert rpc.call("workspace.changes", {"sandbox": sb})["changes"] == []


def test_diff(rpc, wsb):
    sb, _ = wsb
    r = rpc.call("workspace.diff", {"sandbox": sb})
    d = r["diff"]
    assert "--- a/a.txt" in d and "+++ b/a.txt" in d, d
    lines = d.splitlines()
    assert "-two" in lines and "+TWO" in lines, d
    assert " one" in lines or "@@" in d, d
    assert "+new" in lines, d  # added file
    assert "-delete me" in lines, d  # deleted file
    files = {f["path"]: f for f in r["files"]}
    assert set(files) == {"a.txt", "b.txt", "c.txt", "blob.bin", "d/more.txt"}, files
    assert files["a.txt"]["binary"] is False and files["a.txt"]["kind"] == "modified", files
    assert "-two" in files["a.txt"]["diff"].splitlines(), files["a.txt"]
    blob = files["blob.bin"]
    assert blob["binary"] is True, blob
    assert blob["diff"].strip() and "\x00" not in blob["diff"] and "bin\ufffd" not in blob["diff"], blob
    assert len(blob["diff"].strip().splitlines()) <= 3, blob
    assert "blob.bin" in d, d
    # only some paths
    r = rpc.call("workspace.diff", {"sandbox": sb, "paths": ["a.txt"]})
    assert [f["path"] for f in r["files"]] == ["a.txt"], r
    assert "c.txt" not in r["diff"], r


def test_commit_one_path_then_discard_rest(rpc, ws, wsb):
    sb, before = wsb
    r = rpc.call("workspace.commit", {"sandbox": sb, "paths": ["c.txt"]})
    assert r["committed"] == ["c.txt"], r
    assert (ws / "c.txt").read_text() == "new\n"
    # nothing else reached the host
    after = tree_state(ws)
    after.pop("c.txt")
    after.pop(".", None)
    b = dict(before)
    b.pop(".", None)
    assert after == b, "commit of c.txt changed other host files"
    ch = changes(rpc, sb)
    assert set(ch) == {"a.txt", "b.txt", "blob.bin", "d/more.txt"}, ch
    # the sandbox still sees its own view: committed c.txt and the pending rest
    out = sh(rpc, sb, "cat c.txt a.txt; ls b.txt 2>/dev/null || echo no-b")["stdout"]
    assert out == "new\none\nTWO\nthree\nno-b\n", out

    r = rpc.call("workspace.discard", {"sandbox": sb})
    assert sorted(r["discarded"]) == ["a.txt", "b.txt", "blob.bin", "d/more.txt"], r
    assert rpc.call("workspace.changes", {"sandbox": sb})["changes"] == []
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\n"
    assert (ws / "b.txt").read_text() == "delete me\n"
    assert not (ws / "blob.bin").exists() and not (ws / "d" / "more.txt").exists()
    # the sandbox now sees the host's content again
    out = sh(rpc, sb, "cat a.txt b.txt c.txt; ls d")["stdout"]
    assert out == "one\ntwo\nthree\ndelete me\nnew\nin.txt\n", out


def test_commit_directory_and_all(rpc, ws, wsb):
    sb, _ = wsb
    r = rpc.call("workspace.commit", {"sandbox": sb, "paths": ["d"]})
    assert r["committed"] and set(r["committed"]) <= {"d", "d/more.txt"}, r
    assert (ws / "d" / "more.txt").read_text() == "more\n"
    assert "d/more.txt" not in changes(rpc, sb)
    r = rpc.call("workspace.commit", {"sandbox": sb})
    assert sorted(r["committed"]) == ["a.txt", "b.txt", "blob.bin", "c.txt"], r
    assert (ws / "a.txt").read_text() == "one\nTWO\nthree\n"
    assert not (ws / "b.txt").exists()
    assert (ws / "blob.bin").read_bytes() == b"\x00\x01\x02bin\xff"
    assert rpc.call("workspace.changes", {"sandbox": sb})["changes"] == []
    # after the commit the sandbox keeps working on the committed content
    sh(rpc, sb, "echo again >> a.txt")
    assert sh(rpc, sb, "cat a.txt")["stdout"] == "one\nTWO\nthree\nagain\n"
    assert set(changes(rpc, sb)) == {"a.txt"}
    assert (ws / "a.txt").read_text() == "one\nTWO\nthree\n"


def test_discard_some_paths(rpc, ws, wsb):
    sb, _ = wsb
    r = rpc.call("workspace.discard", {"sandbox": sb, "paths": ["a.txt", "b.txt"]})
    assert sorted(r["discarded"]) == ["a.txt", "b.txt"], r
    assert set(changes(rpc, sb)) == {"c.txt", "blob.bin", "d/more.txt"}
    assert sh(rpc, sb, "cat a.txt b.txt")["stdout"] == "one\ntwo\nthree\ndelete me\n"


def test_workspace_errors(rpc, wsb):
    sb, _ = wsb
    with pytest.raises(RpcError) as ei:
        rpc.call("workspace.changes", {"sandbox": "sb-nope"})
    assert ei.value.code == -32002
    with pytest.raises(RpcError) as ei:
        rpc.call("workspace.commit", {"sandbox": sb, "paths": ["../x"]})
    assert ei.value.data_code == "invalid_path", ei.value
