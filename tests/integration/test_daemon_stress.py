# test_daemon_stress.py - many sandboxes and commands at once over several connections to
# one `conch serve`: every command must succeed with the right output, and afterwards the
# daemon must be back where it started (no processes, mounts or fds left behind).
import os
import threading
import time

from conftest import descendants, unique_marker
from rpcclient import result_of, wait_gone

N_SANDBOXES = 50
N_COMMANDS = 20
N_CONNECTIONS = 4
IN_FLIGHT = 2  # requests pipelined per connection


def mount_count(pid):
    with open(f"/proc/{pid}/mountinfo") as f:
        return sum(1 for _ in f)


def mount_points(pid):
    with open(f"/proc/{pid}/mountinfo") as f:
        return sorted(line.split()[4] for line in f)


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(fn, want, timeout=5.0):
    """Poll fn() until it returns want (or the timeout); return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v == want or time.monotonic() > deadline:
            return v
        time.sleep(0.1)


def stable(fn, hold=0.5, timeout=5.0):
    """fn()'s value once it has not changed for `hold` seconds (or at the timeout)."""
    deadline = time.monotonic() + timeout
    v, since = fn(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        n = fn()
        if n != v:
            v, since = n, time.monotonic()
        elif time.monotonic() - since >= hold:
            break
    return v


def test_many_sandboxes_many_commands(daemon, tmp_path):
    pid = daemon.pid
    ctl = daemon.client()
    ctl.call("daemon.ping")
    # warm up: the first workspace sandbox may set up lasting daemon state (its own mount
    # namespace, a staging mount); leaks are what grows per sandbox after that
    w = tmp_path / "warmup"
    w.mkdir()
    sb = ctl.call("sandbox.create", {"workspace": str(w)})["id"]
    ctl.call("exec.run", {"sandbox": sb, "command": "true"})
    ctl.call("sandbox.destroy", {"id": sb})
    base_mounts = mount_count(pid)
    base_points = mount_points(pid)
    base_fds = fd_count(pid)
    base_desc = stable(lambda: len(descendants(pid)))  # the fresh-run pool refills in the background

    ids = []
    for i in range(N_SANDBOXES):
        w = tmp_path / f"ws{i}"
        w.mkdir()
        (w / "id").write_text(f"{i}\n")
        ids.append(ctl.call("sandbox.create", {"workspace": str(w), "name": f"stress{i}"}, timeout=30)["id"])
    assert len(set(ids)) == N_SANDBOXES
    index = {sb: i for i, sb in enumerate(ids)}
    m = unique_marker("stress")
    for i, sb in enumerate(ids[::5]):
        ctl.call("job.start", {"sandbox": sb, "command": f"exec -a {m}-{i} sleep 1000"})

    failures = []
    lock = threading.Lock()

    def worker(k):
        c = None
        try:
            c = daemon.client()
            mine = ids[k::N_CONNECTIONS]
            todo = [(sb, j) for j in range(N_COMMANDS) for sb in mine]
            inflight = []
            while todo or inflight:
                while todo and len(inflight) < IN_FLIGHT:
                    sb, j = todo.pop(0)
                    rid = c.request("exec.run", {"sandbox": sb, "command": f"echo {j} >> log; echo $(cat id)-{j}"})
                    inflight.append((rid, sb, j))
                rid, sb, j = inflight.pop(0)
                try:
                    r = result_of(c.wait(rid, 60), "exec.run")
                except Exception as e:  # noqa: BLE001 - collected and reported below
                    with lock:
                        failures.append(f"{sb} #{j}: {e}")
                    continue
                if r["exit_code"] != 0 or r["stdout"] != f"{index[sb]}-{j}\n":
                    with lock:
                        failures.append(f"{sb} #{j}: {r}")
        except Exception as e:  # noqa: BLE001
            with lock:
                failures.append(f"worker {k}: {e!r}")
        finally:
            if c is not None:
                c.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(N_CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    # (each command has its own 60 s wait: a stuck one is a failure, how long they all took
    # is not)
    assert not any(t.is_alive() for t in threads), "a worker is still waiting after 300 s"
    assert not failures, f"{len(failures)} failures, first: {failures[:5]}"

    # every sandbox ran its commands in order and kept state
    for sb in [ids[i] for i in range(1, N_SANDBOXES, 7) if i % 5]:  # ones without a job
        r = ctl.call("exec.run", {"sandbox": sb, "command": "cat log"})
        assert r["stdout"] == "".join(f"{j}\n" for j in range(N_COMMANDS)), (sb, r)
        got = ctl.call("sandbox.get", {"id": sb})
        assert got["commands"] == N_COMMANDS + 1, got

    assert len(ctl.call("sandbox.list", {})["sandboxes"]) == N_SANDBOXES
    for sb in ids:
        assert ctl.call("sandbox.destroy", {"id": sb}, timeout=30) == {"destroyed": True}
    assert ctl.call("sandbox.list", {})["sandboxes"] == []
    assert wait_gone(m) == []
    for i in range(N_SANDBOXES):
        assert sorted(os.listdir(tmp_path / f"ws{i}")) == ["id"], f"host ws{i} changed"

    # the daemon is back to its baseline (the worker connections are closed by now)
    desc = settle(lambda: len(descendants(pid)), base_desc)
    assert desc == base_desc, f"daemon has {desc} descendants, {base_desc} before: {descendants(pid)}"
    mounts = settle(lambda: mount_count(pid), base_mounts)
    if mounts != base_mounts:
        now = mount_points(pid)
        extra = [m for m in now if m not in base_points]
        gone = [m for m in base_points if m not in now]
        raise AssertionError(f"daemon mountinfo has {mounts} lines, {base_mounts} before; new: {extra[:20]}; gone: {gone[:20]}")
    deadline = time.monotonic() + 5
    while abs(fd_count(pid) - base_fds) > 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    fds = fd_count(pid)
    assert abs(fds - base_fds) <= 2, f"daemon has {fds} fds, {base_fds} before: {sorted(os.listdir(f'/proc/{pid}/fd'))}"
    assert "version" in ctl.call("daemon.ping")
