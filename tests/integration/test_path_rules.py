# test_path_rules.py - path rules in the workspace (issue 18): read-only subpaths and hidden
# paths (`conch run --readonly/--hidden`, sandbox.create "readonly"/"hidden"), enforced by
# mounts inside the sandbox. Each fence is attacked from inside, as the agent and as the
# sandbox's root: writes, creates, deletes, chmod, renames of the path and of its parent,
# hard links, symlinks, /proc/self/fd, umount and remount; the host directory keeps what it
# had, commit never writes beneath a rule (even what got into the upper dir another way), and
# bad paths are refused with a clear error.
import os

import pytest

from conftest import conch, tree_state
from rpcclient import RpcError

SECRET = "s3cr3t-value"
HOOK = "#!/bin/sh\necho original hook\n"


def make_ws(ws):
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text(HOOK)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / ".env").write_text(f"TOKEN={SECRET}\n")
    (ws / "secrets").mkdir()
    (ws / "secrets" / "key").write_text(f"{SECRET}-key\n")
    (ws / "src").mkdir()
    (ws / "src" / "main.c").write_text("int main(void) { return 0; }\n")


RULES = ["--readonly", ".git/hooks", "--hidden", ".env", "--hidden", "./secrets/",
         "--hidden", "later/token"]

# Every trick prints a marker only when it worked; the test asserts none did.
TRICKS = r"""
cd /workspace
try() { name=$1; shift; if "$@" 2>/dev/null; then echo "BROKE:$name"; fi; }
# the read-only path
try write sh -c 'echo evil > .git/hooks/pre-commit'
try append sh -c 'echo evil >> .git/hooks/pre-commit'
try create touch .git/hooks/post-checkout
try delete rm -f .git/hooks/pre-commit
try chmod chmod 777 .git/hooks/pre-commit
try chmod-dir chmod 777 .git/hooks
try rename-file mv .git/hooks/pre-commit .git/hooks/x
try rename-dir mv .git/hooks .git/hooks2
try rename-parent mv .git .git2
try rename-parent-py python3 -c 'import os; os.rename(".git", "g2")'
try exchange-dir python3 -c '
import ctypes, os
os.mkdir(".git/evil")
open(".git/evil/pre-commit", "w").write("evil")
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, b".git/evil", -100, b".git/hooks", 2) != 0:  # RENAME_EXCHANGE
    raise SystemExit(1)'
try rmdir-parent rm -rf .git
try hardlink-out ln .git/hooks/pre-commit hl
try hardlink-in sh -c 'echo evil > /tmp/e; ln /tmp/e .git/hooks/e'
try symlink-write sh -c 'ln -sf .git/hooks/pre-commit sl && echo evil > sl'
try truncate truncate -s 0 .git/hooks/pre-commit
try procfd python3 -c '
import os
fd = os.open(".git/hooks/pre-commit", os.O_PATH)
os.close(os.open("/proc/self/fd/%d" % fd, os.O_WRONLY | os.O_TRUNC))'
try exchange-parent python3 -c '
import ctypes, os
os.mkdir("swap")
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, b"swap", -100, b".git", 2) != 0:  # RENAME_EXCHANGE
    raise SystemExit(1)'
try exchange-hidden python3 -c '
import ctypes
open("plain", "w").close()
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, b"plain", -100, b".env", 2) != 0:
    raise SystemExit(1)'
try umount umount .git/hooks
try umount-lazy umount -l .git/hooks
try remount mount -o remount,rw .git/hooks
try remount-bind mount -o remount,bind,rw .git/hooks
try touch-mtime touch -d 2001-01-01 .git/hooks/pre-commit
# the hidden file
try read-file grep -q s3cr3t .env
try read-procfd sh -c 'exec 3<.env; grep -q s3cr3t /proc/self/fd/3'
try chmod-hidden sh -c 'chmod 644 .env && grep -q s3cr3t .env'
try delete-hidden rm -f .env
try rename-hidden mv .env env2
try hardlink-hidden ln .env hl2
try symlink-hidden sh -c 'ln -sf .env sl2 && grep -q s3cr3t sl2'
try umount-hidden umount .env
try overwrite-hidden sh -c 'echo x > .env'
# the hidden dir
try list-dir sh -c 'ls secrets | grep -q key'
try read-dir grep -q s3cr3t secrets/key
try chmod-dir-hidden sh -c 'chmod 755 secrets && cat secrets/key'
try rename-dir-hidden mv secrets s2
try create-in-hidden touch secrets/new
try umount-dir-hidden umount secrets
try find-secret sh -c 'grep -rqs s3cr3t /workspace'
try tar-secret sh -c 'tar cf - -C / workspace 2>/dev/null | grep -qa s3cr3t'
# the hidden path that did not exist: nothing can be made there
try create-missing sh -c 'echo x > later/token'
try mkdir-missing mkdir -p later/token/x
try rename-missing-parent mv later later2
stat -c '%s %a' .env
cat .git/hooks/pre-commit
echo done
"""


