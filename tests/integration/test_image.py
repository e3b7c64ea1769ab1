# test_image.py - the OCI image (deploy/build-image: Debian packages alone, no registry) is
# built, `conch serve` started in it under the narrowest options that let it build its own
# sandboxes (podman's analogue of deploy/kubernetes' securityContext: non-root, no
# capability, no new privileges, read-only root, deploy/seccomp/conch.json, /proc unmasked),
# and driven from outside the container: a sandbox created and a command run in the
# container's conch. `conch doctor` in the container names what podman's defaults lack.
#
# The daemon is reached both ways: over its unix socket, bind-mounted out of the container,
# and over the remote transport (`conch serve --listen` on wss, a token and a certificate
# made here), as a harness outside the pod reaches it.
#
# Time: the first build runs mmdebstrap (~2 min, most of it downloading ~40 MB of packages);
# later ones reuse .deps/image/rootfs-KEY.tar and take ~10 s; the tests ~20 s more.
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from conftest import IS_ROOT, REPO
from rpcclient import Client
from wsfixture import free_port, make_certs

sys.path.insert(0, str(REPO / "clients" / "python"))

pytestmark = pytest.mark.slow

TAG = "localhost/conch:test"
SECCOMP = str(REPO / "deploy" / "seccomp" / "conch.json")


def _missing_tools():
    return [t for t in ("podman", "runc", "mmdebstrap") if not shutil.which(t)]


def _base_args():
    # crun refuses this machine's hybrid cgroups: runc. A container may not raise its
    # limits past ours: nofile is what we have.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(soft, hard, 65536)
    return ["podman", "run", "--runtime", "runc", "--ulimit", f"nofile={n}:{n}",
            "--ulimit", "nproc=4096:4096"]


# The narrowest options under which conch builds sandboxes in a container (documented in
# docs/KUBERNETES.md, "The securityContext", with their Kubernetes names).
NARROW_OPTS = [("--cap-drop", "ALL"), ("--security-opt", "no-new-privileges"),
               ("--security-opt", f"seccomp={SECCOMP}"), ("--security-opt", "unmask=/proc/*")]
NARROW = [a for opt in NARROW_OPTS for a in opt]


@pytest.fixture(scope="module")
def image():
    if not IS_ROOT:
        pytest.skip("podman with runc runs as root here")
    missing = _missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/bootstrap installs them)")
    conch = os.environ.get("CONCH_BIN") or str(REPO / "build" / "conch")
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "deploy" / "build-image"), "--conch", conch, "--tag", TAG],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"image built in {time.monotonic() - t0:.1f} s: {r.stdout.strip()}")
    yield TAG


