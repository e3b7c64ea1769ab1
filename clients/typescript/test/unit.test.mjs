// unit.test.mjs - the JSON-RPC client and ConchSandbox against a fake daemon on in-memory
// streams: id matching, notifications, daemon->client requests and $/cancel, typed errors,
// and ConchSandbox's result shapes for scripted daemon answers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ConchClient, ConchError } from "../dist/index.js";
import { ConchSandbox } from "../dist/deepagents.js";
import { fakeDaemon, serveFake } from "./helpers.mjs";

test("concurrent requests are matched by id whatever the answer order", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const p1 = c.ping();
  const p2 = c.sandboxGet("sb-1");
  const r1 = await fd.next((m) => m.method === "daemon.ping");
  const r2 = await fd.next((m) => m.method === "sandbox.get");
  assert.equal(r1.jsonrpc, "2.0");
  assert.deepEqual(r2.params, { id: "sb-1" });
  assert.notEqual(r1.id, r2.id);
  fd.send({ jsonrpc: "2.0", id: r2.id, result: { id: "sb-1", state: "running" } });
  fd.send({ jsonrpc: "2.0", id: r1.id, result: { version: "0.1.0", pid: 7, sandboxes: 1 } });
  assert.equal((await p2).state, "running");
  assert.equal((await p1).pid, 7);
});

test("errors are ConchError with code, data.code and kind; a batch answer is split", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const p = c.fsRead("sb-1", "nope");
  const q = c.ping();
  const r = await fd.next((m) => m.method === "fs.read");
  const r2 = await fd.next((m) => m.method === "daemon.ping");
  fd.send([
    { jsonrpc: "2.0", id: r.id, error: { code: -32010, message: "open 'nope': no such file", data: { code: "file_not_found", kind: "usage" } } },
    { jsonrpc: "2.0", id: r2.id, result: { pid: 1 } },
  ]);
  await assert.rejects(p, (e) => e instanceof ConchError && e.code === -32010 && e.data.code === "file_not_found" && e.dataCode === "file_not_found" && e.kind === "usage" && /no such file/.test(e.message));
  assert.equal((await q).pid, 1);
});

test("notifications arrive as events and through events(); exec.output goes to the right stream callback", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const seen = [];
  c.on("job.exited", (p) => seen.push(p.job_id));
  const ac = new AbortController();
  const it = c.events("job.exited", ac.signal);
  const firstP = it.next();
  const chunks = [];
  const run = c.execRun({ sandbox: "sb-1", command: "echo hi" }, (e) => chunks.push(e.data));
  const req = await fd.next((m) => m.method === "exec.run");
  assert.equal(req.params.stream, true);
  fd.send({ jsonrpc: "2.0", method: "exec.output", params: { request_id: req.id + 1000, stream: "stdout", data: "not mine\n" } });
  fd.send({ jsonrpc: "2.0", method: "exec.output", params: { request_id: req.id, stream: "stdout", data: "hi\n" } });
  fd.send({ jsonrpc: "2.0", method: "job.exited", params: { job_id: "job-1", sandbox: "sb-1", exit_code: 0, signal: null } });
  fd.send({ jsonrpc: "2.0", id: req.id, result: { exit_code: 0, stdout: "hi\n", text: "hi\n[exit code: 0]" } });
  const res = await run;
  assert.equal(res.exit_code, 0);
  assert.deepEqual(chunks, ["hi\n"]);
  assert.deepEqual(seen, ["job-1"]);
  assert.equal((await firstP).value.job_id, "job-1");
  ac.abort();
  assert.equal((await it.next()).done, true);
});

test("execStream yields output events and returns the result", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const gen = c.execStream({ sandbox: "sb-1", command: "x" });
  const firstP = gen.next();
  const req = await fd.next((m) => m.method === "exec.run");
  fd.send({ jsonrpc: "2.0", method: "exec.output", params: { request_id: req.id, stream: "stderr", data: "e" } });
  fd.send({ jsonrpc: "2.0", id: req.id, result: { exit_code: 2 } });
  assert.deepEqual((await firstP).value, { request_id: req.id, stream: "stderr", data: "e" });
  const last = await gen.next();
  assert.equal(last.done, true);
  assert.equal(last.value.exit_code, 2);
});

