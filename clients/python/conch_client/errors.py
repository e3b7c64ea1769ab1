# errors.py - the exceptions of conch_client: one ConchError subclass per JSON-RPC error
# code of docs/PROTOCOL.md (branch on the class, or on .data_code), plus transport failures.
from __future__ import annotations

from typing import Any, Dict, Optional, Type


class ConchError(Exception):
    """An error answered by the daemon (or met on the way to it).

    Attributes:
        code: the JSON-RPC error code (int), e.g. -32010.
        message: the human-readable message.
        data: the error's ``data`` object (dict; empty when absent).
        data_code: ``data.code``, the stable string to branch on (``"file_not_found"``...).
        kind: ``data.kind``: ``"usage"``, ``"limit"``, ``"infrastructure"`` or ``"internal"``.
        method: the request's method, when known.
    """

    default_code = -32603
    default_data_code = "internal_error"

    def __init__(self, message: str = "", code: Optional[int] = None,
                 data: Optional[Dict[str, Any]] = None, method: Optional[str] = None):
        self.message = message
        self.code = self.default_code if code is None else code
        self.data = data if isinstance(data, dict) else {}
        self.data_code = self.data.get("code", self.default_data_code)
        self.kind = self.data.get("kind")
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{message} ({self.data_code}, {self.code})")


class ConnectionLost(ConchError):
    """The connection to the daemon closed (or could not be opened) before an answer came."""

    default_code = -32099
    default_data_code = "connection_lost"


class RequestTimeout(ConchError):
    """No answer within the timeout the caller gave to the request."""

    default_code = -32098
    default_data_code = "request_timeout"


class ParseError(ConchError):
    """-32700: the daemon could not parse a line we sent (a client bug)."""


class InvalidRequest(ConchError):
    """-32600: not a JSON-RPC 2.0 request object."""


class MessageTooLarge(InvalidRequest):
    """-32600 message_too_large: the line exceeded the daemon's --max-message (data.limit)."""


class MethodNotFound(ConchError):
    """-32601: the daemon does not know the method (an older daemon?)."""


class InvalidParams(ConchError):
    """-32602: a param is missing, of the wrong type or out of range (data.param names it)."""

    @property
    def param(self) -> Optional[str]:
        return self.data.get("param")


class InternalError(ConchError):
    """-32603 internal_error: a bug in conch, or a file worker that died."""


class IOFailure(InternalError):
    """-32603 io_error: a file operation failed for an unlisted reason (message has errno)."""


class InfrastructureError(ConchError):
    """-32001: the sandbox could not be built or driven; the message names the fix."""


class SandboxNotFound(ConchError):
    """-32002: no sandbox with that id."""


class JobNotFound(ConchError):
    """-32003: no job with that id."""


class LimitError(ConchError):
    """-32004: a daemon limit (too many sandboxes, jobs, requests; disk over its limit)."""


class SandboxStopped(ConchError):
    """-32005: the sandbox's processes are gone; only workspace.* and get/destroy work."""


class FileNotFound(ConchError):
    """-32010: the path does not exist."""


class PermissionDenied(ConchError):
    """-32011: the sandbox's user may not do that."""


class IsADirectory(ConchError):
    """-32012: a file operation on a directory."""


class InvalidPath(ConchError):
    """-32013: empty, NUL byte, not UTF-8, or a path the sandbox may not name."""


class NotADirectory(ConchError):
    """-32014: a directory operation on a file."""


class StringNotFound(ConchError):
    """-32015: fs.edit's old_string does not occur."""


class AmbiguousMatch(ConchError):
    """-32016: fs.edit's old_string occurs more than once (data.occurrences)."""

    @property
    def occurrences(self) -> Optional[int]:
        return self.data.get("occurrences")


class TooLarge(ConchError):
    """-32017: a file or result above the size cap (data.limit, bytes)."""

    @property
    def limit(self) -> Optional[int]:
        return self.data.get("limit")


