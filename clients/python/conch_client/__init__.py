# conch_client - the Python client of conch's daemon (`conch serve`, docs/PROTOCOL.md):
# sync Client, asyncio AsyncClient, and the Sandbox / AsyncSandbox objects. Standard library only.
"""Python client for conch's JSON-RPC daemon.

>>> from conch_client import Sandbox
>>> with Sandbox.create(workspace="/home/me/proj", on_exit="commit") as sb:
...     print(sb.run("make test").text)
"""
from ._dispatch import CallContext
from ._methods import tool_spec
from ._paths import default_socket_path, find_conch_bin
from .aio import AsyncClient, AsyncSubscription
from .client import Client, Notification, ProcessTransport, SocketTransport, Subscription
from .errors import (AmbiguousMatch, ConchError, ConnectionLost, FileNotFound,
                     InfrastructureError, InternalError, InvalidParams, InvalidPath,
                     InvalidRequest, IOFailure, IsADirectory, JobNotFound, LimitError,
                     MessageTooLarge, MethodNotFound, NotADirectory, ParseError,
                     NotWriter, PermissionDenied, RequestTimeout, SandboxNotFound,
                     SandboxStopped, SessionBusy, SessionEnded, SessionNotFound,
                     StringNotFound, ToolError, TooLarge, error_class)
from .sandbox import AsyncJob, AsyncSandbox, Job, RunResult, Sandbox
from .session import AsyncSession, Session

__version__ = "0.1.0"

__all__ = [
    "AmbiguousMatch", "AsyncClient", "AsyncJob", "AsyncSandbox", "AsyncSession",
    "AsyncSubscription", "NotWriter", "Session", "SessionBusy", "SessionEnded",
    "SessionNotFound",
    "CallContext", "Client", "ConchError", "ConnectionLost", "FileNotFound",
    "InfrastructureError", "InternalError", "InvalidParams", "InvalidPath", "InvalidRequest",
    "IOFailure", "IsADirectory", "Job", "JobNotFound", "LimitError", "MessageTooLarge",
    "MethodNotFound", "NotADirectory", "Notification", "ParseError", "PermissionDenied",
    "ProcessTransport", "RequestTimeout", "RunResult", "Sandbox", "SandboxNotFound",
    "SandboxStopped", "SocketTransport", "StringNotFound", "Subscription", "ToolError",
    "TooLarge", "default_socket_path", "error_class", "find_conch_bin", "tool_spec",
]
