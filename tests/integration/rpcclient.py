# rpcclient.py - a small JSON-RPC 2.0 client for `conch serve` (newline-delimited JSON over a
# unix socket or a child's stdin/stdout) and a Daemon wrapper that starts and stops one.
# A reader thread matches responses by id (they may come out of order) and collects
# notifications and id-less/batch replies, so tests can also send raw bad bytes.
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time


class RpcError(Exception):
    """An error response: code (int), data_code (data.code), message, data (dict)."""

    def __init__(self, code, message, data, method=None):
        self.code = code
        self.message = message
        self.data = data if isinstance(data, dict) else {}
        self.data_code = self.data.get("code")
        self.method = method
        super().__init__(f"{method}: {code} {self.data_code}: {message} data={data}")


class ToolFailure(Exception):
    """Raised by a handler of a daemon request: answered as a JSON-RPC error."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class RpcTimeout(AssertionError):
    """No response within the timeout (an AssertionError so pytest shows it as a failure)."""


class ConnectionClosed(AssertionError):
    pass


class Client:
    """One JSON-RPC connection. Build with Client.unix(path) or Client.stdio(proc)."""

    def __init__(self, rfile, wfile, closer=None, name="client"):
        self._r = rfile
        self._w = wfile
        self._closer = closer
        self._name = name
        self._wlock = threading.Lock()
        self._cv = threading.Condition()
        self._next_id = 1
        self._responses = {}  # id -> response dict
        self.notifications = []  # every notification, in arrival order
        self.unmatched = []  # responses with id null or an id we never sent
        self.batches = []  # array replies
        self.bad_lines = []  # lines that were not JSON (a daemon bug)
        self.order = []  # ("response", id) / ("notification", method, params) in arrival order
        self.lines = 0
        self.eof = False
        # Requests from the daemon (the tool bridge's tool.call / agent.spawn): method ->
        # fn(params) returning the result, or raising ToolFailure for a JSON-RPC error. Each
        # runs in a thread of its own, so slow tools do not hold the others up.
        self.handlers = {}
        self.incoming = []  # every request the daemon sent, in arrival order
        self._t = threading.Thread(target=self._reader, name=f"rpc-reader-{name}", daemon=True)
        self._t.start()

    @classmethod
    def unix(cls, path, timeout=5.0):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(str(path))
        s.settimeout(None)
        r = s.makefile("rb", buffering=65536)
        c = cls(r, None, name=f"unix:{path}")
        c.sock = s
        c._w = None
        c._closer = lambda: (r.close(), s.close())
        return c

    @classmethod
    def stdio(cls, proc):
        c = cls(proc.stdout, proc.stdin, closer=None, name=f"stdio:{proc.pid}")
        c.sock = None
        return c

    # ---- sending -----------------------------------------------------------------------

    def send_raw(self, data):
        """Write bytes as they are (no newline added)."""
        with self._wlock:
            if self.sock is not None:
                self.sock.sendall(data)
            else:
                self._w.write(data)
                self._w.flush()

    def send(self, obj):
        self.send_raw(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def new_id(self):
        with self._cv:
            i = self._next_id
            self._next_id += 1
            return i

    def request(self, method, params=None):
        """Send a request; return its id (wait for it with wait())."""
        i = self.new_id()
        msg = {"jsonrpc": "2.0", "id": i, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return i

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    # ---- receiving ---------------------------------------------------------------------

    def wait(self, req_id, timeout=30.0):
        """The whole response dict for req_id."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while req_id not in self._responses:
                left = deadline - time.monotonic()
                if self.eof:
                    raise ConnectionClosed(f"{self._name}: connection closed before response to id {req_id}")
                if left <= 0:
                    raise RpcTimeout(f"{self._name}: no response to id {req_id} within {timeout}s")
                self._cv.wait(min(left, 0.5))
            return self._responses.pop(req_id)

    def call(self, method, params=None, timeout=30.0):
        """Result of METHOD, or raise RpcError."""
        resp = self.wait(self.request(method, params), timeout)
        return result_of(resp, method)

    def wait_for(self, pred, timeout=10.0, what="condition"):
        """Wait until pred() (called under the lock) is true; return its value."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                v = pred()
                if v:
                    return v
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RpcTimeout(f"{self._name}: timed out after {timeout}s waiting for {what}")
                if self.eof:
                    v = pred()
                    if v:
                        return v
                    raise ConnectionClosed(f"{self._name}: connection closed while waiting for {what}")
                self._cv.wait(min(left, 0.5))

    def wait_notification(self, method, pred=lambda p: True, timeout=10.0):
        def find():
            for n in self.notifications:
                if n.get("method") == method and pred(n.get("params") or {}):
                    return n
            return None

        return self.wait_for(find, timeout, f"notification {method}")

    def wait_reply(self, req_id=None, timeout=10.0):
        """The response to req_id, or else the first id-less/unknown-id response (a daemon
        that could not read the request's id answers with id null)."""

        def take():
            if req_id is not None and req_id in self._responses:
                return self._responses.pop(req_id)
            if self.unmatched:
                return self.unmatched.pop(0)
            return None

        return self.wait_for(take, timeout, f"a reply to id {req_id}")

    def wait_unmatched(self, count=1, timeout=10.0):
        """Wait for at least `count` id-less (or unknown-id) responses; pop and return them."""
        self.wait_for(lambda: len(self.unmatched) >= count, timeout, f"{count} id-less response(s)")
        with self._cv:
            out, self.unmatched[:] = self.unmatched[:count], self.unmatched[count:]
            return out

    def wait_batch(self, timeout=10.0):
        self.wait_for(lambda: self.batches, timeout, "a batch response")
        with self._cv:
            return self.batches.pop(0)

    def wait_eof(self, timeout=5.0):
        self.wait_for(lambda: self.eof, timeout, "EOF")

    def _reader(self):
        try:
            while True:
                line = self._r.readline()
                if not line:
                    break
                self._dispatch(line)
        except (OSError, ValueError):
            pass
        with self._cv:
            self.eof = True
            self._cv.notify_all()

    def _dispatch(self, line):
        try:
            msg = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            with self._cv:
                self.bad_lines.append(line)
                self._cv.notify_all()
            return
        with self._cv:
            self.lines += 1
            if isinstance(msg, list):
                self.batches.append(msg)
            elif isinstance(msg, dict) and "method" in msg and "id" in msg:
                self.incoming.append(msg)
                threading.Thread(target=self._answer, args=(msg,), daemon=True).start()
            elif isinstance(msg, dict) and "method" in msg and "id" not in msg:
                self.notifications.append(msg)
                self.order.append(("notification", msg.get("method"), msg.get("params")))
            elif isinstance(msg, dict) and ("result" in msg or "error" in msg):
                i = msg.get("id")
                self.order.append(("response", i))
                if isinstance(i, int) and 0 < i < self._next_id:
                    self._responses[i] = msg
                else:
                    self.unmatched.append(msg)
            else:
                self.bad_lines.append(line)
            self._cv.notify_all()

    def _answer(self, msg):
        fn = self.handlers.get(msg["method"])
        try:
            if fn is None:
                raise ToolFailure(-32601, f"no handler for {msg['method']}")
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": fn(msg.get("params"))}
        except ToolFailure as e:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": e.code, "message": e.message}}
        except Exception as e:  # a handler bug still answers
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32000, "message": repr(e)}}
        if reply is not None and not getattr(fn, "no_answer", False):
            try:
                self.send(reply)
            except OSError:
                pass

    def close(self):
        try:
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            elif self._w is not None:
                self._w.close()
        except OSError:
            pass
        if self._closer:
            try:
                self._closer()
            except OSError:
                pass
        self._t.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def result_of(resp, method=None):
    """The result of a response dict, or raise RpcError from its error."""
    if "error" in resp and resp["error"] is not None:
        e = resp["error"]
        raise RpcError(e.get("code"), e.get("message"), e.get("data"), method)
    if "result" not in resp:
        raise AssertionError(f"{method}: response has neither result nor error: {resp}")
    return resp["result"]


