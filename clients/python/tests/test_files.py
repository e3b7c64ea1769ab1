# test_files.py - files over the daemon's 10 MiB per request through Sandbox and AsyncSandbox:
# upload, upload_many, download, download_many, write and read move them whole in chunks
# (fs.read offset/length, fs.write append), byte for byte; a real failure keeps its cause.
import hashlib
import os

import pytest

from conch_client import AsyncSandbox, ConchError, FileNotFound, Sandbox
from conftest import arun

MiB = 1 << 20


@pytest.fixture
def sb(client):
    s = Sandbox(client, client.sandbox_create())
    yield s
    s.destroy()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def test_upload_and_download_over_10_mib(sb):
    big = os.urandom(23 * MiB + 7)
    sb.upload("/workspace/big.bin", big)
    r = sb.run("stat -c %s big.bin; sha256sum big.bin | cut -c1-64")
    assert r.stdout == f"{len(big)}\n{sha(big)}\n", r.text
    assert sha(sb.download("/workspace/big.bin")) == sha(big)
    got = sb.upload_many({"/workspace/b2.bin": big[:11 * MiB], "/workspace/s.txt": b"small"})
    assert got == {"/workspace/b2.bin": None, "/workspace/s.txt": None}
    many = sb.download_many(["/workspace/b2.bin", "/workspace/s.txt", "/workspace/nope"])
    assert many["/workspace/b2.bin"] == big[:11 * MiB] and many["/workspace/s.txt"] == b"small"
    assert isinstance(many["/workspace/nope"], FileNotFound)


def test_write_and_read_text_over_10_mib(sb):
    line = "x" * 99 + "\n"
    n = 12 * MiB // len(line) + 1
    text = line * (n - 1) + "last\n"
    assert sb.write("/workspace/big.txt", text)["bytes_written"] == len(text)
    assert sb.run("wc -l < big.txt; tail -n1 big.txt").stdout == f"{n}\nlast\n"
    assert sb.read("/workspace/big.txt", offset=n - 2, limit=5) == line + "last\n"


def test_a_real_failure_keeps_its_cause(client):
    s = Sandbox(client, client.sandbox_create(disk=4 * MiB))
    try:
        with pytest.raises(ConchError) as e:
            s.upload("/workspace/fill.bin", os.urandom(12 * MiB))
        assert e.value.data_code in ("too_large", "limit") and "disk" in str(e.value), e.value
    finally:
        s.destroy()


def test_async_sandbox_moves_big_files(aconnect):
    async def go():
        c = await aconnect()
        try:
            async with AsyncSandbox.create(c) as s:
                data = os.urandom(15 * MiB)
                await s.upload("/workspace/a.bin", data)
                assert await s.download("/workspace/a.bin") == data
        finally:
            await c.close()
    arun(go())