test("daemon->client requests reach their handler and are answered; errors and unknown methods too", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  c.onRequest("tool.call", async (p) => {
    if (p.name === "bad") throw new Error("the tool failed: boom");
    return { echo: p.input };
  });
  fd.send({ jsonrpc: "2.0", id: "d1", method: "tool.call", params: { sandbox: "sb", call_id: "c1", name: "echo", input: { a: 1 }, origin: { kind: "exec", id: "x" } } });
  fd.send({ jsonrpc: "2.0", id: 2, method: "tool.call", params: { sandbox: "sb", call_id: "c2", name: "bad", input: {}, origin: { kind: "exec", id: "x" } } });
  fd.send({ jsonrpc: "2.0", id: 3, method: "agent.spawn", params: { sandbox: "sb", call_id: "c3", task: "t", type: null } });
  const a1 = await fd.next((m) => m.id === "d1");
  assert.deepEqual(a1.result, { echo: { a: 1 } });
  const a2 = await fd.next((m) => m.id === 2);
  assert.match(a2.error.message, /boom/);
  assert.equal(typeof a2.error.code, "number");
  const a3 = await fd.next((m) => m.id === 3);
  assert.equal(a3.error.code, -32601);
  assert.equal(a3.error.data.code, "method_not_found");
});

test("$/cancel aborts the handler's signal and no late answer is sent", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  let aborted = null;
  let release;
  c.onRequest("tool.call", (p, { signal }) => new Promise((res) => {
    signal.addEventListener("abort", () => (aborted = signal.reason));
    release = () => res("late");
  }));
  fd.send({ jsonrpc: "2.0", id: 9, method: "tool.call", params: { sandbox: "sb", call_id: "call-9", name: "slow", input: {}, origin: { kind: "exec", id: "x" } } });
  await new Promise((r) => setTimeout(r, 30));
  fd.send({ jsonrpc: "2.0", method: "$/cancel", params: { call_id: "call-9", reason: "the command ended" } });
  await new Promise((r) => setTimeout(r, 30));
  assert.ok(aborted, "signal aborted");
  assert.match(aborted.message, /the command ended/);
  release();
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(fd.received.filter((m) => m.id === 9).length, 0, "no answer after $/cancel");
});

test("a closed connection rejects pending and later requests with a transport error", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const p = c.ping();
  await fd.next((m) => m.method === "daemon.ping");
  fd.end();
  await assert.rejects(p, (e) => e instanceof ConchError && e.data.code === "transport");
  await assert.rejects(c.ping(), (e) => e instanceof ConchError && e.data.code === "transport");
});

test("unparseable lines are reported and skipped", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const bad = [];
  c.rpc.on("protocol-error", (line) => bad.push(line));
  const p = c.ping();
  const r = await fd.next((m) => m.method === "daemon.ping");
  fd.sendRaw("{not json\n");
  fd.sendRaw(JSON.stringify({ jsonrpc: "2.0", id: r.id, result: { pid: 3 } }).slice(0, 10));
  fd.sendRaw(JSON.stringify({ jsonrpc: "2.0", id: r.id, result: { pid: 3 } }).slice(10) + "\n");
  assert.equal((await p).pid, 3);
  assert.deepEqual(bad, ["{not json"]);
});

test("line framing: a line in many pieces, many lines in one piece, UTF-8 split between pieces", async () => {
  const fd = fakeDaemon();
  const c = await ConchClient.connect({ transport: fd.transport });
  const ps = [c.ping(), c.ping(), c.ping(), c.ping()];
  const ids = [];
  for (let i = 0; i < 4; i++) ids.push((await fd.next((m) => m.method === "daemon.ping" && !ids.includes(m.id))).id);
  const big = "é日\u2028x\n".repeat(40000);
  const line = (id, v) => JSON.stringify({ jsonrpc: "2.0", id, result: { v } }) + "\n";
  // The first answer a byte at a time for a while (a two-byte character cut in half), then in 1000-byte pieces.
  const b = Buffer.from(line(ids[0], big));
  for (let i = 0; i < 50; i++) fd.transport.readable.write(b.subarray(i, i + 1));
  for (let i = 50; i < b.length; i += 1000) fd.transport.readable.write(b.subarray(i, Math.min(b.length, i + 1000)));
  // Then three answers and blank lines in one piece, the last one unfinished until later.
  const l3 = line(ids[3], "d");
  fd.sendRaw(line(ids[1], "b") + "\n  \n" + line(ids[2], "c") + l3.slice(0, 7));
  fd.sendRaw(l3.slice(7));
  assert.equal((await ps[0]).v, big);
  assert.deepEqual((await Promise.all(ps.slice(1))).map((r) => r.v), ["b", "c", "d"]);
});

async function fakeSandbox(handler) {
  const fd = fakeDaemon();
  const stop = serveFake(fd, async (method, params) => {
    if (method === "sandbox.create") return { id: "sb-fake", state: "running" };
    if (method === "sandbox.destroy") return { destroyed: true };
    return handler(method, params);
  });
  const sb = await ConchSandbox.create({ transport: fd.transport });
  return { sb, fd, stop };
}

