# test_limits.py - resource limits under abuse: fork bombs, memory hogs, output floods and
# disk fillers must end with a classified result, leave nothing running and leave the host
# (its disk, its ability to fork) unaffected.
import os
import shutil
import subprocess

import pytest

from conftest import unique_marker, wait_no_pids


def host_can_fork():
    return subprocess.run(["true"], timeout=10).returncode == 0


@pytest.mark.slow
def test_fork_bomb_contained(sh):
    marker = unique_marker("bomb")
    # the marker sits in the script text, so every bash of the bomb carries it in its argv
    # (ended by its limit or its timeout, not by `sleep 30`: the kind says which; the 120 s
    # limit only catches a hang)
    r = sh(f": {marker}; b() {{ b | b & }}; b; sleep 30", "--pids", "64", "--timeout", "5", timeout=120)
    assert r.rc != 0, r.describe()
    assert r.kind in ("limit", "timeout"), r.describe()
    assert wait_no_pids(marker) == []
    assert host_can_fork()


@pytest.mark.slow
def test_fork_loop_stops_at_pids_limit(py):
    marker = unique_marker("forks")
    code = f"""
import os, sys, time
# {marker}
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print("forked", n, flush=True)
except OSError as e:
    print("fork failed", n, e.errno, flush=True)
time.sleep(60)
"""
    r = py(code, "--pids", "64", "--timeout", "4", timeout=120)
    assert "forked 1000" not in r.out, r.describe()
    if r.out.startswith("fork failed"):
        n, err = map(int, r.out.split()[2:4])
        assert n < 64 and err == 11, r.describe()  # EAGAIN
    # the spec: error kind "limit" when the pids limit was hit (not just "timeout" later)
    assert r.kind == "limit", r.describe()
    assert wait_no_pids(marker) == []


def test_default_pids_limit_bounds_a_fork_loop(py):
    # no --pids: the default (1024 per sandbox) still holds, so that a fork bomb stays small
    # enough to be killed at its deadline (with 8192 it ended 12-56 s late on 2 cores)
    marker = unique_marker("dflt")
    code = f"""
import os
n = 0
try:
    while n < 1500:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["{marker}", "60"])
        n += 1
    print("forked", n, flush=True)
except OSError as e:
    print("fork failed", n, e.errno, flush=True)
"""
    # the sleepers it leaves are killed when it exits
    r = py(code, "--timeout", "100", timeout=150)
    words = r.out.split()
    assert r.rc == 0 and words[:1] in (["forked"], ["fork"]), r.describe()
    n = int(words[1] if words[0] == "forked" else words[2])
    assert n < 1024, f"{n} processes in a sandbox without --pids (default 1024)\n{r.describe()}"
    assert int(words[3]) == 11, r.describe()  # EAGAIN
    assert wait_no_pids(marker, timeout=30) == []


def test_fork_bomb_without_pids_option_ends_by_its_timeout(sh):
    marker = unique_marker("bomb")
    r = sh(f": {marker}; b() {{ b | b & }}; b; sleep 30", "--timeout", "3", "--grace", "1", timeout=120)
    # the bomb's shell goes on to `sleep 30` whether or not its forks failed: what ends it is
    # the deadline (3 s), and then every process of it dies
    assert r.kind == "timeout" and r.rc == 124, r.describe()
    assert wait_no_pids(marker, timeout=30) == []
    assert host_can_fork()


def test_memory_hog_killed(py):
    code = """
chunks = []
for i in range(64):
    chunks.append(b"x" * (16 << 20))  # 1 GiB in 16 MiB pieces, every page written
print("allocated 1G", flush=True)
"""
    r = py(code, "--memory", "64M", "--timeout", "30", timeout=60)
    assert "allocated 1G" not in r.out, r.describe()
    assert r.kind == "limit", r.describe()
    assert r.rc == 137 and r.j["exit_code"] == 137 and r.j["signal"] == 9, r.describe()
    assert r.j["timed_out"] is False, r.describe()


def test_moderate_memory_under_limit_works(py):
    r = py("b = b'x' * (32 << 20); print(len(b))", "--memory", "256M", timeout=60)
    assert r.rc == 0 and r.out == f"{32 << 20}\n", r.describe()


