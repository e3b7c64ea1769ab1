# test_cli.py - the command line itself: usage errors are exit 2 with a message, setup
# errors 125 with a clear cause, `conch doctor` reports, and --rootfs runs a foreign root.
import json
import os
import shutil

import pytest

from conftest import CONCH_BIN, conch


def message_of(r):
    """conch's error message: stderr, or with --json the error object on stdout."""
    msg = r.stderr
    if "--json" in r.argv and r.stdout.strip():
        j = json.loads(r.stdout)
        assert j["error"] and j["error"]["kind"] in ("usage", "infrastructure"), j
        msg += j["error"]["message"]
    return msg


def usage_error(r, *needles):
    assert r.rc == 2, r.describe()
    msg = message_of(r)
    assert msg.strip(), f"no error message\n{r.describe()}"
    for n in needles:
        assert n in msg, f"{n!r} not in the error message\n{r.describe()}"


def test_unknown_option(ws):
    usage_error(conch(["run", "--bogus-option", "--", "true"], cwd=ws), "--bogus-option")


def test_unknown_command():
    usage_error(conch(["frobnicate"]), "frobnicate")


def test_no_subcommand():
    r = conch([])
    assert r.rc == 2 and "usage" in r.stderr.lower(), r.describe()


def test_missing_command(ws):
    usage_error(conch(["run"], cwd=ws))
    usage_error(conch(["run", "--json", "--"], cwd=ws))


@pytest.mark.parametrize(
    "opt,val",
    [
        ("--timeout", "abc"),
        ("--timeout", "-1"),
        ("--memory", "12Q"),
        ("--pids", "many"),
        ("--mode", "bogus"),
        ("--max-output", "x1"),
        ("--cpu", "fast"),
        ("--env", "NOEQUALS"),
    ],
)
def test_bad_option_values(ws, opt, val):
    # the message names the option or the bad value
    r = conch(["run", opt, val, "--", "true"], cwd=ws)
    usage_error(r)
    assert opt in r.stderr or val in r.stderr, r.describe()


def test_option_missing_argument(ws):
    usage_error(conch(["run", "--timeout"], cwd=ws))


def test_run_help():
    r = conch(["run", "--help"])
    assert r.rc == 0, r.describe()
    for opt in ("--workspace", "--mode", "--commit", "--timeout", "--json", "--memory"):
        assert opt in r.stdout, opt


def test_workspace_nonexistent(tmp_path):
    missing = tmp_path / "does-not-exist"
    r = conch(["run", "--workspace", missing, "--", "true"], cwd=tmp_path)
    assert r.rc in (2, 125), r.describe()
    assert str(missing) in r.stderr, r.describe()
    assert "No such file or directory" in r.stderr or "does not exist" in r.stderr or "not a directory" in r.stderr


def test_workspace_nonexistent_json(tmp_path):
    missing = tmp_path / "nope"
    r = conch(["run", "--json", "--workspace", missing, "--", "true"], cwd=tmp_path)
    assert r.rc in (2, 125), r.describe()
    assert str(missing) in message_of(r), r.describe()


def test_workspace_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = conch(["run", "--workspace", f, "--", "true"], cwd=tmp_path)
    assert r.rc in (2, 125), r.describe()
    assert str(f) in r.stderr, r.describe()


def test_doctor():
    r = conch(["doctor"])
    assert r.rc == 0, r.describe()
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert len(lines) >= 5, r.describe()
    text = r.stdout.lower()
    for feature in ("seccomp", "landlock", "overlay", "namespace"):
        assert feature in text, f"doctor does not mention {feature}\n{r.stdout}"


def test_doctor_json():
    r = conch(["doctor", "--json"])
    assert r.rc == 0, r.describe()
    json.loads(r.stdout)


def test_doctor_tries_what_a_containers_defaults_refuse():
    # A hostname in an own UTS namespace, setns, a new /proc for a new pid namespace: each
    # tried for real (here, where the suite builds sandboxes, each works and is required).
    # tests/integration/test_image.py sees them refused in a container.
    r = conch(["doctor", "--json"])
    got = {p["name"]: p for p in json.loads(r.stdout)}
    for name in ("hostname (UTS namespace)", "setns (mount namespaces)", "/proc in a pid namespace"):
        assert got[name]["state"] == "ok" and got[name]["required"] is True, got[name]
    # Nothing failed, so no container settings are listed, in a container or not.
    assert "seccompProfile" not in got and "In a " not in conch(["doctor"]).stdout


