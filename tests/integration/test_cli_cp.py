# test_cli_cp.py - `conch cp` copies directory trees both ways as docker cp does (modes, empty
# directories and symbolic links kept; a DST directory receives SRC under its name), and shows
# its progress when stderr is a terminal (driven through a pty).
import hashlib
import json
import os
import subprocess

import pytest

from conftest import CONCH_BIN, tree_state
from ptydrive import drive


def cli(d, *args, timeout=120):
    verb, rest = args[0], list(args[1:])
    return subprocess.run([CONCH_BIN, verb, "--socket", d.sock, *rest], capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def ok(p):
    assert p.returncode == 0, (p.args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout.decode()


@pytest.fixture
def d(daemon_factory):
    d = daemon_factory(extra_args=["--pool", "0"])
    ok(cli(d, "create", "--name", "dev"))
    return d


def make_tree(root):
    (root / "sub" / "empty").mkdir(parents=True)
    (root / "a.txt").write_text("hello\n")
    (root / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(root / "sub" / "run.sh", 0o755)
    (root / "sub" / "secret").write_text("s\n")
    os.chmod(root / "sub" / "secret", 0o600)
    (root / "sub" / "big.bin").write_bytes(os.urandom((9 << 20) + 123))  # more than a piece
    (root / "it's odd name").write_text("q\n")
    os.symlink("a.txt", root / "link")
    os.chmod(root / "sub" / "empty", 0o700)


def shape(root):
    """tree_state without owners (the sandbox's files are its user's)."""
    return {k: (t, m, h) for k, (t, m, _u, _g, h) in tree_state(root).items() if k != "."}


def test_a_directory_goes_in_and_comes_back_the_same(d, tmp_path):
    src = tmp_path / "tree"
    src.mkdir()
    make_tree(src)
    ok(cli(d, "cp", str(src), "dev:/tmp/"))  # an existing directory: SRC goes under its name
    listing = ok(cli(d, "exec", "dev", "--", "bash", "-c",
                     "cd /tmp/tree && find . -printf '%p %y %m\\n' | sort; sub/run.sh; "
                     "readlink link; sha256sum sub/big.bin"))
    assert "./sub/run.sh f 755" in listing and "./sub/secret f 600" in listing, listing
    assert "./sub/empty d 700" in listing and "./link l 777" in listing, listing
    assert "ran\na.txt\n" in listing, listing
    assert hashlib.sha256((src / "sub" / "big.bin").read_bytes()).hexdigest() in listing
    back = tmp_path / "back"
    js = json.loads(ok(cli(d, "cp", "--json", "dev:/tmp/tree", str(back))))  # a new name
    assert js["dst"] == str(back) and js["bytes"] == (9 << 20) + 123 + 6 + 19 + 2 + 2, js
    assert shape(back) == shape(src)
    # into an existing local directory: under SRC's name
    ok(cli(d, "cp", "dev:/tmp/tree/sub", str(back)))
    assert shape(back / "sub") == shape(src / "sub")


def test_a_workspace_directory_by_relative_path(d, tmp_path):
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("x = 1\n")
    ok(cli(d, "cp", str(src), "dev:proj"))  # a new name under /workspace
    assert ok(cli(d, "exec", "dev", "--", "cat", "/workspace/proj/pkg/m.py")) == "x = 1\n"


def test_progress_on_a_terminal(d, tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(12 << 20))  # two pieces
    out, rc = drive([CONCH_BIN, "cp", "--socket", d.sock, str(f), "dev:/tmp/f.bin"], [],
                    timeout=120)
    assert rc == 0, (rc, out)
    assert b"12.0 / 12.0 MiB" in out and b"MB/s" in out, out
    out, rc = drive([CONCH_BIN, "cp", "--socket", d.sock, "dev:/tmp/f.bin", str(tmp_path / "g")], [],
                    timeout=120)
    assert rc == 0 and b"12.0 / 12.0 MiB" in out, (rc, out)
    # not on a pipe
    p = cli(d, "cp", str(f), "dev:/tmp/f2.bin")
    assert p.returncode == 0 and p.stderr == b"", p


def test_big_files_go_by_fs_copy_small_ones_in_chunks(d, tmp_path):
    """Files of 1 MiB and more move by fs.copy_in / fs.copy_out (the daemon opens the local
    file, a worker copies it in the kernel: issue 20's 200 MB/s); --json counts them."""
    src = tmp_path / "mixed"
    src.mkdir()
    big = os.urandom(5 << 20) + b"\0" * (3 << 20) + os.urandom(1000)
    (src / "big.bin").write_bytes(big)
    (src / "small.txt").write_text("small\n")
    os.chmod(src / "big.bin", 0o600)
    js = json.loads(ok(cli(d, "cp", "--json", str(src), "dev:/tmp/mixed")))
    assert js["copied"] == 1 and js["bytes"] == len(big) + 6, js
    inside = ok(cli(d, "exec", "dev", "--", "sh", "-c",
                    "sha256sum /tmp/mixed/big.bin; stat -c %a /tmp/mixed/big.bin"))
    assert inside == f"{hashlib.sha256(big).hexdigest()}  /tmp/mixed/big.bin\n600\n", inside
    back = tmp_path / "back"
    js = json.loads(ok(cli(d, "cp", "--json", "dev:/tmp/mixed", str(back))))
    assert js["copied"] == 1, js
    assert shape(back) == shape(src)
    # one file out (its size unknown until copied), into a relative local path
    js = json.loads(ok(subprocess.run(
        [CONCH_BIN, "cp", "--socket", d.sock, "--json", "dev:/tmp/mixed/big.bin", "one.bin"],
        capture_output=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)))
    assert js["copied"] == 1 and js["bytes"] == len(big), js
    assert (tmp_path / "one.bin").read_bytes() == big
    # a big file past the sandbox's disk limit: the error of the chunked path, nothing left
    ok(cli(d, "create", "--name", "tiny", "--disk", "2M"))
    p = cli(d, "cp", str(src / "big.bin"), "tiny:/workspace/big.bin")
    assert p.returncode != 0 and (b"too_large" in p.stderr or b"limit" in p.stderr), p
    assert ok(cli(d, "exec", "tiny", "--", "ls", "-A", "/workspace")) == ""