test("ConchSandbox.execute formats output as LocalShellBackend does", async () => {
  const answers = [
    { exit_code: 0, stdout: "out\n", stderr: "", timed_out: false },
    { exit_code: 3, stdout: "a\n", stderr: "e1\ne2\n", timed_out: false },
    { exit_code: 0, stdout: "", stderr: "", timed_out: false },
    { exit_code: 143, stdout: "x", stderr: "", timed_out: true },
  ];
  const { sb, stop } = await fakeSandbox(async (m, p) => {
    assert.equal(m, "exec.run");
    assert.equal(p.cwd, "/workspace");
    // /bin/sh as LocalShellBackend's spawn(shell: true); no change list asked for.
    assert.equal(p.shell, "sh");
    assert.equal(p.changes, false);
    return answers.shift();
  });
  assert.deepEqual(await sb.execute("a"), { output: "out\n", exitCode: 0, truncated: false });
  assert.deepEqual(await sb.execute("b"), { output: "a\n\n[stderr] e1\n[stderr] e2\n\nExit code: 3", exitCode: 3, truncated: false });
  assert.deepEqual(await sb.execute("c"), { output: "<no output>", exitCode: 0, truncated: false });
  assert.deepEqual(await sb.execute("d"), { output: "Error: Command timed out after 120.0 seconds.", exitCode: 124, truncated: false });
  assert.deepEqual(await sb.execute(""), { output: "Error: Command must be a non-empty string.", exitCode: 1, truncated: false });
  stop();
  await sb.close();
});

test("ConchSandbox maps daemon errors to deepagents' messages and never throws", async () => {
  const err = (code, data) => Object.assign(new Error(`daemon says ${data.code}`), { code, data: { kind: "usage", ...data } });
  const { sb, fd, stop } = await fakeSandbox(async (m, p) => {
    if (m === "fs.edit" && p.old_string === "x") throw err(-32016, { code: "ambiguous_match", occurrences: 2 });
    if (m === "fs.edit") throw err(-32015, { code: "string_not_found" });
    if (m === "fs.read") throw err(-32010, { code: "file_not_found" });
    if (m === "fs.ls") throw err(-32010, { code: "file_not_found" });
    if (m === "fs.delete") throw err(-32010, { code: "file_not_found" });
    if (m === "fs.download") return { files: p.paths.map((path) => ({ path, error: { code: path.endsWith("d") ? "is_directory" : "too_large", message: "m" } })) };
    throw err(-32013, { code: "invalid_path" });
  });
  assert.deepEqual(await sb.edit("/w/f", "x", "y"), { error: "Error: String 'x' has multiple occurrences (appears 2 times) in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context." });
  assert.deepEqual(await sb.edit("/w/f", "q", "y"), { error: "Error: String not found in file: 'q'" });
  assert.deepEqual(await sb.read("/w/f"), { error: "File '/w/f' not found" });
  assert.deepEqual(await sb.readRaw("/w/f"), { error: "File '/w/f' not found" });
  assert.deepEqual(await sb.ls("/w/none"), { files: [] });
  assert.deepEqual(await sb.delete("/w/f"), { error: "Error: '/w/f' not found" });
  assert.deepEqual(await sb.write("/w/f", "x"), { error: "Error writing file '/w/f': daemon says invalid_path" });
  assert.deepEqual(await sb.downloadFiles(["/a/d", "/a/big"]), [
    { path: "/a/d", content: null, error: "is_directory" },
    // too_large from fs.download: read again in chunks (here the file has gone meanwhile).
    { path: "/a/big", content: null, error: "file_not_found" },
  ]);
  // The daemon goes away: every method still returns.
  stop();
  fd.end();
  await new Promise((r) => setTimeout(r, 20));
  assert.match((await sb.read("/w/f")).error, /closed the connection/);
  assert.match((await sb.execute("true")).output, /^Error executing command: /);
  // The real cause, not "invalid_path".
  assert.match((await sb.uploadFiles([["/w/a", new Uint8Array([1])]]))[0].error, /^transport: .*closed/);
  assert.match((await sb.glob("*")).error, /closed/);
  assert.match((await sb.grep("x")).error, /closed/);
});

test("an uninitialized ConchSandbox returns NOT_INITIALIZED errors instead of throwing", async () => {
  const sb = new ConchSandbox();
  assert.equal(sb.id, "");
  assert.match((await sb.read("/workspace/x")).error, /not initialized/);
  assert.match((await sb.execute("true")).output, /^Error executing command: .*not initialized/);
  assert.match((await sb.ls("/workspace")).error, /not initialized/);
  assert.deepEqual(await sb.downloadFiles(["/a"]), [{ path: "/a", content: null, error: "NOT_INITIALIZED: ConchSandbox is not initialized: call initialize() or ConchSandbox.create()" }]);
});