def test_doctor_knows_the_network_modes(tmp_path):
    # Here (where the suite runs sandboxes) the default mode works; allow and host are reported
    # with what was tried, optional.
    r = conch(["doctor", "--json"])
    assert r.rc == 0, r.describe()
    got = {p["name"]: p for p in json.loads(r.stdout)}
    for mode, required in (("none", True), ("allow", False), ("host", False)):
        p = got[f"network mode {mode}"]
        assert p["required"] is required and p["detail"], p
    assert got["network mode none"]["state"] == "ok", got
    assert got["network mode allow"]["state"] in ("ok", "partial"), got
    assert "127.0.0.1:3128" in got["network mode allow"]["detail"], got
    # Inside a sandbox (no namespaces of its own may be made there) none of them can be
    # built: each says so and what to fix, and doctor fails.
    bindir = os.path.dirname(os.path.abspath(CONCH_BIN))
    os.chmod(tmp_path, 0o755)
    r = conch(["run", "--no-daemon", "--workspace", str(tmp_path), "--mount",
               f"type=bind,source={bindir},target=/opt/conch", "--", "/opt/conch/"
               + os.path.basename(CONCH_BIN), "doctor", "--json"])
    assert r.rc == 1, r.describe()
    got = {p["name"]: p for p in json.loads(r.stdout)}
    for mode in ("none", "allow", "host"):
        p = got[f"network mode {mode}"]
        assert p["state"] == "missing" and p["fix"] and "unshare" in p["detail"], p
    r = conch(["run", "--no-daemon", "--workspace", str(tmp_path), "--mount",
               f"type=bind,source={bindir},target=/opt/conch", "--", "/opt/conch/"
               + os.path.basename(CONCH_BIN), "doctor"])
    assert "MISSING network mode allow" in r.stdout and "fix:" in r.stdout, r.describe()


@pytest.fixture
def busybox_root(tmp_path):
    bb = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(bb):
        pytest.skip("busybox not installed")
    root = tmp_path / "bbroot"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    shutil.copy2(bb, root / "bin" / "busybox")
    for tool in ("sh", "ls", "cat", "echo", "id", "touch"):
        os.symlink("busybox", root / "bin" / tool)
    (root / "etc" / "rootfs-marker").write_text("busybox-root\n")
    return root


def test_rootfs_busybox(busybox_root, run):
    r = run(["--rootfs", busybox_root, "--", "/bin/sh", "-c", "echo hi; ls /; cat /etc/rootfs-marker"])
    assert r.rc == 0, r.describe()
    lines = r.out.splitlines()
    assert lines[0] == "hi", r.describe()
    listing = set(" ".join(lines[1:-1]).split())
    assert {"bin", "etc", "workspace"} <= listing, r.describe()
    assert "usr" not in listing or not os.path.exists(busybox_root / "usr"), r.describe()
    assert lines[-1] == "busybox-root"


def test_rootfs_is_read_only_and_workspace_writable(busybox_root, run, ws):
    r = run(["--rootfs", busybox_root, "--", "/bin/sh", "-c",
             "touch /bin/x; echo rc1=$?; echo w > /workspace/w; echo rc2=$?"])
    assert "rc1=1" in r.out and "rc2=0" in r.out, r.describe()
    assert not (busybox_root / "bin" / "x").exists()
    assert [c["path"] for c in r.j["changes"]] == ["w"], r.describe()


def test_rootfs_nonexistent(tmp_path, ws):
    r = conch(["run", "--rootfs", tmp_path / "nope", "--", "/bin/true"], cwd=ws)
    assert r.rc in (2, 125), r.describe()
    assert str(tmp_path / "nope") in r.stderr, r.describe()


def test_an_unknown_short_option_is_named_not_the_verb(ws):
    # One option parser for every verb: the message names the word that is wrong (it named
    # 'run'), and a bundle names the letter that is unknown in it.
    r = conch(["run", "-it", "--", "true"], cwd=ws)
    usage_error(r, "'-i'")
    assert "'run'" not in r.stderr, r.describe()
    r = conch(["run", "-x", "--", "true"], cwd=ws)
    usage_error(r, "'-x'")
    assert "'run'" not in r.stderr, r.describe()
    r = conch(["ps", "-it"])
    usage_error(r, "'-i'")


