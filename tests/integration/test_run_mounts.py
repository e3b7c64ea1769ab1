# test_run_mounts.py - `conch run --mount type=overlay` and `type=store` (issue 18): an
# overlay mount's changes are reported beside the workspace's ("mounts" in --json) and reach
# the host dir only with --commit, when the command exited by itself (the workspace's rule);
# its upper lives in the sandbox's --disk tmpfs, out of the command's reach. A store mount is
# materialised from the store's database before the command and written back, in one
# transaction, when it ends (also after a timeout), by the daemon's own code: a second conch
# run, a daemon's `conch store cat` and a daemon's sandbox all see it; concurrent conch runs
# on one store lose no file.
import json
import os
import sqlite3
import subprocess
import time

import pytest

from conftest import CONCH_BIN, conch


def host_dir(tmp_path, name="data"):
    d = tmp_path / name
    d.mkdir()
    (d / "keep.txt").write_text("keep\n")
    (d / "gone.txt").write_text("gone\n")
    (d / "sub").mkdir()
    (d / "sub" / "a.txt").write_text("a\n")
    os.chmod(tmp_path, 0o755)
    return d


def tree(d):
    out = {}
    for root, dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = open(p).read()
        for x in dirs:
            out[os.path.relpath(os.path.join(root, x), d) + "/"] = None
    return out


def run(ws, mounts, script, *opts, timeout=60):
    args = ["run", "--no-daemon", "--json", "--workspace", ws]
    for m in mounts:
        args += ["--mount", m]
    return conch([*args, *opts, "--", "sh", "-c", script], cwd=ws, want_json=True,
                 timeout=timeout)


def data_mount(src):
    return f"type=overlay,source={src},target=/data"


def mount_changes(res, target="/data"):
    (m,) = [m for m in res["mounts"] if m["target"] == target]
    return m, {c["path"]: c["kind"] for c in m["changes"]}


SCRIPT = ("cat /data/keep.txt; echo new > /data/new.txt; rm /data/gone.txt; "
          "echo more >> /data/sub/a.txt; echo w > /workspace/w.txt")


def test_overlay_changes_reported_host_untouched(ws, tmp_path):
    src = host_dir(tmp_path)
    before = tree(src)
    r = run(ws, [data_mount(src)], SCRIPT + "; grep ' /data ' /proc/mounts")
    assert r.rc == 0, r.describe()
    res = r.j
    assert res["stdout"].startswith("keep\n"), res
    mnt = res["stdout"].splitlines()[-1]
    assert " overlay " in mnt and "nosuid" in mnt and "nodev" in mnt, mnt
    m, got = mount_changes(res)
    assert got == {"new.txt": "added", "gone.txt": "deleted", "sub/a.txt": "modified"}, m
    assert m["committed"] is False and "commit" not in m
    # The workspace's changes are its own, beside the mount's.
    assert [c["path"] for c in res["changes"]] == ["w.txt"], res
    assert tree(src) == before
    assert not (ws / "w.txt").exists()


def test_overlay_text_summary(ws, tmp_path):
    src = host_dir(tmp_path)
    r = conch(["run", "--no-daemon", "--workspace", ws, "--mount", data_mount(src), "--", "sh",
               "-c", "echo n > /data/n.txt"], cwd=ws)
    assert r.rc == 0, r.describe()
    assert "1 change in /data:\n  A n.txt\n" in r.stderr, r.describe()


@pytest.mark.parametrize("as_root", [False, True])
def test_overlay_committed_with_commit(ws, tmp_path, as_root):
    src = host_dir(tmp_path)
    extra = ["--commit"] + (["--as-root"] if as_root else [])
    r = run(ws, [data_mount(src)], SCRIPT, *extra)
    assert r.rc == 0, r.describe()
    m, got = mount_changes(r.j)
    assert m["committed"] is True and m["commit"]["applied"] == 3, m
    assert tree(src) == {"keep.txt": "keep\n", "new.txt": "new\n", "sub/": None,
                         "sub/a.txt": "a\nmore\n"}
    assert (ws / "w.txt").read_text() == "w\n"


def test_overlay_not_committed_when_the_command_did_not_exit(ws, tmp_path):
    # --commit applies changes of a command that exited by itself only, the workspace's rule.
    src = host_dir(tmp_path)
    before = tree(src)
    r = run(ws, [data_mount(src)], "echo n > /data/n.txt; sleep 30", "--commit", "--timeout",
            "1", "--grace", "0.2")
    assert r.rc == 124, r.describe()
    m, got = mount_changes(r.j)
    assert got == {"n.txt": "added"} and m["committed"] is False, m
    assert tree(src) == before


def test_overlay_needs_the_overlay_mode(ws, tmp_path):
    src = host_dir(tmp_path)
    for mode in ("ro", "rw"):
        r = conch(["run", "--no-daemon", "--workspace", ws, "--mode", mode, "--mount",
                   data_mount(src), "--", "true"])
        assert r.rc == 2 and "--mode overlay" in r.stderr, r.describe()


