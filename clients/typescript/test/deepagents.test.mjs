// deepagents.test.mjs - a REAL deepagents agent (createDeepAgent, deepagents 1.14.x) driven by a
// scripted fake chat model (@langchain/core/testing fakeModel, no network) through every file
// tool and `execute`, once with ConchSandbox over `conch serve --stdio` and once with deepagents'
// own LocalShellBackend (virtualMode, a host temp dir as "/", glob as FilesystemBackend has it):
// every tool message must be the same. Also the backend methods deepagents calls directly
// (uploadFiles/downloadFiles/readRaw), lifecycle (commit/discard on close), and two agents with
// their own `conch serve --stdio` started at the same moment, 20 times.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createDeepAgent, LocalShellBackend, FilesystemBackend } from "deepagents";
import { fakeModel } from "@langchain/core/testing";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { ConchSandbox } from "../dist/deepagents.js";
import { ConchClient } from "../dist/index.js";
import { conchBin, haveConch, tmp, stdioArgs } from "./helpers.mjs";

const skip = haveConch ? false : `no conch binary at ${conchBin} (build it or set CONCH_BIN)`;

/** deepagents' LocalShellBackend, with FilesystemBackend's glob (absolute paths, files only), which ConchSandbox follows. */
class RefBackend extends LocalShellBackend {
  async glob(pattern, path = "/") {
    return FilesystemBackend.prototype.glob.call(this, pattern, path);
  }
}

