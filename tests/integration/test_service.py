# test_service.py - conch as a service: `conch serve` started by socket activation
# (systemd-socket-activate hands it a listening socket through LISTEN_FDS, as conch.socket
# does), and `meson install --destdir` putting the binary, the man page, the systemd units and
# the bash completion where they belong, the man page rendering without warnings and covering
# every command and option, the completion offering them.
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import CONCH_BIN, IS_ROOT, REPO

ACTIVATE = shutil.which("systemd-socket-activate")
BUILD_DIR = Path(CONCH_BIN).resolve().parent
HAVE_SOURCES = (REPO / "man" / "conch.1").exists() and (REPO / "systemd").is_dir()


def rpc(sock_path, method, params=None, rid=1, timeout=30):
    """One JSON-RPC request on a fresh connection; returns the parsed response."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock_path))
        s.sendall((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}) + "\n").encode())
        buf = b""
        while True:
            chunk = s.recv(65536)
            assert chunk, f"the daemon closed the connection during {method}"
            buf += chunk
            for line in buf.split(b"\n")[:-1]:
                msg = json.loads(line)
                if msg.get("id") == rid:
                    return msg


def service_argv():
    """The daemon's command line as conch.service has it, with the binary under test."""
    unit = REPO / "systemd" / "conch.service.in"
    args = ["serve"]
    if unit.exists():
        line = next(l for l in unit.read_text().splitlines() if l.startswith("ExecStart="))
        exe, *args = line[len("ExecStart="):].split()
        assert exe == "@bindir@/conch"
    return [CONCH_BIN, *args]


