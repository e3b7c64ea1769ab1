# test_files.py - files over the daemon's 10 MiB per request through Sandbox and AsyncSandbox:
# upload, upload_many, download, download_many, write and read move them whole, by
# fs.copy_in / fs.copy_out where the daemon can open our files, else in chunks (fs.read
# offset/length, fs.write append), byte for byte; a real failure keeps its cause.
import hashlib
import os

import pytest

import conch_client.sandbox as sandbox_mod
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


def spy(client):
    """The methods @client sends from now on, in order."""
    sent, orig = [], client._request

    def request(method, params, **kw):
        sent.append(method)
        return orig(method, params, **kw)
    client._request = request
    return sent


def test_100_mib_move_by_fs_copy_both_ways(client, sb, tmp_path):
    big = bytearray(os.urandom(40 * MiB))  # random, then a run of NULs, then random again
    big += bytes(40 * MiB) + os.urandom(20 * MiB)
    big = bytes(big)
    sent = spy(client)
    sb.upload("/workspace/big.bin", big)
    assert sb.run("sha256sum big.bin | cut -c1-64").stdout == sha(big) + "\n"
    assert sha(sb.download("/workspace/big.bin")) == sha(big)
    assert "fs.copy_in" in sent and "fs.copy_out" in sent and "fs.write" not in sent, sent
    # from and to local files, with nothing read into this process
    src, dst = str(tmp_path / "src.bin"), str(tmp_path / "dst.bin")
    with open(src, "wb") as f:
        f.write(big[:3 * MiB])
    sb.upload_file("/workspace/f.bin", src)
    sb.download_file("/workspace/f.bin", dst)
    with open(dst, "rb") as f:
        assert f.read() == big[:3 * MiB]
    # below COPY_MIN a file goes in one request as before
    del sent[:]
    sb.upload("/workspace/small", b"s" * 100)
    assert sent == ["fs.upload"], sent


def test_a_daemon_that_cannot_open_our_files_gets_chunks(client, sb, monkeypatch, tmp_path):
    """A daemon on another host (ssh ... conch serve --stdio) sees other files under our
    paths: its host_id check refuses, and the file moves in chunks instead, as do later ones."""
    other = tmp_path / "other"
    other.write_bytes(b"not ours")
    monkeypatch.setattr(sandbox_mod, "_memfd_path", lambda fd: str(other))
    sent = spy(client)
    data = os.urandom(12 * MiB)
    sb.upload("/workspace/a.bin", data)
    assert sb.download("/workspace/a.bin") == data
    assert sent.count("fs.copy_in") == 1 and "fs.write" in sent, sent
    assert "fs.copy_out" not in sent, sent  # not asked again
    assert other.read_bytes() == b"not ours"


def test_copy_keeps_the_sandbox_side_errors(client, sb, tmp_path):
    src = tmp_path / "s"
    src.write_bytes(os.urandom(2 * MiB))
    with pytest.raises(ConchError) as e:
        sb.upload_file("/etc/x", str(src))
    assert e.value.data_code == "permission_denied", e.value
    with pytest.raises(FileNotFound):
        sb.download_file("/workspace/nope", str(tmp_path / "d"))
    with pytest.raises(ConchError) as e:
        sb.upload("/etc/x", src.read_bytes())
    assert e.value.data_code == "permission_denied", e.value


def test_a_workspace_file_above_the_disk_limit_downloads_in_chunks(client, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    big = os.urandom(12 * MiB)
    (ws / "big.bin").write_bytes(big)
    s = Sandbox(client, client.sandbox_create(workspace=str(ws), disk=4 * MiB))
    try:
        sent = spy(client)
        assert s.download("/workspace/big.bin") == big
        assert "fs.copy_out" in sent and "fs.read" in sent, sent
    finally:
        s.destroy()


def test_many_big_uploads_at_once_all_arrive(aconnect):
    """More transfers at once than the daemon runs per sandbox: the rest move in chunks."""
    import asyncio

    async def go():
        c = await aconnect()
        try:
            async with AsyncSandbox.create(c) as s:
                blobs = [os.urandom(2 * MiB) for _ in range(8)]
                await asyncio.gather(*(s.upload(f"/workspace/{i}.bin", b)
                                       for i, b in enumerate(blobs)))
                got = await asyncio.gather(*(s.download(f"/workspace/{i}.bin")
                                             for i in range(8)))
                assert [sha(g) for g in got] == [sha(b) for b in blobs]
        finally:
            await c.close()
    arun(go())
