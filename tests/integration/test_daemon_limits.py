# test_daemon_limits.py - resource limits of daemon sandboxes (sandbox.create memory/pids):
# a command over the limit ends with error.kind "limit", the host is unaffected, and the
# next command in the same sandbox is not blamed for it. Root enforces them with a cgroup;
# an ordinary user (no cgroup on this machine) through sampling and rlimits.
import pytest

from conftest import unique_marker
from rpcclient import RpcError, wait_gone


def test_memory_hog_is_a_limit_and_the_next_command_is_not(rpc, sandbox):
    sb = sandbox(memory=64 << 20)
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 30,
                              "command": "python3 -c 'x = [b\"x\" * (16 << 20) for i in range(64)]; print(\"allocated\")'"},
                 timeout=60)
    assert "allocated" not in r["stdout"], r
    assert r["error"] and r["error"]["kind"] == "limit", r
    assert "memory" in r["error"]["message"], r
    assert r["exit_code"] != 0 and r["timed_out"] is False, r
    r = rpc.call("exec.run", {"sandbox": sb, "command": "python3 -c 'b = b\"y\" * (8 << 20); print(len(b))'"})
    assert r["exit_code"] == 0 and r["error"] is None and r["stdout"] == f"{8 << 20}\n", r


def test_process_limit_is_a_limit(rpc, sandbox):
    marker = unique_marker("pids")
    sb = sandbox(pids=32)
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 5, "grace": 1,
                              "command": f"for i in $(seq 80); do sleep 30 & done; wait # {marker}"},
                 timeout=60)
    assert r["error"] and r["error"]["kind"] == "limit", r
    assert "process" in r["error"]["message"], r
    assert wait_gone(marker) == [], "processes of the command outlived it"
    r = rpc.call("exec.run", {"sandbox": sb, "command": "echo fine"})
    assert r["exit_code"] == 0 and r["error"] is None and r["stdout"] == "fine\n", r


def test_disk_limit_of_the_workspace(rpc, sandbox, ws):
    # the upper dir lives on the host's disk: a filler is stopped near the sandbox's limit
    sb = sandbox(disk=32 << 20)
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 60,
                              "command": "for i in $(seq 2000); do head -c 1M /dev/zero > f$i || exit 1; done; echo filled"},
                 timeout=90)
    assert "filled" not in r["stdout"], r
    assert r["error"] and r["error"]["kind"] == "limit" and "disk" in r["error"]["message"], r
    used = rpc.call("workspace.changes", {"sandbox": sb})["changes_total"]
    assert used < 600, f"the filler wrote {used} files of 1 MiB before it was stopped"
    # over the limit, nothing more may be written until room is made
    with pytest.raises(RpcError) as ei:
        rpc.call("exec.run", {"sandbox": sb, "command": "true"})
    assert ei.value.data_code == "limit" and "fs.delete" in ei.value.message, ei.value
    rpc.call("workspace.discard", {"sandbox": sb}, timeout=60)
    # one file larger than the limit fails at once (RLIMIT_FSIZE)
    r = rpc.call("exec.run", {"sandbox": sb, "command": "head -c 40M /dev/zero > big; echo rc=$?"})
    assert "rc=0" not in r["stdout"], r
    assert not any(p.name.startswith("f") for p in ws.iterdir()), "the host workspace was written"


def test_output_flood_is_a_limit(rpc, sandbox):
    # past the spill cap (256 MiB per stream) the command is killed and the result says why
    sb = sandbox()
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 60, "command": "yes conch-output-flood"},
                 timeout=90)
    assert r["error"] and r["error"]["kind"] == "limit" and "output" in r["error"]["message"], r
    assert r["stdout_truncated"] is True and r["stdout_spill"], r
    assert len(r["stdout"].encode()) <= (1 << 20) + 4096, "stdout not capped"
    r = rpc.call("exec.run", {"sandbox": sb, "command": "echo fine"})
    assert r["error"] is None and r["stdout"] == "fine\n", r


def test_an_oom_kill_picks_the_command_not_its_shepherd(rpc, sandbox):
    """The command's oom_score_adj is at the top, its shepherd's (PID 1 of the command's pid
    namespace, whose death ends the command) is not, and neither is that of a process the
    command forks. Before, the command's process raised its own score while it shared its
    shepherd's memory, and the kernel raised every sharer's: the shepherd's too (and walked
    every process of the machine to do it, per command)."""
    sb = sandbox()
    r = rpc.call("exec.run", {"sandbox": sb, "timeout": 30, "command":
                              "sleep 0.3; echo self=$(cat /proc/$$/oom_score_adj);"
                              " echo shepherd=$(cat /proc/1/oom_score_adj);"
                              " sleep 5 & echo child=$(cat /proc/$!/oom_score_adj); kill $!"},
                 timeout=60)
    assert r["exit_code"] == 0, r
    got = dict(line.split("=", 1) for line in r["stdout"].split())
    assert got["self"] == "1000" and got["child"] == "1000", r
    assert int(got["shepherd"]) <= 0, r