def _run(args, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


TOKEN = "image-test-token-" + uuid.uuid4().hex
remote = {}  # the running container's wss URL and CA (served)


@pytest.fixture
def served(image, tmp_path):
    """conch serve in a container shaped like the pod: volumes for its state and socket
    (emptyDirs there: mode 0777, root's), a read-only root. Yields the socket path."""
    state, run, tmp = tmp_path / "state", tmp_path / "run", tmp_path / "tmp"
    for d in (state, run, tmp):
        d.mkdir()
        os.chmod(d, 0o1777 if d is tmp else 0o777)
    name = f"conch-test-{uuid.uuid4().hex[:8]}"
    # The remote transport's files, as the pod's Secrets are given to it: owned by the
    # image's user (10001), not readable by others. The host's network (the container's
    # sandboxes still get their own): the test is the client outside.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    ca, crt, key = make_certs(str(secrets))
    (secrets / "tokens").write_text(f"admin {TOKEN}\n")
    for f in ("tokens", "server.crt", "server.key"):
        os.chown(secrets / f, 10001, 10001)
        os.chmod(secrets / f, 0o600)
    os.chmod(secrets, 0o755)
    port = free_port()
    r = _run(_base_args() + NARROW + [
        "-d", "--name", name, "--read-only", "--network", "host",
        "-v", f"{state}:/var/lib/conch", "-v", f"{run}:/run/conch", "-v", f"{tmp}:/tmp",
        "-v", f"{secrets}:/etc/conch:ro",
        image, "serve", "--socket", "/run/conch/sock/conch.sock",
        "--state-dir", "/var/lib/conch/state", "--pool", "1",
        "--listen", f"127.0.0.1:{port}", "--tls-cert", "/etc/conch/server.crt",
        "--tls-key", "/etc/conch/server.key", "--tokens", "/etc/conch/tokens"])
    assert r.returncode == 0, r.stdout + r.stderr
    sock = run / "sock" / "conch.sock"
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        logs = _run(["podman", "logs", name]).stderr
        assert sock.exists(), f"no socket after 30 s; container logs:\n{logs}"
        remote["url"], remote["ca"] = f"wss://127.0.0.1:{port}/rpc", ca
        yield name, str(sock)
    finally:
        _run(["podman", "rm", "-f", "-t", "5", name])


def test_a_command_runs_in_a_sandbox_of_the_containers_conch(served):
    name, sock = served
    with Client.unix(sock, timeout=10) as c:
        ping = c.call("daemon.ping")
        # The daemon is the container's first process: this is the image's conch, not ours.
        assert ping["pid"] == 1 and ping["state_dir"] == "/var/lib/conch/state", ping
        sb = c.call("sandbox.create", {})
        res = c.call("exec.run", {"sandbox": sb["id"], "command":
                                  "id -u; hostname; ls /proc | grep -c '^[0-9]'; "
                                  "python3 -c 'print(6*7)'; test -x /usr/lib/conch/conch && echo image; "
                                  "echo hi > /workspace/f && cat /workspace/f"})
        assert res["exit_code"] == 0, res
        uid, host, nprocs, py, img, hi = res["stdout"].split("\n")[:6]
        # The sandbox's own ids, hostname and pid namespace, inside the container.
        assert uid == "1000" and host == "conch", res["stdout"]
        assert int(nprocs) < 10, res["stdout"]
        assert py == "42" and img == "image" and hi == "hi", res["stdout"]
        c.call("sandbox.destroy", {"id": sb["id"]})


def test_the_remote_transport_from_outside_the_container(served):
    """conch's Python client on the host, over wss to the gateway in the container: the
    container's daemon builds the sandbox and runs the command; a wrong token is refused."""
    from conch_client import Client as ConchClient, ConchError, Sandbox
    deadline = time.monotonic() + 30
    while True:
        try:
            c = ConchClient.connect(url=remote["url"], token=TOKEN, ca=remote["ca"], timeout=30)
            break
        except (ConchError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with c:
        sb = Sandbox(c, c.sandbox_create())
        # /usr/lib/conch is the image's: the container's daemon built this sandbox
        r = sb.run("hostname; test -x /usr/lib/conch/conch && echo image; echo over wss $((6*7))")
        assert r.exit_code == 0 and r.stdout == "conch\nimage\nover wss 42\n", r.text
        sb.destroy()
    with pytest.raises(Exception) as ei:
        ConchClient.connect(url=remote["url"], token="wrong-" + TOKEN, ca=remote["ca"], timeout=30)
    assert TOKEN not in str(ei.value)


def test_the_sandbox_cannot_reach_the_daemon_or_the_container_root(served):
    name, sock = served
    with Client.unix(sock, timeout=10) as c:
        sb = c.call("sandbox.create", {})
        res = c.call("exec.run", {"sandbox": sb["id"], "command":
                                  "ls /run/conch/sock 2>&1; ls /var/lib/conch/state 2>&1; "
                                  "touch /usr/lib/conch/x 2>&1; echo done"})
        out = res["stdout"]
        # Neither the daemon's socket nor its state is in the sandbox; the image is read-only.
        assert "conch.sock" not in out and "conch.db" not in out, out
        assert "Read-only file system" in out or "Permission denied" in out, out
        c.call("sandbox.destroy", {"id": sb["id"]})


def test_the_unmasked_container_proc_stays_masked_in_the_sandbox(served):
    # The container's /proc is unmasked so that a sandbox may mount its own; conch masks its
    # own list of sensitive paths there, and the daemon holds no capability at all.
    name, sock = served
    caps = _run(["podman", "exec", name, "grep", "^CapEff", "/proc/1/status"]).stdout
    assert caps.split() == ["CapEff:", "0000000000000000"], caps
    with Client.unix(sock, timeout=10) as c:
        sb = c.call("sandbox.create", {})
        res = c.call("exec.run", {"sandbox": sb["id"], "command":
                                  "for p in kcore sysrq-trigger timer_list keys latency_stats "
                                  "sched_debug kallsyms kmsg; do [ -e /proc/$p ] || continue; "
                                  "grep -q \" /proc/$p \" /proc/self/mountinfo && echo masked $p "
                                  "|| echo OPEN $p; done; cat /proc/keys | wc -c"})
        out = res["stdout"]
        # Each of conch's masks that this kernel has a file for is mounted over, and the
        # masked file reads as nothing.
        assert "OPEN" not in out and out.count("masked") >= 2, out
        assert out.split("\n")[-2] == "0", out
        c.call("sandbox.destroy", {"id": sb["id"]})


def test_doctor_passes_under_the_narrow_options(image):
    r = _run(_base_args() + NARROW + ["--rm", image, "doctor"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "conch can run here." in r.stdout, r.stdout


def test_doctor_names_what_podmans_defaults_lack(image):
    # podman's defaults: a seccomp filter allowing sethostname only with CAP_SYS_ADMIN, and
    # /proc with masked paths. Doctor fails, and says which settings to grant.
    r = _run(_base_args() + ["--rm", "-e", "KUBERNETES_SERVICE_HOST=10.0.0.1", image,
                             "doctor", "--json"])
    assert r.returncode == 1, r.stdout + r.stderr
    got = {p["name"]: p for p in json.loads(r.stdout)}
    assert got["hostname (UTS namespace)"]["state"] == "missing", got
    assert got["/proc in a pid namespace"]["state"] == "missing", got
    assert "masked" in got["/proc in a pid namespace"]["fix"], got
    for setting in ("hostUsers: false", "procMount: Unmasked", "seccompProfile"):
        assert got[setting]["state"] == "missing" and got[setting]["fix"], got[setting]
    assert "Localhost" in got["seccompProfile"]["fix"], got["seccompProfile"]
    assert got["capabilities"]["state"] == "ok", got["capabilities"]
    # Text: the pod's settings follow the probes, the narrowest first.
    r = _run(_base_args() + ["--rm", "-e", "KUBERNETES_SERVICE_HOST=10.0.0.1", image, "doctor"])
    out = r.stdout
    assert "In a Kubernetes pod (KUBERNETES_SERVICE_HOST is set)" in out, out
    out = out[out.index("In a Kubernetes pod"):]
    order = [out.index(s) for s in ("hostUsers: false", "procMount: Unmasked", "seccompProfile",
                                    "appArmorProfile", "capabilities")]
    assert order == sorted(order), out


def test_doctor_sees_an_own_user_namespace(image):
    # podman's analogue of hostUsers: false: that setting is then reported as granted.
    r = _run(_base_args() + ["--rm", "--uidmap", "0:200000:65536", "--gidmap", "0:200000:65536",
                             image, "doctor", "--json"])
    got = {p["name"]: p for p in json.loads(r.stdout)}
    assert got["hostUsers: false"]["state"] == "ok", got["hostUsers: false"]
    assert got["procMount: Unmasked"]["state"] == "missing", got


def test_doctor_maps_a_profile_refusing_unshare_to_seccomp(image, tmp_path):
    # As Kubernetes' RuntimeDefault does without CAP_SYS_ADMIN: unshare refused by the
    # filter. The user namespace probe fails, and the seccomp profile is what to grant.
    prof = json.loads(open(SECCOMP).read())
    for rule in prof["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n != "unshare"]
    (tmp_path / "no-unshare.json").write_text(json.dumps(prof))
    r = _run(_base_args() + ["--rm", "--security-opt", f"seccomp={tmp_path / 'no-unshare.json'}",
                             "--security-opt", "unmask=/proc/*", image, "doctor", "--json"])
    assert r.returncode == 1, r.stdout + r.stderr
    got = {p["name"]: p for p in json.loads(r.stdout)}
    assert got["user namespaces"]["state"] == "missing", got["user namespaces"]
    assert "unshare" in got["user namespaces"]["detail"], got["user namespaces"]
    sec = got["seccompProfile"]
    assert sec["state"] == "missing" and "user namespaces" in sec["detail"], sec
    assert got["procMount: Unmasked"]["state"] == "ok", got["procMount: Unmasked"]


def test_each_narrow_option_is_needed(image):
    # Without the seccomp profile or without the unmasked /proc, no sandbox is built: each
    # option in NARROW that widens anything is there because the kernel refuses without it.
    for drop, refused in ((("--security-opt", f"seccomp={SECCOMP}"), "set hostname"),
                          (("--security-opt", "unmask=/proc/*"), "mount proc")):
        args = [a for opt in NARROW_OPTS if opt != drop for a in opt]
        r = _run(_base_args() + args + ["--rm", "-w", "/tmp", image, "run", "--", "true"])
        assert r.returncode != 0 and refused in r.stderr, (drop, r.stdout + r.stderr)
