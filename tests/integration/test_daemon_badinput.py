# test_daemon_badinput.py - `conch serve` facing bad clients (docs/PROTOCOL.md): malformed
# JSON, invalid UTF-8, wrong types, unknown methods and params, oversized lines, batches,
# odd framing, clients that vanish mid-request, binary command output, and a client of
# another uid. After each, the connection (or the daemon) must still serve.
import json
import os
import stat
import subprocess
import time

import pytest

from conftest import unique_marker
from rpcclient import RpcError, pids_matching, result_of, wait_gone


def raw_error(c, raw, code, data_code=None, req_id=None):
    """Send raw bytes; expect one error reply (matched by req_id or id-less); return it."""
    c.send_raw(raw)
    resp = c.wait_reply(req_id, 10)
    assert "error" in resp and resp["error"], f"expected error {code} for {raw[:200]!r}, got {resp}"
    e = resp["error"]
    assert e["code"] == code, f"for {raw[:200]!r}: {resp}"
    assert isinstance(e.get("message"), str) and e["message"], resp
    assert isinstance(e.get("data"), dict), resp
    if data_code is not None:
        assert e["data"].get("code") == data_code, resp
    return resp


def still_works(c):
    assert c.call("daemon.ping", {}, timeout=10)["version"]


def params_error(c, method, params, param):
    with pytest.raises(RpcError) as ei:
        c.call(method, params)
    e = ei.value
    assert (e.code, e.data_code) == (-32602, "invalid_params"), f"{method} {params}: {e}"
    assert e.data.get("param") == param, f"{method} {params}: data.param should name {param!r}: {e}"


