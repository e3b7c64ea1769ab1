# test_mounts.py - extra mounts (issue 18): `conch run --mount` and sandbox.create "mounts",
# docker's --mount spelling: tmpfs with a size, bind of a host directory read-only unless
# rw. Each fence is attacked: a tmpfs cannot outgrow its size, a read-only bind can be
# neither written nor remounted writable from inside, and the sources and targets a caller
# may not have are refused (a link planted to /etc/shadow, '..', a missing dir, the
# workspace, /proc, conch's control paths).
import os

import pytest

from conftest import conch
from rpcclient import RpcError


def run(ws, mounts, script, *extra):
    args = ["run", "--no-daemon", "--workspace", ws]
    for m in mounts:
        args += ["--mount", m]
    return conch([*args, *extra, "--", "bash", "-c", script])


def test_run_mounts_are_fenced(ws, tmp_path):
    host = tmp_path / "hostdir"
    host.mkdir()
    (host / "tool.txt").write_text("toolchain\n")
    os.chmod(tmp_path, 0o755)
    rw = tmp_path / "rwdir"
    rw.mkdir()
    os.chmod(rw, 0o777)
    script = (
        # the tmpfs: writable up to its size, not beyond
        "head -c 1500000 /dev/zero > /scratch/big 2>/dev/null && echo over || echo tmpfs-full; rm -f /scratch/big; "
        "head -c 500000 /dev/zero > /scratch/small && echo tmpfs-ok; "
        # the read-only bind: readable, not writable, not remountable
        "cat /opt/tool/tool.txt; "
        "touch /opt/tool/x 2>/dev/null && echo wrote-ro || echo ro-refused; "
        "mount -o remount,rw /opt/tool 2>/dev/null && echo remounted || echo remount-refused; "
        "mount -o remount,rw,bind /opt/tool 2>/dev/null && echo remounted || echo remount-refused; "
        "umount /opt/tool 2>/dev/null && echo unmounted || echo umount-refused; "
        "touch /opt/tool/x 2>/dev/null && echo wrote-ro || echo ro-refused; "
        # the rw bind: the agent's writes land on the host
        "if [ $(id -u) != 0 ]; then echo from-sandbox > /data/out.txt; fi; echo rw-ok"
    )
    mounts = ["type=tmpfs,target=/scratch,size=1m", f"type=bind,source={host},target=/opt/tool",
              f"type=bind,source={rw},target=/data,rw"]
    want = ("tmpfs-full\ntmpfs-ok\ntoolchain\nro-refused\nremount-refused\nremount-refused\n"
            "umount-refused\nro-refused\nrw-ok\n")
    for extra in ((), ("--as-root",)):
        r = run(ws, mounts, script, *extra)
        assert r.rc == 0 and r.stdout == want, (extra, r.describe())
        if not extra:
            assert (rw / "out.txt").read_text() == "from-sandbox\n"
            (rw / "out.txt").unlink()
    assert sorted(os.listdir(host)) == ["tool.txt"]

    # Sources and targets that are refused before anything runs (usage, exit 2).
    shadow_link = tmp_path / "shadow"
    shadow_link.symlink_to("/etc/shadow")
    bad = [
        (f"type=bind,source={shadow_link},target=/opt/s", "not a directory"),
        ("type=bind,source=/etc/shadow,target=/opt/s", "not a directory"),
        (f"type=bind,source={host}/../hostdir,target=/opt/s", "'..'"),
        (f"type=bind,source={tmp_path}/missing,target=/opt/s", "No such file"),
        ("type=bind,source=relative,target=/opt/s", "absolute"),
        (f"type=bind,source={host},target=/workspace", "/workspace"),
        (f"type=bind,source={host},target=/workspace/sub", "/workspace"),
        (f"type=bind,source={host},target=/proc/sys", "/proc"),
        (f"type=bind,source={host},target=/run/conch", "/run"),
        (f"type=bind,source={host},target=/etc", "/etc"),
        (f"type=bind,source={host},target=/", "hide"),
        (f"type=bind,source={host},target=/opt/../proc", "'..'"),
        ("type=tmpfs,target=/tmp", "hide"),
        ("type=tmpfs,target=/scratch,size=1", "size"),
        ("type=store,target=/memories", "name=NAME"),
        (f"type=overlay,source={tmp_path}/missing,target=/data", "No such file"),
        ("type=tmpfs", "target"),
        ("type=bind,target=/opt/x", "source"),
        ("type=tmpfs,target=/a,bogus=1", "unknown"),
    ]
    for spec, why in bad:
        r = run(ws, [spec], "echo ran")
        assert r.rc == 2 and "ran" not in r.stdout and why in r.stderr, (spec, r.describe())
    r = run(ws, ["type=tmpfs,target=/a", "type=tmpfs,target=/a/b"], "echo ran")
    assert r.rc == 2 and "overlap" in r.stderr, r.describe()
    r = run(ws, [f"type=tmpfs,target=/m{i}" for i in range(9)], "echo ran")
    assert r.rc == 2 and "at most 8" in r.stderr, r.describe()

    # A directory the calling user cannot read is not bound (unprivileged: the kernel refuses
    # the user; root may read it, and the daemon serves only its own uid and root).
    if os.geteuid() != 0:
        r = run(ws, ["type=bind,source=/root,target=/opt/root"], "ls /opt/root; echo ran")
        assert r.rc == 2 and "ran" not in r.stdout and "may not read" in r.stderr, r.describe()
        r = run(ws, ["type=bind,source=/usr/share,target=/opt/u,rw"], "echo ran")
        assert r.rc == 2 and "may not read and write" in r.stderr, r.describe()


