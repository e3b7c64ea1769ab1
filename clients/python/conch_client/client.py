# client.py - the synchronous, thread-safe JSON-RPC client of `conch serve`: a reader thread
# matches responses to requests by id, delivers notifications to subscribers on an event
# thread, and runs the handlers of daemon->client requests (tool.call, agent.spawn) on a
# thread pool, answering each with its result or a JSON-RPC error ($/cancel sets their event).
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import json
import logging
import queue
import socket as _socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

from . import _paths, _ws
from ._dispatch import Registry, RpcFail, error_of, response_line
from ._methods import ProtocolMethods
from .errors import ConnectionLost, RequestTimeout, from_error_object

log = logging.getLogger("conch_client")

#: Reconnecting a remote client after a dropped connection: tries, and the first pause (s),
#: doubled after each failed try.
RECONNECT_TRIES = 5
RECONNECT_DELAY = 0.2

#: Incoming lines up to this size are read (the daemon caps a download at 64 MiB raw).
MAX_LINE = 1 << 30


class Notification:
    """A notification from the daemon: ``method`` (e.g. "exec.output", "job.exited") and
    ``params`` (dict)."""

    __slots__ = ("method", "params")

    def __init__(self, method: str, params: Any):
        self.method = method
        self.params = params if isinstance(params, dict) else {}

    def __repr__(self) -> str:
        return f"Notification({self.method!r}, {self.params!r})"


# ---- transports -----------------------------------------------------------------------

