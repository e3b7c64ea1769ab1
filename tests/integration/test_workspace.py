# test_workspace.py - the workspace contract: changes reported exactly, the host tree left
# byte-for-byte alone without --commit, applied exactly with it, never written outside
# through a planted symlink; ro and rw modes; working-directory mapping.
import hashlib
import os
import shutil
import subprocess
import time

import pytest

from conftest import CONCH_BIN, conch, tree_checksum, tree_state

# Every kind of change, in relative paths so it can also be replayed on a host copy.
SCRIPT = r"""
set -e
umask 022
echo new > new.txt
echo changed >> mod.txt
rm del.txt
mv ren_src.txt ren_dst.txt
chmod 755 run.sh
ln -s keep.txt link
mkdir emptydir
printf '\000\001\377\376binary\000' > bin.dat
head -c 4096 /dev/zero >> bin.dat
rm f2d
mkdir f2d
echo inside > f2d/x
rm -r d2f
echo now-a-file > d2f
ln -sfn mod.txt retarget
echo deeper > sub/deep.txt
"""

EXPECTED = {
    # path: (kind, type or None for "don't care")
    "new.txt": ("added", "f"),
    "mod.txt": ("modified", "f"),
    "del.txt": ("deleted", None),
    "ren_src.txt": ("deleted", None),
    "ren_dst.txt": ("added", "f"),
    "run.sh": ("modified", "f"),
    "link": ("added", "l"),
    "emptydir": ("added", "d"),
    "bin.dat": ("added", "f"),
    "f2d": ("type_changed", "d"),
    "f2d/x": ("added", "f"),
    "d2f": ("type_changed", "f"),
    "d2f/old": ("deleted", None),
    "retarget": ("modified", "l"),
    "sub/deep.txt": ("added", "f"),
}