def test_overlay_upper_is_bounded_and_hidden(ws, tmp_path):
    # The mount's upper shares the workspace's --disk tmpfs (a hard bound, the host's disk
    # untouched) and is detached: nothing in the sandbox reaches it.
    src = host_dir(tmp_path)
    before = tree(src)
    r = run(ws, [data_mount(src)],
            "ls -a / | grep -c conch-upper; for i in 1 2 3 4; do "
            "head -c 400000 /dev/zero > /data/b$i 2>/dev/null || echo fail$i; done",
            "--disk", "1m", "--commit")
    res = r.j
    assert res["stdout"].startswith("0\n") and "fail" in res["stdout"], res
    m, got = mount_changes(res)
    assert sum(c.get("size", 0) for c in m["changes"]) <= 1 << 20, m
    assert sum(f.stat().st_size for f in src.glob("b*")) <= 1 << 20
    assert (src / "keep.txt").read_text() == "keep\n"


@pytest.mark.parametrize("as_root", [False, True])
def test_overlay_upper_out_of_reach(ws, tmp_path, as_root):
    # The tmpfs holding the uppers is detached and held by the warden alone: no path, no
    # process's fd in the sandbox's /proc leads to it (its root holds m0/ beside upper/).
    src = host_dir(tmp_path)
    script = ("test -e /.conch-upper && echo visible; "
              "for f in /proc/[0-9]*/fd/* /proc/[0-9]*/cwd /proc/[0-9]*/root; do "
              "[ -e \"$f/../m0/upper\" ] || [ -e \"$f/m0/upper\" ] && echo reached $f; done "
              "2>/dev/null; echo done")
    r = run(ws, [data_mount(src)], script, *(["--as-root"] if as_root else []))
    assert r.rc == 0 and r.j["stdout"] == "done\n", r.describe()


def test_no_mount_over_the_upper_tmpfs(ws, tmp_path):
    # The uppers' tmpfs is in the tree while the extra mounts are made: none may go on or in it
    # (one over it would be detached in its place, one in it would see the uppers).
    src = host_dir(tmp_path)
    for target in ("/.conch-upper", "/.conch-upper/m0", "/.conch-upper/x"):
        for spec in (f"type=tmpfs,target={target}", f"type=bind,source={src},target={target}",
                     f"type=overlay,source={src},target={target}"):
            r = conch(["run", "--no-daemon", "--workspace", ws, "--mount", data_mount(src),
                       "--mount", spec, "--", "true"])
            assert r.rc == 2 and "sandbox's own" in r.stderr, r.describe()


def test_overlay_commit_does_not_follow_planted_links(ws, tmp_path):
    # A link made in the mount is committed as a link, never written through; a write "into"
    # it inside lands in the sandbox's own view of the target, not on the host.
    src = host_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    r = run(ws, [data_mount(src)],
            f"rm -r /data/sub; ln -s {outside} /data/sub; echo x > /data/sub/evil 2>/dev/null; "
            "ln -s /etc /data/etc; echo done", "--commit")
    assert r.rc == 0, r.describe()
    m, got = mount_changes(r.j)
    assert m["committed"] is True, m
    assert os.listdir(outside) == []
    assert os.readlink(src / "etc") == "/etc" and os.readlink(src / "sub") == str(outside)