const PNG = Buffer.from(Array.from({ length: 300 }, (_, i) => (i * 7 + 3) % 256));
PNG.set([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 0);
const PNG_B64 = PNG.toString("base64");

// The scripted run: one tool call per model turn. Paths are absolute in the sandbox ("/" of the
// reference = its temp dir); execute runs in "/" on both (ConchSandbox cwd option), so commands
// use paths relative to "/".
const W = "/workspace";
const STEPS = [
  ["write_file", { file_path: `${W}/hello.txt`, content: "hello world\nsecond line\nthird world\n" }],
  ["read_file", { file_path: `${W}/hello.txt` }],
  ["read_file", { file_path: `${W}/hello.txt`, offset: 1, limit: 1 }],
  ["read_file", { file_path: `${W}/hello.txt`, offset: 9 }],
  ["read_file", { file_path: `${W}/missing.txt` }],
  ["edit_file", { file_path: `${W}/hello.txt`, old_string: "world", new_string: "there" }],
  ["edit_file", { file_path: `${W}/hello.txt`, old_string: "world", new_string: "there", replace_all: true }],
  ["edit_file", { file_path: `${W}/hello.txt`, old_string: "not in it", new_string: "x" }],
  ["edit_file", { file_path: `${W}/hello.txt`, old_string: "", new_string: "x" }],
  ["edit_file", { file_path: `${W}/nope.txt`, old_string: "a", new_string: "b" }],
  ["write_file", { file_path: `${W}/empty.txt`, content: "" }],
  ["read_file", { file_path: `${W}/empty.txt` }],
  ["edit_file", { file_path: `${W}/empty.txt`, old_string: "", new_string: "filled\n" }],
  ["read_file", { file_path: `${W}/empty.txt` }],
  ["write_file", { file_path: `${W}/src/app.py`, content: "def main():\n    return 'there'\n" }],
  ["write_file", { file_path: `${W}/src/lib/util.py`, content: "X = 'there'\n" }],
  ["write_file", { file_path: `${W}/notes.md`, content: "# notes\nthere is more\n" }],
  ["ls", { path: W }],
  ["ls", { path: `${W}/src` }],
  ["ls", { path: `${W}/no-such-dir` }],
  ["glob", { pattern: "**/*.py", path: W }],
  ["glob", { pattern: "*.md", path: W }],
  ["glob", { pattern: "*.rs", path: W }],
  ["grep", { pattern: "there", path: W }],
  ["grep", { pattern: "there", path: W, output_mode: "files_with_matches" }],
  ["grep", { pattern: "there", path: W, output_mode: "count" }],
  ["grep", { pattern: "there", path: W, glob: "*.py" }],
  ["grep", { pattern: "there", path: W, max_count: 2 }],
  ["grep", { pattern: "return 'there'", path: `${W}/src/app.py` }],
  ["grep", { pattern: "zzz-nothing", path: W }],
  ["grep", { pattern: "there", path: `${W}/no-such-dir` }],
  ["write_file", { file_path: `${W}/pic.png`, content: PNG_B64 }],
  ["read_file", { file_path: `${W}/pic.png` }],
  ["execute", { command: "od -An -tx1 -N16 workspace/pic.png; wc -c < workspace/pic.png" }],
  ["execute", { command: "cat workspace/hello.txt; echo oops >&2; exit 3" }],
  ["execute", { command: "true" }],
  // The shell is /bin/sh on both (LocalShellBackend spawns with shell: true).
  ["execute", { command: "echo $0; [ -n \"$BASH_VERSION\" ] && echo bash || echo not bash" }],
  ["execute", { command: "ls workspace/src | sort" }],
  ["delete", { file_path: `${W}/src/lib` }],
  ["delete", { file_path: `${W}/notes.md` }],
  ["delete", { file_path: `${W}/notes.md` }],
  ["delete", { file_path: "workspace/relative" }],
  ["ls", { path: `${W}/src` }],
  // A result over 80 000 characters: deepagents offloads it to /large_tool_results/.
  ["execute", { command: "seq 1 16000" }, "call_big"],
  ["read_file", { file_path: "/large_tool_results/call_big.txt", offset: 15998, limit: 5 }],
  // Outside the workspace: the sandbox is a machine, /tmp is writable.
  ["write_file", { file_path: "/tmp/scratch/out.txt", content: "outside\n" }],
  ["read_file", { file_path: "/tmp/scratch/out.txt" }],
  ["ls", { path: "/tmp/scratch" }],
];
// Steps that touch paths outside /workspace (they need fs.* beyond the workspace).
const OUTSIDE = new Set(STEPS.map((s, i) => (s[2] === "call_big" || /^\/(large_tool_results|tmp)\//.test(s[1].file_path ?? s[1].path ?? "") ? i : -1)).filter((i) => i >= 0));

async function runAgent(backend, steps) {
  const model = fakeModel();
  // respond() with a ready AIMessage: respondWithTools() would echo the whole conversation as content.
  steps.forEach(([name, args, id], i) => model.respond(new AIMessage({ content: "", tool_calls: [{ name, args, id: id ?? `call_${i}`, type: "tool_call" }] })));
  model.respond(new AIMessage("done"));
  const agent = createDeepAgent({ model, backend, systemPrompt: "You are a test agent." });
  const out = await agent.invoke({ messages: [{ role: "user", content: "go" }] }, { recursionLimit: 1000 });
  const msgs = out.messages.filter((m) => ToolMessage.isInstance(m));
  return msgs.map((m) => ({ id: m.tool_call_id, name: m.name, status: m.status ?? "success", content: m.content }));
}

let sandbox, ref, refRoot, wsHost, conchMsgs, refMsgs, outsideRefused;

before(async () => {
  if (skip) return;
  refRoot = tmp("conch-ts-ref-");
  mkdirSync(join(refRoot, "workspace"));
  ref = new RefBackend({ rootDir: refRoot, virtualMode: true, inheritEnv: true }); // (LocalShellBackend.create() would build the base class)
  await ref.initialize();
  wsHost = tmp("conch-ts-agentws-");
  sandbox = await ConchSandbox.create({ bin: conchBin, args: stdioArgs(), cwd: "/", sandbox: { workspace: wsHost } });
  // Does this daemon's fs.* reach paths outside /workspace yet?
  const probe = await sandbox.write("/tmp/.conch-probe", "x");
  outsideRefused = !!probe.error;
  if (!probe.error) await sandbox.delete("/tmp/.conch-probe");
  [conchMsgs, refMsgs] = await Promise.all([runAgent(sandbox, STEPS), runAgent(ref, STEPS)]);
});
after(async () => {
  await sandbox?.close();
});

test("a deepagents agent over ConchSandbox prints what LocalShellBackend prints (workspace steps)", { skip }, () => {
  assert.equal(conchMsgs.length, STEPS.length);
  assert.equal(refMsgs.length, STEPS.length);
  for (let i = 0; i < STEPS.length; i++) {
    if (OUTSIDE.has(i)) continue;
    assert.deepEqual(conchMsgs[i], refMsgs[i], `step ${i} ${JSON.stringify(STEPS[i])}`);
  }
  // The comparison means something: spot-check what the model saw.
  const text = (i) => (typeof conchMsgs[i].content === "string" ? conchMsgs[i].content : conchMsgs[i].content.map((b) => b.text ?? `[${b.type}]`).join(""));
  assert.equal(text(1), "@@ lines 1-3 of 3 @@\nhello world\nsecond line\nthird world");
  assert.match(text(5), /has multiple occurrences \(appears 2 times\)/);
  assert.equal(text(6), `Successfully replaced 2 occurrence(s) in '${W}/hello.txt'`);
  assert.equal(text(17), `${W}/empty.txt (7 bytes)\n${W}/hello.txt (36 bytes)\n${W}/notes.md (22 bytes)\n${W}/src/ (directory)`);
  assert.equal(text(20), `${W}/src/app.py\n${W}/src/lib/util.py`);
  assert.match(text(27), /Note: the search stopped early/);
  assert.deepEqual(conchMsgs[32].content, [{ type: "image", mimeType: "image/png", data: PNG_B64 }]);
  assert.match(text(33), /^ 89 50 4e 47 0d 0a 1a 0a/);
  assert.equal(text(34), "hello there\nsecond line\nthird there\n\n[stderr] oops\n\nExit code: 3\n[Command failed with exit code 3]");
  assert.equal(text(35), "<no output>\n[Command succeeded with exit code 0]");
  assert.equal(text(36), "/bin/sh\nnot bash\n\n[Command succeeded with exit code 0]");
  assert.equal(conchMsgs[40].status, "error");
  // The host directory is untouched until commit.
  assert.equal(existsSync(join(wsHost, "hello.txt")), false);
});

test("paths outside /workspace: /large_tool_results offload and /tmp", { skip }, async (t) => {
  if (outsideRefused)
    t.todo("KNOWN FAILURE: the daemon's fs.* refuses paths outside /workspace (invalid_path), so deepagents cannot offload a big tool result to /large_tool_results/ (issue 8; being fixed in the daemon)");
  for (const i of OUTSIDE) assert.deepEqual(conchMsgs[i], refMsgs[i], `step ${i} ${JSON.stringify(STEPS[i])}`);
  const big = conchMsgs[STEPS.findIndex((s) => s[2] === "call_big")];
  assert.match(big.content, /saved in the filesystem at this path: \/large_tool_results\/call_big\.txt/);
});

test("uploadFiles/downloadFiles/readRaw match FilesystemBackend, binary and errors included", { skip }, async () => {
  const bytes = new Uint8Array([0, 255, 1, 254, 10, 13, 0]);
  const files = [[`${W}/up/a.bin`, bytes], [`${W}/up/t.txt`, new TextEncoder().encode("text\n")], [`${W}/up`, bytes]];
  const cu = await sandbox.uploadFiles(files);
  const ru = await ref.uploadFiles(files);
  assert.deepEqual(cu, ru);
  assert.deepEqual(cu.map((r) => r.error), [null, null, "is_directory"]);
  const paths = [`${W}/up/a.bin`, `${W}/up/t.txt`, `${W}/up/none`, `${W}/up`];
  const cd = await sandbox.downloadFiles(paths);
  const rd = (await ref.downloadFiles(paths)).map((r) => ({ ...r, content: r.content ? new Uint8Array(r.content) : null }));
  assert.deepEqual(cd, rd);
  const craw = await sandbox.readRaw(`${W}/up/t.txt`);
  const rraw = await ref.readRaw(`${W}/up/t.txt`);
  assert.equal(craw.data.content, rraw.data.content);
  assert.equal(craw.data.mimeType, rraw.data.mimeType);
  await sandbox.uploadFiles([[`${W}/up/raw.png`, bytes]]);
  assert.deepEqual((await sandbox.readRaw(`${W}/up/raw.png`)).data.content, bytes);
  assert.equal((await sandbox.readRaw(`${W}/up/raw.png`)).data.mimeType, "image/png");
  assert.deepEqual(await sandbox.readRaw(`${W}/up/none`), { error: `File '${W}/up/none' not found` });
});

test("read() gives exactly LocalShellBackend's result for awkward files, offsets and limits (text fast path and whole-file path)", { skip }, async () => {
  const enc = (s) => Buffer.from(s, "utf8");
  const files = {
    "empty.txt": enc(""),
    "nl.txt": enc("\n"),
    "nlnl.txt": enc("\n\n"),
    "one.txt": enc("a"),
    "onenl.txt": enc("a\n"),
    "two.txt": enc("a\nb"),
    "twonl.txt": enc("a\nb\n"),
    "blank.txt": enc("  \n \t\n"),
    "blankmid.txt": enc("x\n   \n\t\n\u00a0\n\ny\n"),
    "gaps.txt": enc("x\n\n\ny\n\n"),
    "bom.txt": Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), enc("first\nsecond\n")]),
    "crlf.txt": enc("a\r\nb\r\n\r\nc"),
    "bad.txt": Buffer.concat([enc("ok\n"), Buffer.from([0xe2, 0x82, 0x41, 0x0a, 0xff, 0xc3]), enc("\nend\n")]),
    "fffd.txt": enc("a\n\ufffd\nb\n"),
    "nul.txt": enc("a\u0000b\n\u0000\n"),
    "seps.txt": enc("l\u2028s\u2029p \u00e9 \ud83d\ude00 \"q\" \\ \u007f\n2\n"),
    "long.md": enc(Array.from({ length: 300 }, (_, i) => `line ${i} ${"x".repeat(i % 50)}`).join("\n") + "\n"),
  };
  const host = join(refRoot, "workspace", "rd");
  mkdirSync(host, { recursive: true });
  for (const [n, b] of Object.entries(files)) writeFileSync(join(host, n), b);
  const up = await sandbox.uploadFiles(Object.entries(files).map(([n, b]) => [`${W}/rd/${n}`, new Uint8Array(b)]));
  assert.deepEqual(up.map((u) => u.error), Object.keys(files).map(() => null));
  const offsets = [0, 1, 2, 3, 5, 6, 7, 150, 299, 300, 301, -1, 1.7, NaN];
  const limits = [0, 1, 2, 3, 5, 100, 500, 1.5, -2, NaN, Infinity, 1e16];
  let n = 0;
  for (const name of [...Object.keys(files), "missing.txt"])
    for (const off of offsets)
      for (const lim of limits) {
        const p = `${W}/rd/${name}`;
        assert.deepEqual(await sandbox.read(p, off, lim), await ref.read(p, off, lim), `${name} offset ${off} limit ${lim}`);
        n++;
      }
  assert.ok(n > 2000);
  // The default arguments, and a directory.
  assert.deepEqual(await sandbox.read(`${W}/rd/long.md`), await ref.read(`${W}/rd/long.md`));
  assert.deepEqual(await sandbox.read(`${W}/rd`), await ref.read(`${W}/rd`));
});

test("lifecycle: close commits or discards the workspace as asked; initialize twice is ALREADY_INITIALIZED", { skip }, async () => {
  const ws1 = tmp("conch-ts-life-");
  const a = await ConchSandbox.create({ bin: conchBin, args: stdioArgs(), sandbox: { workspace: ws1 }, onClose: "commit" });
  await assert.rejects(a.initialize(), (e) => e.code === "ALREADY_INITIALIZED");
  assert.ok(a.id.startsWith("sb-"));
  assert.equal((await a.write(`${W}/kept.txt`, "kept\n")).error, undefined);
  const r = await a.close();
  assert.deepEqual(r.committed, ["kept.txt"]);
  assert.equal(readFileSync(join(ws1, "kept.txt"), "utf8"), "kept\n");
  const b = await ConchSandbox.create({ bin: conchBin, args: stdioArgs(), sandbox: { workspace: ws1 } });
  await b.write(`${W}/dropped.txt`, "x");
  await b.close();
  assert.equal(existsSync(join(ws1, "dropped.txt")), false);
  // A missing binary fails initialize with a SandboxError, not a hang.
  await assert.rejects(ConchSandbox.create({ bin: "/nonexistent/conch" }), (e) => e.code === "NOT_INITIALIZED" && /cannot start/.test(e.message));
});

test("spawnInteractive streams a job's output, takes files, and reports the exit code", { skip }, async () => {
  const p = await sandbox.spawnInteractive("echo start; cat /workspace/in.txt; echo err >&2; exit 5");
  await p.writeFile(`${W}/in.txt`, "ignored: the job already started\n").catch(() => {});
  let out = "";
  for await (const c of p.stdout) out += new TextDecoder().decode(c);
  let err = "";
  for await (const c of p.stderr) err += new TextDecoder().decode(c);
  assert.match(out, /^start\n/);
  assert.match(err, /err\n$/);
  assert.deepEqual(await p.waitForExit(), { exitCode: 5 });
  const k = await sandbox.spawnInteractive("sleep 30");
  await k.kill();
  const { exitCode } = await k.waitForExit();
  assert.notEqual(exitCode, 0);
});

test("two agents, each with its own conch serve --stdio, started at the same moment, 20 times", { skip, timeout: 150000 }, async (t) => {
  // `conch serve --stdio` with no options, as a harness spawns it: each must run beside the other.
  const failures = [];
  for (let round = 0; round < 20; round++) {
    const runs = [0, 1].map(async (k) => {
      let sb;
      try {
        sb = await ConchSandbox.create({ bin: conchBin, args: [] });
        const msgs = await runAgent(sb, [
          ["write_file", { file_path: `${W}/agent${k}.txt`, content: `agent ${k}\n` }],
          ["execute", { command: `sleep 0.2; cat agent${k}.txt` }],
          ["read_file", { file_path: `${W}/agent${k}.txt` }],
        ]);
        const want = [`Successfully wrote to '${W}/agent${k}.txt'`, `agent ${k}\n\n[Command succeeded with exit code 0]`, `@@ lines 1-1 of 1 @@\nagent ${k}`];
        const got = msgs.map((m) => (typeof m.content === "string" ? m.content : m.content.map((b) => b.text).join("")));
        if (JSON.stringify(got) !== JSON.stringify(want)) failures.push(`round ${round} agent ${k}: ${JSON.stringify(got)}`);
      } catch (e) {
        failures.push(`round ${round} agent ${k}: ${e.message}`);
      } finally {
        await sb?.close().catch((e) => failures.push(`round ${round} agent ${k} close: ${e.message}`));
      }
    });
    await Promise.all(runs);
  }
  if (failures.length && failures.every((f) => /in use by another conch daemon/.test(f)))
    t.todo(`KNOWN FAILURE: a second conch serve --stdio (no options: the default state dir) refuses to start ("state database ... is in use by another conch daemon"): ${failures.length} of 40 agent runs failed (issue 8; being fixed in the daemon: private state dirs for --stdio)`);
  assert.deepEqual(failures, [], `${failures.length} of 40 agent runs failed`);
});
