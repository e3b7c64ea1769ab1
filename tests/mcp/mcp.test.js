// mcp.test.js - `conch mcp` driven by the official MCP TypeScript SDK client (Client +
// StdioClientTransport), as an MCP host would drive it, plus raw JSON-RPC lines for what the
// SDK never sends (bad JSON, batches, version negotiation). Run with `node --test` from this
// directory; CONCH_BIN names the binary (default ../../build/conch).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const conch = path.resolve(process.env.CONCH_BIN || path.join(here, '../../build/conch'));
const TOOLS = ['bash', 'shell', 'js_eval', 'job_output', 'job_kill', 'read_file', 'write_file', 'edit_file', 'ls',
  'glob', 'grep', 'changes', 'diff', 'commit', 'snapshot', 'restore', 'snapshots', 'fork'];

function tempWorkspace() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'conch-mcp-'));
  fs.chmodSync(dir, 0o755);
  fs.writeFileSync(path.join(dir, 'hello.txt'), 'hello\nworld\n');
  fs.mkdirSync(path.join(dir, 'src'));
  fs.writeFileSync(path.join(dir, 'src', 'main.py'), 'def main():\n    return 1\n');
  return dir;
}

async function connect(args) {
  const transport = new StdioClientTransport({ command: conch, args: ['mcp', ...args],
    stderr: 'pipe' });
  let stderr = '';
  transport.stderr.on('data', (d) => { stderr += d; });
  const client = new Client({ name: 'conch-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport, stderr: () => stderr };
}

function text(res) {
  assert.ok(Array.isArray(res.content), 'content is a list');
  assert.equal(res.content.length, 1);
  assert.equal(res.content[0].type, 'text');
  return res.content[0].text;
}

async function call(client, name, args) {
  return client.callTool({ name, arguments: args });
}

function childrenOf(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(/\s+/)
      .filter(Boolean).map(Number);
  } catch { return []; }
}

function alive(pid) {
  try { process.kill(pid, 0); return true; } catch { return false; }
}

async function waitGone(pids, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end && pids.some(alive)) await new Promise((r) => setTimeout(r, 50));
  return pids.filter(alive);
}

