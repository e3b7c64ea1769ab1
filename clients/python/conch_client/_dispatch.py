# _dispatch.py - requests the daemon sends to the client (tool.call, agent.spawn, or any
# method given a handler): finding the handler, the context passed to it, and turning its
# return value or exception into a JSON-RPC response. Shared by Client and AsyncClient.
from __future__ import annotations

import inspect
import json
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from .errors import ConchError, ToolError

# JSON-RPC codes of answers the client itself makes.
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
TOOL_ERROR = -32000


class CallContext:
    """What a tool/agent handler may want besides its input.

    Attributes:
        method: ``"tool.call"``, ``"agent.spawn"`` or the method of a generic handler.
        sandbox: the sandbox id the call comes from.
        call_id: the daemon's id for the call (matches ``tool_trace()`` records).
        name: the tool name (tool.call) or the agent type (agent.spawn; None = default).
        origin: ``{"kind": "exec"|"job"|"session", "id": ...}``.
        params: the request's whole params object.
        cancelled: a ``threading.Event`` set when the daemon sends ``$/cancel`` for the call
            (the command ended or the call timed out); a sync handler should poll it and
            stop early. Async handlers are cancelled (``asyncio.CancelledError``) as well.
        cancel_reason: the ``reason`` of that ``$/cancel``.
    """

    def __init__(self, method: str, params: Dict[str, Any]):
        self.method = method
        self.params = params
        self.sandbox = params.get("sandbox")
        self.call_id = params.get("call_id")
        self.name = params.get("name") if method == "tool.call" else params.get("type")
        self.origin = params.get("origin")
        self.cancelled = threading.Event()
        self.cancel_reason: Optional[str] = None

    def cancel(self, reason: Optional[str]) -> None:
        self.cancel_reason = reason
        self.cancelled.set()

    def __repr__(self) -> str:
        return (f"CallContext(method={self.method!r}, sandbox={self.sandbox!r}, "
                f"call_id={self.call_id!r}, name={self.name!r})")


class RpcFail(Exception):
    """An error answer the dispatcher makes without calling a handler."""

    def __init__(self, code: int, message: str, data_code: str):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = {"code": data_code, "kind": "usage"}


_ctx_cache: Dict[Any, bool] = {}


def wants_ctx(fn: Callable) -> bool:
    """True when fn takes a second positional parameter (or *args): it gets the context."""
    key = getattr(fn, "__func__", fn)
    try:
        return _ctx_cache[key]
    except (KeyError, TypeError):
        pass
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        res = False
    else:
        pos = 0
        res = False
        for p in sig.parameters.values():
            if p.kind == p.VAR_POSITIONAL:
                res = True
            elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                pos += 1
            elif p.kind == p.KEYWORD_ONLY and p.name == "ctx":
                res = True
        res = res or pos >= 2
    try:
        _ctx_cache[key] = res
    except TypeError:
        pass
    return res


def is_async_fn(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))