def populate(d):
    (d / "keep.txt").write_text("keep\n")
    (d / "mod.txt").write_text("original\n")
    (d / "del.txt").write_text("delete me\n")
    (d / "ren_src.txt").write_text("rename me\n")
    (d / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(d / "run.sh", 0o644)
    (d / "f2d").write_text("file to become a dir\n")
    (d / "d2f").mkdir()
    (d / "d2f" / "old").write_text("in a dir that becomes a file\n")
    os.symlink("keep.txt", d / "retarget")
    (d / "sub").mkdir()
    (d / "sub" / "untouched.txt").write_text("untouched\n")
    (d / "bin_keep.dat").write_bytes(bytes(range(256)) * 16)


def check_changes(r):
    ch = r.changes()
    got = {p: (c["kind"], c["type"]) for p, c in ch.items()}
    want = {p: (k, t) for p, (k, t) in EXPECTED.items()}
    # a deleted entry's "type" may describe the old object: compare only where it matters
    for p, (k, t) in want.items():
        if t is None and p in got:
            got[p] = (got[p][0], None)
    extra = {p: v for p, v in got.items() if p not in want}
    missing = {p: v for p, v in want.items() if p not in got}
    # Removing a whole directory may be reported as one entry; nothing else may differ.
    if "d2f/old" in missing:
        missing.pop("d2f/old")
    assert not extra and not missing, f"extra: {extra}\nmissing: {missing}\nall: {r.j['changes']}"
    wrong = {p: (got[p], want[p]) for p in want if p in got and got[p] != want[p]}
    assert not wrong, f"(got, want): {wrong}"
    assert ch["new.txt"]["size"] == 4
    assert ch["run.sh"]["mode"] == "0755"
    assert ch["new.txt"]["mode"] == "0644"
    assert ch["bin.dat"]["size"] == 11 + 4096
    assert ch["f2d/x"]["size"] == 7


def test_changes_reported_exactly_and_host_untouched(ws, sh):
    populate(ws)
    before = tree_state(ws)
    r = sh(SCRIPT)
    assert r.rc == 0 and r.j["error"] is None, r.describe()
    check_changes(r)
    assert r.j["committed"] is False
    assert tree_state(ws) == before, "host workspace changed without --commit"


def test_commit_applies_exactly(tmp_path, ws, sh):
    populate(ws)
    expect = tmp_path / "expect"
    shutil.copytree(ws, expect, symlinks=True)
    os.chmod(expect, os.stat(ws).st_mode)
    subprocess.run(["bash", "-c", SCRIPT], cwd=expect, check=True)
    r = sh(SCRIPT, "--commit")
    assert r.rc == 0 and r.j["error"] is None, r.describe()
    check_changes(r)
    assert r.j["committed"] is True, r.describe()
    got, want = tree_state(ws), tree_state(expect)
    diff = {p: (got.get(p), want.get(p)) for p in set(got) | set(want) if got.get(p) != want.get(p)}
    assert not diff, f"committed tree differs from expected (got, want): {diff}"


def test_unchanged_tree_reports_nothing(ws, sh):
    populate(ws)
    r = sh("cat keep.txt >/dev/null; ls -R >/dev/null; echo tmp > /tmp/x")
    assert r.rc == 0 and r.j["changes"] == [], r.describe()


def test_failed_command_still_reports_changes(ws, sh):
    r = sh("echo partial > half.txt; exit 7")
    assert r.rc == 7 and r.kind == "command", r.describe()
    assert [(c["path"], c["kind"]) for c in r.j["changes"]] == [("half.txt", "added")], r.describe()


def test_large_binary_commit(ws, sh):
    r = sh("head -c 5000000 /dev/urandom > big.bin; sha256sum big.bin", "--commit", timeout=60)
    assert r.rc == 0 and r.j["committed"], r.describe()
    assert hashlib.sha256((ws / "big.bin").read_bytes()).hexdigest() == r.out.split()[0]


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_planted_symlink_cannot_redirect_commit(tmp_path, ws, sh, target):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside) if target == "absolute" else "../outside", ws / "escape")
    before_outside = tree_state(outside)
    # Through the symlink first (inside it resolves within the sandbox), then replace the
    # symlink by a real directory holding a file: a naive commit would follow the host's
    # symlink and write outside.
    r = sh(
        f"mkdir -p {outside} 2>/dev/null; echo pwned > escape/pwned; echo via-link=$?; "
        "rm escape && mkdir escape && echo pwned > escape/pwned2 && echo replaced",
        "--commit",
    )
    assert "replaced" in r.out, r.describe()
    assert tree_state(outside) == before_outside, f"commit wrote outside the workspace: {os.listdir(outside)}"
    assert os.listdir(outside) == []
    # the replacement itself was committed, inside the workspace
    assert (ws / "escape").is_dir() and not (ws / "escape").is_symlink(), r.describe()
    assert (ws / "escape" / "pwned2").read_text() == "pwned\n"


def test_symlink_to_outside_not_followed_by_reads_or_changes(tmp_path, ws, sh):
    outside = tmp_path / "outside2"
    outside.mkdir()
    (outside / "secret").write_text("OUTSIDE-SECRET\n")
    os.symlink(str(outside / "secret"), ws / "leak")
    r = sh("cat leak; echo rc=$?")
    assert "OUTSIDE-SECRET" not in r.out, r.describe()
    assert "rc=1" in r.out


def test_mode_ro(ws, sh):
    populate(ws)
    before = tree_state(ws)
    r = sh("echo x > new.txt; echo rc1=$?; echo y >> keep.txt; echo rc2=$?; rm del.txt; echo rc3=$?; cat keep.txt",
           "--mode", "ro")
    assert "rc1=1" in r.out and "rc2=1" in r.out and "rc3=1" in r.out, r.describe()
    assert "Read-only file system" in r.err, r.describe()
    assert r.out.endswith("keep\n")
    assert r.j["changes"] == [], r.describe()
    assert tree_state(ws) == before


def test_mode_ro_commit_is_noop(ws, sh):
    populate(ws)
    before = tree_state(ws)
    r = sh("touch x", "--mode", "ro", "--commit")
    assert r.rc in (1, 2), r.describe()  # either touch fails or --commit is refused with ro
    assert tree_state(ws) == before


