# test_timeout.py - --timeout/--grace against a process tree built to survive: shells that
# ignore SIGTERM, double-forked daemons in their own sessions, nohup'd sleepers. conch
# must return on time with 124 and leave none of them behind on the host.
import time

from conftest import unique_marker, wait_no_pids


def stubborn_tree(m):
    # every process below carries the marker in its argv (script text or exec -a)
    return f"""
trap '' TERM
( trap '' TERM; exec -a {m}-ignorer sleep 1000 ) &
( trap '' TERM; while :; do sleep 0.1; done ) &
setsid bash -c "trap '' TERM; exec -a {m}-setsid sleep 1000" &
( setsid bash -c "exec -a {m}-double sleep 1000" & ) &
nohup bash -c "exec -a {m}-nohup sleep 1000" >/dev/null 2>&1 &
( ( exec -a {m}-orphan sleep 1000 ) & ) &
echo started
exec -a {m}-main sleep 1000
"""


def test_timeout_kills_whole_tree(sh):
    m = unique_marker("tree")
    t0 = time.monotonic()
    # (the 120 s limit only catches a hang; rc 124 and timed_out say it ended by its timeout)
    r = sh(stubborn_tree(m), "--timeout", "1", "--grace", "1", timeout=120)
    took = time.monotonic() - t0
    assert took >= 1, r.describe()  # it waited for its timeout (a lower bound: no clock race)
    assert r.rc == 124, r.describe()
    assert r.j["timed_out"] is True, r.describe()
    assert r.j["exit_code"] == 124 or r.j["signal"] in (9, 15), r.describe()
    assert r.kind == "timeout", r.describe()
    assert "started" in r.out, r.describe()
    assert wait_no_pids(m) == []


def test_timeout_cooperative_process_ends_at_sigterm(sh):
    # a process that honours SIGTERM ends without waiting for the grace period: it dies of
    # the SIGTERM, not of the SIGKILL the grace's end would send (a grace of 100 s: waiting
    # for it would also run into the 120 s limit)
    r = sh("echo go; exec sleep 1000", "--timeout", "0.5", "--grace", "100", timeout=120)
    assert r.rc == 124 and r.j["timed_out"] is True and r.kind == "timeout", r.describe()
    assert r.j["signal"] == 15, r.describe()
    assert r.out == "go\n"


def test_term_handler_runs_before_kill(sh):
    # SIGTERM comes first: a handler gets to run and print before the grace expires
    r = sh("trap 'echo got-term; exit 0' TERM; sleep 1000 & wait", "--timeout", "0.5", "--grace", "100", timeout=120)
    assert r.rc == 124, r.describe()
    assert "got-term" in r.out, r.describe()
    assert r.j["signal"] is None and r.j["exit_code"] == 124, r.describe()  # not killed after the grace


def test_fast_command_not_timed_out(sh):
    r = sh("echo ok", "--timeout", "5", timeout=120)
    assert r.rc == 0 and r.j["timed_out"] is False and r.j["error"] is None, r.describe()


def test_background_process_after_exit_is_reaped(sh):
    # the command exits at once, leaving a daemon behind: conch must not leave it running
    m = unique_marker("daemon")
    r = sh(f"setsid bash -c 'exec -a {m} sleep 1000' </dev/null >/dev/null 2>&1 & echo bye", "--timeout", "100", timeout=120)
    # it did not wait for the daemon it left: no timeout (100 s) was reached
    assert r.rc == 0 and r.out == "bye\n" and r.j["timed_out"] is False, r.describe()
    assert wait_no_pids(m) == []
