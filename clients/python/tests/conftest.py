# conftest.py - fixtures of conch_client's own tests: the real conch binary ($CONCH_BIN,
# else the repo's build/conch), a daemon on a socket in a temp dir (one per module), and
# sync/async clients over `conch serve --stdio` and over that socket.
import asyncio
import os
import shutil
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CONCH_BIN = os.environ.get("CONCH_BIN") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "build", "conch"))
if os.environ.get("CONCH_BIN") and not os.access(CONCH_BIN, os.X_OK):
    # asked for a binary that is not there: fail loudly rather than skip everything
    raise RuntimeError(f"CONCH_BIN={CONCH_BIN} is not an executable")


def serve_args():
    return ["--pool", "0", "--idle-timeout", "0"]


def have_bin():
    return os.access(CONCH_BIN, os.X_OK)


@pytest.fixture(scope="session")
def conch_bin():
    if not have_bin():
        pytest.skip(f"no conch binary at {CONCH_BIN} (build it, or set CONCH_BIN)")
    return CONCH_BIN


class SocketDaemon:
    """`conch serve --socket DIR/conch.sock --state-dir DIR/state` running for a module."""

    def __init__(self, bin_):
        self.dir = tempfile.mkdtemp(prefix="cc-d-")
        os.chmod(self.dir, 0o700)
        self.sock = os.path.join(self.dir, "conch.sock")
        self.state = os.path.join(self.dir, "state")
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(
            [bin_, "serve", "--socket", self.sock, "--state-dir", self.state, *serve_args()],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.time() + 15
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"conch serve did not start: {self.logtext()}")
            time.sleep(0.02)

    def logtext(self):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def socket_daemon(conch_bin):
    d = SocketDaemon(conch_bin)
    yield d
    d.stop()


@pytest.fixture
def state_dir():
    d = tempfile.mkdtemp(prefix="cc-s-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["stdio", "socket"])
def transport(request):
    return request.param


@pytest.fixture
def client(transport, conch_bin, state_dir, request):
    """A sync conch_client.Client over stdio or over the module's socket daemon."""
    from conch_client import Client
    if transport == "stdio":
        c = Client.spawn(conch_bin, state_dir=state_dir, serve_args=serve_args(), timeout=120)
    else:
        c = Client.connect(request.getfixturevalue("socket_daemon").sock, timeout=120)
    yield c
    c.close()


@pytest.fixture
def ws():
    """A host workspace directory with two files."""
    d = tempfile.mkdtemp(prefix="cc-ws-")
    with open(os.path.join(d, "hello.txt"), "w") as f:
        f.write("hello\nworld\n")
    os.mkdir(os.path.join(d, "src"))
    with open(os.path.join(d, "src", "main.py"), "w") as f:
        f.write("print('hi')\n")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def aconnect(transport, conch_bin, state_dir, request):
    """An async factory of conch_client.AsyncClient over stdio or the socket daemon."""
    from conch_client import AsyncClient
    sock = request.getfixturevalue("socket_daemon").sock if transport == "socket" else None

    async def make():
        if sock:
            return await AsyncClient.connect(sock, timeout=120)
        return await AsyncClient.spawn(conch_bin, state_dir=state_dir,
                                       serve_args=serve_args(), timeout=120)
    return make


def arun(coro, timeout=120):
    """Run a coroutine to completion with a deadline (no pytest-asyncio in Debian 12)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def pytest_report_header(config):
    import conch_client
    return [f"conch_client from {os.path.dirname(conch_client.__file__)}", f"conch: {CONCH_BIN}"]
