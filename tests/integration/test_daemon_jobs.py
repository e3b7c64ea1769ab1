# test_daemon_jobs.py - background jobs of `conch serve` (docs/PROTOCOL.md, job.*):
# incremental output by offsets, wait with a timeout, kill (every process of the job),
# listing, the job.exited notification, and jobs dying with their sandbox.
import time

import pytest

from conftest import unique_marker
from rpcclient import RpcError, wait_gone


def expect_error(fn, code, data_code=None):
    with pytest.raises(RpcError) as ei:
        fn()
    assert ei.value.code == code, f"want {code}/{data_code}, got {ei.value}"
    if data_code is not None:
        assert ei.value.data_code == data_code, f"want {data_code}, got {ei.value}"
    return ei.value


LOOP = "for i in $(seq 1 20); do echo line$i; sleep 0.05; done; echo fin >&2"
FULL = "".join(f"line{i}\n" for i in range(1, 21))


def test_job_output_incremental(rpc, sandbox):
    sb = sandbox()
    job = rpc.call("job.start", {"sandbox": sb, "command": LOOP})["job_id"]
    assert isinstance(job, str) and job, job
    # wait until some but not all output is there
    deadline = time.monotonic() + 10
    while True:
        o1 = rpc.call("job.output", {"job_id": job})
        if o1["stdout"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert o1["stdout"].startswith("line1\n"), o1
    assert o1["stdout_offset"] == len(o1["stdout"].encode()), o1
    assert FULL.startswith(o1["stdout"]), o1
    first = o1["stdout"]

    w = rpc.call("job.wait", {"job_id": job, "timeout": 20}, timeout=30)
    assert w["running"] is False and w["exit_code"] == 0 and w["signal"] is None, w

    o2 = rpc.call("job.output", {"job_id": job, "stdout_offset": o1["stdout_offset"], "stderr_offset": o1["stderr_offset"]})
    # only the new bytes
    assert first + o2["stdout"] == FULL, (o1, o2)
    assert not o2["stdout"].startswith("line1\n"), o2
    assert o2["stdout_offset"] == len(FULL), o2
    assert (o1["stderr"] + o2["stderr"]) == "fin\n", (o1, o2)
    assert o2["running"] is False and o2["exit_code"] == 0, o2

    # from offset 0 again: everything; at the end: nothing
    o3 = rpc.call("job.output", {"job_id": job})
    assert o3["stdout"] == FULL and o3["stderr"] == "fin\n", o3
    o4 = rpc.call("job.output", {"job_id": job, "stdout_offset": o3["stdout_offset"], "stderr_offset": o3["stderr_offset"]})
    assert o4["stdout"] == "" and o4["stderr"] == "", o4
    # max_bytes bounds what one call returns
    o5 = rpc.call("job.output", {"job_id": job, "max_bytes": 12})
    assert o5["stdout"] == FULL[:12] and o5["stdout_offset"] == 12, o5


def test_job_wait_timeout_on_running_job(rpc, sandbox):
    sb = sandbox()
    m = unique_marker("jw")
    job = rpc.call("job.start", {"sandbox": sb, "command": f"exec -a {m} sleep 1000"})["job_id"]
    t0 = time.monotonic()
    w = rpc.call("job.wait", {"job_id": job, "timeout": 0.5}, timeout=120)
    took = time.monotonic() - t0
    assert w["running"] is True and w["exit_code"] is None, w
    # it waited (a lower bound), and came back while the job still ran (the 120 s wait
    # catches a job.wait that ignores its timeout)
    assert took >= 0.4, f"job.wait took {took:.2f}s for a 0.5 s timeout"
    rpc.call("job.kill", {"job_id": job, "signal": "KILL"})
    assert wait_gone(m) == []


def test_job_kill(rpc, sandbox):
    sb = sandbox()
    m = unique_marker("jk")
    # a child keeps running in the background: kill must reach every process of the job
    job = rpc.call("job.start", {"sandbox": sb, "command": f"(exec -a {m}-child sleep 1000) & exec -a {m} sleep 1000"})["job_id"]
    deadline = time.monotonic() + 5
    from rpcclient import pids_matching

    while len(pids_matching(m)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids_matching(m)) >= 2, "job processes did not start"
    assert rpc.call("job.kill", {"job_id": job}) == {"killed": True}
    w = rpc.call("job.wait", {"job_id": job, "timeout": 10}, timeout=20)
    assert w["running"] is False, w
    assert w["signal"] == 15, w
    assert wait_gone(m) == []
    o = rpc.call("job.output", {"job_id": job})
    assert o["running"] is False, o


def test_job_kill_stubborn_with_kill(rpc, sandbox):
    sb = sandbox()
    m = unique_marker("jks")
    job = rpc.call("job.start", {"sandbox": sb, "command": f"trap '' TERM; exec -a {m} sleep 1000"})["job_id"]
    time.sleep(0.3)
    rpc.call("job.kill", {"job_id": job, "signal": "KILL"})
    w = rpc.call("job.wait", {"job_id": job, "timeout": 10}, timeout=20)
    assert w["running"] is False and w["signal"] == 9, w
    assert wait_gone(m) == []


def test_job_list(rpc, sandbox, tmp_path):
    sb1 = sandbox()
    wd = tmp_path / "ws2"
    wd.mkdir()
    sb2 = sandbox(workspace=str(wd))
    m = unique_marker("jl")
    j1 = rpc.call("job.start", {"sandbox": sb1, "command": f"exec -a {m} sleep 1000"})["job_id"]
    j2 = rpc.call("job.start", {"sandbox": sb2, "command": "exit 4"})["job_id"]
    assert j1 != j2
    w = rpc.call("job.wait", {"job_id": j2, "timeout": 10}, timeout=20)
    assert w["running"] is False and w["exit_code"] == 4 and w["signal"] is None, w

    jobs = {j["job_id"]: j for j in rpc.call("job.list", {})["jobs"]}
    assert set(jobs) == {j1, j2}, jobs
    assert jobs[j1]["sandbox"] == sb1 and jobs[j1]["running"] is True and jobs[j1]["exit_code"] is None, jobs
    assert jobs[j1]["command"] == f"exec -a {m} sleep 1000", jobs
    assert jobs[j2]["sandbox"] == sb2 and jobs[j2]["running"] is False and jobs[j2]["exit_code"] == 4, jobs
    assert isinstance(jobs[j1]["started_at"], (int, float)) and abs(jobs[j1]["started_at"] - time.time()) < 60, jobs

    only = rpc.call("job.list", {"sandbox": sb2})["jobs"]
    assert [j["job_id"] for j in only] == [j2], only
    rpc.call("job.kill", {"job_id": j1, "signal": "KILL"})
    assert wait_gone(m) == []


def test_job_exited_notification(daemon, rpc, sandbox):
    sb = sandbox()
    other = daemon.client()
    other.call("daemon.ping")
    job = rpc.call("job.start", {"sandbox": sb, "command": "sleep 0.2; exit 7"})["job_id"]
    n = rpc.wait_notification("job.exited", lambda p: p.get("job_id") == job, timeout=10)
    p = n["params"]
    assert p["sandbox"] == sb and p["exit_code"] == 7 and p["signal"] is None, p
    # only the client that started it is told
    time.sleep(0.2)
    assert [x for x in other.notifications if x["method"] == "job.exited"] == [], other.notifications
    # killed job: the notification carries the signal
    job2 = rpc.call("job.start", {"sandbox": sb, "command": "sleep 1000"})["job_id"]
    rpc.call("job.kill", {"job_id": job2, "signal": "KILL"})
    n = rpc.wait_notification("job.exited", lambda p: p.get("job_id") == job2, timeout=10)
    assert n["params"]["signal"] == 9, n


def test_job_env_cwd_stdin(rpc, ws, sandbox):
    (ws / "sub").mkdir()
    sb = sandbox()
    job = rpc.call("job.start", {"sandbox": sb, "command": 'pwd; echo "$JV"; cat', "cwd": "sub", "env": {"JV": "jobvar"}, "stdin": "fed\n"})["job_id"]
    w = rpc.call("job.wait", {"job_id": job, "timeout": 10}, timeout=20)
    assert w["running"] is False and w["exit_code"] == 0, w
    o = rpc.call("job.output", {"job_id": job})
    assert o["stdout"] == "/workspace/sub\njobvar\nfed\n", o


def test_jobs_of_destroyed_sandbox_are_gone(rpc, sandbox):
    sb = sandbox()
    m = unique_marker("jd")
    job = rpc.call("job.start", {"sandbox": sb, "command": f"(exec -a {m}-bg sleep 1000) & exec -a {m} sleep 1000"})["job_id"]
    time.sleep(0.3)
    assert rpc.call("sandbox.destroy", {"id": sb}) == {"destroyed": True}
    assert wait_gone(m) == []
    assert [j for j in rpc.call("job.list", {})["jobs"] if j["job_id"] == job or j["sandbox"] == sb] == []
    expect_error(lambda: rpc.call("job.output", {"job_id": job}), -32003, "job_not_found")
    expect_error(lambda: rpc.call("job.wait", {"job_id": job, "timeout": 1}), -32003, "job_not_found")
    expect_error(lambda: rpc.call("job.kill", {"job_id": job}), -32003, "job_not_found")


def test_job_errors(rpc, sandbox):
    sb = sandbox()
    expect_error(lambda: rpc.call("job.output", {"job_id": "job-nope"}), -32003, "job_not_found")
    expect_error(lambda: rpc.call("job.start", {"sandbox": "sb-nope", "command": "true"}), -32002, "sandbox_not_found")
    e = expect_error(lambda: rpc.call("job.start", {"sandbox": sb}), -32602, "invalid_params")
    assert e.data.get("param") == "command", e


def test_job_kill_right_after_start(rpc, sandbox):
    # a kill that arrives while the job is still being spawned must not be lost
    sb = sandbox()
    m = unique_marker("jkr")
    lost = []
    for i in range(30):
        job = rpc.call("job.start", {"sandbox": sb, "command": f"exec -a {m}-{i} sleep 1000"})["job_id"]
        assert rpc.call("job.kill", {"job_id": job, "signal": "KILL"}) == {"killed": True}
        w = rpc.call("job.wait", {"job_id": job, "timeout": 5}, timeout=15)
        if w["running"]:
            lost.append((i, job, w))
            rpc.call("job.kill", {"job_id": job, "signal": "KILL"})
    assert lost == [], f"job.kill answered killed:true but the job kept running: {lost}"
    assert wait_gone(m) == []


def test_a_burst_of_job_starts_is_queued_not_refused(rpc, sandbox):
    # the warden's control socket holds ~130 messages (its send buffer): a batch of starts
    # sent without waiting must wait for room there, not fail with EAGAIN
    sb = sandbox()
    n = 300
    reqs = [rpc.request("job.start", {"sandbox": sb, "command": f"echo out{i}"}) for i in range(n)]
    jobs, errors = [], []
    for i, req in enumerate(reqs):
        resp = rpc.wait(req, timeout=120)
        if "error" in resp:
            errors.append((i, resp["error"].get("message")))
        else:
            jobs.append((i, resp["result"]["job_id"]))
    assert not errors, f"{len(errors)} of {n} job.start refused, first: {errors[0]}"
    for i, job in jobs:
        w = rpc.call("job.wait", {"job_id": job, "timeout": 60}, timeout=90)
        assert w["running"] is False and w["exit_code"] == 0, (i, w)
        out = rpc.call("job.output", {"job_id": job})
        assert out["stdout"] == f"out{i}\n", (i, out)