# ---- the daemon -------------------------------------------------------------------------

_serve_ok = {}


def serve_available(conch_bin):
    """(ok, reason): whether `conch serve --help` works with this binary."""
    if conch_bin not in _serve_ok:
        if not os.path.exists(conch_bin):
            _serve_ok[conch_bin] = (False, f"conch binary not found at {conch_bin} (set CONCH_BIN)")
        else:
            try:
                p = subprocess.run([conch_bin, "serve", "--help"], capture_output=True, timeout=10)
                ok = p.returncode == 0
                why = "" if ok else f"`conch serve --help` exited {p.returncode}: {p.stderr.decode(errors='replace').strip()[:200]}"
            except (OSError, subprocess.TimeoutExpired) as e:
                ok, why = False, f"`conch serve --help` failed: {e}"
            _serve_ok[conch_bin] = (ok, why)
    return _serve_ok[conch_bin]


def pids_matching(marker):
    """Host pids whose command line contains marker (like pgrep -f), not counting us or
    zombies."""
    me = os.getpid()
    found = []
    m = marker.encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            if m not in cmd:
                continue
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
            if st[st.rindex(b")") + 2 : st.rindex(b")") + 3] == b"Z":
                continue
        except OSError:
            continue
        found.append(int(d))
    return found


def wait_gone(marker, timeout=30.0):
    """Wait until nothing matches marker; return [(pid, cmdline)] of what is left. (It returns
    as soon as nothing is left: the timeout only bounds a failure, so it is generous.)"""
    deadline = time.monotonic() + timeout
    while True:
        left = pids_matching(marker)
        if not left or time.monotonic() > deadline:
            out = []
            for p in left:
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        out.append((p, f.read().replace(b"\0", b" ").decode(errors="replace")))
                except OSError:
                    pass
            return out
        time.sleep(0.05)


