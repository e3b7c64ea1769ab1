# _methods.py - every method of docs/PROTOCOL.md as a Python method, shared by the sync
# Client and the AsyncClient: each builds the params and hands them to self._request, which
# returns the result (Client) or an awaitable of it (AsyncClient).
from __future__ import annotations

import base64
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

JSON = Any


def _params(extra: Optional[Mapping[str, Any]] = None, **kw: Any) -> Dict[str, Any]:
    """Params without the arguments left at None (the daemon's defaults apply)."""
    p = {k: v for k, v in kw.items() if v is not None}
    if extra:
        p.update(extra)
    return p


def _b64(data: Union[bytes, bytearray, memoryview, str]) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(bytes(data)).decode("ascii")


def host_id(path_or_fd: Union[str, int]) -> str:
    """``"st_dev:st_ino"`` of a host file as this process sees it: fs.copy_in / copy_out's
    ``host_id``, by which the daemon checks it opened that very file."""
    st = os.fstat(path_or_fd) if isinstance(path_or_fd, int) else os.stat(path_or_fd)
    return f"{st.st_dev}:{st.st_ino}"


def _key(name: str) -> Callable[[Dict[str, Any]], Any]:
    return lambda r: r[name]


def tool_spec(name: str, description: str = "", input_schema: Optional[dict] = None,
              output_schema: Optional[dict] = None,
              timeout: Optional[float] = None) -> Dict[str, Any]:
    """The tools.register entry for one tool (input_schema defaults to any object;
    ``timeout``: seconds its calls may take, default the sandbox's tool_timeout)."""
    t = {"name": name, "description": description or "",
         "input_schema": input_schema if input_schema is not None else {"type": "object"}}
    if output_schema is not None:
        t["output_schema"] = output_schema
    if timeout is not None:
        t["timeout"] = timeout
    return t


