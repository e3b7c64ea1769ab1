// index.js - conch-tools: call the harness's tools and spawn sub-agents from Node inside a
// conch sandbox.
//
//   const { tools, call, spawnAgent } = require('conch-tools');
//   const hits = await tools.webSearch({ query: 'conch' });   // calls the tool web_search
//   const all = await Promise.all(texts.map((text) => call('classify', { text })));
//
// Each call is one JSON line over the tool bridge's unix socket ($CONCH_PTC_SOCK, default
// /run/conch/ptc.sock). One connection per process carries every call, multiplexed by id, so
// Promise.all of many calls runs them all at once; the socket is unref'd while no call is in
// flight, so it never keeps the process alive. Errors reject with a ToolError (err.kind,
// err.message); UnknownTool and InvalidInput are its subclasses for those kinds.
'use strict';

const net = require('net');

const DEFAULT_SOCK = '/run/conch/ptc.sock';
const MAX_LINE = 4 << 20; // the bridge's payload cap, each way

class ToolError extends Error {
  constructor(kind, message) {
    super(message);
    this.name = 'ToolError';
    this.kind = kind;
  }
}
class UnknownTool extends ToolError {
  constructor(kind, message) {
    super(kind, message);
    this.name = 'UnknownTool';
  }
}
class InvalidInput extends ToolError {
  constructor(kind, message) {
    super(kind, message);
    this.name = 'InvalidInput';
  }
}

function makeError(kind, message) {
  if (kind === 'unknown_tool') return new UnknownTool(kind, message);
  if (kind === 'invalid_input') return new InvalidInput(kind, message);
  return new ToolError(kind, message);
}

function sockPath() {
  return process.env.CONCH_PTC_SOCK || DEFAULT_SOCK;
}

let conn = null;
let nextId = 1;

function failAll(c, err) {
  if (c.dead) return;
  c.dead = true;
  if (conn === c) conn = null;
  for (const p of c.pending.values()) p.reject(makeError(err.kind, err.message));
  c.pending.clear();
  c.sock.destroy();
}

function onLine(c, line) {
  let resp;
  try {
    resp = JSON.parse(line);
  } catch (e) {
    failAll(c, new ToolError('unavailable', `the tool bridge sent a malformed answer: ${e.message}`));
    return;
  }
  const p = resp && c.pending.get(resp.id);
  if (!p) return; // an answer to a call nobody waits for any more
  c.pending.delete(resp.id);
  if (c.pending.size === 0) c.sock.unref();
  if (resp.ok === true) {
    p.resolve(resp.result === undefined ? null : resp.result);
  } else {
    const e = resp.error || {};
    p.reject(makeError(String(e.kind || 'tool_error'), String(e.message || 'the call failed')));
  }
}

function connection() {
  if (conn && !conn.dead) return conn;
  const path = sockPath();
  const sock = net.createConnection({ path });
  const c = { sock, pending: new Map(), parts: [], size: 0, dead: false };
  sock.setEncoding('utf8');
  sock.on('data', (chunk) => {
    let start = 0;
    let nl;
    while ((nl = chunk.indexOf('\n', start)) !== -1) {
      c.parts.push(chunk.slice(start, nl));
      const line = c.parts.length === 1 ? c.parts[0] : c.parts.join('');
      c.parts = [];
      c.size = 0;
      start = nl + 1;
      onLine(c, line);
      if (c.dead) return;
    }
    if (start < chunk.length) {
      c.parts.push(start ? chunk.slice(start) : chunk);
      c.size += chunk.length - start;
      if (c.size > MAX_LINE + 65536)
        failAll(c, new ToolError('too_large', "the answer is over the bridge's 4 MiB cap"));
    }
  });
  sock.on('error', (e) => {
    if (e.code === 'ENOENT' || e.code === 'ECONNREFUSED' || e.code === 'ENOTDIR')
      failAll(c, new ToolError('unavailable',
        `no tool bridge in this sandbox: ${path}: ${e.code} (tools are available only when the ` +
        'sandbox runs with a tool bridge; set CONCH_PTC_SOCK if it is elsewhere)'));
    else failAll(c, new ToolError('unavailable', `the tool bridge connection failed: ${e.message}`));
  });
  sock.on('close', () =>
    failAll(c, new ToolError('unavailable', 'the tool bridge closed the connection before answering')));
  conn = c;
  return c;
}

function request(req) {
  return new Promise((resolve, reject) => {
    const id = nextId++;
    req.id = id;
    let line;
    try {
      line = JSON.stringify(req) + '\n';
    } catch (e) {
      reject(makeError('invalid_input', `the input cannot be sent as JSON: ${e.message}`));
      return;
    }
    if (line.length > MAX_LINE / 4 && Buffer.byteLength(line) > MAX_LINE) {
      reject(new ToolError('too_large', "the request is over the bridge's 4 MiB cap"));
      return;
    }
    const c = connection();
    c.pending.set(id, { resolve, reject });
    if (c.pending.size === 1) c.sock.ref();
    c.sock.write(line);
  });
}

/** Call tool `name` with `input` (an object; default {}); resolves to its result. */
function call(name, input) {
  return request({ op: 'call', name: String(name), input: input === undefined ? {} : input });
}

/** Hand `task` to a sub-agent of `type` (null: the default agent); resolves to its final
 * answer, or with { detach: true } at once to the request id (a string). */
async function spawnAgent(task, type = null, options = {}) {
  const detach = !!(options && options.detach);
  const r = await request({ op: 'spawn', task: String(task), type: type == null ? null : String(type), detach });
  if (detach && r && typeof r === 'object' && 'request_id' in r) return r.request_id;
  return r;
}

/** Resolves to { tools: [{name, description, input_schema}], agents: [{name, description}] }. */
function listTools() {
  return request({ op: 'list' });
}

// tools.webSearch({...}) calls web_search, unless a tool named exactly webSearch exists.
function snake(name) {
  return name
    .replace(/([a-z0-9])([A-Z])/g, '$1_$2')
    .replace(/([A-Z]+)([A-Z][a-z])/g, '$1_$2')
    .toLowerCase();
}

let names = null; // a promise of the registered names, fetched when a name is ambiguous

async function resolveName(prop) {
  const s = snake(prop);
  if (s === prop) return prop;
  for (let attempt = 0; attempt < 2; attempt++) {
    if (!names || attempt === 1)
      names = listTools().then((r) => new Set(((r && r.tools) || []).map((t) => t.name)));
    let set;
    try {
      set = await names;
    } catch (e) {
      names = null;
      throw e;
    }
    if (set.has(prop)) return prop;
    if (set.has(s)) return s;
  }
  return s;
}

const tools = new Proxy(
  {},
  {
    get(_target, prop) {
      // Not thenable (so `await tools` works), no symbol or inspection magic.
      if (typeof prop !== 'string' || prop === 'then' || prop === 'toJSON' || prop === 'inspect') return undefined;
      return async (input) => call(await resolveName(prop), input);
    },
  },
);

module.exports = { call, spawnAgent, listTools, tools, ToolError, UnknownTool, InvalidInput };
