# conftest.py - shared fixtures for conch's integration tests: they run the real `conch`
# binary ($CONCH_BIN, default build/conch) the way a user would, in temp workspaces, and
# check from the host that nothing got out.
import hashlib
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONCH_BIN = os.environ.get("CONCH_BIN") or str(REPO / "build" / "conch")
IS_ROOT = os.geteuid() == 0
# A sanitizer build: its memory figures mean little (shadow memory, the quarantine of freed
# blocks), so memory bounds are looser or skipped under it.
ASAN = os.path.exists(CONCH_BIN) and b"__asan_init" in open(CONCH_BIN, "rb").read()

# The PATH the spec promises inside the sandbox.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def pytest_configure(config):
    config.addinivalue_line("markers", "root_only: needs conch to be run by host root")
    config.addinivalue_line("markers", "user_only: needs conch to be run by an unprivileged user")
    config.addinivalue_line("markers", "slow: takes more than ~10 s on an idle machine (run by the root pass only)")
    config.addinivalue_line("markers", "serial: counts or loads something host-wide; run alone, not beside other tests")
    config.addinivalue_line("markers", "jail: exercises how the sandbox is built, which differs as root and as a user")
    config.addinivalue_line("markers", "daemon_code: exercises the daemon's and conch run's own C code (run as root under ASan)")
    config.addinivalue_line("markers", "plain_build: measures what only the plain build shows (memory figures): skipped under ASan, run as root against the plain build")


# Which of scripts/test's three integration passes finds what (each runs what only it can find):
# - as root against the ASan/UBSan build (`-m "daemon_code and not slow"`): the files that
#   drive the daemon's and conch run's C code, which the sanitizers check as they run;
# - as root against the plain build (`-m "not daemon_code or plain_build or slow"`): the rest
#   (the fence and escape files exercise the kernel's checks; the clients inside the sandbox,
#   the service units), the tests of memory figures that only the plain build shows
#   (plain_build: skipped under ASan), and the `slow` ones (stress and bombs), which run once;
# - as an unprivileged user against the plain build (`-m "jail and not slow"`): the files
#   whose behaviour depends on the mode the sandbox is built in (id maps, cgroups or rlimits,
#   idmapped mounts, the lease); the daemon's protocol, the bridge and the in-sandbox clients
#   behave the same either way.
# So a test of the daemon's code runs as root once, under ASan (before, it ran both plain and
# under ASan: CI took 25 minutes).
JAIL_FILES = {
    "test_cli", "test_cli_daemon", "test_daemon_basic", "test_daemon_fs", "test_daemon_limits",
    "test_daemon_recovery", "test_daemon_workspace", "test_escape", "test_fences",
    "test_file_workers", "test_fresh_reuse", "test_identity", "test_lease_attack", "test_limits",
    "test_programs", "test_review_attack", "test_run_lease", "test_sessions", "test_supervisor",
    "test_supervisor_attack", "test_timeout", "test_workspace", "test_workspace_limits",
    "test_attack_review", "test_daemon_stdio", "test_embedding", "test_clean_image",
    "test_lease_revoke", "test_session_forgery", "test_file_events", "test_cli_lifecycle",
    "test_attack_today", "test_attack_features", "test_js_daemon", "test_snapshots",
    "test_mounts", "test_network", "test_since", "test_path_rules", "test_sockets",
    "test_attack_today2", "test_store", "test_fs_copy", "test_overlay_mount", "test_attack_today3",
    "test_run_mounts", "test_fork_pool", "test_remote_e2e", "test_attack_remote",
}
DAEMON_CODE_FILES = {
    "test_bridge", "test_bridge_attack", "test_cli", "test_cli_daemon", "test_daemon_badinput",
    "test_daemon_basic", "test_daemon_fs", "test_daemon_jobs", "test_daemon_limits",
    "test_daemon_loop", "test_daemon_recovery", "test_daemon_stdio", "test_daemon_workspace",
    "test_embedding", "test_file_workers", "test_fresh_reuse", "test_lease_attack",
    "test_review_attack", "test_run_lease", "test_sessions", "test_supervisor",
    "test_supervisor_attack", "test_workspace", "test_attack_review",
    "test_clean_image", "test_daemon_budgets", "test_lease_revoke", "test_session_forgery",
    "test_session_ids", "test_file_events", "test_js_worker", "test_js_daemon",
    "test_cli_exec", "test_cli_consistency",
    "test_cli_lifecycle", "test_cli_cp", "test_attack_today", "test_attack_features", "test_snapshots",
    "test_mounts", "test_network", "test_since", "test_path_rules", "test_sockets",
    "test_attack_today2", "test_store", "test_fs_copy", "test_overlay_mount", "test_attack_today3",
    "test_run_mounts", "test_tenants", "test_attack_remote", "test_remote_clients", "test_mcp_http", "test_remote", "test_remote_e2e", "test_fork_pool",
}
# Files that only the root pass runs: what they test is the same in every mode and below the
# daemon's C code (in-sandbox clients, the terminal UI, service units), or it is a stress test.
ROOT_PASS_FILES = {"test_daemon_stress", "test_ptc_clients", "test_service", "test_sessions_tmux",
                   "test_install", "test_docs", "test_deploy", "test_image"}
