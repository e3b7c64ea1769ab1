"""conch_tools - call the harness's tools and spawn sub-agents from Python inside a conch sandbox.

    import conch_tools
    hits = conch_tools.call("web_search", {"query": "conch"})
    hits = conch_tools.tools.web_search(query="conch")          # the same
    answer = conch_tools.spawn_agent("Summarise notes.txt", type="analyst")
    results = await asyncio.gather(*(conch_tools.acall("classify", {"text": t}) for t in texts))

Every call is one JSON line over the tool bridge's unix socket ($CONCH_PTC_SOCK, default
/run/conch/ptc.sock). Standard library only, Python 3.9+. Safe from any number of threads and
asyncio tasks at once, and nothing serialises the calls: the threads of a process share one
connection on which their calls are multiplexed by id (a reader thread hands each answer to
its caller; no lock is held while a call waits); so do the tasks of each event loop. Errors raise ToolError (.kind,
.message); UnknownTool and InvalidInput are its subclasses for those kinds.
"""

import asyncio
import itertools
import json
import os
import socket
import threading
import weakref

__all__ = [
    "call",
    "acall",
    "spawn_agent",
    "aspawn_agent",
    "list_tools",
    "alist_tools",
    "tools",
    "ToolError",
    "UnknownTool",
    "InvalidInput",
]

DEFAULT_SOCK = "/run/conch/ptc.sock"
MAX_LINE = 4 << 20  # the bridge's payload cap, each way
_READ_LIMIT = MAX_LINE + (1 << 16)


class ToolError(Exception):
    """A call that failed. kind: tool_error, unknown_tool, invalid_input, invalid_request,
    timeout, unavailable, limit, too_large or cancelled; message: what happened."""

    def __init__(self, kind, message):
        super().__init__(f"{message} ({kind})")
        self.kind = kind
        self.message = message

    def __reduce__(self):  # picklable, e.g. across a multiprocessing pool
        return (self.__class__, (self.kind, self.message))


class UnknownTool(ToolError):
    """No tool of that name is registered."""


class InvalidInput(ToolError):
    """The input does not match the tool's input schema; the message names the field."""


_KINDS = {"unknown_tool": UnknownTool, "invalid_input": InvalidInput}


def _error(kind, message):
    return _KINDS.get(kind, ToolError)(kind, message)


def _sock_path():
    return os.environ.get("CONCH_PTC_SOCK") or DEFAULT_SOCK


_ids = itertools.count(1)