def test_malformed_json_then_works(rpc):
    resp = raw_error(rpc, b'{"jsonrpc": "2.0", "id": 1, "method": \n', -32700, "parse_error")
    assert resp.get("id") is None, resp
    still_works(rpc)
    raw_error(rpc, b"not json at all\n", -32700, "parse_error")
    raw_error(rpc, b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"} trailing\n', -32700, "parse_error")
    still_works(rpc)


def test_invalid_utf8_then_works(rpc):
    i = rpc.new_id()
    raw_error(rpc, b'{"jsonrpc":"2.0","id":%d,"method":"daemon.ping","params":{"x":"\xff\xfe"}}\n' % i, -32700, "parse_error", i)
    i = rpc.new_id()
    # a UTF-16 surrogate encoded as UTF-8 bytes (CESU-8) is not valid UTF-8 either
    raw_error(rpc, b'{"jsonrpc":"2.0","id":%d,"method":"sandbox.create","params":{"name":"\xed\xa0\x80"}}\n' % i, -32700, "parse_error", i)
    still_works(rpc)


def test_invalid_requests(rpc):
    for obj in (
        {"id": None, "method": "daemon.ping"},  # no jsonrpc
        {"jsonrpc": "1.0", "id": None, "method": "daemon.ping"},
        {"jsonrpc": "2.0", "id": None},  # no method
        {"jsonrpc": "2.0", "id": None, "method": 5},
        {"jsonrpc": "2.0", "id": {"x": 1}, "method": "daemon.ping"},  # id must be str/number/null
    ):
        i = rpc.new_id() if obj["id"] is None else None
        if i is not None:
            obj["id"] = i
        raw_error(rpc, json.dumps(obj).encode() + b"\n", -32600, "invalid_request", i)
    raw_error(rpc, b"42\n", -32600, "invalid_request")
    raw_error(rpc, b'"str"\n', -32600, "invalid_request")
    # params neither object nor array
    i = rpc.new_id()
    rpc.send_raw(b'{"jsonrpc":"2.0","id":%d,"method":"daemon.ping","params":"x"}\n' % i)
    resp = rpc.wait_reply(i)
    assert resp["error"]["code"] in (-32600, -32602), resp
    still_works(rpc)


def test_unknown_method(rpc):
    with pytest.raises(RpcError) as ei:
        rpc.call("no.such.method", {})
    assert (ei.value.code, ei.value.data_code) == (-32601, "method_not_found"), ei.value
    with pytest.raises(RpcError) as ei:
        rpc.call("sandbox", {})
    assert ei.value.code == -32601
    still_works(rpc)


def test_wrong_types_and_unknown_params(rpc, ws):
    params_error(rpc, "sandbox.create", {"workspace": 5}, "workspace")
    params_error(rpc, "sandbox.create", {"mode": "bogus"}, "mode")
    params_error(rpc, "sandbox.create", {"as_root": "yes"}, "as_root")
    params_error(rpc, "sandbox.create", {"env": ["A=1"]}, "env")
    params_error(rpc, "sandbox.create", {"workspace": "relative/path"}, "workspace")
    params_error(rpc, "sandbox.create", {"bogus": 1}, "bogus")
    assert rpc.call("sandbox.list", {})["sandboxes"] == [], "a rejected create left a sandbox"
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    params_error(rpc, "exec.run", {"sandbox": sb, "command": 5}, "command")
    params_error(rpc, "exec.run", {"sandbox": sb}, "command")
    params_error(rpc, "exec.run", {"sandbox": sb, "command": "true", "timeout": "10"}, "timeout")
    params_error(rpc, "exec.run", {"sandbox": sb, "command": "true", "timeout": -1}, "timeout")
    params_error(rpc, "exec.run", {"sandbox": sb, "command": "true", "max_output": -5}, "max_output")
    params_error(rpc, "exec.run", {"sandbox": sb, "command": "true", "env": {"A": 1}}, "env")
    params_error(rpc, "exec.run", {"sandbox": sb, "command": "true", "stdin": 7}, "stdin")
    params_error(rpc, "exec.run", {"sandbox": sb, "command": "true", "comand": "typo"}, "comand")
    params_error(rpc, "exec.run", {"sandbox": 12, "command": "true"}, "sandbox")
    params_error(rpc, "fs.read", {"sandbox": sb, "path": ["a"]}, "path")
    params_error(rpc, "fs.read", {"sandbox": sb, "path": "a", "encoding": "latin1"}, "encoding")
    params_error(rpc, "daemon.ping", {"extra": True}, "extra")
    r = rpc.call("exec.run", {"sandbox": sb, "command": "echo fine"})
    assert r["stdout"] == "fine\n", r
    rpc.call("sandbox.destroy", {"id": sb})


def test_nul_in_path(rpc, ws):
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    (ws / "a").write_text("a\n")
    i = rpc.new_id()
    rpc.send_raw(b'{"jsonrpc":"2.0","id":%d,"method":"fs.read","params":{"sandbox":"%s","path":"a\\u0000/etc/passwd"}}\n' % (i, sb.encode()))
    resp = rpc.wait_reply(i)
    assert resp["error"]["code"] == -32013 and resp["error"]["data"]["code"] == "invalid_path", resp
    with pytest.raises(RpcError) as ei:
        rpc.call("fs.write", {"sandbox": sb, "path": "b\x00c", "content": "x"})
    assert ei.value.data_code == "invalid_path"
    with pytest.raises(RpcError) as ei:
        rpc.call("exec.run", {"sandbox": sb, "command": "true", "cwd": "sub\x00dir"})
    assert ei.value.code in (-32602, -32013), ei.value
    rpc.call("sandbox.destroy", {"id": sb})


def test_oversized_message(daemon_factory):
    d = daemon_factory(extra_args=["--max-message", "65536"])
    c = d.client()
    i0 = c.new_id()
    big = json.dumps({"jsonrpc": "2.0", "id": i0, "method": "daemon.ping", "params": {"pad": "x" * 100000}}).encode() + b"\n"
    resp = raw_error(c, big, -32600, "message_too_large", i0)
    still_works(c)
    # a long non-JSON line sent in pieces, with a valid request right behind it in the same write
    i = c.new_id()
    chunk = b"y" * 4096
    for _ in range(60):
        c.send_raw(chunk)
        time.sleep(0.001)
    c.send_raw(b"\n" + json.dumps({"jsonrpc": "2.0", "id": i, "method": "daemon.ping"}).encode() + b"\n")
    first = c.wait_reply(None, 10)
    assert first["error"]["code"] == -32600 and first["error"]["data"]["code"] == "message_too_large", first
    assert "result" in c.wait(i, 10)
    # just under the cap is fine
    r = c.call("exec.run", {"fresh": True, "command": "true # " + "z" * 60000}, timeout=60)
    assert r["exit_code"] == 0, r
    still_works(c)
    assert d.proc.poll() is None
    assert resp.get("id") in (None, i0), resp


def test_batch(rpc):
    a, b = rpc.new_id(), rpc.new_id()
    rpc.send_raw(json.dumps([
        {"jsonrpc": "2.0", "id": a, "method": "daemon.ping"},
        {"jsonrpc": "2.0", "id": b, "method": "sandbox.list", "params": {}},
    ]).encode() + b"\n")
    arr = rpc.wait_batch(10)
    assert isinstance(arr, list) and len(arr) == 2, arr
    by_id = {x["id"]: x for x in arr}
    assert set(by_id) == {a, b}, arr
    assert "version" in by_id[a]["result"] and by_id[b]["result"] == {"sandboxes": []}, arr
    # a batch with one bad member: the others still answered
    c = rpc.new_id()
    rpc.send_raw(json.dumps([{"jsonrpc": "2.0", "id": c, "method": "nope"}, {"jsonrpc": "2.0", "id": c + 1000, "method": "daemon.ping"}]).encode() + b"\n")
    arr = rpc.wait_batch(10)
    assert len(arr) == 2 and {x["id"] for x in arr} == {c, c + 1000}, arr
    assert [x["error"]["code"] for x in arr if x["id"] == c] == [-32601], arr
    # an empty batch is an invalid request (JSON-RPC 2.0)
    resp = raw_error(rpc, b"[]\n", -32600, "invalid_request")
    assert resp.get("id") is None
    still_works(rpc)


def test_notifications_get_no_reply(rpc):
    rpc.notify("daemon.ping", {})
    rpc.notify("no.such.method", {})
    still_works(rpc)
    time.sleep(0.2)
    assert rpc.unmatched == [] and rpc.batches == [], (rpc.unmatched, rpc.batches)


def test_framing(rpc):
    # two requests in one write, and one request dribbled byte by byte
    a, b = rpc.new_id(), rpc.new_id()
    rpc.send_raw((json.dumps({"jsonrpc": "2.0", "id": a, "method": "daemon.ping"}) + "\n" + json.dumps({"jsonrpc": "2.0", "id": b, "method": "daemon.ping"}) + "\n").encode())
    assert "version" in result_of(rpc.wait(a, 10)) and "version" in result_of(rpc.wait(b, 10))
    i = rpc.new_id()
    for ch in (json.dumps({"jsonrpc": "2.0", "id": i, "method": "daemon.ping"}) + "\r\n").encode():
        rpc.send_raw(bytes([ch]))
    assert "version" in result_of(rpc.wait(i, 10))
    # blank lines are ignored or answered, but never break the connection
    rpc.send_raw(b"\n\n")
    still_works(rpc)


def test_requests_served_concurrently(rpc, ws):
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    # the slow command waits for a file that the test makes only once the ping is answered:
    # a daemon that served one connection's requests in turn never answers the ping (its
    # wait times out), nor the command (it gives up after 60 s)
    slow = rpc.request("exec.run", {"sandbox": sb, "command":
                                    "for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done; "
                                    "[ -e go ] && echo slow", "timeout": 100})
    assert "version" in rpc.call("daemon.ping", {}, timeout=90), "ping waited for the slow exec.run on the same connection"
    rpc.call("fs.write", {"sandbox": sb, "path": "go", "content": ""}, timeout=90)
    assert result_of(rpc.wait(slow, 120))["stdout"] == "slow\n"
    order = [o[1] for o in rpc.order if o[0] == "response"]
    assert order[-1] == slow, f"responses in order of ids {order}: the slow one should come last"
    rpc.call("sandbox.destroy", {"id": sb})


def test_client_disconnect_mid_exec(daemon, ws):
    a = daemon.client()
    b = daemon.client()
    sb = a.call("sandbox.create", {"workspace": str(ws)})["id"]
    m = unique_marker("disc")
    # the command runs until the test makes the file go (60 s at most)
    a.request("exec.run", {"sandbox": sb, "command": f"(exec -a {m}-bg sleep 1000) & exec -a {m} bash -c "
                           "'for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done'"})
    # (generous: on a loaded 2-CPU machine a command's start has been seen to take seconds)
    deadline = time.monotonic() + 30
    while len(pids_matching(m)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids_matching(m)) >= 2, "command did not start"
    a.close()
    still_works(b)
    r = b.call("exec.run", {"fresh": True, "command": "echo other"}, timeout=30)
    assert r["stdout"] == "other\n"
    # ... while the vanished client's command still ran (its `sleep 2` and the background
    # sleep): the daemon did not wait for it before serving others
    assert len(pids_matching(m)) >= 2, "the vanished client's command ended before the others were served"
    b.call("fs.write", {"sandbox": sb, "path": "go", "content": ""})
    assert wait_gone(m) == []
    assert daemon.proc.poll() is None
    # the sandbox itself is still there (sandboxes belong to the daemon, not the connection)
    assert [s["id"] for s in b.call("sandbox.list", {})["sandboxes"]] == [sb]
    assert b.call("exec.run", {"sandbox": sb, "command": "echo ok"})["stdout"] == "ok\n"


def test_client_disconnect_while_streaming(daemon, ws):
    a = daemon.client()
    sb = a.call("sandbox.create", {"workspace": str(ws)})["id"]
    a.request("exec.run", {"sandbox": sb, "command": "yes | head -c 50000000", "stream": True})
    time.sleep(0.3)
    a.close()  # the daemon now writes notifications into a closed socket (EPIPE, not SIGPIPE)
    b = daemon.client()
    still_works(b)
    time.sleep(0.5)
    assert daemon.proc.poll() is None, f"daemon died\n{daemon.log()}"
    still_works(b)


def test_binary_output(rpc, ws):
    sb = rpc.call("sandbox.create", {"workspace": str(ws)})["id"]
    r = rpc.call("exec.run", {"sandbox": sb, "command": "head -c 1000 /dev/urandom; head -c 500 /dev/urandom >&2"})
    assert r["exit_code"] == 0 and r["stdout_bytes"] == 1000 and r["stderr_bytes"] == 500, r
    assert isinstance(r["stdout"], str) and isinstance(r["text"], str)
    assert rpc.bad_lines == [], "daemon sent a line that is not valid UTF-8 JSON"
    r = rpc.call("exec.run", {"sandbox": sb, "command": "printf 'ok\\377\\000end\\n'", "stream": True})
    assert r["stdout"].startswith("ok") and r["stdout"].endswith("end\n"), r
    assert rpc.bad_lines == []
    rpc.call("sandbox.destroy", {"id": sb})


PEER_SCRIPT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("REFUSED", e.errno); sys.exit(0)
try:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n')
    data = s.recv(65536)
except socket.timeout:
    print("TIMEOUT"); sys.exit(0)
except OSError as e:
    print("CLOSED", e.errno); sys.exit(0)
print("CLOSED" if not data else "RESPONSE " + data.decode(errors="replace"))
"""


def _as_conchtest(sock):
    p = subprocess.run(["runuser", "-u", "conchtest", "--", "/usr/bin/python3", "-c", PEER_SCRIPT, sock],
                       capture_output=True, timeout=30)
    assert p.returncode == 0, p
    return p.stdout.decode().strip()


def test_socket_mode(daemon):
    st = os.stat(daemon.sock)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
    assert st.st_uid == os.geteuid()


@pytest.mark.root_only
def test_other_uid_refused(daemon):
    if subprocess.run(["id", "-u", "conchtest"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", "conchtest"], check=True)
    os.chmod(daemon.base, 0o711)  # let the other user reach the socket file itself
    # the socket's own mode keeps it out
    out = _as_conchtest(daemon.sock)
    assert out.startswith("REFUSED"), out
    # and with the mode opened up, the peer-credential check does
    os.chmod(daemon.sock, 0o666)
    try:
        out = _as_conchtest(daemon.sock)
    finally:
        os.chmod(daemon.sock, 0o600)
    assert out.startswith("CLOSED") or out.startswith("REFUSED"), f"another uid got: {out}"
    still_works(daemon.client())
    assert daemon.proc.poll() is None