@pytest.mark.parametrize("as_root", [False, True], ids=["agent", "root"])
def test_rules_hold_against_tricks_from_inside(ws, as_root):
    make_ws(ws)
    before = tree_state(ws)
    extra = ["--as-root"] if as_root else []
    r = conch(["run", "--no-daemon", "--workspace", str(ws), "--commit", *RULES, *extra, "--",
               "bash", "-c", TRICKS + "echo ok > src/new.c\n"])
    assert r.rc == 0, r.describe()
    out = r.stdout
    assert "BROKE:" not in out, r.describe()
    assert SECRET not in out and SECRET not in r.stderr, r.describe()
    assert out.endswith("0 0\n" + HOOK + "done\n"), r.describe()
    # The host: what the rules protect is as it was; the allowed change was committed.
    after = tree_state(ws)
    for p in (".git", ".git/hooks", ".git/hooks/pre-commit", ".env", "secrets", "secrets/key"):
        assert after[p] == before[p], p
    assert (ws / "src" / "new.c").read_text() == "ok\n"
    assert not (ws / "later" / "token").exists()
    new = sorted(p for p in after if p not in before)
    assert not [p for p in new if p.startswith((".git/hooks/", "hl", "g2", ".git2", "env2", "s2"))], new


def test_commit_skips_rule_paths_that_reach_the_upper_dir(daemon_factory, ws):
    make_ws(ws)
    before = tree_state(ws)
    daemon = daemon_factory()
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "readonly": [".git/hooks"],
                                   "hidden": [".env", "secrets"]}, timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "cat .env; ls secrets; echo x > src/a.c"})
    assert SECRET not in r["stdout"] and r["exit_code"] == 0, r
    # Plant changes beneath the rules straight into the sandbox's upper dir while it is stopped
    # (a daemon restart), as if they had got there another way: commit must still refuse them.
    daemon.stop()
    upper = os.path.join(daemon.state_dir, "sandboxes", sb, "upper")
    os.makedirs(os.path.join(upper, ".git", "hooks"), exist_ok=True)
    with open(os.path.join(upper, ".git", "hooks", "pre-commit"), "w") as f:
        f.write("evil\n")
    with open(os.path.join(upper, ".env"), "w") as f:
        f.write("TOKEN=replaced\n")
    os.makedirs(os.path.join(upper, "secrets"), exist_ok=True)
    with open(os.path.join(upper, "secrets", "new"), "w") as f:
        f.write("planted\n")
    daemon.start()
    c = daemon.client()
    listed = {ch["path"]: ch for ch in c.call("workspace.changes", {"sandbox": sb})["changes"]}
    assert "read-only" in listed[".git/hooks/pre-commit"].get("skip", ""), listed
    assert "hidden" in listed[".env"].get("skip", ""), listed
    assert "skip" not in listed["src/a.c"], listed
    res = c.call("workspace.commit", {"sandbox": sb}, timeout=60)
    skipped = {s["path"]: s["reason"] for s in res["skipped"]}
    assert ".git/hooks/pre-commit" in skipped and "read-only" in skipped[".git/hooks/pre-commit"]
    assert ".env" in skipped and "hidden" in skipped[".env"], res
    assert "secrets/new" in skipped, res
    assert "src/a.c" in res["committed"], res
    after = tree_state(ws)
    for p in (".git/hooks/pre-commit", ".env", "secrets", "secrets/key"):
        assert after[p] == before[p], p
    assert not (ws / "secrets" / "new").exists()


def test_daemon_rules_survive_restart_and_fork(daemon_factory, ws):
    make_ws(ws)
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "readonly": ["./.git/hooks/"],
                                   "hidden": [".env"]}, timeout=30)
    assert sb.get("readonly") in (None, [".git/hooks"])
    sb = sb["id"]
    probe = ("cat .env 2>/dev/null; stat -c %s .env; echo x > .git/hooks/pre-commit 2>/dev/null && echo BROKE; "
             "cat .git/hooks/pre-commit")
    want = "0\n" + HOOK
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == want
    # The file worker sees the same tree.
    read = c.call("fs.read", {"sandbox": sb, "path": ".git/hooks/pre-commit"})
    assert read["content"] == HOOK
    with pytest.raises(RpcError):
        c.call("fs.write", {"sandbox": sb, "path": ".git/hooks/pre-commit", "content": "evil"})
    try:
        assert SECRET not in c.call("fs.read", {"sandbox": sb, "path": ".env"})["content"]
    except RpcError as e:
        assert e.data_code == "permission_denied", e
    c.call("workspace.snapshot", {"sandbox": sb}, timeout=30)
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == want
    d.stop()
    d.start()
    c = d.client()
    c.call("sandbox.start", {"id": sb}, timeout=30)
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == want
    f = c.call("sandbox.fork", {"sandbox": sb}, timeout=30)["id"]
    assert c.call("exec.run", {"sandbox": f, "command": probe})["stdout"] == want
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == HOOK