def _encode(req):
    try:
        line = json.dumps(req, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
    except (TypeError, ValueError) as e:  # a set, NaN, a lone surrogate...
        raise InvalidInput("invalid_input", f"the input cannot be sent as JSON: {e}") from None
    if len(line) > MAX_LINE:
        raise ToolError("too_large", f"the request is {len(line)} bytes, over the bridge's 4 MiB cap")
    return line


def _decode(line):
    if not line:
        raise ToolError("unavailable", "the tool bridge closed the connection before answering")
    if not line.endswith(b"\n"):
        raise ToolError("too_large", "the answer is over the bridge's 4 MiB cap")
    try:
        resp = json.loads(line)
    except ValueError as e:
        raise ToolError("unavailable", f"the tool bridge sent a malformed answer: {e}") from None
    if not isinstance(resp, dict):
        raise ToolError("unavailable", "the tool bridge sent a malformed answer")
    return resp


def _result(resp):
    if resp.get("ok") is True:
        return resp.get("result")
    err = resp.get("error") or {}
    raise _error(str(err.get("kind") or "tool_error"), str(err.get("message") or "the call failed"))


def _connect_error(path, e):
    if isinstance(e, (FileNotFoundError, ConnectionRefusedError, NotADirectoryError)):
        return ToolError(
            "unavailable",
            f"no tool bridge in this sandbox: {path}: {e.strerror} (tools are available only when the "
            "sandbox runs with a tool bridge; set CONCH_PTC_SOCK if it is elsewhere)",
        )
    return ToolError("unavailable", f"cannot connect to the tool bridge at {path}: {e}")


# ---- threads: one connection per process, calls multiplexed by id ------------------------
#
# A reader thread reads the answers and wakes each caller; a caller holds the write lock only
# while it writes its line. Measured against one connection per call and a pool of
# connections (one call in flight on each): the same latency for one call at a time, and
# more throughput with many threads (the bridge gets their calls in batches); one connection
# per process also stays well clear of the bridge's limits.


class _Mux:
    def __init__(self):
        path = _sock_path()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # CLOEXEC by default (PEP 446)
        try:
            s.connect(path)
        except OSError as e:
            s.close()
            raise _connect_error(path, e) from None
        self.sock = s
        self.rfile = s.makefile("rb")
        self.wlock = threading.Lock()
        self.mu = threading.Lock()  # guards pending and dead together
        self.pending = {}
        self.dead = None  # the ToolError every call gets once the connection is gone
        threading.Thread(target=self._read, name="conch_tools reader", daemon=True).start()

    def _read(self):
        err = ToolError("unavailable", "the tool bridge closed the connection before answering")
        try:
            while True:
                line = self.rfile.readline(_READ_LIMIT)
                try:
                    resp = _decode(line)
                except ToolError as e:
                    err = e
                    break
                with self.mu:
                    slot = self.pending.pop(resp.get("id"), None)
                if slot is not None:
                    slot[1] = resp
                    slot[0].release()
        except (OSError, ValueError) as e:
            err = ToolError("unavailable", f"the tool bridge connection failed: {e}")
        finally:
            with self.mu:
                self.dead = err
                slots = list(self.pending.values())
                self.pending.clear()
            for slot in slots:
                slot[1] = err
                slot[0].release()
            self.kill()

    def kill(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def round_trip(self, req):
        rid = next(_ids)
        req["id"] = rid
        line = _encode(req)
        done = threading.Lock()
        done.acquire()
        slot = [done, None]
        with self.mu:
            if self.dead is not None:
                raise _error(self.dead.kind, self.dead.message)
            self.pending[rid] = slot
        try:
            try:
                with self.wlock:
                    self.sock.sendall(line)
            except BaseException as e:
                # Half a line may have gone out: the stream is unusable for every caller.
                self.kill()
                if isinstance(e, OSError):
                    raise ToolError("unavailable", f"the tool bridge connection failed: {e}") from None
                raise
            done.acquire()  # the reader releases it with the answer, or the error
        finally:
            with self.mu:
                self.pending.pop(rid, None)
        resp = slot[1]
        if isinstance(resp, ToolError):
            raise _error(resp.kind, resp.message)
        return resp


_mux = None
_mux_lock = threading.Lock()  # held only to create the connection


def _reset_after_fork():
    # The child must not share the parent's connection (answers would go to either process),
    # and its reader thread did not survive the fork.
    global _mux, _mux_lock
    _mux_lock = threading.Lock()
    if _mux is not None:
        try:
            _mux.sock.close()
        except OSError:
            pass
    _mux = None
    _loops.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _round_trip(req):
    global _mux
    m = _mux
    if m is None or m.dead is not None:
        with _mux_lock:
            m = _mux
            if m is None or m.dead is not None:
                m = _mux = _Mux()
    return _result(m.round_trip(req))


def call(name, input=None):
    """Call tool @name with @input (a dict; default {}) and return its result (decoded JSON).
    Raises ToolError (UnknownTool, InvalidInput, or kind timeout/unavailable/...)."""
    return _round_trip({"op": "call", "name": name, "input": {} if input is None else input})


def spawn_agent(task, type=None, detach=False):
    """Hand @task to a sub-agent of @type (None: the harness's default agent) and return its
    final answer; with detach=True return at once with the request id (a string): the answer
    goes to the harness with the command's result."""
    r = _round_trip({"op": "spawn", "task": task, "type": type, "detach": bool(detach)})
    if detach and isinstance(r, dict) and "request_id" in r:
        return r["request_id"]
    return r


def list_tools():
    """{"tools": [{name, description, input_schema}], "agents": [{name, description}]}."""
    return _round_trip({"op": "list"})


# ---- asyncio: one connection per event loop, calls multiplexed by id ----------------------


class _AsyncConn:
    def __init__(self, loop):
        self.loop = loop
        self.pending = {}
        self.reader = self.writer = None
        self.ready = None
        self.dead = False
        self.task = None

    async def _open(self):
        path = _sock_path()
        try:
            self.reader, self.writer = await asyncio.open_unix_connection(path, limit=_READ_LIMIT)
        except OSError as e:
            self.dead = True
            raise _connect_error(path, e) from None
        self.task = self.loop.create_task(self._read())

    async def _read(self):
        err = ToolError("unavailable", "the tool bridge closed the connection before answering")
        try:
            while True:
                try:
                    line = await self.reader.readline()
                except ValueError:
                    err = ToolError("too_large", "the answer is over the bridge's 4 MiB cap")
                    break
                if not line:
                    break
                try:
                    resp = _decode(line)
                except ToolError as e:
                    err = e
                    break
                fut = self.pending.pop(resp.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
        except OSError as e:
            err = ToolError("unavailable", f"the tool bridge connection failed: {e}")
        except asyncio.CancelledError:  # the loop is closing
            err = ToolError("cancelled", "the event loop closed before the answer came")
            raise
        finally:
            self.dead = True
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(_error(err.kind, err.message))
            self.pending.clear()
            if self.writer is not None:
                self.writer.close()

    async def round_trip(self, req):
        if self.ready is None:
            self.ready = self.loop.create_task(self._open())
        await asyncio.shield(self.ready)
        if self.dead:
            raise ToolError("unavailable", "the tool bridge closed the connection")
        rid = next(_ids)
        req["id"] = rid
        line = _encode(req)
        fut = self.loop.create_future()
        self.pending[rid] = fut
        try:
            self.writer.write(line)
            if self.writer.transport.get_write_buffer_size() > (1 << 20):
                await self.writer.drain()
            return await fut
        finally:
            self.pending.pop(rid, None)


_loops = weakref.WeakKeyDictionary()


def _aconn():
    loop = asyncio.get_running_loop()
    c = _loops.get(loop)
    if c is None or c.dead:
        c = _loops[loop] = _AsyncConn(loop)
    return c


async def _around_trip(req):
    return _result(await _aconn().round_trip(req))


async def acall(name, input=None):
    """call() for asyncio: many at once with asyncio.gather run concurrently."""
    return await _around_trip({"op": "call", "name": name, "input": {} if input is None else input})


async def aspawn_agent(task, type=None, detach=False):
    """spawn_agent() for asyncio."""
    r = await _around_trip({"op": "spawn", "task": task, "type": type, "detach": bool(detach)})
    if detach and isinstance(r, dict) and "request_id" in r:
        return r["request_id"]
    return r


async def alist_tools():
    """list_tools() for asyncio."""
    return await _around_trip({"op": "list"})


# ---- tools.NAME(...) ------------------------------------------------------------------------


class _Tool:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __call__(self, input=None, **kwargs):
        """tools.NAME(key=value, ...) or tools.NAME({...}): call(NAME, input)."""
        if input is not None and kwargs:
            raise TypeError(f"{self.name}: pass the input as a dict or as keyword arguments, not both")
        return call(self.name, kwargs if input is None else input)

    async def acall(self, input=None, **kwargs):
        """await tools.NAME.acall(key=value, ...): acall(NAME, input)."""
        return await acall(self.name, kwargs if input is None else input)

    def __repr__(self):
        return f"<conch tool {self.name}>"


class _Tools:
    """conch_tools.tools.web_search(query="...") calls the tool "web_search"."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Tool(name)

    def __getitem__(self, name):
        return _Tool(name)

    def __dir__(self):
        try:
            return [t["name"] for t in list_tools().get("tools", [])]
        except ToolError:
            return []


tools = _Tools()
