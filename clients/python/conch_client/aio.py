# aio.py - the asyncio JSON-RPC client of `conch serve`: the same methods as Client, as
# coroutines. A reader task matches responses by id; notifications go to subscribers
# (callbacks or async iterators) from a delivery task, in arrival order; daemon->client
# requests run as tasks (sync handlers in a thread pool) and `$/cancel` cancels them.
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import itertools
import json
import logging
from typing import Any, Callable, Dict, Optional, Sequence

from . import _paths, _ws
from ._dispatch import Registry, RpcFail, error_of, is_async_fn, response_line
from ._methods import ProtocolMethods
from .client import MAX_LINE, Notification
from .errors import ConnectionLost, RequestTimeout, from_error_object

log = logging.getLogger("conch_client")


class AsyncSubscription:
    """Notifications as an async iterator (``async for n in sub``) or ``await get()``;
    ends when the client closes or ``close()`` is called."""

    _END = object()

    def __init__(self, client: "AsyncClient", method: Optional[str],
                 callback: Optional[Callable] = None):
        self._client = client
        self.method = method
        self._callback = callback
        self._q: "asyncio.Queue[Any]" = asyncio.Queue()
        self.closed = False

    async def get(self, timeout: Optional[float] = None) -> Notification:
        """The next notification; asyncio.TimeoutError after ``timeout`` s,
        StopAsyncIteration once the subscription ended."""
        item = await asyncio.wait_for(self._q.get(), timeout)
        if item is self._END:
            self._q.put_nowait(self._END)
            raise StopAsyncIteration
        return item

    def __aiter__(self) -> "AsyncSubscription":
        return self

    async def __anext__(self) -> Notification:
        return await self.get()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._client._unsubscribe(self)
            self._q.put_nowait(self._END)


class _Pending:
    __slots__ = ("method", "future", "post", "on_output")

    def __init__(self, method, future, post, on_output):
        self.method = method
        self.future = future
        self.post = post
        self.on_output = on_output