test('initialize, tools/list and every tool through the SDK', async () => {
  const ws = tempWorkspace();
  const { client, transport } = await connect(['--workspace', ws]);
  try {
    assert.equal(client.getServerVersion().name, 'conch');
    assert.deepEqual(client.getServerCapabilities().tools, { listChanged: false });
    assert.match(client.getInstructions(), /copy-on-write/);
    await client.ping();

    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name), TOOLS);
    for (const t of tools) {
      assert.equal(t.inputSchema.type, 'object', `${t.name} has an object schema`);
      assert.ok(t.description.length > 40, `${t.name} has a description a model can use`);
      assert.equal(typeof t.inputSchema.properties, 'object');
    }
    const bash = tools.find((t) => t.name === 'bash');
    assert.deepEqual(bash.inputSchema.required, ['command']);
    assert.deepEqual(Object.keys(bash.inputSchema.properties).sort(),
      ['background', 'command', 'cwd', 'timeout']);
    const shell = tools.find((t) => t.name === 'shell');
    assert.deepEqual(shell.inputSchema.required, ['command']);
    assert.deepEqual(Object.keys(shell.inputSchema.properties).sort(), ['command', 'timeout']);
    assert.match(shell.description, /persistent bash session/);
    assert.deepEqual(tools.find((t) => t.name === 'edit_file').inputSchema.required,
      ['path', 'old_string', 'new_string']);

    let r = await call(client, 'bash', { command: 'cat hello.txt; id -un; echo oops >&2; exit 3' });
    assert.equal(r.isError, false);
    assert.equal(text(r), 'hello\nworld\nagent\noops\n[exit code: 3]');
    r = await call(client, 'bash', { command: 'pwd', cwd: '/workspace/src' });
    assert.equal(text(r), '/workspace/src\n[exit code: 0]');

    r = await call(client, 'read_file', { path: 'hello.txt' });
    assert.equal(r.isError, false);
    assert.equal(text(r), '     1\thello\n     2\tworld\n');
    r = await call(client, 'read_file', { path: '/workspace/hello.txt', offset: 1, limit: 1 });
    assert.equal(text(r), '     2\tworld\n');

    r = await call(client, 'write_file', { path: 'out/new.txt', content: 'alpha\nbeta\n' });
    assert.equal(r.isError, false);
    assert.equal(text(r), 'Created out/new.txt (11 bytes).');
    r = await call(client, 'edit_file', { path: 'out/new.txt', old_string: 'beta',
      new_string: 'gamma' });
    assert.equal(text(r), 'Replaced 1 occurrence in out/new.txt.');
    r = await call(client, 'bash', { command: 'cat out/new.txt' });
    assert.equal(text(r), 'alpha\ngamma\n[exit code: 0]');

    r = await call(client, 'ls', {});
    assert.match(text(r), /^0644 +12 {2}hello\.txt$/m);
    assert.match(text(r), /^0755 +- {2}out\/$/m);
    r = await call(client, 'glob', { pattern: '**/*.txt' });
    assert.equal(text(r), '/workspace/hello.txt\n/workspace/out/new.txt\n');
    r = await call(client, 'grep', { pattern: 'gam+a|wor', glob: '*.txt' });
    assert.equal(text(r), '/workspace/hello.txt:2:world\n/workspace/out/new.txt:2:gamma\n');
    r = await call(client, 'grep', { pattern: 'RETURN', ignore_case: true, path: 'src' });
    assert.equal(text(r), '/workspace/src/main.py:2:    return 1\n');

    r = await call(client, 'changes', {});
    assert.equal(text(r), 'A out/\nA out/new.txt\n[2 changes (A added, M modified, D deleted, ' +
      'T type changed)]\n');
    r = await call(client, 'diff', {});
    assert.match(text(r), /^\+\+\+ b\/out\/new\.txt$/m);
    assert.match(text(r), /^\+gamma$/m);

    // Nothing reached the host until commit.
    assert.equal(fs.existsSync(path.join(ws, 'out')), false);
    r = await call(client, 'commit', { paths: ['out'] });
    assert.equal(r.isError, false);
    assert.equal(text(r), 'Committed 2 paths to the host directory:\n  out\n  out/new.txt\n');
    assert.equal(fs.readFileSync(path.join(ws, 'out', 'new.txt'), 'utf8'), 'alpha\ngamma\n');
    r = await call(client, 'changes', {});
    assert.equal(text(r), 'No changes.\n');
  } finally {
    await client.close();
    fs.rmSync(ws, { recursive: true, force: true });
  }
});