class ProtocolMethods:
    """The protocol's methods. Subclasses provide ``_request(method, params, *, post=None,
    on_output=None, timeout=None)`` and ``_registry``."""

    def _request(self, method: str, params: Dict[str, Any], *, post=None, on_output=None,
                 timeout=None):  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    # -- generic ------------------------------------------------------------------------
    def call(self, method: str, params: Optional[Dict[str, Any]] = None, *,
             timeout: Optional[float] = None):
        """Send any request and return its raw result (raises a ConchError on an error).
        ``timeout`` (s) bounds the wait for the answer (RequestTimeout)."""
        return self._request(method, dict(params or {}), timeout=timeout)

    # -- daemon -------------------------------------------------------------------------
    def ping(self):
        """daemon.ping -> ``{"version", "pid", "sandboxes", "pool_ready", "state_dir", "held"}``."""
        return self._request("daemon.ping", {})

    # -- sandbox.* ----------------------------------------------------------------------
    def sandbox_create(self, *, workspace: Optional[str] = None, mode: Optional[str] = None,
                       rootfs: Optional[str] = None, as_root: Optional[bool] = None,
                       env: Optional[Dict[str, str]] = None, memory: Optional[int] = None,
                       pids: Optional[int] = None, cpu: Optional[float] = None,
                       tmp_size: Optional[int] = None, disk: Optional[int] = None,
                       idle_timeout: Optional[float] = None, name: Optional[str] = None,
                       tool_timeout: Optional[float] = None,
                       max_tool_calls: Optional[int] = None,
                       mounts: Optional[List[Union[Dict[str, Any], str]]] = None,
                       net: Optional[str] = None, allow: Optional[List[str]] = None,
                       deny: Optional[List[str]] = None, readonly: Optional[List[str]] = None,
                       hidden: Optional[List[str]] = None,
                       sockets: Optional[List[Union[Dict[str, str], str]]] = None,
                       **extra: Any):
        """sandbox.create -> the sandbox object (``{"id", "state", "workspace", ...}``).

        ``workspace``: absolute host dir mounted at /workspace (none: an empty tmpfs);
        ``mode``: "overlay" (default), "ro" or "rw"; limits in bytes / count / CPUs;
        ``idle_timeout`` in seconds (0 = never); ``tool_timeout`` (s a tool call may wait
        for its answer) and ``max_tool_calls`` (per command) for the tool bridge.
        ``mounts``: extra mounts, each ``{"type": "tmpfs", "target", "size"?}``,
        ``{"type": "bind", "source", "target", "readonly"?}`` (read-only unless
        ``readonly=False``), ``{"type": "store", "name", "target", "size"?}`` (a named
        store, written back after each command: see store_*), ``{"type": "overlay",
        "source", "target"}`` (the host dir through an overlay: writes stay in the daemon's
        upper dir until ``workspace_commit(..., mount=target)``) or docker's
        ``"type=tmpfs,target=/scratch"``.
        ``net``: "none" (default; "allow" when ``allow`` is given), "allow" (HTTP/HTTPS
        through the daemon's proxy by the ``allow``/``deny`` rules: ``"pypi.org"``,
        ``"*.npmjs.org"``, ``"10.0.0.5:8080"``; deny wins) or "host".
        ``readonly`` / ``hidden``: path rules, paths relative to the workspace
        (``[".git/hooks"]``, ``[".env"]``) that commands cannot change / cannot see,
        enforced by the kernel and never committed.
        ``sockets``: host unix sockets passed in (any ``net``), each ``{"host", "path"?}``
        or ``"HOST[:INSIDE]"``: a socket the caller owns, bound at ``path`` (default: its
        host path); set ``SSH_AUTH_SOCK`` in ``env`` yourself for an ssh agent. Extra
        keyword args are passed as params."""
        return self._request("sandbox.create", _params(
            extra, workspace=workspace, mode=mode, rootfs=rootfs, as_root=as_root, env=env,
            memory=memory, pids=pids, cpu=cpu, tmp_size=tmp_size, disk=disk,
            idle_timeout=idle_timeout, name=name, tool_timeout=tool_timeout,
            max_tool_calls=max_tool_calls, mounts=mounts, net=net, allow=allow, deny=deny,
            readonly=readonly, hidden=hidden, sockets=sockets))

    def sandbox_list(self):
        """sandbox.list -> list of sandbox objects (stopped ones included)."""
        return self._request("sandbox.list", {}, post=_key("sandboxes"))

    def sandbox_get(self, id: str):
        """sandbox.get -> the sandbox object (SandboxNotFound if unknown)."""
        return self._request("sandbox.get", {"id": id})

    def sandbox_destroy(self, id: str):
        """sandbox.destroy: kill its processes, drop uncommitted changes -> ``{"destroyed": true}``."""
        return self._request("sandbox.destroy", {"id": id})

    # -- network.* ----------------------------------------------------------------------
    def network_set(self, sandbox: str, *, net: Optional[str] = None,
                    allow: Optional[List[str]] = None, deny: Optional[List[str]] = None):
        """network.set -> ``{"sandbox", "net", "allow", "deny"}``: the lists given replace
        the sandbox's (those left None stay); open connections the new rules refuse are
        closed. ``net`` switches an allow sandbox to "none" and back."""
        return self._request("network.set", _params(sandbox=sandbox, net=net, allow=allow,
                                                    deny=deny))

    def network_log(self, sandbox: str):
        """network.log -> ``{"sandbox", "net", "allow", "deny", "total", "records"}``: the
        sandbox's last 256 network attempts, oldest first (each ``{"host", "port", "kind",
        "allowed", "rule", "error", ...}``)."""
        return self._request("network.log", {"sandbox": sandbox})

    # -- exec.run -----------------------------------------------------------------------
    def exec_run(self, sandbox: Optional[str], command: str, *, cwd: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, stdin: Optional[str] = None,
                 timeout: Optional[float] = None, grace: Optional[float] = None,
                 max_output: Optional[int] = None, fresh: Optional[bool] = None,
                 workspace: Optional[str] = None, mode: Optional[str] = None,
                 changes: Optional[bool] = None, shell: Optional[str] = None,
                 on_output: Optional[Callable[[str, str], Any]] = None, **extra: Any):
        """exec.run: run ``bash -c command`` -> the result dict (exit_code, stdout, stderr,
        text, changes, tool_calls, error...). A failing command is a result, not an error.
        ``changes=False`` leaves the workspace's changes out of the result (the daemon
        then skips scanning for them after the command).
        ``shell="sh"`` runs ``/bin/sh -c command`` instead of bash.

        ``timeout`` is the command's timeout in the sandbox (s; daemon default 120).
        ``on_output(stream, data)`` turns on streaming: it is called for every
        ``exec.output`` notification ("stdout"/"stderr", text), in order, before the
        result is returned. ``sandbox=None, fresh=True`` runs in a throwaway sandbox."""
        p = _params(extra, sandbox=sandbox, command=command, cwd=cwd, env=env, stdin=stdin,
                    timeout=timeout, grace=grace, max_output=max_output, fresh=fresh,
                    workspace=workspace, mode=mode, changes=changes,
                    shell=shell)
        if on_output is not None:
            p["stream"] = True
        return self._request("exec.run", p, on_output=on_output)

    # -- job.* --------------------------------------------------------------------------
    def job_start(self, sandbox: str, command: str, *, cwd: Optional[str] = None,
                  env: Optional[Dict[str, str]] = None, stdin: Optional[str] = None,
                  max_output: Optional[int] = None, **extra: Any):
        """job.start: run a command in the background -> the job id (str)."""
        return self._request("job.start", _params(
            extra, sandbox=sandbox, command=command, cwd=cwd, env=env, stdin=stdin,
            max_output=max_output), post=_key("job_id"))

    def job_output(self, job_id: str, *, stdout_offset: Optional[int] = None,
                   stderr_offset: Optional[int] = None, max_bytes: Optional[int] = None):
        """job.output -> ``{"stdout", "stderr", "stdout_offset", "stderr_offset", "running",
        "exit_code"}``; pass the returned offsets back to read on."""
        return self._request("job.output", _params(
            job_id=job_id, stdout_offset=stdout_offset, stderr_offset=stderr_offset,
            max_bytes=max_bytes))

    def job_wait(self, job_id: str, timeout: Optional[float] = None):
        """job.wait: wait up to ``timeout`` s (daemon default 30) -> ``{"running",
        "exit_code", "signal", ...}``. The request waits as long as the job may."""
        wait = None if timeout is None else timeout + 30
        return self._request("job.wait", _params(job_id=job_id, timeout=timeout),
                             timeout=wait)

    def job_kill(self, job_id: str, signal: Union[str, int, None] = None):
        """job.kill: signal every process of the job (default TERM) -> ``{"killed": true}``."""
        return self._request("job.kill", _params(job_id=job_id, signal=signal))

    def job_list(self, sandbox: Optional[str] = None):
        """job.list -> list of ``{"job_id", "sandbox", "command", "running", "exit_code",
        "started_at"}``."""
        return self._request("job.list", _params(sandbox=sandbox), post=_key("jobs"))

    # -- fs.* ---------------------------------------------------------------------------
    def fs_read(self, sandbox: str, path: str, *, offset: Optional[int] = None,
                limit: Optional[int] = None, encoding: Optional[str] = None, **extra: Any):
        """fs.read -> ``{"content", "offset", "lines", "total_lines", "truncated", "size"}``
        (``offset``/``limit`` in lines); with ``encoding="base64"`` ``{"content", "size"}``."""
        return self._request("fs.read", _params(extra, sandbox=sandbox, path=path,
                                                offset=offset, limit=limit, encoding=encoding))

    def fs_write(self, sandbox: str, path: str, content: Union[str, bytes], *,
                 encoding: Optional[str] = None, **extra: Any):
        """fs.write: create or replace a file (parents created) -> ``{"bytes_written",
        "created"}``. ``bytes`` content travels base64-encoded."""
        if isinstance(content, (bytes, bytearray, memoryview)):
            content, encoding = _b64(content), "base64"
        return self._request("fs.write", _params(extra, sandbox=sandbox, path=path,
                                                 content=content, encoding=encoding))

    def fs_copy_in(self, sandbox: str, path: str, host_path: str, *,
                   host_id: Optional[str] = None):
        """fs.copy_in: the host file ``host_path`` (of any size) becomes ``path``, replaced
        atomically, copied by the daemon's file worker in the kernel (no base64) ->
        ``{"bytes_written", "created"}``. Only where the daemon can open the file itself
        (same machine, same uid): else an InvalidParams on ``host_path``/``host_id``."""
        host_path = os.path.abspath(host_path)
        return self._request("fs.copy_in", _params(
            sandbox=sandbox, path=path, host_path=host_path,
            host_id=host_id if host_id is not None else globals()["host_id"](host_path)))

    def fs_copy_out(self, sandbox: str, path: str, host_path: str, *,
                    host_id: Optional[str] = None):
        """fs.copy_out: ``path`` is copied over the host file ``host_path`` (created or
        truncated here first unless ``host_id`` is given) -> ``{"size"}``. Same conditions
        as fs_copy_in."""
        host_path = os.path.abspath(host_path)
        if host_id is None:
            with open(host_path, "wb"):
                pass
            host_id = globals()["host_id"](host_path)
        return self._request("fs.copy_out", _params(sandbox=sandbox, path=path,
                                                    host_path=host_path, host_id=host_id))

    def fs_edit(self, sandbox: str, path: str, old_string: str, new_string: str, *,
                replace_all: Optional[bool] = None):
        """fs.edit: replace ``old_string`` -> ``{"occurrences"}`` (StringNotFound,
        AmbiguousMatch)."""
        return self._request("fs.edit", _params(sandbox=sandbox, path=path,
                                                old_string=old_string, new_string=new_string,
                                                replace_all=replace_all))

    def fs_ls(self, sandbox: str, path: Optional[str] = None):
        """fs.ls -> list of ``{"name", "path", "type", "size", "mode", "mtime"}``."""
        return self._request("fs.ls", _params(sandbox=sandbox, path=path), post=_key("entries"))

    def fs_glob(self, sandbox: str, pattern: str, *, path: Optional[str] = None,
                max_results: Optional[int] = None, details: Optional[bool] = None):
        """fs.glob -> ``{"paths": [...], "truncated"}``; with ``details=True`` also
        ``"entries": [{"path", "type", "size", "mtime"}]``."""
        return self._request("fs.glob", _params(sandbox=sandbox, pattern=pattern, path=path,
                                                max_results=max_results, details=details))

    def fs_grep(self, sandbox: str, pattern: str, *, path: Optional[str] = None,
                glob: Optional[str] = None, fixed_string: Optional[bool] = None,
                ignore_case: Optional[bool] = None, max_matches: Optional[int] = None):
        """fs.grep (POSIX ERE) -> ``{"matches": [{"path", "line", "text"}], "truncated"}``."""
        return self._request("fs.grep", _params(
            sandbox=sandbox, pattern=pattern, path=path, glob=glob, fixed_string=fixed_string,
            ignore_case=ignore_case, max_matches=max_matches))

    def fs_delete(self, sandbox: str, path: str, *, recursive: Optional[bool] = None):
        """fs.delete -> ``{"deleted": true}`` (a directory needs ``recursive=True``)."""
        return self._request("fs.delete", _params(sandbox=sandbox, path=path,
                                                  recursive=recursive))

    def fs_upload(self, sandbox: str, files: Union[Mapping[str, bytes], Iterable]):
        """fs.upload: ``files`` maps path -> bytes (or is a list of (path, bytes)) ->
        list of ``{"path", "error"?: {"code", "message"}}``, each file on its own."""
        items = files.items() if isinstance(files, Mapping) else files
        return self._request("fs.upload", {"sandbox": sandbox, "files": [
            {"path": p, "content": _b64(c)} for p, c in items]}, post=_key("results"))

    def fs_download(self, sandbox: str, paths: List[str]):
        """fs.download -> list of ``{"path", "content"?: base64 str, "error"?}``."""
        return self._request("fs.download", {"sandbox": sandbox, "paths": list(paths)},
                             post=_key("files"))

    # -- workspace.* --------------------------------------------------------------------
    def workspace_changes(self, sandbox: str, *, offset: Optional[int] = None,
                          limit: Optional[int] = None, since: Optional[str] = None,
                          mount: Optional[str] = None):
        """workspace.changes -> ``{"changes": [...], "changes_total", "changes_truncated",
        "next_offset"?}`` (one page). ``since``: a snapshot (id or name) of the sandbox's
        chain: the changes made after it, against the workspace as it was then. ``mount``:
        the target of an overlay mount, whose changes are meant instead of the workspace's."""
        return self._request("workspace.changes", _params(sandbox=sandbox, offset=offset,
                                                          limit=limit, since=since, mount=mount))

    def workspace_diff(self, sandbox: str, paths: Optional[List[str]] = None, *,
                       since: Optional[str] = None, mount: Optional[str] = None):
        """workspace.diff -> ``{"diff": str, "files": [...], "omitted": int}``. ``since``,
        ``mount``: as for workspace_changes."""
        return self._request("workspace.diff", _params(sandbox=sandbox, paths=paths,
                                                       since=since, mount=mount))

    def workspace_commit(self, sandbox: str, paths: Optional[List[str]] = None, *,
                         mount: Optional[str] = None):
        """workspace.commit: apply changes to the host -> ``{"committed", "skipped"}``.
        ``mount``: an overlay mount's changes, to its source dir."""
        return self._request("workspace.commit", _params(sandbox=sandbox, paths=paths,
                                                         mount=mount))

    def workspace_discard(self, sandbox: str, paths: Optional[List[str]] = None):
        """workspace.discard -> ``{"discarded": [...]}`` (restarts a running sandbox)."""
        return self._request("workspace.discard", _params(sandbox=sandbox, paths=paths))

    def workspace_snapshot(self, sandbox: str, *, name: Optional[str] = None,
                           force: Optional[bool] = None):
        """workspace.snapshot -> the snapshot ``{"id", "name"?, "parent"?, "size", ...}``
        (restarts the sandbox; ``busy`` while commands, jobs or sessions run unless force)."""
        return self._request("workspace.snapshot", _params(sandbox=sandbox, name=name,
                                                           force=force))

    def workspace_restore(self, sandbox: str, snapshot: str, *, force: Optional[bool] = None):
        """workspace.restore: return the workspace to @snapshot (id or name)."""
        return self._request("workspace.restore", _params(sandbox=sandbox, snapshot=snapshot,
                                                          force=force))

    def workspace_snapshots(self, sandbox: Optional[str] = None):
        """workspace.snapshots -> ``{"snapshots": [...]}`` (all, or one sandbox's)."""
        return self._request("workspace.snapshots", _params(sandbox=sandbox))

    def workspace_snapshot_delete(self, snapshot: str):
        """workspace.snapshot_delete (refused with snapshot_in_use while others build on it)."""
        return self._request("workspace.snapshot_delete", _params(snapshot=snapshot))

    # -- store.* (named stores; a sandbox mounts one with {"type": "store", "name", "target"})
    def store_list(self):
        """store.list -> ``{"stores": [{"name", "bytes", "entries", "max_bytes", "version"}]}``."""
        return self._request("store.list", {})

    def store_ls(self, store: str, path: str = ""):
        """store.ls -> ``{"store", "entries": [{"name", "path", "type", "size", "mode",
        "mtime", "writer"}]}`` (the dir ``path``; "" is the root)."""
        return self._request("store.ls", _params(store=store, path=path))

    def store_read(self, store: str, path: str, *, encoding: Optional[str] = None):
        """store.read -> the entry plus ``content`` and ``encoding`` ("utf-8" when the file is
        text, else "base64"; ``encoding="base64"`` asks for base64 always)."""
        return self._request("store.read", _params(store=store, path=path, encoding=encoding))

    def store_write(self, store: str, path: str, content: str, *,
                    encoding: Optional[str] = None, mode: Optional[int] = None):
        """store.write: the file ``path`` (parent dirs made; the store made if missing), in one
        transaction -> ``{"store", "path", "size"}``. ``encoding``: "utf-8" (default) or
        "base64". Refused with ``limit`` past the store's caps."""
        return self._request("store.write", _params(store=store, path=path, content=content,
                                                    encoding=encoding, mode=mode))

    def store_delete(self, store: str, path: str):
        """store.delete: a file, or a dir with what is in it -> ``{"store", "path"}``."""
        return self._request("store.delete", _params(store=store, path=path))

    def sandbox_fork(self, *, sandbox: Optional[str] = None, snapshot: Optional[str] = None,
                     name: Optional[str] = None, force: Optional[bool] = None):
        """sandbox.fork -> the new sandbox, from a sandbox (snapshotted first) or a snapshot;
        given both, the snapshot, which must be one of that sandbox's (else invalid_params).
        A fork served by a pre-built sandbox of the daemon's pool says ``"from_pool": True``."""
        return self._request("sandbox.fork", _params(sandbox=sandbox, snapshot=snapshot,
                                                     name=name, force=force))

    # -- session.* (persistent shells on a terminal) ----------------------------------
    def session_open(self, sandbox: str, *, shell: Optional[str] = None,
                     cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                     rows: Optional[int] = None, cols: Optional[int] = None,
                     scrollback: Optional[int] = None, idle_timeout: Optional[float] = None,
                     attach: Optional[bool] = None, **extra: Any):
        """session.open: a long-lived bash on a terminal of the sandbox -> the session
        object (``{"session", "sandbox", "state", "clients", "writer", "rows", "cols",
        ...}``). ``attach=True`` attaches this connection as the writer."""
        return self._request("session.open", _params(
            extra, sandbox=sandbox, shell=shell, cwd=cwd, env=env, rows=rows, cols=cols,
            scrollback=scrollback, idle_timeout=idle_timeout, attach=attach))

    def session_run(self, session: str, command: str, *, stdin: Optional[str] = None,
                    timeout: Optional[float] = None, grace: Optional[float] = None,
                    max_output: Optional[int] = None, **extra: Any):
        """session.run: run ``command`` in the session's shell (cwd, exports, functions,
        aliases, venvs persist) -> the exec.run result plus ``session``, ``shell_exited``,
        ``new_shell`` and, after a timeout, ``session_usable``. ``timeout`` (s, daemon
        default 120) is the command's; the request waits for it (runs queue in order)."""
        wait = None
        if self.timeout is not None:  # type: ignore[attr-defined]
            wait = max(self.timeout,  # type: ignore[attr-defined]
                       (120 if timeout is None else timeout) + (grace or 2) + 30)
        return self._request("session.run", _params(
            extra, session=session, command=command, stdin=stdin, timeout=timeout,
            grace=grace, max_output=max_output), timeout=wait)

    def session_write(self, session: str, data: str):
        """session.write: keys to the session's terminal -> the number of bytes written
        (NotWriter when another client is the writer)."""
        return self._request("session.write", {"session": session, "data": data},
                             post=_key("written"))

    def session_attach(self, session: str, write: Optional[bool] = None):
        """session.attach: receive its session.output notifications -> the session object
        plus ``scrollback``, ``seq``, ``next_seq``, ``you_write``. ``write=True`` takes the
        keyboard (the previous writer gets session.writer)."""
        return self._request("session.attach", _params(session=session, write=write))

    def session_detach(self, session: str):
        """session.detach -> True when this connection was attached."""
        return self._request("session.detach", {"session": session}, post=_key("detached"))

    def session_resize(self, session: str, rows: int, cols: int):
        """session.resize: the terminal's size (the program gets SIGWINCH) -> ``{"rows",
        "cols"}``."""
        return self._request("session.resize", {"session": session, "rows": rows,
                                                "cols": cols})

    def session_signal(self, session: str, signal: Union[str, int, None] = None):
        """session.signal: to the terminal's foreground process group (default INT) ->
        the signal number."""
        return self._request("session.signal", _params(session=session, signal=signal),
                             post=_key("signal"))

    def session_list(self, sandbox: Optional[str] = None):
        """session.list -> list of session objects (ended ones included)."""
        return self._request("session.list", _params(sandbox=sandbox), post=_key("sessions"))

    def session_close(self, session: str):
        """session.close: kill the shell and forget the session -> ``{"closed": true}``."""
        return self._request("session.close", {"session": session})

    # -- js.* (JavaScript/TypeScript sessions) ------------------------------------------
    def js_eval(self, sandbox: str, code: str, *, session: Optional[str] = None,
                timeout: Optional[float] = None, tools: Any = None, **extra: Any):
        """js.eval: run JavaScript or TypeScript in the sandbox's JS session ``session``
        (default "default"; globals persist between evals) -> the result dict (``ok``,
        ``value``, ``error``, ``console``, ``tool_calls``, ``text``, ...). A script that
        throws is a result (``ok`` false), not an error. The script calls the sandbox's
        registered tools as ``await tools.name(input)`` (camelCase too). ``timeout``: seconds
        (daemon default 60; 0: none). ``tools``: which registered tools the session sees,
        kept until changed: ``"all"`` (default), ``"none"``, ``{"include": [...]}`` or
        ``{"exclude": [...]}``."""
        return self._request("js.eval", _params(extra, sandbox=sandbox, code=code,
                                                session=session, timeout=timeout, tools=tools))

    def js_reset(self, sandbox: str, session: Optional[str] = None):
        """js.reset: drop the session's globals (an eval in flight is cancelled) ->
        ``{"session", "reset": true}``."""
        return self._request("js.reset", _params(sandbox=sandbox, session=session))

    def js_close(self, sandbox: str, session: Optional[str] = None):
        """js.close: stop the session's worker and forget it -> ``{"session", "closed"}``."""
        return self._request("js.close", _params(sandbox=sandbox, session=session))

    def js_list(self, sandbox: str):
        """js.list -> the sandbox's JS sessions ``[{session, running, busy, lost, evals}]``."""
        return self._request("js.list", {"sandbox": sandbox}, post=_key("sessions"))

    # -- tools.* / agents.* (the tool bridge) -------------------------------------------
    def tools_register(self, sandbox: str, tools: List[Dict[str, Any]]):
        """tools.register (raw): declare tools; THIS connection answers their tool.call
        requests (give handlers with register_tool) -> list of registered names."""
        return self._request("tools.register", {"sandbox": sandbox, "tools": list(tools)},
                             post=_key("registered"))

    def tools_unregister(self, sandbox: str, names: List[str]):
        """tools.unregister -> list of removed names."""
        for n in names:
            self._registry.remove_tool(sandbox, n)
        return self._request("tools.unregister", {"sandbox": sandbox, "names": list(names)},
                             post=_key("removed"))

    def tools_list(self, sandbox: str):
        """tools.list -> ``{"tools": [...], "agents": [...]}``."""
        return self._request("tools.list", {"sandbox": sandbox})

    def tools_trace(self, sandbox: str, origin: Optional[Dict[str, Any]] = None):
        """tools.trace -> list of call records ``{call_id, kind, name, input, ok, result?,
        error?, start, duration_ms, origin, detached?}``."""
        return self._request("tools.trace", _params(sandbox=sandbox, origin=origin),
                             post=_key("calls"))

    def tools_prompt(self, sandbox: str, languages: Optional[List[str]] = None):
        """tools.prompt -> the text documenting the sandbox's tools for a model (str).
        ``languages``: any of "bash", "python", "node" (the default: all three) and "js"
        (js.eval's ``tools`` global as TypeScript declarations)."""
        return self._request("tools.prompt", _params(sandbox=sandbox, languages=languages),
                             post=_key("text"))

    def agents_register(self, sandbox: str, agents: List[Dict[str, Any]]):
        """agents.register (raw): declare agent types ``[{name, description}]``; THIS
        connection answers agent.spawn -> list of registered names."""
        return self._request("agents.register", {"sandbox": sandbox, "agents": list(agents)},
                             post=_key("registered"))

    def agents_unregister(self, sandbox: str, names: List[str]):
        """agents.unregister -> list of removed names."""
        for n in names:
            self._registry.remove_agent(sandbox, n)
        return self._request("agents.unregister", {"sandbox": sandbox, "names": list(names)},
                             post=_key("removed"))

    def register_tool(self, sandbox: str, name: str, fn: Callable, description: str = "",
                      input_schema: Optional[dict] = None,
                      output_schema: Optional[dict] = None, timeout: Optional[float] = None):
        """Register a tool with the daemon and answer its tool.call requests with ``fn``.

        ``fn(input)`` or ``fn(input, ctx)`` (ctx: CallContext), sync or async: its return
        value (any JSON) is the result; an exception becomes a JSON-RPC error whose message
        reaches the caller in the sandbox (raise ToolError to choose code/data).
        ``timeout``: seconds its calls may take. Returns the registered names."""
        self._registry.add_tool(sandbox, name, fn)
        return self.tools_register(sandbox, [tool_spec(name, description, input_schema,
                                                       output_schema, timeout)])

    def register_agent(self, sandbox: str, name: Optional[str], description: str,
                       fn: Callable):
        """Register an agent type and answer agent.spawn for it with ``fn(task)`` or
        ``fn(task, ctx)`` (sync or async; the return value is the agent's answer).
        The daemon sends spawns without a type to the connection that registered the
        first agent type; this client gives them to the handler registered with
        ``name=None`` (which declares nothing to the daemon and returns []), else to the
        sandbox's first registered agent type."""
        self._registry.add_agent(sandbox, name, fn)
        if name is None:
            return self._request_done([])
        return self.agents_register(sandbox, [{"name": name, "description": description}])

    def set_request_handler(self, method: str, fn: Optional[Callable]) -> None:
        """Answer daemon->client requests of ``method`` with ``fn(params, ctx)`` (sync or
        async); overrides the built-in tool.call/agent.spawn dispatch. None removes it."""
        self._registry.set_method(method, fn)

    def _request_done(self, value):  # pragma: no cover - provided by subclasses
        raise NotImplementedError
