# _paths.py - where the daemon's socket and the conch binary are, as docs/PROTOCOL.md and
# `conch serve --help` define it, and the ownership check a client makes before trusting a socket.
from __future__ import annotations

import os
import shutil
import stat
from typing import Optional

from .errors import ConnectionLost


def default_socket_path() -> str:
    """The socket `conch serve` listens on by default: /run/conch/conch.sock as root, else
    $XDG_RUNTIME_DIR/conch/conch.sock, else /tmp/conch-<uid>/conch.sock.
    $CONCH_SOCKET, when set, overrides all three."""
    env = os.environ.get("CONCH_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/conch/conch.sock"
    rt = os.environ.get("XDG_RUNTIME_DIR")
    if rt:
        return os.path.join(rt, "conch", "conch.sock")
    return f"/tmp/conch-{os.getuid()}/conch.sock"


def check_socket(path: str) -> None:
    """Refuse a socket owned by someone other than us or root (they could answer as the
    daemon), as conch's own clients do. Raises ConnectionLost naming the problem."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConnectionLost(f"cannot reach the conch daemon at '{path}': {e.strerror} "
                             "(is `conch serve` running? pass socket=PATH)") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ConnectionLost(f"'{path}' is not a socket")
    if st.st_uid not in (os.geteuid(), 0):
        raise ConnectionLost(f"refusing socket '{path}': owned by uid {st.st_uid}, "
                             f"not by you (uid {os.geteuid()}) or root")


def find_conch_bin(conch_bin: Optional[str] = None) -> str:
    """The conch binary: the argument, else $CONCH_BIN, else `conch` on PATH."""
    cand = conch_bin or os.environ.get("CONCH_BIN")
    if cand:
        if os.sep in cand:
            if not os.access(cand, os.X_OK):
                raise ConnectionLost(f"conch binary '{cand}' is not executable")
            return cand
        found = shutil.which(cand)
        if found:
            return found
        raise ConnectionLost(f"conch binary '{cand}' not found on PATH")
    found = shutil.which("conch")
    if not found:
        raise ConnectionLost("cannot find the conch binary: pass conch_bin=, set CONCH_BIN, "
                             "or put conch on PATH")
    return found


def stdio_argv(conch_bin: Optional[str], state_dir: Optional[str], serve_args) -> list:
    argv = [find_conch_bin(conch_bin), "serve", "--stdio"]
    if state_dir:
        argv += ["--state-dir", str(state_dir)]
    argv += [str(a) for a in (serve_args or ())]
    return argv


def remote_options(socket, url, token, ca):
    """(url, token, ca) of the remote daemon to use, or None for the unix socket: ``url``
    when given, else $CONCH_URL unless a ``socket`` was asked for. The token and CA default
    to $CONCH_TOKEN and $CONCH_CA. The URL is checked here (wss:// only)."""
    if url is None and socket is None:
        url = os.environ.get("CONCH_URL") or None
    if url is None:
        return None
    if socket is not None:
        raise ValueError("give socket= or url=, not both")
    from ._ws import parse_url
    parse_url(str(url))
    if token is None:
        token = os.environ.get("CONCH_TOKEN") or None
    if ca is None:
        ca = os.environ.get("CONCH_CA") or None
    return str(url), token, (str(ca) if ca else None)
