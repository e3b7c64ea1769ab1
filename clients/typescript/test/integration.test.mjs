// integration.test.mjs - ConchClient against the real build/conch: over `conch serve --stdio`
// and over a unix socket; every method family, streaming, job events, workspace commit and
// discard on a host directory, and typed errors.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync, readFileSync, existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { ConchClient, ConchError } from "../dist/index.js";
import { conchBin, haveConch, tmp, stdioArgs } from "./helpers.mjs";

const skip = haveConch ? false : `no conch binary at ${conchBin} (build it or set CONCH_BIN)`;
let c;
let sb;
let ws;

before(async () => {
  if (skip) return;
  c = await ConchClient.connect({ bin: conchBin, args: stdioArgs() });
  ws = tmp("conch-ts-ws-");
  writeFileSync(join(ws, "orig.txt"), "original\n");
  sb = (await c.sandboxCreate({ workspace: ws, name: "ts-int" })).id;
});
after(async () => {
  if (c) await c.close();
});

test("daemon.ping and sandbox.*", { skip }, async () => {
  const p = await c.ping();
  assert.equal(typeof p.version, "string");
  assert.ok(p.sandboxes >= 1);
  const info = await c.sandboxGet(sb);
  assert.equal(info.state, "running");
  assert.equal(info.name, "ts-int");
  assert.equal(info.workspace, ws);
  assert.ok((await c.sandboxList()).sandboxes.some((s) => s.id === sb));
  await assert.rejects(c.sandboxGet("sb-missing"), (e) => e instanceof ConchError && e.code === -32002 && e.data.code === "sandbox_not_found");
  await assert.rejects(c.call("no.such"), (e) => e instanceof ConchError && e.data.code === "method_not_found" && e.kind === "usage");
});

test("exec.run, streamed and concurrent", { skip }, async () => {
  const chunks = [];
  const r = await c.execRun({ sandbox: sb, command: "echo one; echo two >&2; exit 4" }, (e) => chunks.push(`${e.stream}:${e.data}`));
  assert.equal(r.exit_code, 4);
  assert.equal(r.stdout, "one\n");
  assert.equal(r.stderr, "two\n");
  assert.equal(r.error.kind, "command");
  assert.match(r.text, /\[exit code: 4\]$/);
  assert.deepEqual(chunks.sort(), ["stderr:two\n", "stdout:one\n"]);
  // Three at once, answered independently: each announces itself in /tmp/meet3 and waits
  // for the others (60 s at most); run one after the other, the first would print "alone".
  const meet = (i) => "mkdir -p /tmp/meet3; touch /tmp/meet3/" + i + "; " +
    "for t in $(seq 600); do [ $(ls /tmp/meet3 | wc -l) -ge 3 ] && break; sleep 0.1; done; " +
    "if [ $(ls /tmp/meet3 | wc -l) -ge 3 ]; then echo " + i + "; else echo alone; fi";
  const rs = await Promise.all([1, 2, 3].map((i) => c.execRun({ sandbox: sb, command: meet(i), timeout: 100 })));
  assert.deepEqual(rs.map((x) => x.stdout), ["1\n", "2\n", "3\n"]);
  const gen = c.execStream({ sandbox: sb, command: "echo streamed" });
  const evs = [];
  let res;
  while (true) {
    const n = await gen.next();
    if (n.done) { res = n.value; break; }
    evs.push(n.value.data);
  }
  assert.equal(evs.join(""), "streamed\n");
  assert.equal(res.exit_code, 0);
});

test("job.* and the job.exited notification", { skip }, async () => {
  const exited = new Promise((r) => c.once("job.exited", r));
  const { job_id } = await c.jobStart({ sandbox: sb, command: "echo tick; sleep 0.2; echo tock" });
  const w = await c.jobWait(job_id, 10);
  assert.equal(w.running, false);
  assert.equal(w.exit_code, 0);
  const o = await c.jobOutput({ job_id });
  assert.equal(o.stdout, "tick\ntock\n");
  const again = await c.jobOutput({ job_id, stdout_offset: o.stdout_offset });
  assert.equal(again.stdout, "");
  const ev = await exited;
  assert.equal(ev.job_id, job_id);
  assert.ok((await c.jobList(sb)).jobs.some((j) => j.job_id === job_id));
  const long = await c.jobStart({ sandbox: sb, command: "sleep 30" });
  assert.deepEqual(await c.jobKill(long.job_id), { killed: true });
  const w2 = await c.jobWait(long.job_id, 10);
  assert.equal(w2.running, false);
  await assert.rejects(c.jobWait("job-nope", 1), (e) => e.data.code === "job_not_found");
});