class Registry:
    """The handlers of one client: tools and agents per (sandbox, name), generic handlers
    per method, and the calls in progress (for $/cancel). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tools: Dict[Tuple[Optional[str], str], Callable] = {}
        self._agents: Dict[Tuple[Optional[str], Optional[str]], Callable] = {}
        self._methods: Dict[str, Callable] = {}
        self._active: Dict[Any, Tuple[CallContext, Optional[Callable[[], None]]]] = {}

    # -- registration --------------------------------------------------------------------
    def add_tool(self, sandbox: Optional[str], name: str, fn: Callable) -> None:
        if not callable(fn):
            raise TypeError(f"tool '{name}': handler must be callable")
        with self._lock:
            self._tools[(sandbox, name)] = fn

    def remove_tool(self, sandbox: Optional[str], name: str) -> None:
        with self._lock:
            self._tools.pop((sandbox, name), None)

    def add_agent(self, sandbox: Optional[str], name: Optional[str], fn: Callable) -> None:
        if not callable(fn):
            raise TypeError(f"agent '{name}': handler must be callable")
        with self._lock:
            self._agents[(sandbox, name)] = fn

    def remove_agent(self, sandbox: Optional[str], name: Optional[str]) -> None:
        with self._lock:
            self._agents.pop((sandbox, name), None)

    def set_method(self, method: str, fn: Optional[Callable]) -> None:
        with self._lock:
            if fn is None:
                self._methods.pop(method, None)
            else:
                self._methods[method] = fn

    def tool_names(self, sandbox: Optional[str]):
        with self._lock:
            return sorted(n for (s, n) in self._tools if s == sandbox)

    # -- dispatch ------------------------------------------------------------------------
    def resolve(self, method: str, params: Any) -> Tuple[Callable, tuple, CallContext]:
        """The handler for an incoming request and the arguments to call it with.
        Raises RpcFail when there is none."""
        if not isinstance(params, dict):
            params = {}
        ctx = CallContext(method, params)
        with self._lock:
            generic = self._methods.get(method)
            if generic is not None:
                return generic, (params, ctx), ctx
            if method == "tool.call":
                name = params.get("name")
                fn = self._tools.get((ctx.sandbox, name)) or self._tools.get((None, name))
                if fn is None:
                    raise RpcFail(METHOD_NOT_FOUND,
                                  f"this client has no handler for tool '{name}'"
                                  f" in sandbox '{ctx.sandbox}'", "unknown_tool")
                inp = params.get("input", {})
                return fn, ((inp, ctx) if wants_ctx(fn) else (inp,)), ctx
            if method == "agent.spawn":
                typ = params.get("type")
                fn = self._agents.get((ctx.sandbox, typ)) or self._agents.get((None, typ))
                if fn is None and typ is None:
                    # no default handler: the first agent type this client registered for
                    # the sandbox (the daemon routes untyped spawns by that registration)
                    fn = next((f for (s, n), f in self._agents.items()
                               if s in (ctx.sandbox, None)), None)
                if fn is None:
                    raise RpcFail(METHOD_NOT_FOUND,
                                  f"this client has no handler for agent type "
                                  f"{'(default)' if typ is None else repr(typ)}"
                                  f" in sandbox '{ctx.sandbox}'", "unknown_agent")
                task = params.get("task", "")
                return fn, ((task, ctx) if wants_ctx(fn) else (task,)), ctx
        raise RpcFail(METHOD_NOT_FOUND, f"the client has no handler for '{method}'",
                      "method_not_found")

    def track(self, ctx: CallContext, canceller: Optional[Callable[[], None]]) -> None:
        if ctx.call_id is None:
            return
        with self._lock:
            self._active[ctx.call_id] = (ctx, canceller)

    def untrack(self, ctx: CallContext) -> None:
        if ctx.call_id is None:
            return
        with self._lock:
            cur = self._active.get(ctx.call_id)
            if cur is not None and cur[0] is ctx:
                del self._active[ctx.call_id]

    def cancel(self, params: Any) -> bool:
        """Handle `$/cancel {call_id, reason}`: set the call's event and run its canceller."""
        if not isinstance(params, dict):
            return False
        with self._lock:
            ent = self._active.get(params.get("call_id"))
        if ent is None:
            return False
        ctx, canceller = ent
        ctx.cancel(params.get("reason"))
        if canceller is not None:
            canceller()
        return True

    def active_calls(self) -> int:
        with self._lock:
            return len(self._active)


def error_of(exc: BaseException) -> Dict[str, Any]:
    """The JSON-RPC error object for an exception a handler raised."""
    if isinstance(exc, ToolError):
        data = {"code": "tool_error", "kind": "usage"}
        data.update(exc.data)
        return {"code": exc.code, "message": str(exc), "data": data}
    if isinstance(exc, RpcFail):
        return {"code": exc.code, "message": exc.message, "data": exc.data}
    if isinstance(exc, ConchError):
        return {"code": exc.code, "message": exc.message, "data": dict(exc.data)}
    msg = str(exc) or type(exc).__name__
    return {"code": TOOL_ERROR, "message": msg,
            "data": {"code": "tool_error", "kind": "usage", "exception": type(exc).__name__}}


def response_line(req_id: Any, result: Any = None, error: Optional[Dict[str, Any]] = None) -> bytes:
    """One response line; a result that is not JSON becomes an error naming why."""
    if error is None:
        try:
            return (json.dumps({"jsonrpc": "2.0", "id": req_id, "result": result},
                               ensure_ascii=False, allow_nan=False) + "\n").encode()
        except (TypeError, ValueError) as e:
            error = {"code": TOOL_ERROR, "message": f"the handler's result is not JSON: {e}",
                     "data": {"code": "tool_error", "kind": "usage"}}
    return (json.dumps({"jsonrpc": "2.0", "id": req_id, "error": error},
                       ensure_ascii=False) + "\n").encode()