def _check_flood(r, stream, cap):
    # ended by the spill cap ("limit"), not by its 60 s timeout
    assert r.kind == "limit", r.describe()
    assert r.rc != 0, r.describe()
    assert r.j[f"{stream}_truncated"] is True, r.describe()
    text = r.j[stream]
    assert len(text.encode()) <= (1 << 20) + 4096, f"{stream} not capped: {len(text)} bytes"
    spill = r.j[f"{stream}_spill"]
    assert spill, r.describe()
    assert os.path.exists(spill), f"spill file {spill} missing"
    assert os.path.getsize(spill) <= cap, f"spill file {os.path.getsize(spill)} > {cap}"


def test_stdout_flood_capped(sh):
    r = sh("yes | head -c 3G; echo done", "--max-spill", "16M", "--timeout", "60", timeout=120)
    _check_flood(r, "stdout", 16 << 20)
    assert "done" not in r.out[-100:]
    os.unlink(r.j["stdout_spill"])


def test_stderr_flood_capped(sh):
    r = sh("cat /dev/zero >&2", "--max-spill", "16M", "--timeout", "60", timeout=120)
    _check_flood(r, "stderr", 16 << 20)
    os.unlink(r.j["stderr_spill"])


def test_max_output_head_tail_and_spill(sh):
    # 100000 numbered lines (588895 bytes): keep 1000, spill everything.
    r = sh("seq 1 100000", "--max-output", "1000", timeout=60)
    assert r.rc == 0 and r.j["error"] is None, r.describe()
    full = "".join(f"{i}\n" for i in range(1, 100001))
    assert r.j["stdout_bytes"] == len(full), r.describe()
    assert r.j["stdout_truncated"] is True
    out = r.out
    assert out.startswith("1\n2\n3\n"), out[:100]
    assert out.endswith("99999\n100000\n"), out[-100:]
    assert "bytes omitted" in out, out
    assert len(out.encode()) < 1000 + 400, len(out)
    spill = r.j["stdout_spill"]
    assert spill and os.path.exists(spill), r.describe()
    with open(spill) as f:
        assert f.read() == full
    os.unlink(spill)
    assert r.j["stderr_truncated"] is False and r.j["stderr_spill"] is None


def _free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_workspace_disk_filler(sh, ws):
    before = {p: _free(p) for p in ("/", "/tmp", str(ws))}
    r = sh("dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; s=$?; echo dd=$s; stat -c %s /workspace/big; exit $s",
           "--disk", "32M", "--timeout", "60", timeout=90)
    assert r.kind in ("limit", "command") or "No space left on device" in r.out, r.describe()
    if r.kind != "limit":
        assert "No space left on device" in r.out, r.describe()
        assert "dd=1" in r.out, r.describe()
        size = int(r.out.strip().splitlines()[-1])
        assert size <= 33 << 20, r.describe()
    assert not (ws / "big").exists()
    for p, b in before.items():
        assert b - _free(p) < 64 << 20, f"host free space on {p} dropped by {(b - _free(p)) >> 20} MiB"


def test_tmp_filler(sh):
    before = _free("/tmp")
    r = sh("dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; s=$?; echo dd=$s; stat -c %s /tmp/big; exit $s",
           "--tmp-size", "32M", "--timeout", "60", timeout=90)
    assert r.kind in ("limit", "command"), r.describe()
    if r.kind == "command":
        assert "No space left on device" in r.out and "dd=1" in r.out, r.describe()
        assert int(r.out.strip().splitlines()[-1]) <= 32 << 20, r.describe()
    assert before - _free("/tmp") < 64 << 20
    shutil.disk_usage("/")  # host still answers


def test_home_size_limit(sh):
    r = sh("dd if=/dev/zero of=$HOME/big bs=1M count=100 2>&1; s=$?; echo dd=$s; exit $s", "--home-size", "16M", timeout=60)
    assert r.kind in ("limit", "command"), r.describe()
    if r.kind == "command":
        assert "No space left on device" in r.out and "dd=1" in r.out, r.describe()
