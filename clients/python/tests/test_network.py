# test_network.py - the network policy through the Python client against the real daemon:
# sandbox_create's net/allow/deny/mounts, network_set, network_log, and exec.run's
# `network` records (no outside network needed: the denied name is refused by the proxy).
from conch_client import Client, InvalidParams, Sandbox

import pytest


def test_network_rules_set_log_and_denied_record(conch_bin, state_dir):
    with Client.spawn(conch_bin, state_dir=state_dir,
                      serve_args=["--pool", "0", "--idle-timeout", "0"]) as c:
        with Sandbox.create(c, allow=["Example.invalid."],
                            mounts=[{"type": "tmpfs", "target": "/scratch"}]) as sb:
            info = sb.info()
            assert info["net"] == "allow"  # implied by allow
            assert info["allow"] == ["example.invalid"] and info["deny"] == []

            r = sb.network_set(allow=["example.invalid", "*.pkg.invalid"],
                               deny=["blocked.invalid"])
            assert (r["net"], r["allow"], r["deny"]) == (
                "allow", ["example.invalid", "*.pkg.invalid"], ["blocked.invalid"])
            log = sb.network_log()
            assert log["allow"] == r["allow"] and log["deny"] == ["blocked.invalid"]
            assert log["total"] == 0 and log["records"] == []

            # the mount is there, and a request through the proxy to a denied name is refused
            res = sb.run("touch /scratch/x && curl -sS -o /dev/null -w '%{http_code}' "
                         "http://blocked.invalid/")
            assert res.exit_code == 0 and res.stdout == "403", res.text
            assert isinstance(res.network, list) and len(res.network) == 1, res.raw
            rec = res.network[0]
            assert rec["host"] == "blocked.invalid" and rec["allowed"] is False
            assert rec["rule"] == "blocked.invalid" and "denied" in rec["error"]
            log = sb.network_log()
            assert log["total"] == 1
            assert [x["host"] for x in log["records"]] == ["blocked.invalid"]

            # switched to none: the mode reads back; another mode change is refused
            assert sb.network_set(net="none")["net"] == "none"
            with pytest.raises(InvalidParams):
                sb.network_set(net="host")

        # a sandbox without the rules has no records in its results
        no_net = c.sandbox_create()
        assert no_net["net"] == "none"
        assert "network" not in c.exec_run(no_net["id"], "true")
        c.sandbox_destroy(no_net["id"])


def test_path_rules_of_sandbox_create(conch_bin, state_dir, tmp_path):
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text("hook\n")
    (ws / ".env").write_text("TOKEN=secret\n")
    with Client.spawn(conch_bin, state_dir=state_dir,
                      serve_args=["--pool", "0", "--idle-timeout", "0"]) as c:
        with Sandbox.create(c, workspace=str(ws), readonly=[".git/hooks"],
                            hidden=[".env"]) as sb:
            res = sb.run("cat .env 2>/dev/null; echo x > .git/hooks/pre-commit || echo refused")
            assert "secret" not in res.stdout and res.stdout.endswith("refused\n"), res.text
        with pytest.raises(InvalidParams):
            c.sandbox_create(workspace=str(ws), hidden=["../up"])
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == "hook\n"


def test_sockets_pass_a_host_unix_socket(conch_bin, state_dir, tmp_path):
    # A host unix socket passed in (with no network at all), read back in the sandbox
    # object; a socket that is not one is refused as invalid params.
    import os
    import socket
    import threading

    os.chmod(tmp_path, 0o755)
    path = str(tmp_path / "db.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"db:" + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    try:
        with Client.spawn(conch_bin, state_dir=state_dir,
                          serve_args=["--pool", "0", "--idle-timeout", "0"]) as c:
            with Sandbox.create(c, net="none",
                                sockets=[{"host": path, "path": "/run/db.sock"}]) as sb:
                assert sb.info()["sockets"] == [{"host": path, "path": "/run/db.sock"}]
                res = sb.run("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                             "s.connect('/run/db.sock'); s.sendall(b'ping'); "
                             "print(s.recv(100).decode())\"")
                assert res.exit_code == 0 and res.stdout == "db:ping\n", res.text
            (tmp_path / "plain").write_text("x")
            with pytest.raises(InvalidParams):
                c.sandbox_create(sockets=[f"{tmp_path}/plain:/run/x.sock"])
    finally:
        srv.close()
