# sandbox.py - Sandbox and AsyncSandbox: one sandbox as an object (run, files, workspace,
# tool bridge), with the lifecycle of a context manager. Each operation is written once as
# a generator that yields client calls; a sync and an async driver run it.
from __future__ import annotations

import base64
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from .aio import AsyncClient
from .client import Client
from ._methods import host_id as _host_id
from .errors import ConchError, TooLarge, from_file_error

log = logging.getLogger("conch_client")

DEFAULT_SERVE_ARGS = ("--pool", "0")

#: The most file content one request carries (the daemon's cap, 10 MiB): larger files move
#: in chunks of this size (fs.read offset/length, fs.write append).
CHUNK = 10 << 20
#: Files from this size on move by fs.copy_in / fs.copy_out where the daemon can open this
#: process's files (a local daemon of our uid): a memfd of ours, copied by the daemon's file
#: worker in the kernel. Elsewhere (a daemon on another host, an older one) in chunks.
COPY_MIN = 1 << 20


@dataclass
class RunResult:
    """What a command did. ``text`` is the model-facing summary (output, notices, a last
    ``[exit code: N]`` line); ``raw`` is the whole exec.run / job result dict."""

    exit_code: Optional[int]
    stdout: str = ""
    stderr: str = ""
    text: str = ""
    signal: Optional[int] = None
    timed_out: bool = False
    duration_ms: Optional[int] = None
    error: Optional[Dict[str, Any]] = None
    changes: List[Dict[str, Any]] = field(default_factory=list)
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)
    detached_agents: List[Dict[str, Any]] = field(default_factory=list)
    #: the bridge's ``[tools: N calls (...), N ok, N failed, T s]`` line (also in ``text``)
    #: when the command called tools or sub-agents, else None
    tools_summary: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    #: session.run only: a new shell ran this command (the previous one had exited; the
    #: session's state was lost), the shell exited during it (``exit``, ``exec``, ``set -e``),
    #: and, after a timeout, whether the shell is still there with its state.
    new_shell: bool = False
    shell_exited: bool = False
    session_usable: Optional[bool] = None
    #: exec.run: "host" for a sandbox of the host network, the records of the command's
    #: network attempts (as network.log's) in the allow mode, None with no network
    network: Union[str, List[Dict[str, Any]], None] = None

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and nothing (timeout, limit) stopped it."""
        return self.exit_code == 0 and not self.error

    @classmethod
    def from_dict(cls, r: Dict[str, Any]) -> "RunResult":
        return cls(exit_code=r.get("exit_code"), stdout=r.get("stdout") or "",
                   stderr=r.get("stderr") or "", text=r.get("text") or "",
                   signal=r.get("signal"), timed_out=bool(r.get("timed_out")),
                   duration_ms=r.get("duration_ms"), error=r.get("error"),
                   changes=list(r.get("changes") or []),
                   tool_calls=list(r.get("tool_calls") or []),
                   detached_agents=list(r.get("detached_agents") or []),
                   tools_summary=r.get("tools_summary"), raw=r,
                   new_shell=bool(r.get("new_shell")),
                   shell_exited=bool(r.get("shell_exited")),
                   session_usable=r.get("session_usable"), network=r.get("network"))

    def __str__(self) -> str:
        return self.text


# ---- the operations, written once ------------------------------------------------------
# Each yields (client_method_name, args, kwargs) and receives the result (or the exception
# is thrown into it); its return value is the operation's.

def _call(name: str, *a: Any, **kw: Any):
    return (name, a, kw)


def _drive_sync(client: Client, gen):
    try:
        step = next(gen)
        while True:
            name, a, kw = step
            try:
                res = getattr(client, name)(*a, **kw)
            except Exception as e:  # noqa: BLE001 - handed to the operation
                step = gen.throw(e)
            else:
                step = gen.send(res)
    except StopIteration as s:
        return s.value


async def _drive_async(client: AsyncClient, gen):
    try:
        step = next(gen)
        while True:
            name, a, kw = step
            try:
                res = await getattr(client, name)(*a, **kw)
            except Exception as e:  # noqa: BLE001
                step = gen.throw(e)
            else:
                step = gen.send(res)
    except StopIteration as s:
        return s.value


def _sync(op):
    @functools.wraps(op)
    def method(self, *a, **kw):
        return _drive_sync(self.client, op(self, *a, **kw))
    return method


def _async(op):
    @functools.wraps(op)
    async def method(self, *a, **kw):
        return await _drive_async(self.client, op(self, *a, **kw))
    return method


def _write_chunks(sid: str, path: str, data: bytes):
    """Create or replace @path with @data in CHUNK-sized fs.writes (the first replaces the
    file, the others append: not atomic) -> ``{"bytes_written", "created"}``."""
    view = memoryview(data)
    r = yield _call("fs_write", sid, path, bytes(view[:CHUNK]))
    created, written = r.get("created"), r.get("bytes_written", 0)
    for off in range(CHUNK, len(data), CHUNK):
        r = yield _call("fs_write", sid, path, bytes(view[off:off + CHUNK]), append=True)
        written += r.get("bytes_written", 0)
    return {"bytes_written": written, "created": created}


def _read_chunks(sid: str, path: str):
    """The bytes of @path, in CHUNK-sized fs.reads from offset 0 to its end."""
    parts, off = [], 0
    while True:
        r = yield _call("fs_read", sid, path, offset=off, encoding="base64", length=CHUNK)
        b = base64.b64decode(r.get("content", ""))
        parts.append(b)
        off += len(b)
        if r.get("eof") or not b:
            return b"".join(parts)


def _copy_refused(client: Any, e: ConchError) -> bool:
    """Whether @e says the daemon cannot open our files (the caller moves the file in
    chunks); an older daemon or one that sees another filesystem is not asked again."""
    param = e.data.get("param")
    if e.code == -32601 or param == "host_id":
        client._conch_no_copy = True
        return True
    return e.data_code == "invalid_params" and param == "host_path"


def _can_copy(client: Any) -> bool:
    return hasattr(os, "memfd_create") and not getattr(client, "_conch_no_copy", False)


def _memfd_path(fd: int) -> str:
    return f"/proc/{os.getpid()}/fd/{fd}"


def _copy_in(client: Any, sid: str, path: str, data: bytes):
    """Write @data to @path by fs.copy_in from a memfd -> True, or False when the daemon
    cannot open it (the caller writes in chunks)."""
    fd = os.memfd_create("conch-upload", os.MFD_CLOEXEC)
    try:
        view, off = memoryview(data), 0
        while off < len(view):
            off += os.write(fd, view[off:])
        try:
            yield _call("fs_copy_in", sid, path, _memfd_path(fd), host_id=_host_id(fd))
        except ConchError as e:
            # busy: the sandbox's transfers are all taken; chunks queue instead
            if _copy_refused(client, e) or e.data_code == "busy":
                return False
            raise
        return True
    finally:
        os.close(fd)


def _copy_out(client: Any, sid: str, path: str):
    """The bytes of @path by fs.copy_out into a memfd, or None when the daemon cannot open
    it (the caller reads in chunks)."""
    fd = os.memfd_create("conch-download", os.MFD_CLOEXEC)
    try:
        try:
            r = yield _call("fs_copy_out", sid, path, _memfd_path(fd), host_id=_host_id(fd))
        except ConchError as e:
            # too_large: a workspace file above the sandbox's disk limit, which bounds what
            # the copy writes; chunks have no such bound
            if _copy_refused(client, e) or e.data_code in ("too_large", "busy"):
                return None
            raise
        size, parts, off = r.get("size", 0), [], 0
        while off < size:
            b = os.pread(fd, size - off, off)  # one read, into the bytes returned, as a rule
            if not b:
                break
            parts.append(b)
            off += len(b)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def _as_bytes(data: Union[bytes, bytearray, memoryview, str]) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


class _Ops:
    """The operations of a sandbox (generators; see Sandbox/AsyncSandbox)."""

    id: str

    def info(self):
        """sandbox.get: the sandbox object (state, workspace, commands...)."""
        return (yield _call("sandbox_get", self.id))

    def run(self, command: str, *, timeout: Optional[float] = None,
            env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
            stdin: Optional[str] = None, max_output: Optional[int] = None,
            on_output: Optional[Callable[[str, str], Any]] = None, **extra: Any):
        """Run ``bash -c command`` -> RunResult (a non-zero exit is a result, not an
        exception). ``timeout`` in seconds (daemon default 120); ``on_output(stream,
        data)`` streams the output while it runs."""
        r = yield _call("exec_run", self.id, command, timeout=timeout, env=env, cwd=cwd,
                        stdin=stdin, max_output=max_output, on_output=on_output, **extra)
        return RunResult.from_dict(r)

    def read(self, path: str, offset: Optional[int] = None, limit: Optional[int] = None) -> str:
        """The text of a file (``offset``: first line, 0-based; ``limit``: line count,
        daemon default 2000). FileNotFound, IsADirectory, InvalidPath. A file over the
        daemon's 10 MiB per request is read whole in chunks and sliced here."""
        try:
            r = yield _call("fs_read", self.id, path, offset=offset, limit=limit)
            return r["content"]
        except TooLarge:
            data = yield from _read_chunks(self.id, path)
        lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
        start = offset or 0
        return "".join(lines[start:start + (2000 if limit is None else limit)])

    def write(self, path: str, content: Union[str, bytes]):
        """Create or replace a file (str as UTF-8; bytes exactly) -> ``{"bytes_written",
        "created"}``. Parent directories are created. Over 10 MiB it is written in chunks
        (then not atomically)."""
        if len(content) > CHUNK // 4 and len(_as_bytes(content)) > CHUNK:
            return (yield from _write_chunks(self.id, path, _as_bytes(content)))
        return (yield _call("fs_write", self.id, path, content))

    def edit(self, path: str, old_string: str, new_string: str, replace_all: bool = False) -> int:
        """Replace ``old_string`` by ``new_string`` -> the number of occurrences replaced
        (StringNotFound; AmbiguousMatch unless ``replace_all``)."""
        r = yield _call("fs_edit", self.id, path, old_string, new_string,
                        replace_all=replace_all or None)
        return r["occurrences"]

    def ls(self, path: Optional[str] = None) -> List[Dict[str, Any]]:
        """Directory entries ``{"name", "path", "type", "size", "mode", "mtime"}``."""
        return (yield _call("fs_ls", self.id, path))

    def glob(self, pattern: str, path: Optional[str] = None) -> List[str]:
        """Paths matching ``pattern`` (``**`` crosses directories)."""
        r = yield _call("fs_glob", self.id, pattern, path=path)
        return r["paths"]

    def grep(self, pattern: str, path: Optional[str] = None, *, glob: Optional[str] = None,
             fixed_string: bool = False, ignore_case: bool = False) -> List[Dict[str, Any]]:
        """Lines matching ``pattern`` (POSIX ERE unless ``fixed_string``) as ``{"path",
        "line", "text"}``."""
        r = yield _call("fs_grep", self.id, pattern, path=path, glob=glob,
                        fixed_string=fixed_string or None, ignore_case=ignore_case or None)
        return r["matches"]

    def delete(self, path: str, recursive: bool = False):
        """Delete a file (a directory with ``recursive=True``)."""
        return (yield _call("fs_delete", self.id, path, recursive=recursive or None))

    def upload(self, path: str, data: Union[bytes, str]) -> None:
        """Write ``data`` (bytes) to ``path``, of any size (over 10 MiB in chunks, not
        atomically); raises the file's ConchError."""
        data = _as_bytes(data)
        if len(data) >= COPY_MIN and _can_copy(self.client):
            if (yield from _copy_in(self.client, self.id, path, data)):
                return
        if len(data) > CHUNK:
            yield from _write_chunks(self.id, path, data)
            return
        res = yield _call("fs_upload", self.id, [(path, data)])
        err = res[0].get("error") if res else {"code": "internal_error", "message": "no answer"}
        if err:
            raise from_file_error(err, path, "fs.upload")

    def upload_many(self, files: Union[Mapping[str, bytes], Iterable]) -> Dict[str, Optional[ConchError]]:
        """Upload several files -> path -> None (written) or the ConchError of that file.
        Files over 10 MiB go one by one in chunks."""
        items = [(p, _as_bytes(d)) for p, d in (files.items() if isinstance(files, Mapping)
                                                 else files)]
        out: Dict[str, Optional[ConchError]] = {}
        small = [(p, d) for p, d in items if len(d) <= CHUNK]
        if small:
            res = yield _call("fs_upload", self.id, small)
            out.update({r["path"]: (from_file_error(r["error"], r["path"], "fs.upload")
                                    if r.get("error") else None) for r in res})
        for p, d in items:
            if len(d) > CHUNK:
                try:
                    yield from _Ops.upload(self, p, d)
                    out[p] = None
                except ConchError as e:
                    out[p] = e
        return out

    def download(self, path: str) -> bytes:
        """The bytes of a file of any size (over 10 MiB in chunks); raises its ConchError
        (FileNotFound, IsADirectory...)."""
        res = yield _call("fs_download", self.id, [path])
        f = res[0] if res else {"error": {"code": "internal_error", "message": "no answer"}}
        if f.get("error", {}).get("code") == "too_large":
            if _can_copy(self.client):
                data = yield from _copy_out(self.client, self.id, path)
                if data is not None:
                    return data
            return (yield from _read_chunks(self.id, path))
        if f.get("error"):
            raise from_file_error(f["error"], path, "fs.download")
        return base64.b64decode(f.get("content", ""))

    def upload_file(self, path: str, local_path: str) -> None:
        """Copy the local file ``local_path`` to ``path`` (replaced atomically): by
        fs.copy_in where the daemon can open it (no byte through this process), else read
        and uploaded."""
        if not getattr(self.client, "_conch_no_copy", False):
            try:
                yield _call("fs_copy_in", self.id, path, local_path)
                return
            except ConchError as e:
                if not _copy_refused(self.client, e) and e.data_code != "busy":
                    raise
        with open(local_path, "rb") as f:
            data = f.read()
        yield from _Ops.upload(self, path, data)

    def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` to the local file ``local_path`` (created or truncated): by
        fs.copy_out where the daemon can open it, else downloaded and written."""
        if not getattr(self.client, "_conch_no_copy", False):
            try:
                yield _call("fs_copy_out", self.id, path, local_path)
                return
            except ConchError as e:
                if not _copy_refused(self.client, e) and e.data_code not in ("busy", "too_large"):
                    raise
        data = yield from _Ops.download(self, path)
        with open(local_path, "wb") as f:
            f.write(data)

    def download_many(self, paths: Iterable[str]) -> Dict[str, Union[bytes, ConchError]]:
        """Download several files -> path -> bytes, or the ConchError of that file. Files
        over 10 MiB (or past fs.download's 64 MiB in all) are read again in chunks."""
        res = yield _call("fs_download", self.id, list(paths))
        out: Dict[str, Union[bytes, ConchError]] = {}
        for f in res:
            err = f.get("error")
            if err and err.get("code") == "too_large":
                try:
                    data = None
                    if _can_copy(self.client):
                        data = yield from _copy_out(self.client, self.id, f["path"])
                    out[f["path"]] = (data if data is not None
                                      else (yield from _read_chunks(self.id, f["path"])))
                except ConchError as e:
                    out[f["path"]] = e
            elif err:
                out[f["path"]] = from_file_error(err, f["path"], "fs.download")
            else:
                out[f["path"]] = base64.b64decode(f.get("content", ""))
        return out

    def changes(self, since: Optional[str] = None,
                mount: Optional[str] = None) -> List[Dict[str, Any]]:
        """Every change of the workspace against the host dir (all pages), in path order;
        with ``since`` (a snapshot's id or name), those made after that snapshot; with
        ``mount`` (an overlay mount's target), those of that mount."""
        out: List[Dict[str, Any]] = []
        offset = 0
        while True:
            r = yield _call("workspace_changes", self.id, offset=offset or None, since=since,
                            mount=mount)
            out.extend(r.get("changes", []))
            nxt = r.get("next_offset")
            if nxt is None or nxt <= offset:
                return out
            offset = nxt

    def diff(self, paths: Optional[List[str]] = None, since: Optional[str] = None,
             mount: Optional[str] = None) -> str:
        """The unified diff of the changes (``git apply``-able); with ``since`` (a
        snapshot's id or name), of those made after that snapshot, against it; with
        ``mount``, of that overlay mount's."""
        r = yield _call("workspace_diff", self.id, paths, since=since, mount=mount)
        return r["diff"]

    def commit(self, paths: Optional[List[str]] = None,
               mount: Optional[str] = None) -> Dict[str, Any]:
        """Apply the changes (all, or ``paths``) to the host dir -> ``{"committed",
        "skipped"}``; with ``mount`` (an overlay mount's target), that mount's, to its
        source dir."""
        return (yield _call("workspace_commit", self.id, paths, mount=mount))

    def discard(self, paths: Optional[List[str]] = None) -> List[str]:
        """Drop the changes (all, or ``paths``) -> the discarded paths. Restarts the
        sandbox's processes."""
        r = yield _call("workspace_discard", self.id, paths)
        return r["discarded"]

    def network_set(self, *, net: Optional[str] = None, allow: Optional[List[str]] = None,
                    deny: Optional[List[str]] = None) -> Dict[str, Any]:
        """Replace the network rules given (``net`` "none"/"allow" for an allow sandbox)
        -> ``{"net", "allow", "deny", ...}``."""
        return (yield _call("network_set", self.id, net=net, allow=allow, deny=deny))

    def network_log(self) -> Dict[str, Any]:
        """The sandbox's recent network attempts -> ``{"net", "allow", "deny", "total",
        "records"}``."""
        return (yield _call("network_log", self.id))

    def jobs(self) -> List[Dict[str, Any]]:
        """The sandbox's jobs (running and finished)."""
        return (yield _call("job_list", self.id))

    def register_tool(self, name: str, fn: Callable, description: str = "",
                      input_schema: Optional[dict] = None,
                      output_schema: Optional[dict] = None,
                      timeout: Optional[float] = None) -> List[str]:
        """Offer a tool to the sandbox's commands (``tool_call NAME JSON``): ``fn(input)``
        or ``fn(input, ctx)``, sync or async; its return value is the result, an exception
        an error whose message the caller sees. ``input_schema`` (JSON Schema) is checked
        by the daemon before ``fn`` runs; ``timeout``: seconds a call may take."""
        return (yield _call("register_tool", self.id, name, fn, description, input_schema,
                            output_schema, timeout))

    def unregister_tool(self, name: str) -> List[str]:
        """Withdraw a tool."""
        return (yield _call("tools_unregister", self.id, [name]))

    def register_agent(self, name: Optional[str], description: str, fn: Callable) -> List[str]:
        """Offer a sub-agent type (``spawn_agent TASK NAME``): ``fn(task)`` or ``fn(task,
        ctx)`` returns its answer. ``name=None``: the handler of the default type."""
        return (yield _call("register_agent", self.id, name, description, fn))

    def tools(self) -> Dict[str, Any]:
        """tools.list: ``{"tools": [...], "agents": [...]}`` registered for the sandbox."""
        return (yield _call("tools_list", self.id))

    def tool_trace(self, origin: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
        """The call records of the sandbox's tool and agent calls (of one ``origin``)."""
        return (yield _call("tools_trace", self.id, origin))

    def tools_prompt(self, languages: Optional[List[str]] = None) -> str:
        """Documentation of the sandbox's tools for a model's system prompt."""
        return (yield _call("tools_prompt", self.id, languages))

    def js_eval(self, code: str, *, session: Optional[str] = None,
                timeout: Optional[float] = None, tools: Any = None) -> Dict[str, Any]:
        """Run JavaScript/TypeScript in the sandbox's JS session (js.eval) -> the result
        dict; ``result["text"]`` is what to show a model. Scripts call the registered tools
        as ``await tools.name(input)``."""
        return (yield _call("js_eval", self.id, code, session=session, timeout=timeout,
                            tools=tools))

    def js_reset(self, session: Optional[str] = None) -> Dict[str, Any]:
        """A fresh JS session (js.reset): its globals dropped."""
        return (yield _call("js_reset", self.id, session))

    def js_close(self, session: Optional[str] = None) -> Dict[str, Any]:
        """Close a JS session (js.close)."""
        return (yield _call("js_close", self.id, session))

    def js_sessions(self) -> List[Dict[str, Any]]:
        """The sandbox's JS sessions (js.list)."""
        return (yield _call("js_list", self.id))


class _JobOps:
    job_id: str

    def output(self, stdout_offset: int = 0, stderr_offset: int = 0,
               max_bytes: Optional[int] = None) -> Dict[str, Any]:
        """job.output from the given offsets."""
        return (yield _call("job_output", self.job_id, stdout_offset=stdout_offset or None,
                            stderr_offset=stderr_offset or None, max_bytes=max_bytes))

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """job.wait: ``{"running", "exit_code", "signal"}`` once it ends or ``timeout``."""
        return (yield _call("job_wait", self.job_id, timeout))

    def kill(self, signal: Union[str, int] = "TERM") -> Dict[str, Any]:
        """job.kill."""
        return (yield _call("job_kill", self.job_id, signal))


def _wrap_ops(ops_cls, wrap):
    return {name: wrap(fn) for name, fn in vars(ops_cls).items()
            if callable(fn) and not name.startswith("_")}


class Job:
    """A background command (Sandbox.start)."""

    def __init__(self, client: Client, job_id: str):
        self.client = client
        self.job_id = job_id

    def __repr__(self) -> str:
        return f"Job({self.job_id!r})"


class AsyncJob(Job):
    """A background command (AsyncSandbox.start); methods are coroutines."""


for _n, _m in _wrap_ops(_JobOps, _sync).items():
    setattr(Job, _n, _m)
for _n, _m in _wrap_ops(_JobOps, _async).items():
    setattr(AsyncJob, _n, _m)


class _Lifecycle:
    def __init__(self, client: Any, info: Dict[str, Any], *, keep: bool = False,
                 on_exit: Optional[str] = None, owns_client: bool = False):
        if on_exit not in (None, "commit", "discard"):
            raise ValueError("on_exit must be None, 'commit' or 'discard'")
        self.client = client
        self.info_at_create = info
        self.id: str = info["id"]
        self.keep = keep
        self.on_exit = on_exit
        self.owns_client = owns_client
        self.destroyed = False

    def _exit_action(self, failed: bool) -> Optional[str]:
        if self.on_exit == "commit":
            return "discard" if failed else "commit"
        return self.on_exit

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"


class Sandbox(_Lifecycle):
    """One sandbox, synchronously. Make one with ``Sandbox.create(...)`` (a new sandbox)
    or ``Sandbox(client, {"id": ...})`` (an existing one). As a context manager it is
    destroyed on exit unless ``keep=True``; ``on_exit="commit"`` commits the workspace
    first when the block succeeded (and discards when it raised), ``"discard"`` discards.
    """

    @classmethod
    def create(cls, client: Optional[Client] = None, *, keep: bool = False,
               on_exit: Optional[str] = None, conch_bin: Optional[str] = None,
               socket: Optional[str] = None, state_dir: Optional[str] = None,
               serve_args=DEFAULT_SERVE_ARGS, url: Optional[str] = None,
               token: Optional[str] = None, ca: Optional[str] = None,
               **params: Any) -> "Sandbox":
        """Create a sandbox (params as sandbox.create: workspace, mode, env, memory, ...).
        Without ``client``: connect to ``socket`` when given, or to the remote daemon at
        ``url`` (``token``, ``ca``; else $CONCH_URL, $CONCH_TOKEN, $CONCH_CA when set), else
        spawn a private ``conch serve --stdio`` (closed with the sandbox)."""
        owns = client is None
        if client is None:
            client = (Client.connect(socket) if socket else
                      Client.connect(url=url, token=token, ca=ca)
                      if url or os.environ.get("CONCH_URL") else
                      Client.spawn(conch_bin, state_dir=state_dir, serve_args=serve_args))
        try:
            info = client.sandbox_create(**params)
        except BaseException:
            if owns:
                client.close()
            raise
        return cls(client, info, keep=keep, on_exit=on_exit, owns_client=owns)

    def start(self, command: str, *, cwd: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, stdin: Optional[str] = None) -> Job:
        """Start a background job -> Job (output, wait, kill)."""
        return Job(self.client, self.client.job_start(self.id, command, cwd=cwd, env=env,
                                                      stdin=stdin))

    def session(self, *, shell: Optional[str] = None, cwd: Optional[str] = None,
                env: Optional[Dict[str, str]] = None, rows: Optional[int] = None,
                cols: Optional[int] = None, **params: Any) -> "Session":
        """Open a persistent shell session (session.open params: ``scrollback``,
        ``idle_timeout``, ``attach``...) -> Session; closed when its ``with`` block ends."""
        from .session import Session
        return Session._open(self.client, self.id, dict(
            params, shell=shell, cwd=cwd, env=env, rows=rows, cols=cols))

    def sessions(self) -> List[Dict[str, Any]]:
        """The sandbox's session objects (session.list)."""
        return self.client.session_list(self.id)

    def destroy(self) -> None:
        """Destroy the sandbox now (uncommitted changes are lost)."""
        if not self.destroyed:
            self.destroyed = True
            self.client.sandbox_destroy(self.id)

    def close(self, failed: bool = False) -> None:
        """What leaving the ``with`` block does: on_exit action, destroy unless keep,
        close the client if the sandbox opened it."""
        try:
            action = self._exit_action(failed)
            if action and not self.destroyed:
                getattr(self, action)()
            if not self.keep:
                self.destroy()
        finally:
            if self.owns_client:
                self.client.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.close()
            return
        try:  # the block's own exception is the one to see
            self.close(failed=True)
        except ConchError as e:
            log.warning("conch_client: closing sandbox %s after an error failed: %s", self.id, e)


class AsyncSandbox(_Lifecycle):
    """One sandbox, with coroutine methods. ``async with AsyncSandbox.create(...) as sb``
    or ``sb = await AsyncSandbox.create(...)``; lifecycle as Sandbox."""

    @classmethod
    def create(cls, client: Optional[AsyncClient] = None, **kw: Any) -> "_AsyncCreate":
        """Create a sandbox (see Sandbox.create); await it or use it with ``async with``."""
        return _AsyncCreate(cls, client, kw)

    @classmethod
    async def _create(cls, client: Optional[AsyncClient], *, keep: bool = False,
                      on_exit: Optional[str] = None, conch_bin: Optional[str] = None,
                      socket: Optional[str] = None, state_dir: Optional[str] = None,
                      serve_args=DEFAULT_SERVE_ARGS, url: Optional[str] = None,
                      token: Optional[str] = None, ca: Optional[str] = None,
                      **params: Any) -> "AsyncSandbox":
        owns = client is None
        if client is None:
            client = (await AsyncClient.connect(socket) if socket else
                      await AsyncClient.connect(url=url, token=token, ca=ca)
                      if url or os.environ.get("CONCH_URL") else
                      await AsyncClient.spawn(conch_bin, state_dir=state_dir,
                                              serve_args=serve_args))
        try:
            info = await client.sandbox_create(**params)
        except BaseException:
            if owns:
                await client.close()
            raise
        return cls(client, info, keep=keep, on_exit=on_exit, owns_client=owns)

    async def start(self, command: str, *, cwd: Optional[str] = None,
                    env: Optional[Dict[str, str]] = None, stdin: Optional[str] = None) -> AsyncJob:
        """Start a background job -> AsyncJob."""
        jid = await self.client.job_start(self.id, command, cwd=cwd, env=env, stdin=stdin)
        return AsyncJob(self.client, jid)

    def session(self, *, shell: Optional[str] = None, cwd: Optional[str] = None,
                env: Optional[Dict[str, str]] = None, rows: Optional[int] = None,
                cols: Optional[int] = None, **params: Any) -> "_AsyncSessionOpen":
        """Open a persistent shell session -> AsyncSession: ``s = await sb.session()`` or
        ``async with sb.session() as s`` (closed at the end of the block)."""
        from .session import _AsyncSessionOpen
        return _AsyncSessionOpen(self.client, self.id, dict(
            params, shell=shell, cwd=cwd, env=env, rows=rows, cols=cols))

    async def sessions(self) -> List[Dict[str, Any]]:
        """The sandbox's session objects (session.list)."""
        return await self.client.session_list(self.id)

    async def destroy(self) -> None:
        """Destroy the sandbox now."""
        if not self.destroyed:
            self.destroyed = True
            await self.client.sandbox_destroy(self.id)

    async def close(self, failed: bool = False) -> None:
        """See Sandbox.close."""
        try:
            action = self._exit_action(failed)
            if action and not self.destroyed:
                await getattr(self, action)()
            if not self.keep:
                await self.destroy()
        finally:
            if self.owns_client:
                await self.client.close()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, et, ev, tb) -> None:
        await _aclose(self, et)


class _AsyncCreate:
    """The awaitable / async context manager AsyncSandbox.create returns."""

    def __init__(self, cls, client, kw):
        self._args = (cls, client, kw)
        self._sb: Optional[AsyncSandbox] = None

    def __await__(self):
        cls, client, kw = self._args
        return cls._create(client, **kw).__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sb = await self
        return self._sb

    async def __aexit__(self, et, ev, tb) -> None:
        if self._sb is not None:
            await _aclose(self._sb, et)


async def _aclose(sb: AsyncSandbox, et) -> None:
    if et is None:
        await sb.close()
        return
    try:  # the block's own exception is the one to see
        await sb.close(failed=True)
    except ConchError as e:
        log.warning("conch_client: closing sandbox %s after an error failed: %s", sb.id, e)


for _n, _m in _wrap_ops(_Ops, _sync).items():
    setattr(Sandbox, _n, _m)
for _n, _m in _wrap_ops(_Ops, _async).items():
    setattr(AsyncSandbox, _n, _m)
