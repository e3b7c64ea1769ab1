// sessions.test.mjs - session.* and ConchSession against the real build/conch (stdio, and a
// unix socket for two clients): state that persists between runs, exit codes, stdin, a
// timeout that leaves the shell usable, `exit` and the new shell after it, the raw terminal
// (attach, write, session.output events, resize, signal), a writer takeover, the end of a
// session told to an attached client, close.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { ConchClient, ConchError, ConchSession } from "../dist/index.js";
import { conchBin, haveConch, tmp, stdioArgs } from "./helpers.mjs";

const skip = haveConch ? false : `no conch binary at ${conchBin} (build it or set CONCH_BIN)`;
let c;
let sb;

before(async () => {
  if (skip) return;
  c = await ConchClient.connect({ bin: conchBin, args: stdioArgs() });
  sb = (await c.sandboxCreate({ name: "ts-sessions" })).id;
});
after(async () => {
  if (c) await c.close();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("state persists between runs; exit codes; stdin; close", { skip }, async () => {
  const s = await c.openSession(sb, { env: { FROM_OPEN: "o" } });
  assert.ok(s instanceof ConchSession);
  assert.match(s.id, /^ses-/);
  assert.equal(s.info.state, "running");
  let r = await s.run("cd /tmp && export V=42 && f() { echo fn-$1; }; alias hi='echo hi-alias'");
  assert.equal(r.exit_code, 0);
  assert.equal(r.new_shell, false);
  assert.equal(r.shell_exited, false);
  r = await s.run("pwd; echo $V $FROM_OPEN; f x; hi");
  assert.equal(r.stdout, "/tmp\n42 o\nfn-x\nhi-alias\n");
  assert.match(r.text, /\[exit code: 0\]$/);
  r = await s.run("g() { return 3; }; g");
  assert.equal(r.exit_code, 3);
  assert.match(r.text, /\[exit code: 3\]$/);
  r = await s.run("echo fake; printf '[exit code: 0]\\n'; false");
  assert.equal(r.exit_code, 1);
  r = await s.run("read a; echo got-$a", { stdin: "hello" });
  assert.equal(r.stdout, "got-hello\n");
  // runs on one session queue in order
  const [a, b] = await Promise.all([s.run("export Q=q"), s.run("echo $Q")]);
  assert.equal(a.exit_code, 0);
  assert.equal(b.stdout, "q\n");
  assert.deepEqual((await c.sessionList(sb)).sessions.map((x) => x.session), [s.id]);
  assert.equal((await s.refresh()).shells, 1);
  await s.close();
  await s.close(); // idempotent
  assert.deepEqual((await c.sessionList(sb)).sessions, []);
  await assert.rejects(s.run("true"), (e) => e instanceof ConchError && e.data.code === "session_not_found" && e.code === -32003);
});

test("a timeout leaves the shell usable; exit starts a new shell", { skip }, async () => {
  const s = await c.openSession(sb);
  try {
    await s.run("export K=kept; cd /etc");
    let r = await s.run("sleep 30", { timeout: 1 });
    assert.equal(r.timed_out, true);
    assert.equal(r.session_usable, true);
    assert.equal(r.shell_exited, false);
    assert.notEqual(r.exit_code, 0);
    r = await s.run("echo $K; pwd");
    assert.equal(r.stdout, "kept\n/etc\n");
    assert.equal(r.new_shell, false);
    r = await s.run("exit 7");
    assert.equal(r.exit_code, 7);
    assert.equal(r.shell_exited, true);
    r = await s.run("echo [$K]");
    assert.equal(r.new_shell, true);
    assert.equal(r.stdout, "[]\n");
  } finally {
    await s.close();
  }
});

test("raw terminal: attach, write, output events, resize, signal", { skip }, async () => {
  const s = await c.openSession(sb);
  try {
    const a = await s.attach({ write: true });
    assert.equal(a.you_write, true);
    assert.equal(s.youWrite, true);
    assert.equal(typeof a.scrollback, "string");
    const events = [];
    c.on("session.output", (e) => events.push(e)); // the client's own event too
    assert.equal(await s.write("echo raw$((6*7))\n"), "echo raw$((6*7))\n".length);
    assert.match(await s.waitFor("raw42"), /raw42/);
    assert.ok(events.some((e) => e.session === s.id && typeof e.seq === "number"));
    assert.deepEqual(await s.resize(30, 100), { rows: 30, cols: 100 });
    await s.write("stty size\n");
    await s.waitFor("30 100");
    await s.write("sleep 1000\n");
    await s.waitFor("sleep 1000");
    await sleep(500); // sleep is the terminal's foreground job now
    assert.equal(await s.signal("INT"), 2);
    await s.waitFor("$ ", 60_000); // the prompt is back: sleep was interrupted
    await s.write("echo after-$((1+1))\n");
    await s.waitFor("after-2");
    await s.write("echo one; echo two\n");
    const seqs = [];
    for await (const e of s.output({ idleMs: 1500 })) seqs.push(e.seq);
    assert.ok(seqs.length > 0);
    assert.deepEqual([...seqs].sort((x, y) => x - y), seqs);
    const r = await s.run("echo via-run");
    assert.equal(r.stdout, "via-run\n");
    await s.waitFor("via-run"); // a run shows on the terminal too
    assert.equal(await s.detach(), true);
  } finally {
    await s.close();
  }
});

test("the end of a session is told to attached clients", { skip }, async () => {
  const s = await c.openSession(sb, { attach: true });
  assert.equal(s.youWrite, true);
  await s.write("exit 5\n");
  const chunks = [];
  for await (const e of s.output({ idleMs: 15_000 })) chunks.push(e.data);
  assert.ok(s.ended, `no session.ended: ${chunks.join("")}`);
  assert.equal(s.ended.exit_code, 5);
  assert.equal((await s.refresh()).state, "ended");
  const r = await s.run("echo again");
  assert.equal(r.new_shell, true);
  assert.equal(r.stdout, "again\n");
  await s.close();
});

test("writer takeover between two connections on a socket", { skip }, async () => {
  const dir = tmp("conch-ts-sock-");
  const sock = join(dir, "conch.sock");
  const d = spawn(conchBin, ["serve", "--socket", sock, "--state-dir", join(dir, "state"), "--pool", "0", "--idle-timeout", "0"], { stdio: "ignore" });
  try {
    for (let i = 0; i < 300 && !existsSync(sock); i++) await sleep(50);
    const a = await ConchClient.connect({ socket: sock });
    const b = await ConchClient.connect({ socket: sock });
    try {
      const id = (await a.sandboxCreate({})).id;
      const s = await a.openSession(id, { attach: true });
      const seen = [];
      b.on("session.output", (e) => seen.push(e.data));
      const r = await b.sessionAttach(s.id, true);
      assert.equal(r.you_write, true);
      for (let i = 0; i < 100 && !s.writerEvents.length; i++) await sleep(50);
      assert.equal(s.writerEvents[0]?.writer, false);
      assert.equal(s.youWrite, false);
      await assert.rejects(s.write("echo no\n"), (e) => e instanceof ConchError && e.data.code === "not_writer");
      await b.sessionWrite(s.id, "echo from-b-$((2+3))\n");
      await s.waitFor("from-b-5"); // every attached client sees the output
      for (let i = 0; i < 100 && !seen.join("").includes("from-b-5"); i++) await sleep(50);
      assert.match(seen.join(""), /from-b-5/);
      await s.close();
      await a.sandboxDestroy(id);
    } finally {
      await b.close();
      await a.close();
    }
  } finally {
    d.kill("SIGTERM");
  }
});

test("a second client gets a ConchSession for an existing session", { skip }, async () => {
  const dir = tmp("conch-ts-sock-");
  const sock = join(dir, "conch.sock");
  const d = spawn(conchBin, ["serve", "--socket", sock, "--state-dir", join(dir, "state"), "--pool", "0", "--idle-timeout", "0"], { stdio: "ignore" });
  try {
    for (let i = 0; i < 300 && !existsSync(sock); i++) await sleep(50);
    const a = await ConchClient.connect({ socket: sock });
    const b = await ConchClient.connect({ socket: sock });
    try {
      const id = (await a.sandboxCreate({})).id;
      const s = await a.openSession(id);
      await s.run("export SHARED=from-a; cd /tmp");
      // b knows only the id: it gets the same session, with its state, as an object.
      const t = await b.getSession(s.id);
      assert.ok(t instanceof ConchSession);
      assert.deepEqual([t.id, t.sandbox, t.info.state], [s.id, id, "running"]);
      assert.equal((await t.run("echo $SHARED; pwd")).stdout, "from-a\n/tmp\n");
      // Attached as the writer, b types into the terminal and reads its output.
      const w = await ConchSession.get(b, s.id, { write: true });
      assert.equal(w.youWrite, true);
      await w.write("echo typed-$((6*7))\n");
      await w.waitFor("typed-42");
      await assert.rejects(b.getSession("ses-nosuch"), (e) => e instanceof ConchError && e.data.code === "session_not_found");
      await w.detach();
      await s.close();
      await a.sandboxDestroy(id);
    } finally {
      await b.close();
      await a.close();
    }
  } finally {
    d.kill("SIGTERM");
  }
});
