// remote.test.mjs - the client and ConchSandbox over the remote transport (issue 21): a real
// daemon on a unix socket behind tests/integration/wsfixture.py (a stand-in for the gateway:
// wss on loopback, bearer token, one JSON-RPC message per WebSocket text message). exec.run,
// file operations with multi-MiB messages, a tool call answered by this client, a wrong CA and
// a wrong hostname refused, a wrong token refused without showing it, and a reconnect after
// the gateway drops every connection. Skips when python3-websockets or openssl is missing.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";
import { ConchClient, ConchError } from "../dist/index.js";
import { ConchSandbox } from "../dist/deepagents.js";
import { conchBin, haveConch, tmp } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const fixture = resolve(here, "../../../tests/integration/wsfixture.py");
const PY = existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
const haveWs = spawnSync(PY, ["-c", "import websockets"]).status === 0;
const skip = !haveConch ? `no conch binary at ${conchBin}` : !haveWs ? "python3-websockets is not installed (the fixture gateway needs it)" : false;
const TOKEN = "tok-" + "s3cr3t".repeat(6);

let dir, daemon, gw, gwBad, certs;

function makeCerts(d) {
  const code = `import sys, json; sys.path.insert(0, ${JSON.stringify(dirname(fixture))})
from wsfixture import make_certs
d = ${JSON.stringify(d)}
ca, crt, key = make_certs(d)
_, wc, wk = make_certs(d, names=("DNS:wrong.example",), prefix="wrongname")
import os; os.makedirs(d + "/other", exist_ok=True)
oca, _, _ = make_certs(d + "/other")
print(json.dumps({"ca": ca, "crt": crt, "key": key, "wc": wc, "wk": wk, "other": oca}))`;
  const r = spawnSync(PY, ["-c", code], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`make_certs: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

function startGateway(sock, crt, key) {
  const tf = join(dir, `token-${Math.random().toString(36).slice(2)}`);
  writeFileSync(tf, TOKEN, { mode: 0o600 });
  const log = `${tf}.methods`;
  const p = spawn(PY, [fixture, "--socket", sock, "--cert", crt, "--key", key, "--token-file", tf, "--log", log], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((res, rej) => {
    let out = "";
    p.stdout.setEncoding("utf8");
    p.stdout.on("data", (d) => {
      out += d;
      if (out.includes("\n")) res({ proc: p, url: `wss://127.0.0.1:${parseInt(out, 10)}`, methods: () => (existsSync(log) ? readFileSync(log, "utf8").split("\n") : []) });
    });
    p.once("exit", (c) => rej(new Error(`wsfixture exited with ${c}`)));
  });
}

before(async () => {
  if (skip) return;
  dir = tmp("conch-ts-remote-");
  certs = makeCerts(dir);
  const sock = join(dir, "conch.sock");
  daemon = spawn(conchBin, ["serve", "--socket", sock, "--state-dir", join(dir, "state"), "--pool", "0"], { stdio: ["ignore", "ignore", "inherit"] });
  for (let i = 0; i < 300 && !existsSync(sock); i++) await new Promise((r) => setTimeout(r, 50));
  gw = await startGateway(sock, certs.crt, certs.key);
  gwBad = await startGateway(sock, certs.wc, certs.wk);
});

after(async () => {
  for (const p of [gw?.proc, gwBad?.proc, daemon]) p?.kill("SIGTERM");
});

const connect = (extra = {}) => ConchClient.connect({ url: gw.url, token: TOKEN, ca: certs.ca, ...extra });