test('errors: tool errors with clear text, protocol errors as JSON-RPC errors', async () => {
  const ws = tempWorkspace();
  const { client } = await connect(['--workspace', ws]);
  try {
    let r = await call(client, 'read_file', { path: 'missing.txt' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^Error \(file_not_found\): .*'missing\.txt'.*no such file/);
    r = await call(client, 'edit_file', { path: 'hello.txt', old_string: 'absent',
      new_string: 'x' });
    assert.equal(r.isError, true);
    assert.match(text(r), /string_not_found.*old_string does not occur in 'hello\.txt'/);
    await call(client, 'write_file', { path: 'twice.txt', content: 'x x\n' });
    r = await call(client, 'edit_file', { path: 'twice.txt', old_string: 'x', new_string: 'y' });
    assert.equal(r.isError, true);
    assert.match(text(r), /ambiguous_match.*2 times/);
    r = await call(client, 'read_file', { path: 'src' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^Error \(is_directory\): /);
    r = await call(client, 'ls', { path: 'hello.txt' });
    assert.equal(r.isError, true);
    assert.match(text(r), /^Error \(not_a_directory\): /);
    r = await call(client, 'read_file', {});
    assert.equal(r.isError, true);
    assert.equal(text(r), "Error: argument 'path' is required (a string)");
    r = await call(client, 'bash', { command: 'sleep 10', timeout: 0.3 });
    assert.equal(r.isError, true, 'a timed-out command is a tool error');
    assert.match(text(r), /\[timed out; exit code: \d+\]$/);
    r = await call(client, 'job_output', { job_id: 'job-nope' });
    assert.equal(r.isError, true);
    assert.match(text(r), /job_not_found/);
    await assert.rejects(call(client, 'no_such_tool', {}),
      (e) => e.code === -32602 && /unknown tool 'no_such_tool'/.test(e.message));
    // A request over the line cap (32 MiB) is answered with its id (the SDK puts the id
    // last), not left waiting; one under it goes through to the daemon.
    await assert.rejects(call(client, 'write_file', { path: 'huge', content: 'x'.repeat(40 << 20) }),
      (e) => e.code === -32600 && /message too large/.test(e.message));
    r = await call(client, 'write_file', { path: 'large', content: 'y'.repeat(20 << 20) });
    assert.equal(text(r), 'Created large (20971520 bytes).');
    // Content above the daemon's 10 MiB per fs.write goes in chunks, never splitting a
    // character; rewriting a file says so.
    const big = 'x' + '\u00e9'.repeat(6 << 20) + 'end';
    r = await call(client, 'write_file', { path: 'large', content: big });
    assert.equal(text(r), `Overwrote large (${Buffer.byteLength(big)} bytes).`);
    r = await call(client, 'bash', { command: 'sha256sum < large' });
    const sum = (await import('node:crypto')).createHash('sha256').update(big).digest('hex');
    assert.equal(text(r), `${sum}  -\n[exit code: 0]`);
    // The session still works after each of them.
    r = await call(client, 'bash', { command: 'echo still here' });
    assert.equal(text(r), 'still here\n[exit code: 0]');
  } finally {
    await client.close();
    fs.rmSync(ws, { recursive: true, force: true });
  }
});

test('big outputs are capped with a note', async () => {
  const { client } = await connect(['--max-output', '8k']);
  try {
    let r = await call(client, 'bash', { command: 'seq 1 200000; echo END >&2' });
    let t = text(r);
    assert.equal(r.isError, false);
    assert.ok(t.length <= 8192 + 400, `bash text is capped (${t.length} bytes)`);
    assert.ok(t.startsWith('1\n2\n3\n'), 'the head is kept');
    // The note names the whole output's spill file in the sandbox, which read_file reads.
    const note = t.match(/\[\.\.\. \d+ bytes omitted; full output in (\/run\/conch\/output\/[^ ]+) \.\.\.\]/);
    assert.ok(note, 'a note says output was left out and where all of it is');
    assert.doesNotMatch(t, /conch\/mcp-/, 'no host path');
    const spill = await call(client, 'read_file', { path: note[1], offset: 199990, limit: 2 });
    assert.equal(text(spill), '199991\t199991\n199992\t199992\n' +
      '[lines 199991-199992 of 200000; pass offset=199992 to read on]\n');
    assert.match(t, /200000\n/, 'the tail is kept');
    assert.match(t, /END\n\[exit code: 0\]$/, 'stderr and the exit code survive');

    await call(client, 'bash', { command: 'seq 1 100000 > /workspace/big.txt' });
    r = await call(client, 'read_file', { path: 'big.txt' });
    t = text(r);
    assert.ok(t.length <= 8192, `read_file text is capped (${t.length} bytes)`);
    const m = t.match(/\[lines 1-(\d+) of 100000 \(the rest did not fit in one result\); pass offset=(\d+) to read on\]\n$/);
    assert.ok(m, `a note says how to read on: ${t.slice(-200)}`);
    assert.equal(m[1], m[2]);
    const n = Number(m[1]);
    assert.ok(t.includes(`${String(n).padStart(6)}\t${n}\n`), 'the last line shown is whole');
    r = await call(client, 'read_file', { path: 'big.txt', offset: n, limit: 2 });
    assert.equal(text(r), `${String(n + 1).padStart(6)}\t${n + 1}\n${String(n + 2).padStart(6)}\t${n + 2}\n` +
      `[lines ${n + 1}-${n + 2} of 100000; pass offset=${n + 2} to read on]\n`);

    r = await call(client, 'grep', { pattern: '7', path: 'big.txt' });
    t = text(r);
    assert.ok(t.length <= 8192 + 400, `grep text is capped (${t.length} bytes)`);
    assert.match(t, /bytes left out here/);
  } finally {
    await client.close();
  }
});

test('background bash: job_output and job_kill', async () => {
  const { client } = await connect([]);
  try {
    let r = await call(client, 'bash', {
      command: 'for i in 1 2 3; do echo tick $i; sleep 0.2; done; echo done >&2', background: true });
    assert.equal(r.isError, false);
    const job = text(r).match(/^Started background job (job-[0-9a-f]+)\./)[1];
    r = await call(client, 'job_output', { job_id: job, wait: 10 });
    assert.equal(text(r), `tick 1\ntick 2\ntick 3\ndone\n[job ${job} exited; exit code: 0]`);
    r = await call(client, 'job_output', { job_id: job });
    assert.equal(text(r), `(no new output)\n[job ${job} exited; exit code: 0]`);

    r = await call(client, 'bash', { command: 'echo started; exec sleep 100', background: true });
    const long = text(r).match(/(job-[0-9a-f]+)/)[1];
    r = await call(client, 'job_output', { job_id: long, wait: 0.5 });
    assert.equal(text(r), `started\n[job ${long} is still running]`);
    r = await call(client, 'job_kill', { job_id: long });
    assert.equal(text(r), `Sent TERM to every process of job ${long}.`);
    r = await call(client, 'job_output', { job_id: long, wait: 10 });
    assert.equal(text(r), `(no new output)\n[job ${long} exited; exit code: 143]`);
  } finally {
    await client.close();
  }
});

test('shell: one persistent bash per MCP session', async () => {
  const state = fs.mkdtempSync(path.join(os.tmpdir(), 'conch-mcp-state-'));
  const { client, stderr } = await connect(['--state-dir', state]);
  try {
    // Two first calls at once share the one session that the first opens.
    const [a, b] = await Promise.all([call(client, 'shell', { command: 'echo pid=$$' }),
      call(client, 'shell', { command: 'echo pid=$$' })]);
    assert.equal(text(a), text(b));
    assert.match(text(a), /^pid=\d+\n\[exit code: 0\]$/);

    let r = await call(client, 'shell', { command: 'pwd' });
    assert.equal(text(r), '/workspace\n[exit code: 0]');
    r = await call(client, 'shell', { command: "mkdir -p /tmp/w && cd /tmp/w && export V=42 && f() { echo fn-$1; }; alias ll='echo aliased'" });
    assert.equal(r.isError, false);
    assert.equal(text(r), '[exit code: 0]');
    r = await call(client, 'shell', { command: 'pwd; echo $V; f x; ll' });
    assert.equal(text(r), '/tmp/w\n42\nfn-x\naliased\n[exit code: 0]');
    // bash still starts afresh
    r = await call(client, 'bash', { command: 'pwd; echo "[$V]"' });
    assert.equal(text(r), '/workspace\n[]\n[exit code: 0]');

    r = await call(client, 'shell', { command: 'echo out; echo err >&2; (exit 3)' });
    assert.equal(r.isError, false, 'a failing command is a result');
    assert.equal(text(r), 'out\nerr\n[exit code: 3]');

    // A timeout interrupts the command; the shell and its state stay. (The sleep outlasts
    // any wait of the test: only the timeout can have ended it, and the result says so.)
    r = await call(client, 'shell', { command: 'sleep 1000', timeout: 1 });
    assert.equal(r.isError, true, 'a stopped command is an error, as with bash');
    assert.match(text(r), /timed out/);
    assert.match(text(r), /\[interrupted; the session is still usable\]$/);
    r = await call(client, 'shell', { command: 'pwd; echo $V' });
    assert.equal(text(r), '/tmp/w\n42\n[exit code: 0]');

    // exit ends the shell; the next call says a new one started, with fresh state.
    r = await call(client, 'shell', { command: 'exit 7' });
    assert.match(text(r), /\[exit code: 7\]/);
    assert.match(text(r), /the shell exited/);
    r = await call(client, 'shell', { command: 'pwd; echo "[$V]"' });
    assert.match(text(r), /^\[a new shell: /);
    assert.match(text(r), /\n\/workspace\n\[\]\n\[exit code: 0\]$/);

    r = await call(client, 'shell', {});
    assert.equal(r.isError, true);
    assert.match(text(r), /argument 'command' is required/);
    r = await call(client, 'shell', { command: 'true', timeout: -1 });
    assert.equal(r.isError, true);
    assert.match(text(r), /'timeout' must be a number >= 0/);
  } finally {
    await client.close();
  }
  // The session was closed at the end (session.close forgets its record).
  assert.doesNotMatch(stderr(), /closing the shell session/);
  const recs = fs.existsSync(path.join(state, 'sessions')) ? fs.readdirSync(path.join(state, 'sessions')) : [];
  assert.deepEqual(recs, []);
  fs.rmSync(state, { recursive: true, force: true });
});

test('snapshot, restore, snapshots, fork and changes/diff since a snapshot', async () => {
  const ws = tempWorkspace();
  const { client } = await connect(['--workspace', ws]);
  try {
    let r = await call(client, 'snapshots', {});
    assert.equal(text(r), 'No snapshots yet (take one with snapshot).');
    await call(client, 'bash', { command: 'echo one > a.txt' });
    r = await call(client, 'snapshot', { name: 'first' });
    assert.equal(r.isError, false, text(r));
    const first = text(r).match(/^Snapshot (snap-[0-9a-f]+) \("first"\) taken/)[1];
    await call(client, 'bash', { command: 'echo two > a.txt; echo b > b.txt; rm hello.txt' });

    // changes and diff since the snapshot: only what came after it.
    r = await call(client, 'changes', { since: 'first' });
    assert.equal(text(r), 'M a.txt\nA b.txt\nD hello.txt\n[3 changes (A added, M modified, ' +
      'D deleted, T type changed)]\n');
    r = await call(client, 'diff', { since: first, paths: ['a.txt'] });
    assert.match(text(r), /^-one\n\+two$/m);
    r = await call(client, 'changes', { since: 'nope' });
    assert.equal(r.isError, true);
    assert.match(text(r), /nope/);
    // Without since: against the host, as before.
    r = await call(client, 'changes', {});
    assert.match(text(r), /^A a\.txt$/m);

    // A running shell session makes a snapshot refuse, unless forced.
    r = await call(client, 'shell', { command: 'cd src; export X=1' });
    r = await call(client, 'snapshot', { name: 'second' });
    assert.equal(r.isError, true);
    assert.match(text(r), /session/);
    r = await call(client, 'snapshot', { name: 'second', force: true });
    assert.equal(r.isError, false, text(r));
    r = await call(client, 'shell', { command: 'pwd' });
    assert.match(text(r), /^\/workspace$/m);

    r = await call(client, 'snapshots', {});
    assert.match(text(r), new RegExp(`^${first} \\("first"\\): \\d+ bytes, \\d+ entries, on the host directory$`, 'm'));
    assert.match(text(r), new RegExp(`^snap-[0-9a-f]+ \\("second"\\): .* on ${first}$`, 'm'));
    assert.match(text(r), /\[2 snapshots, oldest first\]/);

    // Restore: back to the first snapshot.
    r = await call(client, 'restore', { snapshot: 'first', force: true });
    assert.equal(r.isError, false, text(r));
    r = await call(client, 'bash', { command: 'cat a.txt; ls' });
    assert.equal(text(r), 'one\na.txt\nhello.txt\nsrc\n[exit code: 0]');
    r = await call(client, 'restore', { snapshot: 'no-such' });
    assert.equal(r.isError, true);
    r = await call(client, 'restore', {});
    assert.equal(r.isError, true);
    assert.match(text(r), /'snapshot' is required/);

    // Fork from a snapshot: the session continues in the fork; the sandbox left is unchanged.
    r = await call(client, 'fork', { snapshot: 'second', force: true });
    assert.equal(r.isError, false, text(r));
    const m = text(r).match(/^Forked: this session now works in sandbox (\S+), started from snapshot (\S+)\. Sandbox (\S+) is left/);
    assert.ok(m, text(r));
    assert.notEqual(m[1], m[3]);
    r = await call(client, 'bash', { command: 'cat a.txt b.txt; test -e hello.txt || echo gone' });
    assert.equal(text(r), 'two\nb\ngone\n[exit code: 0]');
    await call(client, 'bash', { command: 'echo in-fork > f.txt' });
    r = await call(client, 'changes', { since: 'second' });
    assert.equal(text(r), 'A f.txt\n[1 change (A added, M modified, D deleted, T type changed)]\n');
    // Fork of the current state: snapshotted first.
    r = await call(client, 'fork', { force: true });
    assert.equal(r.isError, false, text(r));
    r = await call(client, 'bash', { command: 'cat f.txt' });
    assert.equal(text(r), 'in-fork\n[exit code: 0]');
    // Nothing reached the host.
    assert.equal(fs.existsSync(path.join(ws, 'a.txt')), false);
    assert.equal(fs.existsSync(path.join(ws, 'hello.txt')), true);
  } finally {
    await client.close();
    fs.rmSync(ws, { recursive: true, force: true });
  }
});

test('the session ends cleanly: --commit applies the changes, processes are gone', async () => {
  const ws = tempWorkspace();
  const { client, transport, stderr } = await connect(['--workspace', ws, '--commit']);
  const pid = transport.pid;
  const daemon = childrenOf(pid);
  assert.equal(daemon.length, 1, 'one daemon child');
  await call(client, 'bash', { command: 'echo made > made.txt; rm hello.txt' });
  assert.equal(fs.existsSync(path.join(ws, 'made.txt')), false);
  await client.close();
  assert.deepEqual(await waitGone([pid, ...daemon], 5000), [], 'conch mcp and its daemon exit');
  assert.equal(fs.readFileSync(path.join(ws, 'made.txt'), 'utf8'), 'made\n');
  assert.equal(fs.existsSync(path.join(ws, 'hello.txt')), false);
  assert.match(stderr(), /committed 2 changes to /);
  fs.rmSync(ws, { recursive: true, force: true });

  // Without --commit nothing reaches the host; --mode ro refuses writes.
  const ws2 = tempWorkspace();
  const s2 = await connect(['--workspace', ws2]);
  await call(s2.client, 'write_file', { path: 'x.txt', content: 'x' });
  await s2.client.close();
  assert.equal(fs.existsSync(path.join(ws2, 'x.txt')), false);
  const s3 = await connect(['--workspace', ws2, '--mode', 'ro']);
  const r = await call(s3.client, 'write_file', { path: 'x.txt', content: 'x' });
  assert.equal(r.isError, true);
  assert.match(text(r), /permission_denied|read-only/i);
  await s3.client.close();
  fs.rmSync(ws2, { recursive: true, force: true });
});

function defaultStateDir() {
  if (process.getuid() === 0) return '/var/lib/conch';
  const xdg = process.env.XDG_STATE_HOME;
  return xdg && xdg.startsWith('/') ? path.join(xdg, 'conch')
    : path.join(os.homedir(), '.local/state/conch');
}

test('js_eval: a persistent JS session with the sandbox\'s files', async () => {
  const ws = tempWorkspace();
  const { client } = await connect(['--workspace', ws]);
  try {
    const { tools } = await client.listTools();
    assert.match(tools.find((t) => t.name === 'js_eval').description, /await tools\.name\(input\)/);
    let r = await call(client, 'js_eval', { code: "const lines: string[] = (await readFile('hello.txt')).split('\\n');\nconsole.log(lines[1]);\nlines.length" });
    assert.equal(r.isError, false, text(r));
    assert.equal(text(r), 'world\n\u2192 3');
    r = await call(client, 'js_eval', { code: 'lines[0].toUpperCase()' });
    assert.equal(text(r), '\u2192 "HELLO"');
    r = await call(client, 'js_eval', { code: 'Object.keys(tools).length' });
    assert.equal(text(r), '\u2192 0');
    r = await call(client, 'js_eval', { code: 'typeof lines', session: 'other' });
    assert.equal(text(r), '\u2192 "undefined"');
    r = await call(client, 'js_eval', { code: '\nnull.x' });
    assert.equal(r.isError, true);
    assert.match(text(r), /TypeError/);
    r = await call(client, 'js_eval', { code: 'for (;;) {}', timeout: 0.5 });
    assert.equal(r.isError, true);
    assert.match(text(r), /TimeoutError/);
  } finally {
    await client.close();
    fs.rmSync(ws, { recursive: true, force: true });
  }
});

test('private state dirs: removed at the end, and stale ones of killed sessions too', async () => {
  const parent = defaultStateDir();
  const before = new Set(fs.existsSync(parent) ? fs.readdirSync(parent) : []);
  const s = await connect([]);
  const mine = fs.readdirSync(parent).filter((n) => /^mcp-.{6}$/.test(n) && !before.has(n));
  assert.equal(mine.length, 1, 'the session made one private state dir');
  await s.client.close();
  assert.equal(fs.existsSync(path.join(parent, mine[0])), false, 'and removed it');

  // A session killed with SIGKILL leaves its dir; the next session removes it once it is
  // older than a minute and no daemon holds its database. A fresh one stays.
  const k = await connect([]);
  const killed = fs.readdirSync(parent).filter((n) => /^mcp-.{6}$/.test(n) && !before.has(n))[0];
  const daemon = childrenOf(k.transport.pid);
  process.kill(k.transport.pid, 'SIGKILL');
  assert.deepEqual(await waitGone([k.transport.pid, ...daemon], 10000), []);
  const stale = path.join(parent, killed);
  assert.ok(fs.existsSync(path.join(stale, 'state.db')), 'SIGKILL left the dir');
  const fresh = fs.mkdtempSync(path.join(parent, 'mcp-'));
  const old = new Date(Date.now() - 120000);
  fs.utimesSync(stale, old, old);
  const seen = new Set(fs.readdirSync(parent));
  const live = await connect([]);
  const liveDir = path.join(parent, fs.readdirSync(parent).find((x) => !seen.has(x)));
  fs.utimesSync(liveDir, old, old);
  const n = await connect([]);
  assert.ok(fs.existsSync(path.join(liveDir, 'state.db')), 'a live session\'s dir is kept');
  assert.equal(text(await call(live.client, 'bash', { command: 'echo alive' })),
    'alive\n[exit code: 0]');
  await n.client.close();
  await live.client.close();
  await k.client.close().catch(() => {});
  assert.equal(fs.existsSync(stale), false, 'the stale dir is gone');
  assert.ok(fs.existsSync(fresh), 'a dir younger than a minute is kept');
  fs.rmSync(fresh, { recursive: true, force: true });
});

// ---- raw JSON-RPC lines, for what the SDK never sends ----

function rawSession(args = []) {
  const p = spawn(conch, ['mcp', ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
  const lines = readline.createInterface({ input: p.stdout });
  const queue = [];
  const waiters = [];
  lines.on('line', (l) => {
    const msg = JSON.parse(l);
    if (waiters.length) waiters.shift()(msg); else queue.push(msg);
  });
  let stderr = '';
  p.stderr.on('data', (d) => { stderr += d; });
  const next = () => new Promise((resolve) => {
    if (queue.length) resolve(queue.shift()); else waiters.push(resolve);
  });
  const send = (obj) => p.stdin.write(typeof obj === 'string' ? obj : JSON.stringify(obj) + '\n');
  const exited = new Promise((resolve) => p.on('exit', (code, sig) => resolve({ code, sig })));
  return { p, next, send, exited, stderr: () => stderr };
}

const init = (id, version) => ({ jsonrpc: '2.0', id, method: 'initialize',
  params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } });

test('raw protocol: negotiation, errors, ping, shutdown on SIGTERM', async () => {
  const s = rawSession();
  s.send({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'bash' } });
  let m = await s.next();
  assert.equal(m.id, 1);
  assert.equal(m.error.code, -32600);
  assert.match(m.error.message, /not initialized/);
  s.send({ jsonrpc: '2.0', id: 2, method: 'ping' });
  assert.deepEqual(await s.next(), { jsonrpc: '2.0', id: 2, result: {} });

  s.send(init(3, '1999-01-01'));
  m = await s.next();
  assert.equal(m.id, 3);
  assert.equal(m.result.protocolVersion, '2025-06-18', 'an unknown version gets our latest');
  assert.deepEqual(m.result.capabilities, { tools: { listChanged: false } });
  s.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
  s.send(init(4, '2025-06-18'));
  m = await s.next();
  assert.equal(m.error.code, -32600, 'a second initialize is refused');

  s.send('{"jsonrpc": "2.0", "id": 5, bad json\n');
  m = await s.next();
  assert.equal(m.id, null);
  assert.equal(m.error.code, -32700);
  s.send([{ jsonrpc: '2.0', id: 6, method: 'ping' }]);
  m = await s.next();
  assert.equal(m.error.code, -32600);
  assert.match(m.error.message, /batch/);
  s.send({ jsonrpc: '2.0', id: 7, method: 'resources/list' });
  m = await s.next();
  assert.equal(m.id, 7);
  assert.equal(m.error.code, -32601);
  s.send({ jsonrpc: '2.0', id: 8, method: 'tools/call', params: { name: 'bash', arguments: 5 } });
  m = await s.next();
  assert.equal(m.error.code, -32602);
  s.send({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'bash',
    arguments: { command: 'echo ok' } } });
  m = await s.next();
  assert.deepEqual(m.result, { content: [{ type: 'text', text: 'ok\n[exit code: 0]' }],
    isError: false });

  // A client that ends the server with SIGTERM, with a command in flight.
  s.send({ jsonrpc: '2.0', id: 10, method: 'tools/call', params: { name: 'bash',
    arguments: { command: 'sleep 100' } } });
  await new Promise((r) => setTimeout(r, 300));
  const daemon = childrenOf(s.p.pid);
  s.p.kill('SIGTERM');
  const { code } = await s.exited;
  assert.equal(code, 0);
  assert.deepEqual(await waitGone(daemon, 5000), []);
  assert.match(s.stderr(), /signal 15: ending the session/);
});

test('raw protocol: a client version we speak is kept; a bad workspace fails initialize', async () => {
  const s = rawSession();
  s.send(init(1, '2025-03-26'));
  assert.equal((await s.next()).result.protocolVersion, '2025-03-26');
  s.p.stdin.end();
  assert.equal((await s.exited).code, 0);

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'conch-mcp-'));
  const s2 = rawSession(['--workspace', dir, '--rootfs', path.join(dir, 'nope')]);
  s2.send(init(1, '2025-06-18'));
  const m = await s2.next();
  assert.equal(m.error.code, -32603);
  assert.match(m.error.message, /cannot create the sandbox: .*nope/);
  s2.p.stdin.end();
  await s2.exited;
  fs.rmSync(dir, { recursive: true, force: true });

  const s3 = spawn(conch, ['mcp', '--workspace', '/nonexistent-dir']);
  let err = '';
  s3.stderr.on('data', (d) => { err += d; });
  const code = await new Promise((r) => s3.on('exit', r));
  assert.equal(code, 2);
  assert.match(err, /--workspace: '\/nonexistent-dir' is not a directory/);
});