class SocketTransport:
    """A connected unix stream socket."""

    def __init__(self, sock: _socket.socket):
        self.sock = sock
        self._r = sock.makefile("rb", buffering=1 << 16)

    def readline(self) -> bytes:
        return self._r.readline(MAX_LINE)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class ProcessTransport:
    """The stdin/stdout of a `conch serve --stdio` child; closing ends the child."""

    def __init__(self, proc: subprocess.Popen, close_timeout: float = 15.0):
        self.proc = proc
        self.close_timeout = close_timeout

    def readline(self) -> bytes:
        return self.proc.stdout.readline(MAX_LINE)

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(self.close_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            self.proc.stdout.close()
        except OSError:
            pass


class _Pending:
    __slots__ = ("method", "future", "post", "on_output")

    def __init__(self, method, post, on_output):
        self.method = method
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.post = post
        self.on_output = on_output


class Subscription:
    """Notifications as an iterator (``for n in sub``) or with ``get(timeout)``; ends when
    the client closes or ``close()`` is called."""

    _END = object()

    def __init__(self, client: "Client", method: Optional[str]):
        self._client = client
        self.method = method
        self._q: "queue.Queue[Any]" = queue.Queue()
        self.closed = False

    def _put(self, n: Notification) -> None:
        if not self.closed:
            self._q.put(n)

    def get(self, timeout: Optional[float] = None) -> Notification:
        """The next notification; raises queue.Empty after ``timeout`` s, StopIteration
        once the subscription ended."""
        item = self._q.get(timeout=timeout)
        if item is self._END:
            self._q.put(self._END)
            raise StopIteration
        return item

    def __iter__(self) -> Iterator[Notification]:
        while True:
            try:
                yield self.get()
            except StopIteration:
                return

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._client._unsubscribe(self)
            self._q.put(self._END)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Client(ProtocolMethods):
    """A synchronous connection to `conch serve`. Thread-safe: any number of threads may
    call methods at once; each call blocks until its own answer comes.

    Build with ``Client.connect(socket=None)`` (a running daemon) or
    ``Client.spawn(conch_bin=None)`` (a private `conch serve --stdio`), or from any
    transport object with ``readline() -> bytes``, ``write(bytes)`` and ``close()``.

    ``timeout``: default seconds to wait for an answer (None = forever).
    ``handler_threads``: threads running tool/agent handlers at once.
    """

    def __init__(self, transport: Any, *, timeout: Optional[float] = None,
                 handler_threads: int = 32, name: str = "conch",
                 reconnect: Optional[Callable[[], Any]] = None):
        self._t = transport
        self._reconnect = reconnect
        self._connect_lock = threading.Lock()
        self.timeout = timeout
        self.name = name
        self._registry = Registry()
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: Dict[Any, _Pending] = {}
        self._subs: Dict[Optional[str], list] = {}
        self._events: "queue.Queue[Any]" = queue.Queue()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=handler_threads, thread_name_prefix=f"{name}-handler")
        self._closed = threading.Event()
        self._close_reason = "the connection is closed"
        self._event_thread = threading.Thread(target=self._event_loop,
                                              name=f"{name}-events", daemon=True)
        self._event_thread.start()
        self._start_reader()

    def _start_reader(self) -> None:
        self._reader = threading.Thread(target=self._read_loop, args=(self._t,),
                                        name=f"{self.name}-reader", daemon=True)
        self._reader.start()

    # -- construction --------------------------------------------------------------------
    @classmethod
    def connect(cls, socket: Optional[str] = None, *, url: Optional[str] = None,
                token: Optional[str] = None, ca: Optional[str] = None,
                connect_timeout: float = 10.0, **kw: Any) -> "Client":
        """Connect to a daemon's unix socket (default: see default_socket_path()), or to a
        remote daemon at ``url`` (``wss://HOST:PORT``, path /rpc implied) with the bearer
        ``token`` and a private CA bundle ``ca``; without ``socket`` and ``url``, the
        environment's CONCH_URL, CONCH_TOKEN and CONCH_CA choose the remote daemon. A remote
        client reconnects for new requests after a dropped connection (requests in flight
        fail with ConnectionLost)."""
        remote = _paths.remote_options(socket, url, token, ca)
        if remote is not None:
            def dial() -> Any:
                return _ws.WebSocketTransport(remote[0], remote[1], remote[2],
                                              connect_timeout=connect_timeout)
            c = cls(dial(), name=kw.pop("name", "conch"), reconnect=dial, **kw)
            c._conch_no_copy = True  # the daemon's host is not ours: contents go in messages
            return c
        path = str(socket) if socket else _paths.default_socket_path()
        _paths.check_socket(path)
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        s.settimeout(connect_timeout)
        try:
            s.connect(path)
        except OSError as e:
            s.close()
            raise ConnectionLost(f"cannot connect to '{path}': {e}") from None
        s.settimeout(None)
        return cls(SocketTransport(s), name=kw.pop("name", "conch"), **kw)

    @classmethod
    def spawn(cls, conch_bin: Optional[str] = None, *, state_dir: Optional[str] = None,
              serve_args: Sequence[str] = (), stderr: Any = None,
              env: Optional[Dict[str, str]] = None, **kw: Any) -> "Client":
        """Start ``conch serve --stdio`` (binary: ``conch_bin``, $CONCH_BIN or PATH) and
        talk to it; ``close()`` ends it. ``serve_args`` are extra options (e.g.
        ``["--pool", "0"]``); ``stderr`` is where its logs go (default: inherited)."""
        argv = _paths.stdio_argv(conch_bin, state_dir, serve_args)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=stderr, env=env)
        except OSError as e:
            raise ConnectionLost(f"cannot start {argv[0]}: {e}") from None
        c = cls(ProcessTransport(proc), name=kw.pop("name", "conch"), **kw)
        c.process = proc
        return c

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Close the connection (a spawned daemon exits; its sandboxes go). Calls still
        waiting fail with ConnectionLost."""
        if not self._closed.is_set():
            self._close_reason = "the client was closed"
        with self._lock:
            t, self._t = self._t, None
            self._reconnect = None
        try:
            if t is not None:
                t.close()
        except Exception:  # noqa: BLE001 - closing must not fail
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(30)
        self._shutdown()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            pending, self._pending = self._pending, {}
            subs = [s for lst in self._subs.values() for s in lst]
            self._subs = {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(ConnectionLost(self._close_reason, method=p.method))
        for s in subs:
            if isinstance(s, Subscription):
                s.closed = True
                s._q.put(Subscription._END)
        self._events.put(None)
        self._pool.shutdown(wait=False)

    # -- requests ------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        with self._wlock:
            t = self._t
            if t is None:
                raise OSError("connection lost")
            t.write(data)

    def _ensure_connected(self, method: str) -> None:
        """A remote client whose connection dropped dials again (bounded tries, backoff)."""
        if self._t is not None or self._reconnect is None:
            return
        with self._connect_lock:
            if self._t is not None or self._closed.is_set():
                return
            delay, why = RECONNECT_DELAY, ""
            for i in range(RECONNECT_TRIES):
                if i:
                    time.sleep(delay)
                    delay *= 2
                dial = self._reconnect
                if dial is None:
                    break
                try:
                    t = dial()
                except ConnectionLost as e:
                    why = str(e)
                    continue
                with self._lock:
                    self._t = t
                self._start_reader()
                return
            raise ConnectionLost(f"connection lost, and {RECONNECT_TRIES} tries to reconnect "
                                 f"failed: {why}", method=method)

    def _request(self, method: str, params: Dict[str, Any], *, post=None, on_output=None,
                 timeout=None):
        if self._closed.is_set():
            raise ConnectionLost(self._close_reason, method=method)
        self._ensure_connected(method)
        rid = next(self._ids)
        p = _Pending(method, post, on_output)
        line = (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                           ensure_ascii=False, allow_nan=False) + "\n").encode()
        with self._lock:
            self._pending[rid] = p
        try:
            self._send(line)
        except (OSError, ValueError) as e:
            with self._lock:
                self._pending.pop(rid, None)
            raise ConnectionLost(f"cannot send: {e}", method=method) from None
        wait = timeout if timeout is not None else self.timeout
        try:
            return p.future.result(wait)
        except concurrent.futures.TimeoutError:
            raise RequestTimeout(f"no answer within {wait} s", method=method) from None
        finally:  # answered, timed out or interrupted: forget it (a late answer is dropped)
            with self._lock:
                self._pending.pop(rid, None)

    def _request_done(self, value):
        return value

    # -- notifications -------------------------------------------------------------------
    def subscribe(self, method: Optional[str] = None,
                  callback: Optional[Callable[[Notification], Any]] = None) -> Subscription:
        """Receive notifications of ``method`` (None: all). With ``callback``, it is called
        with each Notification on the client's event thread (in arrival order; it may call
        the client); without, iterate the returned Subscription. ``close()`` it to stop."""
        sub = Subscription(self, method)
        if callback is not None:
            sub._callback = callback  # type: ignore[attr-defined]
        with self._lock:
            if self._closed.is_set():
                sub.closed = True
                sub._q.put(Subscription._END)
                return sub
            self._subs.setdefault(method, []).append(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            lst = self._subs.get(sub.method)
            if lst and sub in lst:
                lst.remove(sub)

    def _event_loop(self) -> None:
        while True:
            fn = self._events.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # noqa: BLE001 - a subscriber's bug must not stop delivery
                log.exception("conch_client: notification callback failed")

    # -- reading -------------------------------------------------------------------------
    def _read_loop(self, t: Any) -> None:
        why = ("the server closed the connection" if self._reconnect is not None else
               "the daemon closed the connection")
        try:
            while True:
                line = t.readline()
                if not line:
                    break
                self._handle_line(line)
        except Exception as e:  # noqa: BLE001
            why = f"connection lost: {e}"
        if self._reconnect is not None and not self._closed.is_set():
            self._lost(t, why)
            return
        if not self._closed.is_set():
            if self._close_reason == "the connection is closed":
                self._close_reason = why
        self._shutdown()

    def _lost(self, t: Any, why: str) -> None:
        """A remote connection dropped: the requests sent on it fail; the next request
        dials again."""
        with self._lock:
            if self._t is t:
                self._t = None
            pending, self._pending = self._pending, {}
        try:
            t.close()
        except Exception:  # noqa: BLE001
            pass
        msg = why if why.startswith("connection lost") else f"connection lost: {why}"
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(ConnectionLost(msg, method=p.method))

    def _handle_line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            log.warning("conch_client: ignoring a line that is not JSON: %.200r", line)
            return
        for m in (msg if isinstance(msg, list) else [msg]):
            if isinstance(m, dict):
                self._handle_message(m)

    def _handle_message(self, m: Dict[str, Any]) -> None:
        method = m.get("method")
        if isinstance(method, str):
            if "id" in m:
                self._incoming(m.get("id"), method, m.get("params"))
            elif method == "$/cancel":
                self._registry.cancel(m.get("params"))
            else:
                self._notification(Notification(method, m.get("params")))
            return
        with self._lock:
            p = self._pending.pop(m.get("id"), None)
        if p is None:
            return
        if p.on_output is not None:
            self._events.put(lambda: self._complete(p, m))
        else:
            self._complete(p, m)

    @staticmethod
    def _complete(p: _Pending, m: Dict[str, Any]) -> None:
        if p.future.done():
            return
        if "error" in m and m["error"] is not None:
            p.future.set_exception(from_error_object(m["error"], p.method))
            return
        try:
            res = m.get("result")
            p.future.set_result(p.post(res) if p.post else res)
        except Exception as e:  # noqa: BLE001
            p.future.set_exception(ConnectionLost(f"malformed result: {e!r}", method=p.method))

    def _notification(self, n: Notification) -> None:
        if n.method == "exec.output":
            with self._lock:
                p = self._pending.get(n.params.get("request_id"))
            if p is not None and p.on_output is not None:
                cb = p.on_output
                self._events.put(lambda: cb(n.params.get("stream"), n.params.get("data", "")))
        with self._lock:
            subs = list(self._subs.get(n.method, ())) + list(self._subs.get(None, ()))
        for s in subs:
            cb = getattr(s, "_callback", None)
            if cb is not None:
                self._events.put(lambda cb=cb: cb(n))
            else:
                s._put(n)

    # -- daemon -> client requests -------------------------------------------------------
    def _incoming(self, rid: Any, method: str, params: Any) -> None:
        try:
            fn, args, ctx = self._registry.resolve(method, params)
        except RpcFail as e:
            self._answer(rid, error=error_of(e))
            return
        holder: Dict[str, Callable[[], None]] = {}

        def canceller() -> None:
            c = holder.get("cancel")
            if c is not None:
                c()

        self._registry.track(ctx, canceller)

        def run() -> None:
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    result = _run_awaitable(result, ctx, holder)
            except BaseException as e:  # noqa: BLE001 - every failure is an answer
                if not ctx.cancelled.is_set():
                    self._answer(rid, error=error_of(e))
            else:
                if not ctx.cancelled.is_set():
                    self._answer(rid, result=result)
            finally:
                self._registry.untrack(ctx)

        try:
            self._pool.submit(run)
        except RuntimeError:  # the pool is shut down: the connection is closing
            self._registry.untrack(ctx)

    def _answer(self, rid: Any, result: Any = None, error: Optional[dict] = None) -> None:
        try:
            self._send(response_line(rid, result, error))
        except (OSError, ValueError) as e:
            log.warning("conch_client: cannot answer request %r: %s", rid, e)


def _run_awaitable(aw: Any, ctx: Any, holder: Dict[str, Callable[[], None]]) -> Any:
    """Run a handler's coroutine to completion on a private loop in this worker thread;
    $/cancel cancels its task."""
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(_wrap(aw))

        def cancel() -> None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass

        holder["cancel"] = cancel
        if ctx.cancelled.is_set():
            task.cancel()
        return loop.run_until_complete(task)
    finally:
        holder.pop("cancel", None)
        loop.close()


async def _wrap(aw: Any) -> Any:
    return await aw