def test_mode_rw_writes_land_immediately(ws):
    populate(ws)
    # the command writes, then waits for the host to acknowledge having seen the file
    script = "echo live > w.txt; for i in $(seq 100); do [ -e ack ] && break; sleep 0.1; done; cat ack; rm del.txt"
    p = subprocess.Popen([CONCH_BIN, "run", "--json", "--mode", "rw", "--workspace", ws, "--", "bash", "-c", script],
                         cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while not (ws / "w.txt").exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        seen_live = (ws / "w.txt").exists() and p.poll() is None
        (ws / "ack").write_text("host-ack\n")
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    assert seen_live, f"write did not land while the command ran: rc={p.returncode} {out!r} {err!r}"
    assert p.returncode == 0, (out, err)
    assert b"host-ack" in out
    assert (ws / "w.txt").read_text() == "live\n"
    assert (ws / "w.txt").stat().st_uid == os.stat(ws).st_uid, "file created in rw mode has a foreign host owner"
    assert not (ws / "del.txt").exists()


def test_overlay_new_files_owned_like_workspace_after_commit(ws, sh):
    r = sh("echo a > owned.txt; mkdir d; echo b > d/f", "--commit")
    assert r.rc == 0, r.describe()
    owner = os.stat(ws).st_uid, os.stat(ws).st_gid
    for p in ("owned.txt", "d", "d/f"):
        st = os.lstat(ws / p)
        assert (st.st_uid, st.st_gid) == owner, (p, st.st_uid, st.st_gid)


def test_workspace_owned_by_agent_inside(ws, sh):
    (ws / "f").write_text("x")
    r = sh("stat -c '%u:%g' /workspace /workspace/f")
    assert r.out == "1000:1000\n1000:1000\n", r.describe()


@pytest.mark.parametrize(
    "how,expect",
    [
        ("cwd-host-subdir", "/workspace/sub/deeper"),
        ("cwd-abs-workspace", "/workspace/sub"),
        ("default-from-process-cwd", "/workspace/sub/deeper"),
        ("cwd-outside", "/workspace"),
    ],
)
def test_cwd_mapping(tmp_path, ws, run, how, expect):
    (ws / "sub" / "deeper").mkdir(parents=True)
    if how == "cwd-host-subdir":
        r = run(["--cwd", ws / "sub" / "deeper", "--", "pwd"])
    elif how == "cwd-abs-workspace":
        r = run(["--cwd", "/workspace/sub", "--", "pwd"])
    elif how == "default-from-process-cwd":
        r = run(["--", "pwd"], cwd=ws / "sub" / "deeper")
    else:
        other = tmp_path / "elsewhere"
        other.mkdir()
        r = run(["--cwd", other, "--", "pwd"])
    assert r.rc == 0, r.describe()
    assert r.out == expect + "\n", r.describe()
    warned = [l for l in r.stderr.splitlines() if l.strip()]
    if how == "cwd-outside":
        assert len(warned) == 1 and "workspace" in warned[0].lower(), r.describe()
    else:
        assert warned == [], r.describe()


def test_default_workspace_is_current_directory(ws):
    (ws / "marker.txt").write_text("here\n")
    r = conch(["run", "--json", "--", "cat", "/workspace/marker.txt"], cwd=ws, want_json=True)
    assert r.rc == 0 and r.out == "here\n", r.describe()


def test_checksum_helper_sees_differences(tmp_path):
    # the no-change assertions above are only as good as this helper
    d = tmp_path / "t"
    d.mkdir()
    (d / "a").write_text("1")
    c0 = tree_checksum(d)
    os.chmod(d / "a", 0o600)
    c1 = tree_checksum(d)
    (d / "a").write_text("2")
    c2 = tree_checksum(d)
    os.symlink("a", d / "l")
    c3 = tree_checksum(d)
    os.unlink(d / "l")
    os.symlink("b", d / "l")
    c4 = tree_checksum(d)
    assert len({c0, c1, c2, c3, c4}) == 5