def test_overlay_source_must_be_a_dir(ws, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = conch(["run", "--no-daemon", "--workspace", ws, "--mount",
               f"type=overlay,source={f},target=/data", "--", "true"])
    assert r.rc == 2, r.describe()
    r = conch(["run", "--no-daemon", "--workspace", ws, "--mount",
               f"type=overlay,source={tmp_path}/missing,target=/data", "--", "true"])
    assert r.rc == 2, r.describe()


# ---- stores ----

def store_mount(name="mem"):
    return f"type=store,name={name},target=/memories"


def srun(ws, state, script, *opts, name="mem", **kw):
    return run(ws, [store_mount(name)], script, "--state-dir", state, *opts, **kw)


@pytest.fixture
def state(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def test_store_round_trip_across_runs(ws, state):
    r = srun(ws, state, "echo x > /memories/a; mkdir -p /memories/d; echo y > /memories/d/b; "
                        "ln -s /etc /memories/link")
    assert r.rc == 0, r.describe()
    (st,) = r.j["stores"]
    assert st["name"] == "mem" and st["target"] == "/memories" and "error" not in st, st
    assert st["written"] == 3 and st["skipped"] == 1, st
    r = srun(ws, state, "cat /memories/a /memories/d/b; test -e /memories/link || echo nolink; "
                        "rm /memories/a")
    assert r.rc == 0 and r.j["stdout"] == "x\ny\nnolink\n", r.describe()
    assert r.j["stores"][0]["deleted"] == 1, r.j
    r = srun(ws, state, "ls /memories; ls /memories/d")
    assert r.j["stdout"] == "d\nb\n", r.describe()
    # Nothing of the views is left behind.
    assert os.listdir(state / "runs") == []
    # The workspace saw none of it.
    assert r.j["changes"] == []


def test_store_written_back_after_a_timeout(ws, state):
    # The sandbox is gone when the write-back runs: what the killed command left in the view
    # is written back whole, in one transaction (the store is consistent either way).
    r = srun(ws, state, "echo t > /memories/t; sleep 30", "--timeout", "1", "--grace", "0.2")
    assert r.rc == 124, r.describe()
    assert r.j["stores"][0]["written"] == 1, r.j
    r = srun(ws, state, "cat /memories/t")
    assert r.j["stdout"] == "t\n", r.describe()


def test_store_views_count_against_the_disk_limit(ws, state):
    # A view lies on the host's disk, not in a tmpfs: it is measured while the command runs
    # and a command that writes past --disk there is stopped (limit), as in a daemon's sandbox.
    r = srun(ws, state, "for i in $(seq 40); do head -c 500000 /dev/zero > /memories/f$i; "
                        "sleep 0.1; done; echo finished", "--disk", "1m")
    res = r.j
    assert "finished" not in res["stdout"], res
    assert res["error"]["kind"] == "limit" and "store mounts" in res["error"]["message"], res
    # What it wrote is still written back (within the store's own cap).
    assert "error" not in res["stores"][0] and res["stores"][0]["written"] >= 2, res


def test_concurrent_runs_lose_no_file(ws, state):
    assert srun(ws, state, "echo 0 > /memories/shared").rc == 0
    n, files = 4, 15
    procs = []
    for k in range(n):
        # A barrier in the (rw) workspace: every view is made before any is written back.
        script = (f"for i in $(seq {files}); do echo {k}-$i > /memories/r{k}-$i; done; "
                  f"echo {k} > /memories/shared; touch /workspace/ready{k}; "
                  f"while [ $(ls /workspace | grep -c ready) -lt {n} ]; do sleep 0.05; done")
        argv = [CONCH_BIN, "run", "--no-daemon", "--json", "--mode", "rw", "--timeout", "60",
                "--workspace", str(ws),
                "--state-dir", str(state), "--mount", store_mount(), "--", "sh", "-c", script]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      cwd=ws, text=True))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        st = json.loads(out)["stores"][0]
        assert "error" not in st and st["written"] == files + 1, st
    r = srun(ws, state, "ls /memories | sort; cat /memories/shared")
    names = r.j["stdout"].split()
    want = sorted([f"r{k}-{i}" for k in range(n) for i in range(1, files + 1)] + ["shared"])
    assert names[:-1] == want, r.j["stdout"]
    # Per-file last writer wins: one of the writers' value, whole; the history names each
    # write-back of it and, for all but the first, whose change it replaced.
    assert names[-1] in {str(k) for k in range(n)}
    con = sqlite3.connect(f"file:{state}/stores/mem.db?mode=ro", uri=True)
    try:
        rows = list(con.execute("SELECT writer, replaced FROM history WHERE path = 'shared' "
                                "ORDER BY seq"))
    finally:
        con.close()
    assert len(rows) == n + 1 and all(w.startswith("conch-run-") for w, _ in rows), rows
    assert sum(1 for _, rep in rows[1:] if rep) >= n - 1, rows


def test_store_shared_with_a_daemon(daemon, ws):
    state = daemon.state_dir
    r = srun(ws, state, "echo x > /memories/a")
    assert r.rc == 0, r.describe()
    # The daemon's conch store reads what conch run wrote...
    r = conch(["store", "--socket", daemon.sock, "cat", "mem", "a"])
    assert r.rc == 0 and r.stdout == "x\n", r.describe()
    # ... and a daemon's sandbox writes what the next conch run reads.
    c = daemon.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "mounts": [
        {"type": "store", "name": "mem", "target": "/m"}]}, timeout=30)["id"]
    res = c.call("exec.run", {"sandbox": sb, "command": "cat /m/a; echo z > /m/z"}, timeout=60)
    assert res["stdout"] == "x\n", res
    r = srun(ws, state, "cat /memories/z")
    assert r.j["stdout"] == "z\n", r.describe()
    c.call("sandbox.destroy", {"id": sb})


def test_store_without_a_daemon_uses_the_default_state_dir(ws, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root's default is /var/lib/conch, the host's")
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "xdg"), CONCH_NO_DAEMON="1")
    base = ["run", "--json", "--workspace", ws, "--mount", store_mount(), "--", "sh", "-c"]
    r = conch([*base, "echo d > /memories/d"], env=env, cwd=ws, want_json=True)
    assert r.rc == 0, r.describe()
    assert (tmp_path / "xdg" / "conch" / "stores" / "mem.db").exists()
    r = conch([*base, "cat /memories/d"], env=env, cwd=ws, want_json=True)
    assert r.j["stdout"] == "d\n", r.describe()


def test_store_bad_name_and_state_dir(ws, tmp_path):
    r = conch(["run", "--no-daemon", "--workspace", ws, "--mount",
               "type=store,name=../x,target=/memories", "--", "true"])
    assert r.rc == 2, r.describe()
    f = tmp_path / "notadir"
    f.write_text("")
    r = conch(["run", "--no-daemon", "--workspace", ws, "--state-dir", f, "--mount",
               store_mount(), "--", "true"])
    assert r.rc in (2, 125) and "state directory" in r.stderr, r.describe()