# Files whose every test loads or counts something host-wide (systemd units, process floods).
SERIAL_FILES = {"test_service", "test_daemon_stress", "test_limits"}
# Tests elsewhere that flood the host (fork bombs) or count a host-wide or per-uid resource
# that a test beside them would use too (aio contexts, inotify instances, pending signals).
SERIAL_WORDS = ("fork_bomb", "aio", "inotify", "pending_signals", "process_bound", "fork_loop")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = Path(str(item.fspath)).stem
        if name not in JAIL_FILES | DAEMON_CODE_FILES | ROOT_PASS_FILES:
            raise pytest.UsageError(f"{name}.py is in none of conftest.py's JAIL_FILES, "
                                    "DAEMON_CODE_FILES or ROOT_PASS_FILES: say which passes run it")
        if name in JAIL_FILES or item.get_closest_marker("user_only"):
            item.add_marker(pytest.mark.jail)
        if name in DAEMON_CODE_FILES:
            item.add_marker(pytest.mark.daemon_code)
        # The `users` fixture (test_identity) creates host users and /etc/subuid entries that
        # its tests share: they run alone.
        if (name in SERIAL_FILES or any(w in item.name for w in SERIAL_WORDS)
                or "users" in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)


def pytest_runtest_setup(item):
    if item.get_closest_marker("plain_build") and ASAN:
        pytest.skip("plain_build: memory figures of a sanitizer build mean little; the plain pass checks them")
    if item.get_closest_marker("root_only") and not IS_ROOT:
        pytest.skip("root_only: this test checks root mode (a host id block per sandbox); run as root")
    if item.get_closest_marker("user_only") and IS_ROOT:
        pytest.skip("user_only: this test checks unprivileged mode; run via tests/integration/as_user.sh")


def pytest_report_header(config):
    return [f"conch binary: {CONCH_BIN}", f"running as uid {os.geteuid()} ({'root' if IS_ROOT else 'unprivileged'} mode)"]