def _force_remove(func, path, exc_info):
    # overlayfs leaves a mode-000 work/work dir: make the parent and the path writable
    # and searchable, then retry (as an unprivileged user that is all it takes)
    try:
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


class Daemon:
    """One `conch serve` process. Its directory (socket + state) is named after a unique
    marker that appears in the daemon's argv, so leftovers can be found with pgrep -f."""

    def __init__(self, conch_bin, base=None, state_dir=None, extra_args=(), stdio=False):
        self.conch_bin = conch_bin
        if base is None:
            base = tempfile.mkdtemp(prefix=f"conchit-d{os.getpid()}-", dir="/tmp")
            # traversable like /var/lib (the default state dir's parents); a 0700 parent
            # has its own test (test_state_dir_under_private_parent)
            os.chmod(base, 0o711)
        self.base = base
        self.marker = os.path.basename(self.base)
        self.sock = os.path.join(self.base, "conch.sock")
        self.state_dir = state_dir or os.path.join(self.base, "state")
        self.extra_args = list(extra_args)
        self.stdio = stdio
        self.proc = None
        self.killed = False  # set by kill9(): a death the test caused
        self.clients = []
        self.log_path = os.path.join(self.base, f"daemon-{int(time.time() * 1000)}.log")

    @property
    def pid(self):
        return self.proc.pid

    def argv(self):
        a = [self.conch_bin, "serve"]
        a += ["--stdio"] if self.stdio else ["--socket", self.sock]
        return a + ["--state-dir", self.state_dir, *self.extra_args]

    def start(self, timeout=10.0):
        self.killed = False
        self.log_path = os.path.join(self.base, f"daemon-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.PIPE if self.stdio else subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.stdio else self._log,
            stderr=self._log,
            start_new_session=True,
        )
        if self.stdio:
            return self
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"conch serve exited {self.proc.returncode} at start\n{self.log()}")
            if os.path.exists(self.sock) and self._answers_ping():
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"conch serve did not listen on {self.sock} within {timeout}s\n{self.log()}")
            time.sleep(0.02)

    def _answers_ping(self):
        # a real ping from this very process: a stale socket left by a previous daemon may
        # still accept connections if one of its children kept the listening fd
        try:
            c = Client.unix(self.sock, timeout=1)
        except OSError:
            return False
        try:
            return c.call("daemon.ping", {}, timeout=2).get("pid") == self.proc.pid
        except (AssertionError, RpcError, OSError):
            return False
        finally:
            c.close()

    def client(self):
        """A new connection (closed at stop())."""
        if self.stdio:
            c = Client.stdio(self.proc)
        else:
            c = Client.unix(self.sock)
        self.clients.append(c)
        return c

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except OSError:
            return "(no daemon log)"
        s = data.decode("utf-8", "replace")
        if len(s) > 6000:
            s = s[:2000] + "\n[...]\n" + s[-4000:]
        return f"--- daemon log {self.log_path}:\n{s}"

    def close_clients(self):
        for c in self.clients:
            c.close()
        self.clients = []

    def kill9(self):
        """SIGKILL the daemon itself (not its group): a crash."""
        self.killed = True
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.close_clients()

    def stop(self, timeout=10.0):
        """SIGTERM and wait. Returns (exited_by_itself, returncode)."""
        if self.proc is None:
            return True, None
        self.close_clients()
        exited = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                exited = False
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        if self.stdio:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except (OSError, ValueError):
                    pass
        self._log.close()
        return exited, self.proc.returncode

    def mounts_under_base(self):
        """Host mount points (our mount namespace) under the daemon's directory."""
        found = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4]
                if mp == self.base or mp.startswith(self.base + "/"):
                    found.append(mp)
        return found

    def cleanup(self):
        # never rm -rf through a leaked mount (it could reach a workspace)
        if not self.mounts_under_base():
            shutil.rmtree(self.base, onerror=_force_remove)