class SessionNotFound(ConchError):
    """-32003 session_not_found: no session with that id."""


class SessionBusy(LimitError):
    """-32004 session_busy: a program a person started holds the session's terminal."""


class NotWriter(LimitError):
    """-32004 not_writer: another client is the session's writer (take over with
    ``session_attach(write=True)``)."""


class SessionEnded(SandboxStopped):
    """-32005 session_ended: the session's shell is gone and cannot be restarted."""


class ToolError(Exception):
    """Raise from a tool or agent handler to answer the daemon with a chosen error.

    Any exception a handler raises becomes a JSON-RPC error whose message is ``str(exc)``;
    ToolError lets the handler also choose ``code`` and extra ``data`` members.
    """

    def __init__(self, message: str, code: int = -32000, data: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.code = code
        self.data = data or {}


_BY_DATA_CODE: Dict[str, Type[ConchError]] = {
    "parse_error": ParseError,
    "invalid_request": InvalidRequest,
    "message_too_large": MessageTooLarge,
    "method_not_found": MethodNotFound,
    "invalid_params": InvalidParams,
    "internal_error": InternalError,
    "io_error": IOFailure,
    "infrastructure": InfrastructureError,
    "sandbox_not_found": SandboxNotFound,
    "job_not_found": JobNotFound,
    "session_not_found": SessionNotFound,
    "session_busy": SessionBusy,
    "not_writer": NotWriter,
    "session_ended": SessionEnded,
    "limit": LimitError,
    "sandbox_stopped": SandboxStopped,
    "file_not_found": FileNotFound,
    "permission_denied": PermissionDenied,
    "is_directory": IsADirectory,
    "invalid_path": InvalidPath,
    "not_a_directory": NotADirectory,
    "string_not_found": StringNotFound,
    "ambiguous_match": AmbiguousMatch,
    "too_large": TooLarge,
}

_BY_CODE: Dict[int, Type[ConchError]] = {
    -32700: ParseError,
    -32600: InvalidRequest,
    -32601: MethodNotFound,
    -32602: InvalidParams,
    -32603: InternalError,
    -32001: InfrastructureError,
    -32002: SandboxNotFound,
    -32003: JobNotFound,
    -32004: LimitError,
    -32005: SandboxStopped,
    -32010: FileNotFound,
    -32011: PermissionDenied,
    -32012: IsADirectory,
    -32013: InvalidPath,
    -32014: NotADirectory,
    -32015: StringNotFound,
    -32016: AmbiguousMatch,
    -32017: TooLarge,
}


def error_class(code: Optional[int], data_code: Optional[str]) -> Type[ConchError]:
    """The ConchError subclass for a JSON-RPC error: by data.code first, then by code."""
    if data_code in _BY_DATA_CODE:
        return _BY_DATA_CODE[data_code]
    if isinstance(code, int) and code in _BY_CODE:
        return _BY_CODE[code]
    return ConchError


def from_error_object(err: Any, method: Optional[str] = None) -> ConchError:
    """Build the exception for a JSON-RPC ``error`` member."""
    if not isinstance(err, dict):
        return ConchError(f"malformed error object: {err!r}", method=method)
    data = err.get("data") if isinstance(err.get("data"), dict) else {}
    code = err.get("code")
    cls = error_class(code, data.get("code"))
    return cls(str(err.get("message", "")), code=code if isinstance(code, int) else None,
               data=data, method=method)


def from_file_error(err: Any, path: str, method: str) -> ConchError:
    """Build the exception for a per-file ``{"code": str, "message"}`` (fs.upload/download)."""
    if not isinstance(err, dict):
        return ConchError(f"{path}: {err!r}", method=method)
    dc = err.get("code")
    cls = error_class(None, dc)
    code = next((c for c, k in _BY_CODE.items() if k is cls), None)
    return cls(str(err.get("message", "")), code=code, data={"code": dc, "path": path},
               method=method)
