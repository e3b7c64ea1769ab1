// mcp-http.test.js - `conch mcp --listen` driven by the official MCP TypeScript SDK client over
// its Streamable HTTP transport (StreamableHTTPClientTransport), as a remote MCP host would:
// a daemon with a --tokens file, conch mcp serving HTTPS in front of it with a certificate
// made here, and a fetch that trusts that certificate. The raw HTTP refusals (no token,
// another tenant's session, body cap, Origin, ...) are in tests/integration/test_mcp_http.py.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const conch = path.resolve(process.env.CONCH_BIN || path.join(here, '../../build/conch'));
const TOK_A = 'alice-token-0123456789abcdef';
const TOK_B = 'bob-token-0123456789abcdef00';

let dir, daemon, server, url, ca;

function waitFor(cond, what, ms = 30000) {
  const until = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const tick = () => {
      const v = cond();
      if (v) return resolve(v);
      if (Date.now() > until) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, 50);
    };
    tick();
  });
}

// A fetch (the SDK's FetchLike) over node:https that trusts our test certificate.
function fetchWithCa(input, init = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(typeof input === 'string' ? input : input.href ?? input.url);
    const headers = {};
    new Headers(init.headers || {}).forEach((v, k) => { headers[k] = v; });
    if (init.body) headers['content-length'] = Buffer.byteLength(init.body);
    const req = https.request(u, { method: init.method || 'GET', headers, ca }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) h.set(k, Array.isArray(v) ? v.join(', ') : v);
        const body = [204, 202].includes(res.statusCode) ? null : Buffer.concat(chunks);
        resolve(new Response(body, { status: res.statusCode, headers: h }));
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    if (init.signal) init.signal.addEventListener('abort', () => req.destroy(new Error('aborted')));
    if (init.body) req.write(init.body);
    req.end();
  });
}

async function connect(token) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: fetchWithCa,
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: 'conch-http-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

function text(res) {
  assert.equal(res.content.length, 1);
  assert.equal(res.content[0].type, 'text');
  return res.content[0].text;
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'conch-mcp-http-'));
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout',
    path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem'), '-days', '2', '-subj',
    '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'], { stdio: 'ignore' });
  ca = fs.readFileSync(path.join(dir, 'cert.pem'));
  fs.writeFileSync(path.join(dir, 'tokens'), `alice ${TOK_A}\nbob ${TOK_B}\n`, { mode: 0o600 });
  const sock = path.join(dir, 'conch.sock');
  daemon = spawn(conch, ['serve', '--socket', sock, '--state-dir', path.join(dir, 'state'),
    '--tokens', path.join(dir, 'tokens'), '--pool', '0'], { stdio: ['ignore', 'ignore', 'inherit'] });
  await waitFor(() => fs.existsSync(sock), 'the daemon socket');
  let err = '';
  server = spawn(conch, ['mcp', '--listen', '127.0.0.1:0', '--tls-cert', path.join(dir, 'cert.pem'),
    '--tls-key', path.join(dir, 'key.pem'), '--socket', sock], { stdio: ['ignore', 'ignore', 'pipe'] });
  server.stderr.on('data', (d) => { err += d; process.stderr.write(d); });
  const port = await waitFor(() => (err.match(/https:\/\/127\.0\.0\.1:(\d+)\/mcp/) || [])[1],
    'conch mcp --listen');
  url = `https://127.0.0.1:${port}/mcp`;
});

after(async () => {
  for (const p of [server, daemon]) {
    if (!p || p.exitCode !== null) continue;
    const done = new Promise((r) => p.once('exit', r));
    p.kill('SIGTERM');
    await done;
  }
  assert.equal(server.exitCode, 0, 'conch mcp --listen exits cleanly on SIGTERM');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('lists the tools of the stdio server', async () => {
  const { client, transport } = await connect(TOK_A);
  assert.match(transport.sessionId, /^[0-9a-f]{32}$/);
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const n of ['bash', 'shell', 'read_file', 'write_file', 'edit_file', 'snapshot', 'fork'])
    assert.ok(names.includes(n), n);
  await transport.terminateSession();
  await client.close();
});

test('runs a command, writes and reads a file', async () => {
  const { client, transport } = await connect(TOK_A);
  const out = await client.callTool({ name: 'bash', arguments: { command: 'echo hello; id -un' } });
  assert.equal(text(out), 'hello\nagent\n[exit code: 0]');
  const w = await client.callTool({ name: 'write_file',
    arguments: { path: 'notes/a.txt', content: 'one\ntwo\n' } });
  assert.equal(w.isError, false, text(w));
  const r = await client.callTool({ name: 'read_file', arguments: { path: 'notes/a.txt' } });
  assert.match(text(r), /one\n.*two/s);
  const sh1 = await client.callTool({ name: 'shell', arguments: { command: 'cd notes; X=42' } });
  assert.equal(sh1.isError, false, text(sh1));
  const sh2 = await client.callTool({ name: 'shell', arguments: { command: 'pwd; echo $X' } });
  assert.match(text(sh2), /\/workspace\/notes\n42\n/);
  await transport.terminateSession();
  await client.close();
});

test('sessions are apart: each its own sandbox, bound to its token', async () => {
  const a = await connect(TOK_A);
  const b = await connect(TOK_B);
  await a.client.callTool({ name: 'write_file', arguments: { path: 'mine.txt', content: 'a' } });
  const r = await b.client.callTool({ name: 'read_file', arguments: { path: 'mine.txt' } });
  assert.equal(r.isError, true);
  // bob's token on alice's session id: refused as an unknown session.
  const res = await fetchWithCa(url, { method: 'POST', headers: {
    Authorization: `Bearer ${TOK_B}`, 'Mcp-Session-Id': a.transport.sessionId,
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
  body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'ping' }) });
  assert.equal(res.status, 404);
  for (const s of [a, b]) {
    await s.transport.terminateSession();
    await s.client.close();
  }
});

test('a wrong token cannot connect', async () => {
  await assert.rejects(connect('not-a-token-of-this-daemon-0000'), /401|nauthorized/);
});
