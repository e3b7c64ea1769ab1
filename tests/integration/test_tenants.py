# test_tenants.py - tenants in the daemon (issue 21): `conch serve --tokens FILE`,
# connection.auth on the unix socket, what a tenant's connection may see and reach (another
# tenant's ids answer exactly as unknown ones), the host paths and resources refused to it,
# quotas, failed authentications rate-limited and logged, the tokens file reloaded on SIGHUP
# and checked for its mode, ownership surviving a restart, and the token never in the log.
import os
import signal
import subprocess
import time

import pytest

from conftest import CONCH_BIN
from rpcclient import Client, RpcError

TOK_A = "alice-token-0123456789abcdef"
TOK_B = "bob-token-0123456789abcdef00"
TOK_ADMIN = "admin-token-0123456789abcdef"
TOK_Q = "quota-token-0123456789abcdef"


def write_tokens(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


TOKENS = (f"# tenants of the test\nalice {TOK_A}\nbob {TOK_B}\nadmin {TOK_ADMIN}\n"
          f"quota {TOK_Q} sandboxes=2 memory=256M disk=64M commands=1\n")


@pytest.fixture
def tenants(daemon_factory, tmp_path):
    """(daemon, tokens path, auth(token) -> an authenticated client)."""
    path = tmp_path / "tokens"
    write_tokens(path, TOKENS)
    d = daemon_factory(extra_args=["--tokens", str(path), "--pool", "0"])

    def auth(token, peer=None):
        c = d.client()
        p = {"token": token}
        if peer:
            p["peer"] = peer
        c.call("connection.auth", p)
        return c

    return d, path, auth


def err_of(c, method, params, timeout=30):
    with pytest.raises(RpcError) as ei:
        c.call(method, params, timeout=timeout)
    return ei.value


def whole_error(c, method, params, timeout=30):
    """The whole error object of the response (not only its code)."""
    resp = c.wait(c.request(method, params), timeout)
    assert "error" in resp, f"{method} {params}: expected an error, got {resp}"
    return resp["error"]


def test_wrong_token_then_good_token(tenants):
    d, _, auth = tenants
    c = d.client()
    e = whole_error(c, "connection.auth", {"token": "not-a-token-of-anyone-here"})
    assert e["code"] == -32020 and e["message"] == "unauthorized"
    assert e["data"]["code"] == "unauthorized"
    # an unknown token of a known length, a prefix of a good one: the same answer
    e2 = whole_error(c, "connection.auth", {"token": TOK_A[:-1] + "X"})
    assert e2 == e
    r = c.call("connection.auth", {"token": TOK_A})
    assert r == {"tenant": "alice", "admin": False}
    # once authenticated, for good
    e = err_of(c, "connection.auth", {"token": TOK_B})
    assert e.code == -32022 and e.data_code == "forbidden"
    a = auth(TOK_ADMIN)
    assert a.call("daemon.ping", {})["tenant"] == "admin"


def test_no_tokens_file_auth_fails(daemon):
    c = daemon.client()
    e = err_of(c, "connection.auth", {"token": TOK_A})
    assert e.code == -32020 and e.message == "unauthorized"
    # the connection is still the owner's
    assert "pid" in c.call("daemon.ping", {})


def test_token_never_logged(tenants):
    d, _, auth = tenants
    auth(TOK_A)
    c = d.client()
    with pytest.raises(RpcError):
        c.call("connection.auth", {"token": TOK_B + "wrong", "peer": "10.0.0.9:5555"})
    time.sleep(0.2)
    log = d.log()
    assert "10.0.0.9:5555" in log and "authentication failed" in log
    for t in (TOK_A, TOK_B, TOK_ADMIN, TOK_Q, TOK_B + "wrong"):
        assert t not in log
        assert t[:16] not in log


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o610])
def test_bad_file_mode_refused(tmp_path, mode):
    path = tmp_path / "tokens"
    write_tokens(path, TOKENS, mode)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--tokens", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0
    assert "chmod 600" in p.stderr and str(path) in p.stderr
    assert TOK_A not in p.stderr


@pytest.mark.parametrize("text,why", [
    ("alice short\n", "a token is 16"),
    (f"alice {TOK_A}\nalice {TOK_B}\n", "given twice"),
    (f"alice {TOK_A}\nbob {TOK_A}\n", "has the token of tenant"),
    (f"alice {TOK_A} cpu=4\n", "unknown quota"),
    (f"alice {TOK_A} memory=lots\n", "memory=lots"),
    ("# nothing\n", "names no tenant"),
    (f"al/ice {TOK_A}\n", "tenant name"),
])
def test_bad_file_refused(tmp_path, text, why):
    path = tmp_path / "tokens"
    write_tokens(path, text)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--tokens", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0 and why in p.stderr, p.stderr
    assert TOK_A not in p.stderr and TOK_B not in p.stderr


def test_symlink_refused(tmp_path):
    real = tmp_path / "real"
    write_tokens(real, TOKENS)
    link = tmp_path / "tokens"
    os.symlink(real, link)
    p = subprocess.run([CONCH_BIN, "serve", "--socket", str(tmp_path / "s.sock"), "--state-dir",
                        str(tmp_path / "st"), "--tokens", str(link)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0 and "symlink" in p.stderr


def test_rate_limited_per_peer(tenants):
    d, _, auth = tenants
    c = d.client()
    for _ in range(10):
        e = err_of(c, "connection.auth", {"token": "x" * 20, "peer": "192.0.2.1:1"})
        assert e.code == -32020
    # the 11th, even with a good token: rate-limited
    e = err_of(c, "connection.auth", {"token": TOK_A, "peer": "192.0.2.1:1"})
    assert e.code == -32021 and e.data_code == "rate_limited"
    # another peer is not
    assert auth(TOK_A, peer="192.0.2.2:1").call("daemon.ping", {})["tenant"] == "alice"


def test_sighup_reload(tenants, tmp_path):
    d, path, auth = tenants
    b = auth(TOK_B)
    new_a = "alice-new-token-fedcba9876543210"
    write_tokens(path, f"alice {new_a}\nadmin {TOK_ADMIN}\n")
    os.kill(d.pid, signal.SIGHUP)

    def old_refused():
        c = Client.unix(d.sock)
        try:
            c.call("connection.auth", {"token": TOK_A, "peer": "reload-check"})
            return False
        except RpcError:
            return True
        finally:
            c.close()

    deadline = time.monotonic() + 10
    while not old_refused():
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.1)
    assert auth(new_a).call("daemon.ping", {})["tenant"] == "alice"
    # bob is gone from the file: his connection was closed
    b.wait_eof(timeout=10)
    # a bad file on reload keeps the table in force, and says why
    write_tokens(path, f"alice {new_a}\n", 0o644)
    os.kill(d.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "not reloaded" not in d.log():
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.1)
    assert auth(TOK_ADMIN).call("daemon.ping", {})["tenant"] == "admin"
    assert d.proc.poll() is None