@pytest.fixture
def activated(tmp_path):
    """conch serve under systemd-socket-activate on a temp socket; yields (socket, process)."""
    if not ACTIVATE:
        pytest.skip("systemd-socket-activate is missing (Debian package systemd)")
    sock = tmp_path / "conch.sock"
    argv = [ACTIVATE, "-l", str(sock), *service_argv(), "--state-dir", str(tmp_path / "state"), "--pool", "0"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The socket file appears at bind(), before listen(): wait until a connection is taken
    # (a loaded machine showed the gap as ECONNREFUSED).
    deadline = time.time() + 30
    while True:
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "systemd-socket-activate never listened on the socket"
        if sock.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(sock))
                    break
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
        time.sleep(0.02)
    yield sock, p
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_socket_activation_serves_the_passed_socket(activated, tmp_path):
    sock, p = activated
    ping = rpc(sock, "daemon.ping")["result"]
    # systemd-socket-activate execs the service in place: the daemon is that very process,
    # started on the first connection with the socket as fd 3.
    assert ping["pid"] == p.pid
    assert ping["sandboxes"] == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o755)
    (ws / "in.txt").write_text("from the host\n")
    sb = rpc(sock, "sandbox.create", {"workspace": str(ws)}, rid=2)["result"]
    res = rpc(sock, "exec.run", {"sandbox": sb["id"], "command": "cat in.txt; echo out > out.txt; id -un"}, rid=3)["result"]
    assert res["text"] == "from the host\nagent\n[exit code: 0]"
    assert [c["path"] for c in res["changes"]] == ["out.txt"]
    # The CLI clients reach it the same way.
    ps = subprocess.run([CONCH_BIN, "ps", "--socket", str(sock)], capture_output=True, text=True, timeout=30)
    assert ps.returncode == 0, ps.stderr
    assert sb["id"] in ps.stdout
    ex = subprocess.run(
        [CONCH_BIN, "exec", "--socket", str(sock), sb["id"], "--", "cat", "out.txt"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert (ex.returncode, ex.stdout) == (0, "out\n"), ex.stderr
    # Many connections on the one passed socket.
    for i in range(20):
        assert rpc(sock, "daemon.ping", rid=10 + i)["result"]["pid"] == p.pid
    # SIGTERM stops it; the socket belongs to the service manager and stays.
    p.send_signal(signal.SIGTERM)
    assert p.wait(15) == 0
    assert sock.exists()
    assert b"serving on " + str(sock).encode() in p.stderr.read()


def test_listen_fds_for_another_pid_is_ignored(tmp_path):
    """LISTEN_FDS meant for another process (an inherited environment) does not apply."""
    sock = tmp_path / "own.sock"
    env = dict(os.environ, LISTEN_PID="1", LISTEN_FDS="1")
    p = subprocess.Popen(
        [CONCH_BIN, "serve", "--socket", str(sock), "--state-dir", str(tmp_path / "state"), "--pool", "0"],
        env=env, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 10
        while not sock.exists():
            assert p.poll() is None, p.stderr.read().decode()
            assert time.time() < deadline
            time.sleep(0.02)
        assert rpc(sock, "daemon.ping")["result"]["pid"] == p.pid
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(15)
    assert not sock.exists(), "a socket the daemon bound itself is removed when it stops"


def test_listen_fds_not_a_socket_is_refused(tmp_path):
    """fd 3 that is not a listening unix socket is an error naming the fix, not a hang."""
    f = tmp_path / "plain"
    f.write_text("x")
    r = subprocess.run(
        ["bash", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" serve --state-dir "$1" --pool 0 3<"$2"',
         CONCH_BIN, str(tmp_path / "state"), str(f)],
        capture_output=True, text=True, timeout=30,
    )
    assert r.returncode == 1
    assert "LISTEN_FDS: fd 3 is not a listening unix stream socket" in r.stderr


# ---- meson install ----

needs_build_dir = pytest.mark.skipif(
    not (BUILD_DIR / "meson-private").is_dir() or not HAVE_SOURCES or not IS_ROOT,
    reason="needs the meson build dir of CONCH_BIN and the source tree (runs as root, from the repo)",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    dest = tmp_path_factory.mktemp("destdir")
    r = subprocess.run(
        ["meson", "install", "-C", str(BUILD_DIR), "--no-rebuild", "--destdir", str(dest)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    opts = json.loads(subprocess.run(["meson", "introspect", "--buildoptions", str(BUILD_DIR)],
                                     capture_output=True, text=True, check=True).stdout)
    opt = {o["name"]: o["value"] for o in opts}
    prefix = Path(opt["prefix"])
    unitdir = Path(opt["systemdunitdir"] or prefix / "lib/systemd/system")
    userunitdir = Path(opt.get("systemduserunitdir") or prefix / "lib/systemd/user")
    compdir = Path(opt["bashcompletiondir"] or prefix / opt["datadir"] / "bash-completion/completions")
    paths = {
        "bin": prefix / opt["bindir"] / "conch",
        "man": prefix / opt["mandir"] / "man1" / "conch.1",
        "socket": unitdir / "conch.socket",
        "service": unitdir / "conch.service",
        "user_socket": userunitdir / "conch.socket",
        "user_service": userunitdir / "conch.service",
        "completion": compdir / "conch",
        "remote": prefix / opt["libexecdir"] / "conch" / "conch-remote",
    }
    return dest, paths


def under(dest, p):
    return dest / p.relative_to("/")


@needs_build_dir
def test_install_puts_everything_where_it_belongs(installed):
    dest, paths = installed
    for what, p in paths.items():
        assert under(dest, p).is_file(), f"{what}: {p} not installed"
    binary = under(dest, paths["bin"])
    assert os.access(binary, os.X_OK)
    assert binary.read_bytes() == Path(CONCH_BIN).read_bytes()
    # The units: the service runs the installed binary; the socket is root's default one.
    service = under(dest, paths["service"]).read_text()
    assert f"ExecStart={paths['bin']} serve\n" in service
    assert "@" not in service.split("ExecStart=")[1].split("\n")[0]
    sock = under(dest, paths["socket"]).read_text()
    assert "ListenStream=/run/conch/conch.sock\n" in sock
    assert "SocketMode=0600\n" in sock
    # The user units: the same daemon, its socket where conch looks for a user's by default
    # ($XDG_RUNTIME_DIR/conch/conch.sock: %t in a user unit).
    user_service = under(dest, paths["user_service"]).read_text()
    assert f"ExecStart={paths['bin']} serve\n" in user_service
    assert "StateDirectory" not in user_service  # the user's default: ~/.local/state/conch
    user_sock = under(dest, paths["user_socket"]).read_text()
    assert "ListenStream=%t/conch/conch.sock\n" in user_sock and "SocketMode=0600\n" in user_sock
    # conch finds the installed conch-remote (the TLS code) from where it is installed: a
    # remote verb gets as far as connecting (refused: nothing listens on port 1).
    r = subprocess.run([str(binary), "--remote", "wss://127.0.0.1:1", "ps"], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, CONCH_TOKEN="x" * 20))
    assert r.returncode != 0 and "cannot reach the remote daemon" in r.stderr, r.stderr
    assert "conch-remote" not in r.stderr, r.stderr
    # Nothing of the build's insides (the static library, unit test binaries).
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix == ".a" or p.name.startswith("test_")], files


@needs_build_dir
def test_units_verify(installed, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is missing (Debian package systemd)")
    dest, paths = installed
    # systemd-analyze checks that ExecStart's binary exists: point it into the destdir.
    for name in ("socket", "service"):
        text = under(dest, paths[name]).read_text()
        text = text.replace(f"ExecStart={paths['bin']}", f"ExecStart={under(dest, paths['bin'])}")
        (tmp_path / paths[name].name).write_text(text)
    r = subprocess.run(
        ["systemd-analyze", "--man=no", "verify", str(tmp_path / "conch.socket"), str(tmp_path / "conch.service")],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    # The user units, as a user's manager would load them.
    udir = tmp_path / "user"
    udir.mkdir()
    for name in ("user_socket", "user_service"):
        text = under(dest, paths[name]).read_text()
        text = text.replace(f"ExecStart={paths['bin']}", f"ExecStart={under(dest, paths['bin'])}")
        (udir / paths[name].name).write_text(text)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    r = subprocess.run(
        ["systemd-analyze", "--man=no", "--user", "verify", str(udir / "conch.socket"),
         str(udir / "conch.service")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_user_socket_path_is_the_default_one():
    """The user socket unit listens where an unprivileged user's conch looks by default: a
    daemon there (as the unit's socket activation starts it) is found by `conch ps` with no
    --socket. Run as uid 65534 (as root the default is the system units' /run/conch)."""
    if not ACTIVATE:
        pytest.skip("systemd-socket-activate is missing (Debian package systemd)")
    if not IS_ROOT:
        pytest.skip("switches to uid 65534: runs as root")
    unit = (REPO / "systemd" / "user" / "conch.socket").read_text()
    listen = next(l for l in unit.splitlines() if l.startswith("ListenStream="))
    base = Path(tempfile.mkdtemp(prefix="conch-user-unit-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        shutil.copy(CONCH_BIN, base / "conch")
        runtime, state = base / "runtime", base / "state"
        for d in (runtime, state):
            d.mkdir(mode=0o700)
            os.chown(d, 65534, 65534)
        sock = Path(listen[len("ListenStream="):].replace("%t", str(runtime)))
        sock.parent.mkdir(mode=0o700)
        os.chown(sock.parent, 65534, 65534)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(state),
               "XDG_RUNTIME_DIR": str(runtime), "XDG_STATE_HOME": str(state)}

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

        p = subprocess.Popen([ACTIVATE, "-l", str(sock), str(base / "conch"), "serve", "--pool", "0"],
                             env=env, preexec_fn=as_nobody, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            r = subprocess.run([str(base / "conch"), "ps", "--json"], env=env, preexec_fn=as_nobody,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
            assert json.loads(r.stdout) is not None
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def help_options(*argv):
    """The long options a command's --help lists."""
    r = subprocess.run([CONCH_BIN, *argv], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", r.stdout + r.stderr))


def commands():
    r = subprocess.run([CONCH_BIN, "--help"], capture_output=True, text=True, timeout=30)
    block = r.stdout.split("commands:\n")[1].split("\n\n")[0]
    return [line.split()[0] for line in block.splitlines()]


def all_options():
    """Every command and the long options each one takes, from the binary's own help."""
    opts = {}
    for cmd in commands():
        opts[cmd] = help_options(cmd, "--help") - {"--help"}
        if cmd in ("ps", "exec", "rm"):
            # The daemon's clients take --socket, whether or not they have a --help page.
            opts[cmd] |= {"--socket"}
    return opts


@needs_build_dir
def test_man_page_renders_without_warnings_and_covers_every_option(installed):
    dest, paths = installed
    env = dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="0")
    # groff's full set of warnings first (man --warnings gives troff's default set).
    g = subprocess.run(["groff", "-ww", "-z", "-man", "-Tutf8", str(under(dest, paths["man"]))],
                       capture_output=True, text=True, timeout=60, env=env)
    assert (g.returncode, g.stderr) == (0, ""), f"groff printed warnings:\n{g.stderr}"
    r = subprocess.run(["man", "--warnings", "-l", str(under(dest, paths["man"]))],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"man printed warnings:\n{r.stderr}"
    page = re.sub(r".\x08", "", r.stdout).replace("\u2010", "-").replace("\u2011", "-")
    page = re.sub(r"-\n\s+", "-", page)  # words hyphenated at a line end
    opts = all_options()
    assert {"run", "doctor", "serve", "mcp", "ps", "exec", "rm", "gc"} <= set(opts)
    for cmd, cmd_opts in opts.items():
        assert re.search(rf"^   conch {cmd}\b", page, re.M), f"no section for conch {cmd}"
        for o in cmd_opts:
            assert o in page, f"conch {cmd} {o} is not in the man page"
    assert "LISTEN_FDS" in page and "conch.socket" in page


def completer(comp):
    """complete(*words) -> what the installed completion offers for the last word."""

    def complete(*words):
        script = (
            f"source {comp}; COMP_WORDS=({' '.join(repr(str(w)) for w in ('conch',) + words)}); "
            f"COMP_CWORD={len(words)}; _conch; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        env = dict(os.environ, PATH=f"{Path(CONCH_BIN).parent}:{os.environ['PATH']}")
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, env=env)
        assert r.returncode == 0, r.stderr
        return set(r.stdout.split())

    return complete


@needs_build_dir
def test_bash_completion_offers_sandbox_ids(installed, activated):
    dest, paths = installed
    sock, p = activated
    complete = completer(under(dest, paths["completion"]))
    ids = {rpc(sock, "sandbox.create", {}, rid=i)["result"]["id"] for i in (1, 2)}
    assert complete("exec", "--socket", sock, "") == ids
    assert complete("rm", "--socket", sock, sorted(ids)[0], "") == ids
    assert complete("exec", "--socket", sock, sorted(ids)[0], "") == {"--"}


@needs_build_dir
def test_bash_completion_offers_names_and_session_ids(installed, activated):
    dest, paths = installed
    sock, p = activated
    complete = completer(under(dest, paths["completion"]))
    named = rpc(sock, "sandbox.create", {"name": "web"}, rid=1)["result"]["id"]
    anon = rpc(sock, "sandbox.create", {}, rid=2)["result"]["id"]
    # Where a sandbox is resolved by the client, its name is offered too ("-" is not a name).
    for verb in ("exec", "rm", "start", "changes", "diff", "commit", "discard"):
        assert complete(verb, "--socket", sock, "") == {named, anon, "web"}, verb
    assert complete("diff", "--socket", sock, "--") >= {"--json", "--socket"}
    assert complete("changes", "--socket", sock, "web", "") == set()
    # shell takes a name too; cp offers ID: next to local files.
    assert complete("shell", "--socket", sock, "") == {named, anon, "web"}
    assert complete("shell", "--socket", sock, named, "") == set()
    assert complete("cp", "--socket", sock, "we") == {"web:"}
    assert complete("cp", "--socket", sock, "web:x", "") >= {f"{named}:", f"{anon}:"}
    # attach offers the daemon's sessions.
    ses = rpc(sock, "session.open", {"sandbox": anon}, rid=3)["result"]["session"]
    assert complete("attach", "--socket", sock, "") == {ses}
    assert complete("attach", "--socket", sock, "--read-only", "") == {ses}
    assert complete("attach", "--socket", sock, ses, "") == set()


@needs_build_dir
def test_bash_completion_offers_commands_and_options(installed):
    dest, paths = installed
    complete = completer(under(dest, paths["completion"]))

    opts = all_options()
    assert set(opts) <= complete("")
    assert complete("s") == {"serve", "sessions", "shell", "snapshot", "snapshots", "start", "store"}
    assert complete("c") == {"changes", "commit", "cp", "create"}
    for cmd, cmd_opts in opts.items():
        if cmd_opts:
            assert cmd_opts <= complete(cmd, "--"), f"completion of conch {cmd} misses options"
    assert complete("mcp", "--mode", "") == {"overlay", "ro", "rw"}