class Result:
    """One finished `conch` invocation: rc, raw stdout/stderr, parsed JSON (or None), wall time."""

    def __init__(self, argv, rc, stdout, stderr, elapsed, want_json):
        self.argv = argv
        self.rc = rc
        self.raw_stdout = stdout
        self.raw_stderr = stderr
        self.elapsed = elapsed
        self.j = None
        if want_json:
            try:
                self.j = json.loads(stdout.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                pytest.fail(
                    f"conch --json did not print one JSON object ({e})\n{self.describe()}", pytrace=False
                )
            if not isinstance(self.j, dict):
                pytest.fail(f"conch --json printed a non-object\n{self.describe()}", pytrace=False)

    # Convenience accessors on the JSON result.
    @property
    def out(self):
        return self.j["stdout"]

    @property
    def err(self):
        return self.j["stderr"]

    @property
    def kind(self):
        e = self.j.get("error")
        return e.get("kind") if e else None

    @property
    def stderr(self):
        """conch's own stderr (warnings, text-mode summary)."""
        return self.raw_stderr.decode("utf-8", "replace")

    @property
    def stdout(self):
        return self.raw_stdout.decode("utf-8", "replace")

    def changes(self):
        """{path: change dict} from the JSON result."""
        return {c["path"]: c for c in self.j["changes"]}

    def describe(self):
        def cut(b):
            s = b.decode("utf-8", "replace")
            return s if len(s) < 4000 else s[:2000] + f"\n[... {len(s) - 4000} chars ...]\n" + s[-2000:]

        return (
            f"argv: {self.argv}\nrc: {self.rc}  elapsed: {self.elapsed:.2f}s\n"
            f"--- conch stdout:\n{cut(self.raw_stdout)}\n--- conch stderr:\n{cut(self.raw_stderr)}"
        )

    def __repr__(self):
        return f"<Result rc={self.rc} {self.describe()}>"


def conch(args, *, input=None, timeout=60, cwd=None, env=None, pass_fds=(), want_json=False):
    """Run `conch ARGS...` and return a Result. The whole process group is killed if it
    outlives `timeout` (then the test fails: conch must end on its own)."""
    argv = [CONCH_BIN, *map(str, args)]
    if not os.path.exists(CONCH_BIN):
        pytest.fail(f"conch binary not found at {CONCH_BIN} (set CONCH_BIN)", pytrace=False)
    full_env = dict(os.environ) if env is None else env
    t0 = time.monotonic()
    p = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=full_env,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        pytest.fail(
            f"conch did not finish within {timeout}s: {argv}\nstdout: {out[-2000:]!r}\nstderr: {err[-2000:]!r}",
            pytrace=False,
        )
    return Result(argv, p.returncode, out, err, time.monotonic() - t0, want_json)


@pytest.fixture
def conch_bin():
    if not os.path.exists(CONCH_BIN):
        pytest.fail(f"conch binary not found at {CONCH_BIN} (set CONCH_BIN)", pytrace=False)
    return CONCH_BIN


@pytest.fixture
def ws(tmp_path):
    """An empty host workspace directory."""
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def run(ws):
    """run(args, **kw) -> Result: `conch run --json --workspace <ws> ARGS...` with cwd=ws.
    args holds the options and then "--" and the command. Use workspace=... to override."""

    def _run(args, *, workspace=None, json_mode=True, cwd=None, **kw):
        w = ws if workspace is None else workspace
        pre = ["run"] + (["--json"] if json_mode else []) + (["--workspace", str(w)] if w is not False else [])
        return conch(pre + list(args), cwd=cwd if cwd is not None else (w if w else None), want_json=json_mode, **kw)

    return _run


@pytest.fixture
def sh(run):
    """sh(script, *opts, **kw) -> Result: runs `bash -c SCRIPT` in the sandbox."""

    def _sh(script, *opts, **kw):
        return run([*opts, "--", "bash", "-c", script], **kw)

    return _sh


@pytest.fixture
def py(run):
    """py(code, *opts, **kw) -> Result: runs `python3 -c CODE` in the sandbox. If the code
    prints a JSON value as its last stdout line, it is in result.val."""

    def _py(code, *opts, **kw):
        r = run([*opts, "--", "python3", "-c", code], **kw)
        r.val = None
        lines = r.j["stdout"].strip().splitlines()
        if lines:
            try:
                r.val = json.loads(lines[-1])
            except json.JSONDecodeError:
                pass
        return r

    return _py


# ---- host-side helpers -------------------------------------------------------------------


def tree_state(root):
    """A comparable snapshot of a directory tree: {relpath: (type, mode, uid, gid, payload)}
    where payload is a sha256 of a file's bytes, a symlink's target, or None for a dir.
    Never follows symlinks."""
    root = str(root)
    state = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("l", 0, st.st_uid, st.st_gid, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, None)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    h = hashlib.sha256(f.read()).hexdigest()
                state[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, h)
            else:
                state[rel] = ("o", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_rdev)
    st = os.lstat(root)
    state["."] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, None)
    return state


def tree_checksum(root):
    return hashlib.sha256(json.dumps(sorted(tree_state(root).items())).encode()).hexdigest()


def host_pids_matching(marker):
    """Host pids whose command line contains `marker` (like `pgrep -f`), excluding ours."""
    me = os.getpid()
    found = []
    m = marker.encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if m in cmd:
            found.append(int(d))
    return found


def proc_comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def proc_argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return None