def test_options_take_their_values_with_an_equals_sign_or_apart(ws):
    r = conch(["run", "--no-daemon", "-q", "--env=A=b=c", "--timeout=30", "--", "sh", "-c", "echo $A"], cwd=ws)
    assert (r.rc, r.stdout) == (0, "b=c\n"), r.describe()
    usage_error(conch(["run", "--json=yes", "--", "true"], cwd=ws), "--json")
    usage_error(conch(["run", "--timeout"], cwd=ws), "--timeout")


def test_zero_sizes_mean_the_default_not_unlimited(ws):
    # 0 means "the default" for a size, as in sandbox.create's params; it made /tmp an
    # unlimited tmpfs and lifted the largest-file limit.
    r = conch(["run", "--no-daemon", "-q", "--tmp-size", "0", "--disk", "0", "--", "sh", "-c",
               "df -B1 --output=size /tmp | tail -1; ulimit -f"], cwd=ws)
    assert r.rc == 0, r.describe()
    tmp, fsize = r.stdout.split()
    assert int(tmp) == 256 << 20, r.describe()
    assert fsize != "unlimited" and int(fsize) * 512 == 4 << 30, r.describe()


def test_a_root_without_bash_is_an_infrastructure_error(busybox_root, daemon):
    # exec.run and jobs run `/bin/bash -c`: a root filesystem without bash cannot run
    # commands at all. That is the sandbox's failure (125, kind infrastructure: harnesses
    # stop retrying), not the command's "not found" (127).
    c = daemon.client()
    sb = c.call("sandbox.create", {"rootfs": str(busybox_root)}, timeout=60)["id"]
    r = c.call("exec.run", {"sandbox": sb, "command": "echo hi"}, timeout=60)
    assert r["exit_code"] == 125, r
    assert r["error"]["kind"] == "infrastructure" and "/bin/bash" in r["error"]["message"], r
    assert r["text"].endswith("[exit code: 125]"), r["text"]
    # /bin/sh is there: the same sandbox runs commands with shell "sh".
    r = c.call("exec.run", {"sandbox": sb, "command": "echo hi", "shell": "sh"}, timeout=60)
    assert (r["exit_code"], r["stdout"]) == (0, "hi\n"), r
    # A command that is not found is still the command's own 127.
    r = c.call("exec.run", {"sandbox": sb, "command": "nosuchcmd", "shell": "sh"}, timeout=60)
    assert r["exit_code"] == 127 and r["error"]["kind"] == "command", r
    job = c.call("job.start", {"sandbox": sb, "command": "echo hi"}, timeout=60)["job_id"]
    w = c.call("job.wait", {"job_id": job, "timeout": 30}, timeout=60)
    assert w["exit_code"] == 125, w


def test_run_warns_once_when_the_workspace_is_home(ws, tmp_path):
    # The workspace is $HOME (through a symlink too): one warning line, and the command runs.
    (ws / ".secret").write_text("dotfile\n")
    link = tmp_path / "home-link"
    link.symlink_to(ws)
    state = tmp_path / "state"
    for home in (ws, link):
        env = dict(os.environ, HOME=str(home), XDG_STATE_HOME=str(state))
        r = conch(["run", "--", "cat", ".secret"], cwd=ws, env=env)
        assert r.rc == 0, r.describe()
        assert r.raw_stdout == b"dotfile\n"
        err = r.raw_stderr.decode()
        warned = [l for l in err.splitlines() if "home directory" in l]
        assert len(warned) == 1 and warned[0].startswith("conch: warning:"), err
        assert str(ws) in warned[0], err
    # Another workspace (a directory beneath the home, or elsewhere): no warning.
    sub = ws / "project"
    sub.mkdir()
    env = dict(os.environ, HOME=str(ws), XDG_STATE_HOME=str(state))
    r = conch(["run", "--workspace", str(sub), "--", "true"], cwd=ws, env=env)
    assert r.rc == 0, r.describe()
    assert "home directory" not in r.raw_stderr.decode(), r.describe()