test("fs.* round trip, binary included, with typed errors", { skip }, async () => {
  assert.deepEqual(await c.fsWrite(sb, "d/a.txt", "alpha\nbeta\ngamma\n"), { bytes_written: 17, created: true });
  const r = await c.fsRead(sb, "/workspace/d/a.txt", { offset: 1, limit: 1 });
  assert.equal(r.content, "beta\n");
  assert.equal(r.total_lines, 3);
  assert.deepEqual(await c.fsEdit(sb, "d/a.txt", "beta", "BETA"), { occurrences: 1 });
  await assert.rejects(c.fsEdit(sb, "d/a.txt", "zzz", "y"), (e) => e.data.code === "string_not_found" && e.code === -32015);
  const bytes = new Uint8Array([0, 1, 2, 255, 10, 0]);
  await c.fsWrite(sb, "d/bin.dat", bytes);
  assert.deepEqual((await c.fsReadBytes(sb, "d/bin.dat")).content, bytes);
  const ls = await c.fsLs(sb, "d");
  assert.deepEqual(ls.entries.map((e) => [e.name, e.type]), [["a.txt", "f"], ["bin.dat", "f"]]);
  assert.deepEqual((await c.fsGlob(sb, "**/*.txt")).paths, ["/workspace/d/a.txt", "/workspace/orig.txt"]);
  const g = await c.fsGrep(sb, "BETA", { fixed_string: true });
  assert.deepEqual(g.matches, [{ path: "/workspace/d/a.txt", line: 2, text: "BETA" }]);
  const up = await c.fsUpload(sb, [{ path: "u/x.bin", content: bytes }, { path: "d", content: bytes }]);
  assert.equal(up.results[0].error, undefined);
  assert.equal(up.results[1].error.code, "is_directory");
  const down = await c.fsDownload(sb, ["u/x.bin", "missing"]);
  assert.deepEqual(down.files[0].content, bytes);
  assert.equal(down.files[1].error.code, "file_not_found");
  assert.deepEqual(await c.fsDelete(sb, "u", true), { deleted: true });
  await assert.rejects(c.fsRead(sb, "u/x.bin"), (e) => e.data.code === "file_not_found" && e.code === -32010);
  // fs.* reach the whole sandbox: only malformed paths are invalid
  await assert.rejects(c.fsRead(sb, "bad\u0000name"), (e) => e.data.code === "invalid_path");
});

test("workspace.changes/diff/commit/discard reach the host directory only on commit", { skip }, async () => {
  await c.fsWrite(sb, "new.txt", "brand new\n");
  await c.fsWrite(sb, "orig.txt", "changed\n");
  const ch = await c.workspaceChanges(sb);
  const paths = ch.changes.map((x) => x.path);
  assert.ok(paths.includes("new.txt") && paths.includes("orig.txt"));
  const diff = await c.workspaceDiff(sb, ["orig.txt"]);
  assert.match(diff.diff, /-original\n\+changed/);
  assert.equal(readFileSync(join(ws, "orig.txt"), "utf8"), "original\n");
  const com = await c.workspaceCommit(sb, ["new.txt"]);
  assert.deepEqual(com.committed, ["new.txt"]);
  assert.equal(readFileSync(join(ws, "new.txt"), "utf8"), "brand new\n");
  const dis = await c.workspaceDiscard(sb);
  assert.ok(dis.discarded.includes("orig.txt"));
  assert.equal(readFileSync(join(ws, "orig.txt"), "utf8"), "original\n");
  assert.equal((await c.fsRead(sb, "orig.txt")).content, "original\n");
});

