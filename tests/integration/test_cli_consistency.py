# test_cli_consistency.py - the CLI's verbs agree with each other: "daemon unreachable" is
# exit status 125 from every verb, a socket this user may not use says so (and does not send
# them to start a daemon), errors name CLI verbs rather than protocol methods, and the help
# and the man page list every MCP tool conch mcp serves.
import json
import os
import subprocess

import pytest

from conftest import CONCH_BIN, IS_ROOT, REPO

# Every verb that talks to the daemon, with the operands it needs to get that far.
CLIENT_VERBS = [
    ["ps"], ["create"], ["exec", "dev", "--", "true"], ["changes", "dev"], ["diff", "dev"],
    ["commit", "dev"], ["discard", "dev"], ["cp", "dev:/x", "/tmp/x"], ["rm", "dev"],
    ["shell", "dev"], ["attach", "ses-1"], ["sessions"], ["start", "dev"], ["logs", "job-1"],
    ["store", "list"], ["store", "cat", "mem", "x"],
]


@pytest.mark.parametrize("argv", CLIENT_VERBS, ids=lambda a: a[0])
def test_daemon_unreachable_is_125_from_every_verb(tmp_path, argv):
    sock = tmp_path / "none.sock"
    p = subprocess.run([CONCH_BIN, argv[0], "--socket", str(sock), *argv[1:]],
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 125, p
    assert b"cannot reach the daemon" in p.stderr and b"conch serve" in p.stderr, p


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run conch as another user")
def test_a_socket_this_user_may_not_use_says_so(daemon_factory):
    d = daemon_factory(extra_args=["--pool", "0"])
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", CONCH_BIN,
                        "ps", "--socket", d.sock], capture_output=True, timeout=60)
    assert p.returncode == 125, p
    assert b"permission denied" in p.stderr, p
    assert b"conch serve" not in p.stderr, p  # a daemon runs: starting one is no fix


def test_errors_name_cli_verbs_not_protocol_methods(daemon_factory):
    d = daemon_factory(extra_args=["--pool", "0"])
    p = subprocess.run([CONCH_BIN, "attach", "--socket", d.sock, "ses-nosuch"],
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and b"ses-nosuch" in p.stderr, p
    assert b"session.list" not in p.stderr and b"conch sessions" in p.stderr, p


def mcp_tool_names():
    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
    ]
    p = subprocess.Popen([CONCH_BIN, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        p.stdin.write("".join(json.dumps(m) + "\n" for m in msgs).encode())
        p.stdin.flush()
        while True:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            m = json.loads(line)
            if m.get("id") == 2:
                return [t["name"] for t in m["result"]["tools"]]
    finally:
        p.stdin.close()
        p.wait(timeout=60)


def test_mcp_help_and_man_page_list_every_tool():
    names = mcp_tool_names()
    assert "shell" in names and "bash" in names, names
    helptext = subprocess.run([CONCH_BIN, "mcp", "--help"], capture_output=True,
                              timeout=30).stdout.decode()
    man = (REPO / "man" / "conch.1").read_text()
    mcp_section = man[man.index(".SS conch mcp"):]
    mcp_section = mcp_section[:mcp_section.index("\n.SS ")]
    for n in names:
        assert n in helptext, (n, helptext)
        assert f".B {n}" in mcp_section or f".BR {n}" in mcp_section, n