test('raw protocol: U+0000 in a request and NUL bytes in an answer keep their ids', async () => {
  // A valid JSON string may hold \u0000. It used to be answered as a parse error with id null
  // (the client waited for its answer until its own timeout), and a command printing a NUL
  // byte made the daemon's answer unreadable, so the call was never answered at all.
  const ws = tempWorkspace();
  const s = rawSession(['--workspace', ws]);
  try {
    s.send(init(1, '2025-06-18'));
    assert.equal((await s.next()).id, 1);
    s.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
    s.send({ jsonrpc: '2.0', id: 'nul-arg', method: 'tools/call',
      params: { name: 'bash', arguments: { command: 'echo a\u0000b' } } });
    let m = await s.next();
    assert.equal(m.id, 'nul-arg');
    assert.equal(m.result.isError, true, 'a command cut at the NUL is refused, not run');
    assert.match(m.result.content[0].text, /'command' holds a NUL character/);
    s.send({ jsonrpc: '2.0', id: 3, method: 'tools/call',
      params: { name: 'bash', arguments: { command: "printf 'x\\0y'" } } });
    m = await s.next();
    assert.equal(m.id, 3);
    assert.equal(m.result.isError, false);
    assert.match(m.result.content[0].text, /^x.y\n\[exit code: 0\]$/u);
    s.send({ jsonrpc: '2.0', id: 4, method: 'tools/call',
      params: { name: 'write_file', arguments: { path: 'nul.bin', content: 'a\u0000b' } } });
    m = await s.next();
    assert.equal(m.id, 4);
    assert.match(m.result.content[0].text, /Created .*nul\.bin \(3 bytes\)/);
    s.send({ jsonrpc: '2.0', id: 5, method: 'tools/call',
      params: { name: 'bash', arguments: { command: 'od -An -c nul.bin' } } });
    m = await s.next();
    assert.equal(m.id, 5);
    assert.match(m.result.content[0].text, /a +\\0 +b/, 'the NUL reached the file');
  } finally {
    s.p.stdin.end();
    await s.exited;
    fs.rmSync(ws, { recursive: true, force: true });
  }
});