test("exec.run and file operations over wss, options and environment", { skip }, async () => {
  const c = await connect();
  try {
    const ws = join(dir, "ws1");
    mkdirSync(ws, { recursive: true });
    const sb = await c.sandboxCreate({ workspace: ws });
    const r = await c.execRun({ sandbox: sb.id, command: "echo hello $((6*7))" });
    assert.equal(r.exit_code, 0);
    assert.equal(r.stdout, "hello 42\n");
    const blob = new Uint8Array(randomBytes(5 << 20));
    await c.fsWriteFile(sb.id, "big.bin", blob);
    const back = await c.fsReadFile(sb.id, "big.bin");
    assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(blob)), 0);
    // In messages: the daemon's host is not ours (no fs.copy_in / fs.copy_out naming our files).
    assert.ok(gw.methods().includes("exec.run"), gw.methods().join(" "));
    assert.ok(!gw.methods().some((m) => m === "fs.copy_in" || m === "fs.copy_out"), gw.methods().join(" "));
    // The environment names the same daemon.
    const saved = { ...process.env };
    Object.assign(process.env, { CONCH_URL: gw.url, CONCH_TOKEN: TOKEN, CONCH_CA: certs.ca });
    try {
      const c2 = await ConchClient.connect();
      const { sandboxes } = await c2.sandboxList();
      assert.ok(sandboxes.some((s) => s.id === sb.id));
      await c2.close();
    } finally {
      for (const k of ["CONCH_URL", "CONCH_TOKEN", "CONCH_CA"]) if (saved[k] === undefined) delete process.env[k];
    }
    await c.sandboxDestroy(sb.id);
  } finally {
    await c.close();
  }
});

test("ConchSandbox (deepagents backend) over wss, with a tool call answered here", { skip }, async () => {
  const ws = join(dir, "ws2");
  mkdirSync(ws, { recursive: true });
  const sb = await ConchSandbox.create({ url: gw.url, token: TOKEN, ca: certs.ca, sandbox: { workspace: ws } });
  try {
    const w = await sb.write("/workspace/notes.txt", "one\ntwo\n");
    assert.ok(!w.error, w.error);
    const r = await sb.execute("cat notes.txt | wc -l");
    assert.equal(r.exitCode, 0);
    assert.equal(r.output.trim(), "2");
    const c = sb.client;
    c.onRequest("tool.call", async (p) => ({ sum: p.input.a + p.input.b }));
    await c.toolsRegister(sb.id, [{ name: "add", description: "Add", input_schema: { type: "object" } }]);
    const t = await c.execRun({ sandbox: sb.id, command: `tool_call add '{"a":2,"b":40}'` });
    assert.equal(t.exit_code, 0, t.stderr);
    assert.match(t.stdout, /"sum": ?42/);
  } finally {
    await sb.close({ workspace: "discard" });
  }
});

test("a wrong CA, a wrong hostname and a wrong token are refused", { skip }, async () => {
  await assert.rejects(connect({ ca: certs.other }), (e) => e instanceof ConchError && /certificate/.test(e.message));
  await assert.rejects(ConchClient.connect({ url: gwBad.url, token: TOKEN, ca: certs.ca }), (e) => e instanceof ConchError && /certificate/.test(e.message) && /127\.0\.0\.1/.test(e.message));
  await assert.rejects(connect({ token: TOKEN + "x" }), (e) => /401/.test(e.message) && !e.message.includes(TOKEN) && !JSON.stringify(e).includes(TOKEN));
  await assert.rejects(connect({ token: "" }), (e) => /no token/.test(e.message));
  await assert.rejects(connect({ url: gw.url.replace("wss:", "ws:") }), (e) => /wss/.test(e.message));
});

test("a dropped connection fails what was in flight, and the next request reconnects", { skip }, async () => {
  const c = await connect();
  try {
    const ws = join(dir, "ws3");
    mkdirSync(ws, { recursive: true });
    const sb = await c.sandboxCreate({ workspace: ws });
    let started;
    const running = new Promise((r) => (started = r));
    const inflight = c.execRun({ sandbox: sb.id, command: "echo started; sleep 30" }, () => started());
    const failed = assert.rejects(inflight, (e) => e instanceof ConchError && /connection lost/.test(e.message));
    await running;
    gw.proc.kill("SIGUSR1");
    await failed;
    const r = await c.execRun({ sandbox: sb.id, command: "echo back" });
    assert.equal(r.stdout, "back\n");
    await c.sandboxDestroy(sb.id);
  } finally {
    await c.close();
  }
});