@pytest.mark.parametrize("args,msg", [
    (["--readonly", "/etc"], "relative to the workspace"),
    (["--hidden", "../x"], "'..'"),
    (["--hidden", "a/../../b"], "'..'"),
    (["--readonly", "."], "whole workspace"),
    (["--readonly", "./"], "whole workspace"),
    (["--readonly", "a", "--hidden", "a"], "both read-only and hidden"),
    (["--hidden", "a", "--readonly", "a/b"], "beneath the hidden path"),
    (["--readonly", "a/b", "--hidden", "a"], "beneath the hidden path"),
    (["--readonly", "x" * 1100], "at most 1023 bytes"),
    (["--hidden", "a\nb"], "control character"),
    (["--readonly", "link/x"], "symlink"),
    (["--hidden", "link"], "symlink"),
    (["--hidden", "file/x"], "not a directory"),
])
def test_bad_rule_paths_are_refused(ws, args, msg):
    make_ws(ws)
    (ws / "file").write_text("f\n")
    os.symlink("src", ws / "link")
    before = tree_state(ws)
    r = conch(["run", "--no-daemon", "--workspace", str(ws), *args, "--", "echo", "RAN"])
    assert r.rc != 0 and "RAN" not in r.stdout and msg in r.stderr, r.describe()
    assert tree_state(ws) == before


def test_a_missing_path_gets_a_place_that_is_never_committed(ws):
    r = conch(["run", "--no-daemon", "--json", "--workspace", str(ws), "--commit", "--hidden",
               "new/token", "--readonly", "ro", "--", "sh", "-c",
               "stat -c '%F %a' new/token ro; touch ro/x new/token/x 2>/dev/null || echo refused"],
              want_json=True)
    assert r.j["stdout"] == "directory 0\ndirectory 555\nrefused\n", r.describe()
    changes = r.changes()
    assert "hidden" in changes["new/token"]["skip"] and "read-only" in changes["ro"]["skip"]
    # The parent made for it is an empty dir, committed; the places themselves are not.
    assert (ws / "new").is_dir() and not (ws / "new" / "token").exists()
    assert not (ws / "ro").exists()


def test_rw_mode_protects_without_touching_the_host(ws):
    make_ws(ws)
    r = conch(["run", "--no-daemon", "--workspace", str(ws), "--mode", "rw", "--hidden", "later",
               "--", "echo", "RAN"])
    assert r.rc != 0 and "RAN" not in r.stdout and "mode rw" in r.stderr, r.describe()
    assert not (ws / "later").exists()
    r = conch(["run", "--no-daemon", "--workspace", str(ws), "--mode", "rw", *RULES[:6], "--",
               "bash", "-c", TRICKS.replace("later", "scratch") + "echo ok > src/new.c\n"])
    # In rw mode the missing-path tricks act on src (not a rule): only the rule tricks count.
    broke = [l for l in r.stdout.splitlines()
             if l.startswith("BROKE:") and "missing" not in l]
    assert not broke and SECRET not in r.stdout, r.describe()
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == HOOK
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n"
    assert (ws / "secrets" / "key").exists() and (ws / "src" / "new.c").exists()


def test_ro_mode_and_bad_params_over_rpc(daemon, ws):
    make_ws(ws)
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "mode": "ro", "hidden": [".env", "nope"]},
                timeout=30)["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "cat .env; ls -d nope 2>/dev/null; echo end"})
    assert SECRET not in r["stdout"] and r["stdout"].endswith("end\n"), r
    for bad in ({"readonly": "x"}, {"readonly": [1]}, {"hidden": ["/abs"]},
                {"hidden": ["a\u0000b"]}, {"hidden": [".."]}, {"readonly": ["a"], "hidden": ["a"]}):
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), **bad})
        assert ei.value.data_code == "invalid_params", (bad, ei.value)
        assert ei.value.data.get("param") in bad, (bad, ei.value)