test("workspace.changes/diff since a snapshot", { skip }, async () => {
  const w = tmp("conch-ts-since-");
  writeFileSync(join(w, "a.txt"), "host\n");
  const id = (await c.sandboxCreate({ workspace: w })).id;
  try {
    await c.fsWrite(id, "a.txt", "at-snap\n");
    const snap = await c.workspaceSnapshot(id, { name: "ts-since" });
    await c.fsWrite(id, "a.txt", "after\n");
    await c.fsWrite(id, "b.txt", "b\n");
    const ch = await c.workspaceChanges(id, { since: snap.id });
    assert.deepEqual(ch.changes.map((x) => [x.path, x.kind]), [["a.txt", "modified"], ["b.txt", "added"]]);
    const page = await c.workspaceChanges(id, { since: "ts-since", limit: 1 });
    assert.equal(page.changes_total, 2);
    assert.equal(page.next_offset, 1);
    const d = await c.workspaceDiff(id, ["a.txt"], { since: "ts-since" });
    assert.match(d.diff, /-at-snap\n\+after/);
    assert.doesNotMatch(d.diff, /-host/);
    // Without since: against the host directory, as before.
    assert.match((await c.workspaceDiff(id, ["a.txt"])).diff, /-host\n\+after/);
    await assert.rejects(c.workspaceChanges(id, { since: "nope" }),
      (e) => e instanceof ConchError && e.code === -32602 && e.data.param === "since" && /nope/.test(e.message));
  } finally {
    await c.sandboxDestroy(id);
  }
});

test("store.* and a store mount's write-back", { skip }, async () => {
  const name = `ts-${process.pid}-${Date.now()}`;
  const id = (await c.sandboxCreate({ mounts: [{ type: "store", name, target: "/mem" }] })).id;
  try {
    const r = await c.execRun({ sandbox: id, command: "echo inside > /mem/f" });
    assert.equal(r.stores[0].written, 1);
    assert.equal((await c.storeRead(name, "f")).content, "inside\n");
    await c.storeWrite(name, "dir/host.txt", "from host\n");
    assert.equal((await c.execRun({ sandbox: id, command: "cat /mem/dir/host.txt" })).stdout, "from host\n");
    assert.deepEqual((await c.storeLs(name)).entries.map((e) => e.name), ["dir", "f"]);
    await c.storeDelete(name, "dir");
    assert.ok((await c.storeList()).stores.some((s) => s.name === name && s.entries === 1));
    await assert.rejects(c.storeRead(name, "dir/host.txt"), (e) => e instanceof ConchError && e.data.code === "file_not_found");
  } finally {
    await c.sandboxDestroy(id);
  }
});

test("a unix-socket daemon: connect, create, run, destroy", { skip }, async () => {
  const dir = tmp("conch-ts-sock-");
  mkdirSync(join(dir, "run"), { mode: 0o700 });
  const sock = join(dir, "run", "conch.sock");
  const d = spawn(conchBin, ["serve", "--socket", sock, "--state-dir", join(dir, "state"), "--pool", "0"], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  d.stderr.on("data", (x) => (log += x));
  try {
    for (let i = 0; i < 100 && !existsSync(sock); i++) await new Promise((r) => setTimeout(r, 50));
    assert.ok(existsSync(sock), `socket never appeared: ${log}`);
    const sc = await ConchClient.connect({ socket: sock });
    const id = (await sc.sandboxCreate()).id;
    const r = await sc.execRun({ sandbox: id, command: "echo via socket" });
    assert.equal(r.stdout, "via socket\n");
    assert.deepEqual(await sc.sandboxDestroy(id), { destroyed: true });
    await sc.close();
  } finally {
    d.kill("SIGTERM");
    await new Promise((r) => d.once("exit", r));
  }
});

test("a missing binary is a clear error", async () => {
  await assert.rejects(ConchClient.connect({ bin: "/nonexistent/conch" }), (e) => e instanceof ConchError && /cannot start '\/nonexistent\/conch serve --stdio'/.test(e.message));
});