def proc_cmdline(pid):
    """/proc/<pid>/cmdline as bytes (NUL-separated), or b"" if the process is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def proc_stat(pid):
    """(state, ppid) from /proc/<pid>/stat, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read()
    except OSError:
        return None
    rest = st[st.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[1])


def proc_status(pid):
    """/proc/<pid>/status as a dict, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


def titled_descendants(pid, title):
    """Host pids of the live (non-zombie) descendants of @pid whose title (argv) starts with
    @title (bytes): the warden's children by the names they give themselves."""
    found = []
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        st = proc_status(p)
        if cmd.startswith(title) and st and not st.get("State", "").startswith("Z"):
            found.append(p)
    return sorted(found)


def descendants(pid):
    """Live (non-zombie) descendants of pid."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rindex(b")") + 2:].split()
        if rest[0] == b"Z":
            continue
        children.setdefault(int(rest[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def is_zombie(pid):
    s = proc_status(pid)
    return s is None or s.get("State", "").startswith("Z")


def wait_no_pids(marker, timeout=30.0):
    """Wait until no live host process matches `marker`; return what is still there. (It
    returns as soon as none is left: the timeout only bounds a failure, so it is generous.)"""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in host_pids_matching(marker) if not is_zombie(p)]
        if not left or time.monotonic() > deadline:
            return [(p, proc_argv(p)) for p in left]
        time.sleep(0.05)


def unique_marker(tag="m"):
    return f"conchit-{tag}-{os.getpid()}-{time.monotonic_ns()}"


# ---- the daemon (`conch serve`) ----------------------------------------------------------
# Fixtures for the test_daemon_*.py files. They skip (with the reason) while `conch serve`
# does not exist in $CONCH_BIN; once it does they run for real.


@pytest.fixture
def daemon_factory():
    """make(extra_args=(), state_dir=None, stdio=False, start=True) -> rpcclient.Daemon.
    At teardown every daemon made is stopped with SIGTERM; the test errors if one does not
    exit by itself within 10 s, if a process carrying its marker (its directory name, which
    is in its argv) is left, or if a mount under its directory is left on the host."""
    from rpcclient import Daemon, serve_available, wait_gone

    ok, why = serve_available(CONCH_BIN)
    if not ok:
        pytest.skip(f"daemon not available: {why}")
    made = []

    def make(extra_args=(), state_dir=None, stdio=False, start=True):
        d = Daemon(CONCH_BIN, state_dir=state_dir, extra_args=extra_args, stdio=stdio)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    problems = []
    for d in made:
        rc = d.proc.poll() if d.proc else None
        if rc not in (None, 0) and not d.killed:
            problems.append(f"conch serve (pid {d.proc.pid}) died during the test: exit status {rc}\n{d.log()}")
        exited, rc = d.stop()
        if not exited:
            problems.append(f"conch serve (pid {d.proc.pid}) ignored SIGTERM for 10 s\n{d.log()}")
    for d in made:
        left = wait_gone(d.marker)
        if left:
            problems.append(f"processes left behind by daemon {d.marker}: {left}")
        mounts = d.mounts_under_base()
        if mounts:
            problems.append(f"mounts left under {d.base}: {mounts}")
        d.cleanup()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def daemon(daemon_factory):
    """A running `conch serve --socket <dir>/conch.sock --state-dir <dir>/state`:
    .sock, .state_dir, .proc, .pid, .client() (a new rpcclient.Client), .log()."""
    return daemon_factory()


@pytest.fixture
def rpc(daemon):
    """One client connection to the `daemon` fixture."""
    return daemon.client()


@pytest.fixture
def sandbox(rpc, ws):
    """make(**params) -> sandbox id, created over `rpc` on the `ws` workspace (overlay mode)
    unless params say otherwise. Destroyed at teardown if still there."""
    from rpcclient import RpcError

    ids = []

    def make(**params):
        params.setdefault("workspace", str(ws))
        sb = rpc.call("sandbox.create", params, timeout=30)
        ids.append(sb["id"])
        return sb["id"]

    yield make
    for i in ids:
        try:
            rpc.call("sandbox.destroy", {"id": i}, timeout=30)
        except (RpcError, AssertionError, OSError):
            pass