class AsyncClient(ProtocolMethods):
    """An asyncio connection to `conch serve`. Every protocol method is a coroutine; any
    number may be awaited at once (``asyncio.gather``).

    Build with ``await AsyncClient.connect(socket=None)`` or
    ``await AsyncClient.spawn(conch_bin=None)``, or from a reader (``async readline()``)
    and a writer (``write``, ``async drain``, ``close``) inside a running loop.
    """

    def __init__(self, reader: Any, writer: Any, *, timeout: Optional[float] = None,
                 handler_threads: int = 32, process: Any = None, close_timeout: float = 15.0):
        self._reader = reader
        self._writer = writer
        self.process = process
        self.timeout = timeout
        self.close_timeout = close_timeout
        self._loop = asyncio.get_running_loop()
        self._registry = Registry()
        self._ids = itertools.count(1)
        self._pending: Dict[Any, _Pending] = {}
        self._subs: Dict[Optional[str], list] = {}
        self._events: "asyncio.Queue[Any]" = asyncio.Queue()
        self._drain_lock = asyncio.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=handler_threads, thread_name_prefix="conch-handler")
        self._handlers: set = set()
        self._closed = False
        self._close_reason = "the connection is closed"
        self._delivery = self._loop.create_task(self._deliver())
        self._read_task = self._loop.create_task(self._read_loop())

    # -- construction --------------------------------------------------------------------
    @classmethod
    async def connect(cls, socket: Optional[str] = None, *, url: Optional[str] = None,
                      token: Optional[str] = None, ca: Optional[str] = None,
                      connect_timeout: float = 10.0, **kw: Any) -> "AsyncClient":
        """Connect to a daemon's unix socket (default: see default_socket_path()), or to a
        remote daemon (``url``, ``token``, ``ca``, else $CONCH_URL, $CONCH_TOKEN, $CONCH_CA:
        see Client.connect). The asyncio client does not reconnect: after a dropped remote
        connection, connect again."""
        remote = _paths.remote_options(socket, url, token, ca)
        if remote is not None:
            t = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(_ws.WebSocketTransport, *remote,
                                        connect_timeout=connect_timeout))
            a = _ws.AsyncAdapter(t)
            c = cls(a, a, **kw)
            c._conch_no_copy = True  # the daemon's host is not ours: contents go in messages
            return c
        path = str(socket) if socket else _paths.default_socket_path()
        _paths.check_socket(path)
        try:
            r, w = await asyncio.open_unix_connection(path, limit=MAX_LINE)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to '{path}': {e}") from None
        return cls(r, w, **kw)

    @classmethod
    async def spawn(cls, conch_bin: Optional[str] = None, *, state_dir: Optional[str] = None,
                    serve_args: Sequence[str] = (), stderr: Any = None,
                    env: Optional[Dict[str, str]] = None, **kw: Any) -> "AsyncClient":
        """Start ``conch serve --stdio`` and talk to it (see Client.spawn)."""
        argv = _paths.stdio_argv(conch_bin, state_dir, serve_args)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=stderr, env=env, limit=MAX_LINE)
        except OSError as e:
            raise ConnectionLost(f"cannot start {argv[0]}: {e}") from None
        return cls(proc.stdout, proc.stdin, process=proc, **kw)

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Close the connection (a spawned daemon exits). Pending calls fail with
        ConnectionLost; running handlers are cancelled."""
        if not self._closed:
            self._close_reason = "the client was closed"
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001
            pass
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), self.close_timeout)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        else:
            try:
                await self._writer.wait_closed()
            except Exception:  # noqa: BLE001
                pass
        try:
            await asyncio.wait_for(asyncio.shield(self._read_task), 30)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001
            self._read_task.cancel()
        self._shutdown()
        for t in list(self._handlers):
            t.cancel()
        await asyncio.gather(self._delivery, return_exceptions=True)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(ConnectionLost(self._close_reason, method=p.method))
        for lst in self._subs.values():
            for s in lst:
                s.closed = True
                s._q.put_nowait(AsyncSubscription._END)
        self._subs = {}
        self._events.put_nowait(None)
        self._pool.shutdown(wait=False)

    # -- requests ------------------------------------------------------------------------
    async def _send(self, data: bytes) -> None:
        self._writer.write(data)
        async with self._drain_lock:
            await self._writer.drain()

    async def _request(self, method: str, params: Dict[str, Any], *, post=None,
                       on_output=None, timeout=None):
        if self._closed:
            raise ConnectionLost(self._close_reason, method=method)
        rid = next(self._ids)
        p = _Pending(method, self._loop.create_future(), post, on_output)
        line = (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                           ensure_ascii=False, allow_nan=False) + "\n").encode()
        self._pending[rid] = p
        try:
            try:
                await self._send(line)
            except (OSError, RuntimeError, ValueError) as e:
                raise ConnectionLost(f"cannot send: {e}", method=method) from None
            wait = timeout if timeout is not None else self.timeout
            if wait is None:
                return await p.future
            try:
                return await asyncio.wait_for(p.future, wait)
            except asyncio.TimeoutError:
                raise RequestTimeout(f"no answer within {wait} s", method=method) from None
        finally:
            self._pending.pop(rid, None)

    def _request_done(self, value):
        async def done():
            return value
        return done()

    # -- notifications -------------------------------------------------------------------
    def subscribe(self, method: Optional[str] = None,
                  callback: Optional[Callable[[Notification], Any]] = None) -> AsyncSubscription:
        """Receive notifications of ``method`` (None: all): ``callback(n)`` (sync, or async
        and awaited) is called in arrival order; without one, ``async for`` over the
        returned subscription. ``close()`` it to stop."""
        sub = AsyncSubscription(self, method, callback)
        if self._closed:
            sub.closed = True
            sub._q.put_nowait(AsyncSubscription._END)
        else:
            self._subs.setdefault(method, []).append(sub)
        return sub

    def _unsubscribe(self, sub: AsyncSubscription) -> None:
        lst = self._subs.get(sub.method)
        if lst and sub in lst:
            lst.remove(sub)

    async def _deliver(self) -> None:
        while True:
            fn = await self._events.get()
            if fn is None:
                return
            try:
                r = fn()
                if inspect.isawaitable(r):
                    await r
            except Exception:  # noqa: BLE001
                log.exception("conch_client: notification callback failed")

    # -- reading -------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                self._handle_line(line)
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001
            if not self._closed:
                self._close_reason = f"connection lost: {e}"
        else:
            if self._close_reason == "the connection is closed":
                self._close_reason = "the daemon closed the connection"
        self._shutdown()

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
        p = self._pending.get(m.get("id"))
        if p is None:
            return
        if p.on_output is not None:
            self._events.put_nowait(lambda: self._complete(p, m))
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
            p = self._pending.get(n.params.get("request_id"))
            if p is not None and p.on_output is not None:
                cb = p.on_output
                self._events.put_nowait(
                    lambda: cb(n.params.get("stream"), n.params.get("data", "")))
        subs = list(self._subs.get(n.method, ())) + list(self._subs.get(None, ()))
        for s in subs:
            if s._callback is not None:
                self._events.put_nowait(lambda cb=s._callback: cb(n))
            elif not s.closed:
                s._q.put_nowait(n)

    # -- daemon -> client requests -------------------------------------------------------
    def _incoming(self, rid: Any, method: str, params: Any) -> None:
        try:
            fn, args, ctx = self._registry.resolve(method, params)
        except RpcFail as e:
            t = self._loop.create_task(self._answer(rid, error=error_of(e)))
            self._handlers.add(t)
            t.add_done_callback(self._handlers.discard)
            return
        task = self._loop.create_task(self._serve(rid, fn, args, ctx))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        self._registry.track(ctx, task.cancel)

    async def _serve(self, rid: Any, fn: Callable, args: tuple, ctx: Any) -> None:
        try:
            if is_async_fn(fn):
                result = fn(*args)
            else:
                result = await self._loop.run_in_executor(self._pool,
                                                          functools.partial(fn, *args))
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError:
            return  # $/cancel (the daemon ignores a late answer) or the client closing
        except Exception as e:  # noqa: BLE001 - every failure is an answer
            if not ctx.cancelled.is_set():
                await self._answer(rid, error=error_of(e))
        else:
            if not ctx.cancelled.is_set():
                await self._answer(rid, result=result)
        finally:
            self._registry.untrack(ctx)

    async def _answer(self, rid: Any, result: Any = None, error: Optional[dict] = None) -> None:
        if self._closed:
            return
        try:
            await self._send(response_line(rid, result, error))
        except Exception as e:  # noqa: BLE001
            log.warning("conch_client: cannot answer request %r: %s", rid, e)
