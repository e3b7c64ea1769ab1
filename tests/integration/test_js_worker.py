# test_js_worker.py - the JS worker as a process (`conch __js-worker`, src/js): framed JSON
# on a socketpair, as the daemon will drive it. Evals keep their globals, TypeScript runs
# with its own line numbers, writes land in the worker's directory only when the eval
# succeeds, tool calls go out as frames and come back in any order, a runaway script ends
# by its deadline and the worker lives on.
import json
import socket
import struct
import subprocess

import pytest

from conftest import CONCH_BIN


class Worker:
    def __init__(self, cwd):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([CONCH_BIN, "__js-worker"], stdin=theirs, cwd=cwd)
        theirs.close()
        self.sock.settimeout(30)

    def send(self, obj):
        data = json.dumps(obj).encode()
        self.sock.sendall(struct.pack("=Q", len(data)) + data)

    def recv(self):
        head = self._exact(8)
        return json.loads(self._exact(struct.unpack("=Q", head)[0]))

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the worker closed its end"
            buf += chunk
        return buf

    def eval(self, code, **params):
        self.send({"method": "eval", "params": {"code": code, **params}})
        return self.recv()

    def close(self):
        self.sock.close()
        return self.proc.wait(timeout=30)


@pytest.fixture
def worker(tmp_path):
    w = Worker(tmp_path)
    yield w
    if w.proc.poll() is None:
        w.close()


def test_globals_persist_and_typescript_keeps_its_lines(worker):
    r = worker.eval("interface P { n: number }\nconst p: P = { n: 41 };")["result"]
    assert r["ok"], r
    r = worker.eval("p.n + 1")["result"]
    assert r["value"] == 42 and r["text"] == "→ 42"
    r = worker.eval("type T = string;\n\nconst bad = (x: T): never => {\n"
                    "  throw new Error('at four');\n};\nbad('x')")["result"]
    assert not r["ok"]
    assert r["error"]["message"] == "at four" and r["error"]["line"] == 4, r


def test_writes_land_only_when_the_eval_succeeds(worker, tmp_path):
    r = worker.eval("await writeFile('a.txt', 'no'); throw new Error('stop')")["result"]
    assert not r["ok"] and not (tmp_path / "a.txt").exists()
    r = worker.eval("await writeFile('b.txt', 'yes'); await readFile('b.txt')")["result"]
    assert r["value"] == "yes" and r["writes"] == ["b.txt"]
    assert (tmp_path / "b.txt").read_text() == "yes"
    r = worker.eval("await readFile('missing.txt')")["result"]
    assert not r["ok"] and "missing.txt" in r["error"]["message"]


def test_tool_calls_answered_out_of_order(worker):
    worker.send({"method": "eval", "params": {
        "tools": ["double"],
        "code": "const xs = await Promise.all([1, 2, 3].map((n) => tools.double({ n })));\nxs"}})
    calls = [worker.recv()["tool_call"] for _ in range(3)]
    assert sorted(c["input"]["n"] for c in calls) == [1, 2, 3]
    for c in reversed(calls):
        worker.send({"method": "tool_result",
                     "params": {"id": c["id"], "ok": True, "value": c["input"]["n"] * 2}})
    r = worker.recv()["result"]
    assert r["value"] == [2, 4, 6], r
    assert [t["ok"] for t in r["tool_calls"]] == [True, True, True]
    worker.send({"method": "eval", "params": {"code": "await tools.double(1)"}})
    call = worker.recv()["tool_call"]
    worker.send({"method": "tool_result",
                 "params": {"id": call["id"], "ok": False, "error": "no such thing"}})
    r = worker.recv()["result"]
    assert not r["ok"] and r["error"]["message"] == "no such thing"


def test_runaway_script_ends_and_the_worker_lives_on(worker):
    worker.eval("const kept = 'still here'")
    r = worker.eval("while (true) {}", timeout_ms=300)["result"]
    assert r["error"]["name"] == "TimeoutError"
    r = worker.eval("await new Promise(() => {})")["result"]
    assert r["error"]["name"] == "TimeoutError"
    assert worker.eval("kept")["result"]["value"] == "still here"
    assert worker.eval("kept", timeout_ms=1000)["result"]["ok"]
    worker.send({"method": "reset"})
    assert worker.recv()["result"] == {"reset": True}
    assert worker.eval("typeof kept")["result"]["value"] == "undefined"
    assert worker.close() == 0


def test_bad_requests_get_errors(worker):
    worker.send({"method": "eval", "params": {"code": 5}})
    assert "code" in worker.recv()["error"]["message"]
    worker.send({"nothing": True})
    assert "method" in worker.recv()["error"]["message"]
    worker.send({"method": "eval", "params": {"code": "1", "tools": ["not a tool name"]}})
    assert "not 1 or more of letters" in worker.recv()["error"]["message"]
    assert worker.eval("1 + 1")["result"]["value"] == 2


def test_not_on_a_socket_is_refused():
    p = subprocess.run([CONCH_BIN, "__js-worker"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "not a socket" in p.stderr


def test_tool_input_with_a_lone_surrogate_is_refused_with_the_reason(worker):
    worker.send({"method": "eval", "params": {"tools": ["t"], "code":
                 "[await tools.t('a\\ud800b').catch((e) => e.message), await tools.t('\\ud83d\\ude00')]"}})
    call = worker.recv()["tool_call"]  # only the second call goes out
    assert call["input"] == "\U0001F600"
    worker.send({"method": "tool_result", "params": {"id": call["id"], "ok": True, "value": 1}})
    r = worker.recv()["result"]
    assert "lone UTF-16 surrogate" in r["value"][0] and r["value"][1] == 1, r
