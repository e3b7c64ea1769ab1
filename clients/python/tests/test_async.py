# test_async.py - AsyncClient and AsyncSandbox against the real `conch serve` (stdio and
# socket): every method family as coroutines, streaming with async callbacks, notification
# iterators, errors, binary and big files, 50 concurrent runs with asyncio.gather.
import asyncio
import hashlib
import os

import pytest

from conch_client import (AmbiguousMatch, AsyncClient, AsyncSandbox, ConnectionLost,
                          FileNotFound, InvalidParams, InvalidPath, JobNotFound, MethodNotFound,
                          SandboxNotFound, StringNotFound)
from conftest import arun


def with_client(aconnect, body):
    async def main():
        c = await aconnect()
        try:
            return await body(c)
        finally:
            await c.close()
    return arun(main())


def test_ping_and_sandboxes(aconnect, ws):
    async def body(c):
        assert (await c.ping())["pid"] > 0
        info = await c.sandbox_create(workspace=ws, name="async")
        assert info["id"] in [s["id"] for s in await c.sandbox_list()]
        assert (await c.sandbox_get(info["id"]))["name"] == "async"
        await c.sandbox_destroy(info["id"])
        with pytest.raises(SandboxNotFound):
            await c.sandbox_get(info["id"])
    with_client(aconnect, body)


def test_run_stream_and_errors(aconnect):
    async def body(c):
        async with AsyncSandbox.create(c) as sb:
            got = []

            async def on_output(stream, data):
                await asyncio.sleep(0)
                got.append((stream, data))
            r = await sb.run("echo a; sleep 0.05; echo b; echo c >&2; exit 2",
                             on_output=on_output)
            assert (r.exit_code, r.stdout, r.stderr) == (2, "a\nb\n", "c\n")
            assert "".join(d for s, d in got if s == "stdout") == "a\nb\n"
            assert ("stderr", "c\n") in got
            r = await sb.run("echo $V; pwd", env={"V": "v"}, cwd="/tmp", timeout=10)
            assert r.ok and r.stdout == "v\n/tmp\n"
            with pytest.raises(InvalidParams) as ei:
                await sb.run("true", timeout=1e9)
            assert ei.value.param == "timeout"
            with pytest.raises(MethodNotFound):
                await c.call("no.such")
        assert sb.destroyed
        with pytest.raises(SandboxNotFound):
            await c.sandbox_get(sb.id)
    with_client(aconnect, body)


def test_jobs_and_notifications(aconnect):
    async def body(c):
        async with AsyncSandbox.create(c) as sb:
            sub = c.subscribe("job.exited")
            job = await sb.start("echo started; exit 7")
            w = await job.wait(10)
            assert w["exit_code"] == 7 and not w["running"]
            assert (await job.output())["stdout"] == "started\n"
            n = await sub.get(timeout=10)
            assert n.params["job_id"] == job.job_id and n.params["exit_code"] == 7
            sub.close()
            long = await sb.start("sleep 30")
            await long.kill()
            assert (await long.wait(10))["running"] is False
            assert {j["job_id"] for j in await sb.jobs()} == {job.job_id, long.job_id}
            with pytest.raises(JobNotFound):
                await c.job_output("job-none")
    with_client(aconnect, body)


def test_fs_and_workspace(aconnect, ws):
    async def body(c):
        async with AsyncSandbox.create(c, workspace=ws, on_exit="commit") as sb:
            await sb.write("d/x.txt", "alpha\nbeta\n")
            assert await sb.read("d/x.txt") == "alpha\nbeta\n"
            assert await sb.edit("d/x.txt", "beta", "gamma") == 1
            with pytest.raises(StringNotFound):
                await sb.edit("d/x.txt", "beta", "gamma")
            await sb.write("d/y.txt", "a a")
            with pytest.raises(AmbiguousMatch):
                await sb.edit("d/y.txt", "a", "b")
            assert [e["name"] for e in await sb.ls("d")] == ["x.txt", "y.txt"]
            assert await sb.glob("d/*.txt") == ["/workspace/d/x.txt", "/workspace/d/y.txt"]
            assert (await sb.grep("gam+a"))[0]["line"] == 2
            await sb.delete("d/y.txt")
            with pytest.raises(FileNotFound):
                await sb.read("d/y.txt")
            with pytest.raises(InvalidPath):
                await sb.read("bad\x00name")  # fs.* reach the whole sandbox: only malformed paths are invalid
            kinds = {ch["path"]: ch["kind"] for ch in await sb.changes()}
            assert kinds == {"d": "added", "d/x.txt": "added"}
            assert "+gamma" in await sb.diff()
        assert open(os.path.join(ws, "d", "x.txt")).read() == "alpha\ngamma\n"
        async with AsyncSandbox.create(c, workspace=ws) as sb:
            await sb.write("hello.txt", "changed")
            assert await sb.discard() == ["hello.txt"]
            assert await sb.read("hello.txt") == "hello\nworld\n"
    with_client(aconnect, body)


def test_binary_and_big_files(aconnect):
    async def body(c):
        async with AsyncSandbox.create(c) as sb:
            small = b"\x00\xff\x80" + bytes(range(256))
            await sb.upload("s.bin", small)
            assert await sb.download("s.bin") == small
            big = os.urandom(8 << 20)
            await sb.upload("b.bin", big)
            assert await sb.download("b.bin") == big
            r = await sb.run("sha256sum b.bin")
            assert r.stdout.split()[0] == hashlib.sha256(big).hexdigest()
            got = await sb.download_many(["s.bin", "nope"])
            assert got["s.bin"] == small and isinstance(got["nope"], FileNotFound)
    with_client(aconnect, body)


def meet(n, where, i):
    """A command that announces itself in the sandbox's /tmp/@where and waits until @n have
    (60 s at most), then prints @i; alone (run one after the other) it prints "alone"."""
    return (f"mkdir -p /tmp/{where}; touch /tmp/{where}/{i}; "
            f"for t in $(seq 600); do [ $(ls /tmp/{where} | wc -l) -ge {n} ] && break; sleep 0.1; done; "
            f"if [ $(ls /tmp/{where} | wc -l) -ge {n} ]; then echo {i}; else echo alone; fi")


def test_fifty_concurrent_runs(aconnect):
    async def body(c):
        async with AsyncSandbox.create(c) as sb:
            # all 50 meet at a barrier: run in turn, the first would say "alone"
            rs = await asyncio.gather(*[sb.run(meet(50, "meet50", i), timeout=100) for i in range(50)])
            assert [r.stdout for r in rs] == [f"{i}\n" for i in range(50)]
    with_client(aconnect, body)


def test_private_daemon_and_connection_lost(conch_bin, state_dir):
    async def body():
        async with AsyncSandbox.create(conch_bin=conch_bin, state_dir=state_dir) as sb:
            assert (await sb.run("echo hi")).stdout == "hi\n"
            client = sb.client
        assert client.closed
        assert client.process.returncode == 0
        with pytest.raises(ConnectionLost):
            await client.ping()
        c = await AsyncClient.spawn(conch_bin, state_dir=state_dir)
        sid = (await c.sandbox_create())["id"]
        pending = asyncio.ensure_future(c.exec_run(sid, "sleep 30"))
        await asyncio.sleep(0.3)
        c.process.kill()
        with pytest.raises(ConnectionLost):
            await pending
        await c.close()
    arun(body())
