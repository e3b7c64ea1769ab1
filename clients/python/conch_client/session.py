# session.py - Session and AsyncSession: one persistent shell of a sandbox (session.* of
# docs/PROTOCOL.md) as an object: commands whose cwd, exports, functions and venvs persist
# (run), and the raw terminal (attach, write, resize, signal, output). Each session keeps
# the session.* notifications of its own id in a queue from the moment it is opened.
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Union

from .client import Notification
from .errors import ConnectionLost, SessionNotFound
from .sandbox import RunResult, _async, _call, _sync, _wrap_ops

METHODS = ("session.output", "session.started", "session.writer", "session.ended")
_END = object()


class _SessionState:
    """What the session's notifications told so far, and the queue output() reads."""

    def _init_state(self, client: Any, sandbox: str) -> None:
        self.client = client
        self.sandbox = sandbox
        self.id: Optional[str] = None
        self.info: Dict[str, Any] = {}
        #: this connection is the writer (attach(write=True), lost on a takeover)
        self.you_write = False
        #: the session.ended params once the session ended (reason, exit_code), else None
        self.ended: Optional[Dict[str, Any]] = None
        #: shells started so far (session.started)
        self.shells = 0
        #: session.writer notifications received (``{"writer": false, "reason"}``)
        self.writer_events: List[Dict[str, Any]] = []
        self.closed = False
        self._lock = threading.Lock()
        self._early: List[Notification] = []
        self._subs = [client.subscribe(m, self._on_note) for m in METHODS]

    def _set_info(self, info: Dict[str, Any]) -> None:
        with self._lock:
            self.info = info
            self.id = info["session"]
            self.shells = info.get("shells") or self.shells
            early, self._early = self._early, []
        for n in early:
            self._on_note(n)

    def _on_note(self, n: Notification) -> None:
        with self._lock:
            if self.id is None:
                self._early.append(n)
                return
        if n.params.get("session") != self.id:
            return
        p = n.params
        if n.method == "session.output":
            self._put(p)
        elif n.method == "session.started":
            self.shells = p.get("shell") or self.shells
        elif n.method == "session.writer":
            self.you_write = bool(p.get("writer"))
            self.writer_events.append(p)
        elif n.method == "session.ended":
            self.ended = p
            self._put(_END)

    def _unsubscribe(self) -> None:
        for s in self._subs:
            s.close()
        self._subs = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"


class _SessionOps:
    """The session's requests (generators; see Session/AsyncSession)."""

    id: str

    def run(self, command: str, *, timeout: Optional[float] = None,
            stdin: Optional[str] = None, grace: Optional[float] = None,
            max_output: Optional[int] = None, **extra: Any):
        """Run ``command`` in the session's shell -> RunResult (as Sandbox.run: output in
        ``stdout``, ``text`` ending with ``[exit code: N]``), plus ``new_shell``,
        ``shell_exited`` and ``session_usable``. cwd, exports, functions, aliases and an
        activated virtualenv persist between runs. On ``timeout`` (s, default 120) the
        command is interrupted and the shell stays (``session_usable``)."""
        r = yield _call("session_run", self.id, command, timeout=timeout, stdin=stdin,
                        grace=grace, max_output=max_output, **extra)
        return RunResult.from_dict(r)

    def write(self, data: str) -> int:
        """Keys to the terminal (``"ls\\n"``, ``"\\x03"``) -> bytes written (NotWriter
        when another client holds the keyboard)."""
        return (yield _call("session_write", self.id, data))

    def resize(self, rows: int, cols: int) -> Dict[str, Any]:
        """The terminal's size -> ``{"rows", "cols"}`` (the program gets SIGWINCH)."""
        return (yield _call("session_resize", self.id, rows, cols))

    def signal(self, signal: Union[str, int] = "INT") -> int:
        """A signal to the terminal's foreground process group -> its number."""
        return (yield _call("session_signal", self.id, signal))

    def attach(self, write: bool = False) -> Dict[str, Any]:
        """Attach this connection: output() then yields the terminal's output. Returns
        the session object plus ``scrollback`` (earlier output), ``seq``, ``next_seq``
        and ``you_write``; ``write=True`` takes the keyboard."""
        r = yield _call("session_attach", self.id, write or None)
        self.you_write = bool(r.get("you_write"))
        return r

    def detach(self) -> bool:
        """Stop receiving output (the session goes on)."""
        r = yield _call("session_detach", self.id)
        self.you_write = False
        return r

    def refresh(self) -> Dict[str, Any]:
        """The session object as the daemon has it now (from session.list)."""
        for s in (yield _call("session_list", self.sandbox)):
            if s.get("session") == self.id:
                self.info = s
                return s
        raise SessionNotFound(f"no session '{self.id}'", method="session.list")