def test_daemon_mounts_survive_a_restart(daemon_factory, ws, tmp_path):
    host = tmp_path / "data"
    host.mkdir()
    (host / "d.txt").write_text("dataset\n")
    os.chmod(tmp_path, 0o755)
    d = daemon_factory()
    c = d.client()
    sb = c.call("sandbox.create", {"workspace": str(ws), "mounts": [
        {"type": "tmpfs", "target": "/scratch", "size": "2m"},
        f"type=bind,source={host},target=/opt/data"]})["id"]
    probe = ("df -k /scratch | tail -1 | awk '{print $2}'; cat /opt/data/d.txt; "
             "touch /opt/data/x 2>/dev/null || echo ro")
    r = c.call("exec.run", {"sandbox": sb, "command": probe})
    assert r["stdout"] == "2048\ndataset\nro\n", r
    # The same after the sandbox is restarted by a snapshot and after a daemon restart.
    c.call("workspace.snapshot", {"sandbox": sb})
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == "2048\ndataset\nro\n"
    d.stop()
    d.start()
    c = d.client()
    c.call("sandbox.start", {"id": sb}, timeout=30)
    assert c.call("exec.run", {"sandbox": sb, "command": probe})["stdout"] == "2048\ndataset\nro\n"
    # A fork has them too.
    f = c.call("sandbox.fork", {"sandbox": sb})["id"]
    assert c.call("exec.run", {"sandbox": f, "command": probe})["stdout"] == "2048\ndataset\nro\n"
    for bad in ([{"type": "bind", "source": "/etc/shadow", "target": "/x"}],
                [{"type": "tmpfs", "target": "/proc/x"}], "type=tmpfs,target=/x",
                [{"type": "tmpfs", "target": "/x", "extra": 1}], [7],
                [{"type": "tmpfs", "target": "/x\n/y"}], ["type=tmpfs,target=/a\tb"],
                # the host's kernel filesystems, or a dir holding one (the bind is recursive):
                # /proc/PID/root and /proc/PID/mem of the caller's own processes
                *([{"type": "bind", "source": src, "target": "/x"}]
                  for src in ("/proc", "/proc/self/fdinfo", "/sys", "/sys/fs/cgroup", "/dev",
                              "/dev/pts", "/"))):
        with pytest.raises(RpcError) as ei:
            c.call("sandbox.create", {"workspace": str(ws), "mounts": bad})
        assert ei.value.data_code == "invalid_params", (bad, ei.value)
