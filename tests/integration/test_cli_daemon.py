# test_cli_daemon.py - the CLI covers the daemon: `conch create`, `ps`, `exec`, `changes`,
# `diff`, `commit`, `discard`, `cp` and `rm` run as a newcomer would, against a real
# `conch serve` on a temporary socket, by id and by name, with and without --json.
import json
import os
import subprocess

import pytest

from conftest import CONCH_BIN


def cli(d, *args, timeout=60, input=None):
    verb, rest = args[0], list(args[1:])
    # conch exec forwards a stdin that is not a terminal: give it an empty one, not ours.
    return subprocess.run([CONCH_BIN, verb, "--socket", d.sock, *rest], capture_output=True,
                          timeout=timeout, input=input,
                          stdin=subprocess.DEVNULL if input is None else None)


def ok(p):
    assert p.returncode == 0, (p.args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout.decode()


@pytest.fixture
def d(daemon_factory):
    return daemon_factory(extra_args=["--pool", "0"])


@pytest.fixture
def proj(tmp_path):
    p = tmp_path / "proj"
    p.mkdir()
    (p / "a.txt").write_text("hello\n")
    (p / "old.txt").write_text("old\n")
    os.chmod(tmp_path, 0o755)
    return p


def test_create_prints_the_id_and_names_work_everywhere(d, proj):
    sid = ok(cli(d, "create", "--workspace", str(proj), "--name", "dev", "--memory", "512M",
                 "--pids", "200", "--disk", "64M", "--env", "GREETING=hi")).strip()
    assert sid.startswith("sb-") and "\n" not in sid, sid
    c = d.client()
    info = c.call("sandbox.get", {"id": sid})
    assert info["name"] == "dev" and info["workspace"] == str(proj) and info["mode"] == "overlay", info
    out = ok(cli(d, "ps"))
    assert sid in out and "dev" in out, out
    listed = json.loads(ok(cli(d, "ps", "--json")))["sandboxes"]
    assert [s["id"] for s in listed] == [sid], listed
    assert ok(cli(d, "exec", "dev", "--", "bash", "-c", "echo $GREETING; cat a.txt")) == "hi\nhello\n"
    assert ok(cli(d, "exec", sid, "--", "ulimit", "-f")).strip() != ""
    # --json gives the whole sandbox object; a relative --workspace is made absolute
    p = subprocess.run([CONCH_BIN, "create", "--socket", d.sock, "--json", "--workspace", ".", "--name",
                        "two", "--mode", "ro"], capture_output=True, cwd=proj, timeout=60)
    obj = json.loads(ok(p))
    assert obj["name"] == "two" and obj["workspace"] == str(proj) and obj["mode"] == "ro", obj
    ok(cli(d, "rm", "two"))
    ok(cli(d, "rm", "dev"))
    assert json.loads(ok(cli(d, "ps", "--json")))["sandboxes"] == []


def test_unknown_and_ambiguous_names_are_refused(d, proj):
    a = ok(cli(d, "create", "--name", "same")).strip()
    # names are unique (test_cli_lifecycle.py): a second 'same' is refused at creation
    p = cli(d, "create", "--name", "same")
    assert p.returncode == 1 and b"'same' is taken" in p.stderr, p
    b = ok(cli(d, "create", "--name", "other")).strip()
    p = cli(d, "changes", "nope")
    assert p.returncode == 1 and b"no sandbox with id or name 'nope'" in p.stderr, p
    p = cli(d, "rm", "nope")
    assert p.returncode == 1, p
    p = cli(d, "create", "--bogus")
    assert p.returncode == 2 and b"usage: conch create" in p.stderr, p
    ok(cli(d, "rm", a, b))


def test_exec_prints_output_with_nul_bytes(d):
    sid = ok(cli(d, "create")).strip()
    p = cli(d, "exec", sid, "--", "bash", "-c", "printf 'x\\0y\\n'; printf 'e\\0' >&2; exit 3", timeout=30)
    assert p.returncode == 3 and p.stdout == b"x\0y\n" and p.stderr == b"e\0", p


def test_exec_refuses_arguments_that_are_not_utf8(d):
    """Found in review: a request whose params could not be built (json_pack refuses bytes
    that are not UTF-8) went out with no params at all, and the daemon blamed a missing
    'command'. It is refused here, saying why, and nothing runs."""
    sid = ok(cli(d, "create")).strip()
    p = subprocess.run([CONCH_BIN.encode(), b"exec", b"--socket", d.sock.encode(), sid.encode(),
                        b"--", b"sh", b"-c", b"echo \xff > ran"], capture_output=True, timeout=30)
    assert p.returncode != 0 and b"multibyte" in p.stderr, p
    assert b"missing required param" not in p.stderr, p
    assert ok(cli(d, "exec", sid, "--", "sh", "-c", "ls ran 2>/dev/null; true")) == ""


def test_changes_diff_commit_discard(d, proj):
    sid = ok(cli(d, "create", "--workspace", str(proj), "--name", "w")).strip()
    ok(cli(d, "exec", "w", "--", "bash", "-c",
           "echo more >> a.txt; rm old.txt; mkdir -p sub; echo n > sub/new.txt; echo t > tmp.txt"))
    out = ok(cli(d, "changes", "w"))
    assert out.splitlines() == ["M a.txt", "D old.txt", "A sub", "A sub/new.txt", "A tmp.txt"], out
    js = json.loads(ok(cli(d, "changes", "--json", sid)))
    assert js["changes_total"] == 5 and {c["path"]: c["kind"] for c in js["changes"]}["a.txt"] == "modified", js
    diff = ok(cli(d, "diff", "w", "a.txt"))
    assert "--- a/a.txt\n+++ b/a.txt\n" in diff and "+more\n" in diff and "old.txt" not in diff, diff
    whole = json.loads(ok(cli(d, "diff", "--json", "w")))
    assert {f["path"] for f in whole["files"]} >= {"a.txt", "old.txt", "sub/new.txt"}, whole
    # the diff applies to a copy of the host dir
    out = ok(cli(d, "commit", "w", "a.txt", "sub"))
    assert out.splitlines() == ["committed a.txt", "committed sub", "committed sub/new.txt"], out
    assert (proj / "a.txt").read_text() == "hello\nmore\n" and (proj / "sub" / "new.txt").read_text() == "n\n"
    assert (proj / "old.txt").exists()
    res = json.loads(ok(cli(d, "discard", "--json", "w", "tmp.txt")))
    assert res["discarded"] == ["tmp.txt"], res
    assert ok(cli(d, "changes", "w")).splitlines() == ["D old.txt"]
    res = json.loads(ok(cli(d, "commit", "--json", "w")))
    assert res["committed"] == ["old.txt"], res
    assert not (proj / "old.txt").exists() and not (proj / "tmp.txt").exists()
    assert ok(cli(d, "changes", "w")) == ""
    ok(cli(d, "rm", sid))


def test_cp_into_and_out_of_a_sandbox(d, proj, tmp_path):
    sid = ok(cli(d, "create", "--workspace", str(proj), "--name", "cpy")).strip()
    blob = bytes(range(256)) * 4099  # binary, ~1 MiB
    src = tmp_path / "blob.bin"
    src.write_bytes(blob)
    ok(cli(d, "cp", str(src), "cpy:in/blob.bin"))
    r = ok(cli(d, "exec", "cpy", "--", "sha256sum", "in/blob.bin"))
    import hashlib
    assert r.split()[0] == hashlib.sha256(blob).hexdigest()
    assert not (proj / "in").exists(), "cp into an overlay sandbox must not touch the host"
    # out, into a local directory (takes the name), with --json
    outdir = tmp_path / "out"
    outdir.mkdir()
    js = json.loads(ok(cli(d, "cp", "--json", f"{sid}:in/blob.bin", str(outdir))))
    assert js["bytes"] == len(blob) and js["dst"] == str(outdir / "blob.bin"), js
    assert (outdir / "blob.bin").read_bytes() == blob
    # a DST ending in '/' inside the sandbox takes SRC's name; absolute sandbox paths work
    ok(cli(d, "cp", str(src), "cpy:/workspace/dir/"))
    assert ok(cli(d, "exec", "cpy", "--", "stat", "-c", "%s", "dir/blob.bin")).strip() == str(len(blob))
    # larger than one request may carry (10 MiB): copied in pieces, both ways
    big = os.urandom(13 << 20)
    (tmp_path / "big.bin").write_bytes(big)
    ok(cli(d, "cp", str(tmp_path / "big.bin"), "cpy:big.bin"))
    assert ok(cli(d, "exec", "cpy", "--", "sha256sum", "big.bin")).split()[0] == hashlib.sha256(big).hexdigest()
    ok(cli(d, "cp", "cpy:big.bin", str(tmp_path / "back.bin")))
    assert (tmp_path / "back.bin").read_bytes() == big
    # an empty file too
    (tmp_path / "empty").write_bytes(b"")
    ok(cli(d, "cp", str(tmp_path / "empty"), "cpy:empty"))
    ok(cli(d, "cp", "cpy:empty", str(tmp_path / "empty2")))
    assert (tmp_path / "empty2").read_bytes() == b""
    # errors: a missing file on either side, two local paths
    p = cli(d, "cp", "cpy:nope.txt", str(tmp_path / "x"))
    assert p.returncode == 1 and b"file_not_found" in p.stderr and not (tmp_path / "x").exists(), p
    p = cli(d, "cp", str(tmp_path / "missing"), "cpy:x")
    assert p.returncode == 1 and b"No such file" in p.stderr, p
    p = cli(d, "cp", str(src), str(tmp_path / "y"))
    assert p.returncode == 2 and b"neither SRC nor DST" in p.stderr, p
    # (directories are copied: test_cli_cp.py)
    ok(cli(d, "rm", "cpy"))


def test_shell_takes_a_name_too(d, proj):
    # `conch shell NAME` (it took ids only, though names work wherever an id does)
    ok(cli(d, "create", "--workspace", str(proj), "--name", "web"))
    # (typed once the shell is up, stdin kept open meanwhile: EOF on stdin detaches)
    p = subprocess.run(["bash", "-c", "(sleep 1; printf 'echo from-$(cat a.txt)\\nexit 3\\n'; sleep 3) | "
                        '"$0" shell --socket "$1" web', CONCH_BIN, d.sock], capture_output=True, timeout=60)
    out, err = p.stdout, p.stderr
    assert p.returncode == 3, (out, err)
    assert b"from-hello" in out, out
    q = cli(d, "shell", "nosuch", input=b"exit 0\n")
    assert q.returncode != 0 and b"no sandbox with id or name 'nosuch'" in q.stderr, q.stderr


def test_exec_and_rm_take_json_and_every_client_verb_has_help(d, proj):
    sid = ok(cli(d, "create", "--workspace", str(proj), "--name", "js")).strip()
    # exec --json: the whole exec.run result, and still the command's status
    p = cli(d, "exec", "--json", "js", "--", "bash", "-c", "echo out; echo n > new.txt; exit 4")
    assert p.returncode == 4, p
    res = json.loads(p.stdout)
    assert res["stdout"] == "out\n" and res["exit_code"] == 4, res
    assert [c["path"] for c in res["changes"]] == ["new.txt"], res["changes"]
    # rm --json names what went and what did not; a failure still exits 1
    p = cli(d, "rm", "--json", "js", "nope")
    assert p.returncode == 1, p
    assert json.loads(p.stdout) == {"destroyed": [sid], "failed": ["nope"]}, p.stdout
    assert json.loads(ok(cli(d, "ps", "--json")))["sandboxes"] == []
    # --help is help (stdout, status 0), not an id or an unknown argument
    for verb in ("ps", "exec", "rm"):
        p = cli(d, verb, "--help")
        assert p.returncode == 0 and p.stdout.startswith(f"usage: conch {verb}".encode()), (verb, p)


@pytest.mark.parametrize("verb", ["ps", "exec", "rm", "shell", "attach", "sessions", "create",
                                  "changes", "diff", "commit", "discard", "cp"])
def test_socket_with_an_equals_sign_works_on_every_client_verb(d, proj, tmp_path, verb):
    """`--socket=PATH` is `--socket PATH` on every verb: ps, exec, rm, shell, attach and
    sessions parsed their options by hand and refused it (or took it for an id)."""
    c = d.client()
    sid = c.call("sandbox.create", {"workspace": str(proj), "name": "eq"})["id"]

    def run(*args, input=None):
        return subprocess.run([CONCH_BIN, verb, f"--socket={d.sock}", *args], capture_output=True,
                              timeout=60, input=input)

    if verb == "ps":
        assert sid in ok(run())
    elif verb == "exec":
        assert ok(run("eq", "--", "cat", "a.txt")) == "hello\n"
    elif verb == "rm":
        ok(run("eq"))
        assert c.call("sandbox.list")["sandboxes"] == []
    elif verb == "shell":
        p = run("eq", input=b"")  # a session opened, then our input ends: detached, status 0
        assert p.returncode == 0, p
        assert [s["sandbox"] for s in c.call("session.list")["sessions"]] == [sid]
    elif verb == "attach":
        ses = c.call("session.open", {"sandbox": sid})["session"]
        p = run("--read-only", ses, input=b"")  # our input ends at once: detached, status 0
        assert p.returncode == 0, p
    elif verb == "sessions":
        ses = c.call("session.open", {"sandbox": sid})["session"]
        assert ses in ok(run())
    elif verb == "create":
        assert ok(run("--name=two", f"--workspace={proj}")).startswith("sb-")
    elif verb in ("changes", "diff", "commit", "discard"):
        ok(run("eq"))
    elif verb == "cp":
        (tmp_path / "f.txt").write_text("x\n")
        ok(run(str(tmp_path / "f.txt"), "eq:f.txt"))
        assert c.call("fs.read", {"sandbox": sid, "path": "f.txt"})["content"].startswith("x")