class Session(_SessionState):
    """A persistent shell of a sandbox (``Sandbox.session()``), synchronously. As a
    context manager it is closed (shell killed, session forgotten) at the end."""

    def __init__(self, client: Any, sandbox: str):
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._init_state(client, sandbox)

    @classmethod
    def _open(cls, client: Any, sandbox: str, params: Dict[str, Any]) -> "Session":
        s = cls(client, sandbox)
        try:
            info = client.session_open(sandbox, **params)
        except BaseException:
            s._unsubscribe()
            raise
        s._set_info(info)
        s.you_write = bool(params.get("attach"))
        return s

    @classmethod
    def get(cls, client: Any, session: str, *, attach: bool = False,
            write: bool = False) -> "Session":
        """A Session for a session that already exists (opened by this or another client),
        found by id (SessionNotFound). ``attach`` (or ``write``, which takes the keyboard)
        attaches this connection, so that output() yields the terminal's output from then on.
        ``close()`` ends the session for everyone; ``detach()`` just lets go."""
        info = next((x for x in client.session_list() if x.get("session") == session), None)
        if info is None:
            raise SessionNotFound(f"no session '{session}'", method="session.list")
        s = cls(client, info["sandbox"])  # listening before attaching: no output is lost
        s._set_info(info)
        if attach or write:
            try:
                s.attach(write=write)
            except BaseException:
                s._unsubscribe()
                raise
        return s

    def _put(self, item: Any) -> None:
        self._q.put(item)

    def output(self, timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        """The terminal's output once attached: ``{"session", "seq", "data"}`` per
        session.output notification, in order. Ends when the session ends or is closed,
        the connection closes, or no output came for ``timeout`` seconds."""
        last = time.monotonic()
        while True:
            if self.closed and self._q.empty():
                return
            try:
                item = self._q.get(timeout=0.2)
            except queue.Empty:
                if self.client.closed or (timeout is not None and
                                          time.monotonic() - last >= timeout):
                    return
                continue
            if item is _END:
                self._q.put(_END)  # every later output() ends too
                return
            last = time.monotonic()
            yield item

    def wait_for(self, text: str, timeout: float = 10.0) -> str:
        """Read output until ``text`` appears -> the output read (TimeoutError when it
        did not within ``timeout`` s). The output it reads is consumed."""
        buf, deadline = "", time.monotonic() + timeout
        while text not in buf:
            left = deadline - time.monotonic()
            got = False
            for item in self.output(timeout=max(left, 0.01)):
                buf += item.get("data", "")
                got = True
                break
            if not got:
                raise TimeoutError(f"'{text}' not seen in the session's output within "
                                   f"{timeout} s; got {buf[-500:]!r}")
        return buf

    def close(self) -> None:
        """session.close: kill the shell and forget the session (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._unsubscribe()
        self._put(_END)
        try:
            self.client.session_close(self.id)
        except (SessionNotFound, ConnectionLost):
            pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncSession(_SessionState):
    """A persistent shell of a sandbox (``AsyncSandbox.session()``); methods are
    coroutines. ``async with sb.session() as s`` closes it at the end."""

    def __init__(self, client: Any, sandbox: str):
        self._aq: "asyncio.Queue[Any]" = asyncio.Queue()
        self._init_state(client, sandbox)

    @classmethod
    async def _open(cls, client: Any, sandbox: str, params: Dict[str, Any]) -> "AsyncSession":
        s = cls(client, sandbox)
        try:
            info = await client.session_open(sandbox, **params)
        except BaseException:
            s._unsubscribe()
            raise
        s._set_info(info)
        s.you_write = bool(params.get("attach"))
        return s

    @classmethod
    async def get(cls, client: Any, session: str, *, attach: bool = False,
                  write: bool = False) -> "AsyncSession":
        """As Session.get, on an AsyncClient."""
        info = next((x for x in await client.session_list() if x.get("session") == session),
                    None)
        if info is None:
            raise SessionNotFound(f"no session '{session}'", method="session.list")
        s = cls(client, info["sandbox"])
        s._set_info(info)
        if attach or write:
            try:
                await s.attach(write=write)
            except BaseException:
                s._unsubscribe()
                raise
        return s

    def _put(self, item: Any) -> None:
        self._aq.put_nowait(item)

    async def output(self, timeout: Optional[float] = None) -> AsyncIterator[Dict[str, Any]]:
        """As Session.output, an async iterator: ``async for o in s.output(): ...``."""
        while True:
            if self.closed and self._aq.empty():
                return
            try:
                item = await asyncio.wait_for(self._aq.get(),
                                              0.2 if timeout is None else timeout)
            except asyncio.TimeoutError:
                if self.client.closed or timeout is not None:
                    return
                continue
            if item is _END:
                self._aq.put_nowait(_END)
                return
            yield item

    async def wait_for(self, text: str, timeout: float = 10.0) -> str:
        """As Session.wait_for."""
        buf, deadline = "", time.monotonic() + timeout
        while text not in buf:
            left = deadline - time.monotonic()
            got = False
            async for item in self.output(timeout=max(left, 0.01)):
                buf += item.get("data", "")
                got = True
                break
            if not got:
                raise TimeoutError(f"'{text}' not seen in the session's output within "
                                   f"{timeout} s; got {buf[-500:]!r}")
        return buf

    async def close(self) -> None:
        """session.close (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._unsubscribe()
        self._put(_END)
        try:
            await self.client.session_close(self.id)
        except (SessionNotFound, ConnectionLost):
            pass

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _AsyncSessionOpen:
    """What AsyncSandbox.session returns: awaitable, or an async context manager."""

    def __init__(self, client: Any, sandbox: str, params: Dict[str, Any]):
        self._args = (client, sandbox, params)
        self._s: Optional[AsyncSession] = None

    def __await__(self):
        return AsyncSession._open(*self._args).__await__()

    async def __aenter__(self) -> AsyncSession:
        self._s = await self
        return self._s

    async def __aexit__(self, *exc) -> None:
        if self._s is not None:
            await self._s.close()


for _n, _m in _wrap_ops(_SessionOps, _sync).items():
    setattr(Session, _n, _m)
for _n, _m in _wrap_ops(_SessionOps, _async).items():
    setattr(AsyncSession, _n, _m)
