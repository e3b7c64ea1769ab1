// client.ts - ConchClient: every method of docs/PROTOCOL.md (and the tool bridge of
// notes/BRIDGE.md) as a typed async method over one RpcConnection.
import { ConchError, RpcConnection, socketTransport, stdioTransport, type StdioOptions, type Transport, type RequestHandler } from "./rpc.js";
import { EventEmitter } from "node:events";
import { ConchSession } from "./session.js";
import { remoteOptions, remoteTransport, type RemoteOptions } from "./remote.js";
import { join, resolve } from "node:path";
import { promises as fsp } from "node:fs";
import { tmpdir } from "node:os";

export type SandboxMode = "overlay" | "ro" | "rw";

export interface SandboxInfo {
  id: string;
  name: string | null;
  state: "running" | "stopped" | string;
  workspace: string | null;
  mode: SandboxMode;
  as_root: boolean;
  created_at: number;
  last_used_at: number;
  commands: number;
  /** bytes the daemon holds for the sandbox now, charged to its budget */
  held: number;
  /** the snapshot its workspace stands on, or null */
  snapshot?: string | null;
  /** a fork served by a pre-built sandbox of the daemon's pool (sandbox.fork) */
  from_pool?: boolean;
  [key: string]: unknown;
}

export interface SandboxCreateParams {
  workspace?: string;
  mode?: SandboxMode;
  rootfs?: string;
  as_root?: boolean;
  env?: Record<string, string>;
  memory?: number;
  pids?: number;
  cpu?: number;
  tmp_size?: number;
  disk?: number;
  idle_timeout?: number;
  name?: string;
  /** Seconds a tool call may wait for its answer (default 300). */
  tool_timeout?: number;
  /** Tool calls one command may make (default 10,000). */
  max_tool_calls?: number;
  /** Extra mounts: `{type: "tmpfs", target, size?}`, `{type: "bind", source, target, readonly?}` (read-only unless `readonly: false`), `{type: "store", name, target, size?}` (a named store, written back after each command), `{type: "overlay", source, target}` (the host dir through an overlay: writes stay in the daemon's upper dir until `workspaceCommit(id, paths, {mount: target})`), or docker's `"type=tmpfs,target=/scratch,size=64m"`. */
  mounts?: (MountSpec | string)[];
  /** The network: "none" (default; "allow" when `allow` is given), "allow" (HTTP/HTTPS through the daemon's proxy by the rules) or "host". */
  net?: NetMode;
  /** Rules of the allow mode: `"pypi.org"`, `"*.npmjs.org"`, `"10.0.0.5"`, each with an optional `":PORT"`; deny wins. */
  allow?: string[];
  deny?: string[];
  /** Path rules: paths relative to the workspace (`".git/hooks"`) that commands cannot change, enforced by the kernel and never committed (at most 32 rules in all). */
  readonly?: string[];
  /** Paths relative to the workspace (`".env"`) that commands cannot see: an empty file or dir of mode 000 in their place (a missing path: an empty dir, so nothing can be made there); never committed. */
  hidden?: string[];
  /** Host unix sockets passed in (any `net`): `{host, path?}` or `"HOST[:INSIDE]"`, a socket the caller owns bound at `path` (default: its host path). Set `SSH_AUTH_SOCK` in `env` yourself for an ssh agent. */
  sockets?: (SocketSpec | string)[];
  [key: string]: unknown;
}

/** A host unix socket passed into a sandbox (sandbox.create's `sockets`). */
export interface SocketSpec {
  /** absolute host path of a unix socket the caller owns (no symbolic link) */
  host: string;
  /** where it is inside (default: `host`); at most 107 bytes */
  path?: string;
}

export type NetMode = "none" | "allow" | "host";

/** One network attempt of a sandbox (network.log, and exec.run's `network`). */
export interface NetworkRecord {
  at: number;
  host: string;
  port: number;
  kind: "connect" | "http" | string;
  allowed: boolean;
  /** the rule that decided, or null */
  rule: string | null;
  /** why it was refused or failed, or null */
  error: string | null;
  address?: string | null;
  bytes_out?: number;
  bytes_in?: number;
  duration?: number;
  open?: boolean;
  [key: string]: unknown;
}

/** network.set's params: the lists given replace the sandbox's (those left out stay). */
export interface NetworkSetParams {
  /** only "none" <-> "allow" for an allow sandbox */
  net?: NetMode;
  allow?: string[];
  deny?: string[];
}

export interface NetworkPolicy {
  sandbox: string;
  net: NetMode;
  allow: string[];
  deny: string[];
}

export interface NetworkLog extends NetworkPolicy {
  /** every attempt since the sandbox was created */
  total: number;
  /** the last 256 attempts, oldest first */
  records: NetworkRecord[];
}

export interface MountSpec {
  type: "tmpfs" | "bind" | "store" | "overlay";
  target: string;
  source?: string;
  /** tmpfs: its size; store: its cap (bytes) when it is new (default 256 MiB) */
  size?: number | string;
  readonly?: boolean;
  /** store: which one (1-64 of [A-Za-z0-9._-]) */
  name?: string;
}

/** An entry of a store (store.ls, store.read). */
export interface StoreEntry {
  name: string;
  path: string;
  type: "file" | "dir";
  size: number;
  mode: number;
  mtime: number;
  /** who wrote it last: a sandbox id, or "host" */
  writer: string;
}

/** A store as store.list lists it. */
export interface StoreInfo {
  name: string;
  bytes: number;
  entries: number;
  max_bytes: number;
  version: number;
}

/** What the write-back of a store mount did after a command (exec.run's, a job's and session.run's "stores"). */
export interface StoreReport {
  name: string;
  target: string;
  written: number;
  deleted: number;
  /** brought in from other writers */
  pulled: number;
  /** links, fifos, devices, sockets: never stored */
  skipped: number;
  /** files over the largest-file cap, names with control characters */
  refused: number;
  first_skipped?: string;
  /** the write-back's transaction failed (over the store's cap...): nothing of it was written */
  error?: string;
}

/** A snapshot of a sandbox's workspace (workspace.snapshot, workspace.snapshots). */
export interface Snapshot {
  id: string;
  name?: string;
  parent?: string;
  sandbox: string;
  workspace: string;
  size: number;
  files: number;
  depth: number;
  created_at: number;
}

export interface Change {
  path: string;
  kind: "added" | "modified" | "deleted" | string;
  type: string;
  size: number;
  mode: string;
  binary?: boolean;
  skip?: string;
  link_outside?: boolean;
  [key: string]: unknown;
}

export interface CallRecord {
  call_id: string;
  kind: "tool" | "agent";
  name: string;
  input: unknown;
  ok: boolean;
  result?: unknown;
  error?: { kind: string; message: string };
  start: number;
  duration_ms: number;
  origin: { kind: string; id: string };
  detached?: boolean;
}

/** js.eval's params: JavaScript or TypeScript run in the sandbox's JS session `session`. */
export interface JsEvalParams {
  sandbox: string;
  code: string;
  /** default "default"; globals persist between evals of a session */
  session?: string;
  /** seconds for the whole eval, pending promises included (default 60; 0: none) */
  timeout?: number;
  /** which registered tools the session sees (kept by the session until changed; default "all") */
  tools?: JsToolSet;
}

/** js.eval's `tools`: which of the sandbox's registered tools a JS session sees. */
export type JsToolSet = "all" | "none" | { include: string[] } | { exclude: string[] };

/** js.eval's result: a script that threw is `ok: false`, not an error. */
export interface JsEvalResult {
  ok: boolean;
  value?: unknown;
  type?: string;
  error?: { name: string; message: string; stack?: string; line?: number };
  console: { level: string; text: string }[];
  console_dropped?: number;
  /** the eval's calls of the sandbox's tools (`await tools.name(input)`) */
  tool_calls: CallRecord[];
  tools_summary?: string;
  writes: string[];
  /** what to show a model: console lines, then `→ value` or the error */
  text: string;
  session: string;
  restarted: boolean;
  restart_reason?: string;
}

export interface JsSessionInfo {
  session: string;
  running: boolean;
  busy: boolean;
  lost: boolean;
  evals: number;
}

/** A `spawn_agent --detach` request: recorded by the daemon, run by the harness. */
export interface DetachedAgentRequest {
  call_id: string;
  task: string;
  type: string | null;
}

export interface ExecParams {
  sandbox?: string;
  fresh?: boolean;
  workspace?: string;
  mode?: SandboxMode;
  command: string;
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string;
  timeout?: number;
  grace?: number;
  max_output?: number;
  /** false: the result lists no workspace changes (the daemon skips scanning them). */
  changes?: boolean;
  /** "bash" (default: /bin/bash -c) or "sh" (/bin/sh -c). */
  shell?: "bash" | "sh";
  [key: string]: unknown;
}

export interface ExecResult {
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  duration_ms: number;
  stdout: string;
  stderr: string;
  stdout_bytes: number;
  stderr_bytes: number;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  stdout_spill: string | null;
  stderr_spill: string | null;
  changes: Change[];
  changes_total: number;
  changes_truncated: boolean;
  usage: { cpu_ms: number; max_rss_kb: number };
  error: null | { kind: "command" | "timeout" | "limit" | string; message: string };
  text: string;
  tool_calls?: CallRecord[];
  detached_agents?: DetachedAgentRequest[];
  /** The `[tools: ...]` summary line (also in `text`) when the command called tools. */
  tools_summary?: string;
  /** Not there with no network; "host" for the host's network; in the allow mode the command's attempts (at most 100). */
  network?: "host" | NetworkRecord[];
  /** how many attempts beyond those listed in `network` */
  network_dropped?: number;
  /** with store mounts: what each one's write-back did after the command */
  stores?: StoreReport[];
  [key: string]: unknown;
}

export interface ExecOutputEvent {
  request_id: number | string;
  stream: "stdout" | "stderr";
  data: string;
}

export interface JobInfo {
  job_id: string;
  sandbox: string;
  command: string;
  running: boolean;
  exit_code: number | null;
  signal?: number | null;
  started_at: number;
}
export interface JobOutput {
  stdout: string;
  stderr: string;
  stdout_offset: number;
  stderr_offset: number;
  running: boolean;
  exit_code: number | null;
}
export interface JobWaitResult {
  running: boolean;
  exit_code: number | null;
  signal: number | null;
  lost?: string;
  tools_summary?: string;
  tool_calls?: CallRecord[];
  detached_agents?: DetachedAgentRequest[];
}
export interface JobExitedEvent {
  job_id: string;
  sandbox: string;
  exit_code: number | null;
  signal: number | null;
  tool_calls?: CallRecord[];
  detached_agents?: DetachedAgentRequest[];
}

export interface FsReadText {
  content: string;
  offset: number;
  lines: number;
  total_lines: number;
  truncated: boolean;
  size: number;
}
export interface FsReadBase64 {
  content: string;
  size: number;
}
/** One chunk of a file (fs.read's chunk form). */
export interface FsChunk {
  content: Uint8Array;
  /** The file's size when read. */
  size: number;
  offset: number;
  length: number;
  eof: boolean;
}

/** The most file content one request carries (the daemon's cap: 10 MiB). */
export const FS_CHUNK_MAX = 10 << 20;
/** Chunk size of fsReadFile / fsWriteFile by default (see bench/README.md). */
export const FS_CHUNK_DEFAULT = FS_CHUNK_MAX;
/**
 * Files from this size on move by fs.copy_in / fs.copy_out (a private temporary file the
 * daemon opens, copied by its file worker in the kernel) where the daemon can open this
 * process's files (a local daemon of our uid); elsewhere in chunks.
 */
export const FS_COPY_MIN = 1 << 20;

/** fs.copy_in / fs.copy_out's host_id of a host file: "st_dev:st_ino" as we see it. */
export async function hostId(path: string): Promise<string> {
  const st = await fsp.stat(path, { bigint: true });
  return `${st.dev}:${st.ino}`;
}

export interface FsEntry {
  name: string;
  path: string;
  type: "f" | "d" | "l" | "o";
  size: number;
  mode: string;
  mtime: number;
}
/** An entry of `fs.glob {details: true}`. */
export interface FsGlobEntry {
  path: string;
  type: "f" | "d" | "l" | "o";
  size: number;
  mtime: number;
}
export interface FsGrepMatch {
  path: string;
  line: number;
  text: string;
}
export interface FsFileError {
  code: string;
  message: string;
}

export interface ToolSpec {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
  output_schema?: Record<string, unknown>;
  /** Seconds this tool's calls may take (default: the sandbox's tool_timeout). */
  timeout?: number;
}
export interface AgentSpec {
  name: string;
  description: string;
}
export interface ToolCallParams {
  sandbox: string;
  call_id: string;
  name: string;
  input: any;
  origin: { kind: "exec" | "job" | "session" | string; id: string };
}
export interface AgentSpawnParams {
  sandbox: string;
  call_id: string;
  task: string;
  type: string | null;
  origin: { kind: string; id: string };
}

export interface SessionOpenParams {
  sandbox: string;
  /** Only "bash" is supported. */
  shell?: "bash";
  cwd?: string;
  env?: Record<string, string>;
  rows?: number;
  cols?: number;
  /** Bytes of output kept for late attachers (default 1 MiB). */
  scrollback?: number;
  /** Seconds without a run, write or attach before the session ends (default 3600). */
  idle_timeout?: number;
  /** Attach the opening client as the writer. */
  attach?: boolean;
  [key: string]: unknown;
}

/** The session object of docs/PROTOCOL.md ("session.*"). */
export interface SessionInfo {
  session: string;
  sandbox: string;
  state: "starting" | "running" | "ended" | string;
  clients: number;
  writer: boolean;
  rows: number;
  cols: number;
  created_at: number;
  last_used_at: number;
  output_bytes: number;
  shells: number;
  queued: number;
  reason?: string;
  exit_code?: number | null;
  [key: string]: unknown;
}

export interface SessionRunParams {
  session: string;
  command: string;
  stdin?: string;
  /** Seconds (default 120); on expiry the command is interrupted and the shell stays. */
  timeout?: number;
  grace?: number;
  max_output?: number;
  [key: string]: unknown;
}

/** exec.run's result plus the session's flags. Output (stdout and stderr merged) is in `stdout`. */
export interface SessionRunResult extends ExecResult {
  session: string;
  /** The shell ended during this command (`exit`, `exec`, `set -e`); the next run starts a new one. */
  shell_exited: boolean;
  /** A new shell ran this command: the previous one had exited and its state is lost. */
  new_shell: boolean;
  /** After a timeout: the command was interrupted and the shell (with its state) stays. */
  session_usable?: boolean;
}

export interface SessionAttachResult extends SessionInfo {
  /** The last `scrollback` bytes of output. */
  scrollback: string;
  /** Offset of the scrollback's first byte in the session's output. */
  seq: number;
  next_seq: number;
  you_write: boolean;
}

export interface SessionOutputEvent {
  session: string;
  /** Byte offset of `data` in the session's output. */
  seq: number;
  data: string;
}
export interface SessionStartedEvent {
  session: string;
  /** Shells started so far: 1, 2, ... */
  shell: number;
}
export interface SessionWriterEvent {
  session: string;
  writer: boolean;
  reason: string;
}
export interface SessionEndedEvent {
  session: string;
  reason: string;
  exit_code: number | null;
}

export interface ConnectOptions extends StdioOptions, RemoteOptions {
  /** Connect to this daemon socket instead of spawning `conch serve --stdio`. */
  socket?: string;
  /** Use this transport as it is (tests). */
  transport?: Transport;
}

/** The default socket path of `conch serve` for this user (docs/PROTOCOL.md). */
export function defaultSocketPath(): string {
  const uid = process.getuid?.() ?? 0;
  if (uid === 0) return "/run/conch/conch.sock";
  if (process.env.XDG_RUNTIME_DIR) return join(process.env.XDG_RUNTIME_DIR, "conch", "conch.sock");
  return `/tmp/conch-${uid}/conch.sock`;
}

/**
 * A client of one conch daemon. Events: "exec.output" (ExecOutputEvent), "job.exited"
 * (JobExitedEvent), "session.output" (SessionOutputEvent), "session.started"
 * (SessionStartedEvent), "session.writer" (SessionWriterEvent), "session.ended"
 * (SessionEndedEvent), "notification" (method, params), "close" (error).
 */
export class ConchClient extends EventEmitter {
  readonly rpc: RpcConnection;
  private streams = new Map<number | string, (e: ExecOutputEvent) => void>();
  private streamIds = 0;
  /** Set once the daemon could not open our files (an older daemon, one on another host):
   * big files then move in chunks without asking again. */
  noCopy = false;

  constructor(rpc: RpcConnection) {
    super();
    this.rpc = rpc;
    rpc.on("notification", (method: string, params: any) => {
      if (method === "exec.output") {
        const cb = this.streams.get(params?.request_id);
        cb?.(params);
      }
      this.emit(method, params);
      this.emit("notification", method, params);
    });
    rpc.on("close", (e: Error) => this.emit("close", e));
  }

  /**
   * Spawn `conch serve --stdio` (the default), or connect to `socket`, or to the remote daemon
   * at `url` (`token`, `ca`; without `socket` and `url`, $CONCH_URL, $CONCH_TOKEN and $CONCH_CA
   * name it), or use `transport`. A remote client dials again for the next request after a
   * dropped connection (requests in flight fail with "connection lost").
   */
  static async connect(opts: ConnectOptions = {}): Promise<ConchClient> {
    if (opts.transport) return new ConchClient(new RpcConnection(opts.transport));
    const remote = remoteOptions(opts);
    if (remote) {
      const dial = () => remoteTransport(remote);
      const c = new ConchClient(new RpcConnection(await dial(), { reconnect: dial }));
      c.noCopy = true; // its files are on another machine: file contents go in messages
      return c;
    }
    const t = opts.socket ? await socketTransport(opts.socket) : await stdioTransport(opts);
    return new ConchClient(new RpcConnection(t));
  }

  close(): Promise<void> {
    return this.rpc.close();
  }

  /** Raw call of any method (for protocol additions not typed here yet). */
  call<T = any>(method: string, params: object = {}): Promise<T> {
    return this.rpc.request<T>(method, params);
  }

  /** Yields every notification of `method` until the connection closes or `signal` aborts. */
  async *events<T = any>(method: string, signal?: AbortSignal): AsyncGenerator<T> {
    const queue: T[] = [];
    let wake: (() => void) | null = null;
    let done = false;
    const onEv = (p: T) => {
      queue.push(p);
      wake?.();
    };
    const stop = () => {
      done = true;
      wake?.();
    };
    this.on(method, onEv);
    this.rpc.once("close", stop);
    signal?.addEventListener("abort", stop, { once: true });
    try {
      while (true) {
        if (queue.length) {
          yield queue.shift()!;
          continue;
        }
        if (done) return;
        await new Promise<void>((r) => (wake = r));
        wake = null;
      }
    } finally {
      this.off(method, onEv);
      this.rpc.off("close", stop);
      signal?.removeEventListener("abort", stop);
    }
  }

  /** Answer daemon->client requests (`tool.call`, `agent.spawn`). */
  onRequest(method: "tool.call", handler: (p: ToolCallParams, ctx: { signal: AbortSignal }) => unknown): void;
  onRequest(method: "agent.spawn", handler: (p: AgentSpawnParams, ctx: { signal: AbortSignal }) => unknown): void;
  onRequest(method: string, handler: RequestHandler | null): void;
  onRequest(method: string, handler: any): void {
    this.rpc.setRequestHandler(method, handler);
  }

  // daemon
  ping(): Promise<{
    version: string;
    pid: number;
    sandboxes: number;
    pool_ready: number;
    state_dir: string;
    /** bytes charged now to the daemon's budgets (docs/ARCHITECTURE.md, "Budgets") */
    held: { sandboxes: number; output: number };
  }> {
    return this.call("daemon.ping");
  }

  // sandbox.*
  sandboxCreate(p: SandboxCreateParams = {}): Promise<SandboxInfo> {
    return this.call("sandbox.create", p);
  }
  sandboxList(): Promise<{ sandboxes: SandboxInfo[] }> {
    return this.call("sandbox.list");
  }
  sandboxGet(id: string): Promise<SandboxInfo> {
    return this.call("sandbox.get", { id });
  }
  sandboxDestroy(id: string): Promise<{ destroyed: boolean }> {
    return this.call("sandbox.destroy", { id });
  }
  /** Replace a sandbox's network rules (the lists given); open connections they refuse are closed. */
  networkSet(sandbox: string, p: NetworkSetParams): Promise<NetworkPolicy> {
    return this.call("network.set", { sandbox, ...p });
  }
  /** A sandbox's rules and its last 256 network attempts, oldest first. */
  networkLog(sandbox: string): Promise<NetworkLog> {
    return this.call("network.log", { sandbox });
  }

  // exec.run
  /** Run a command; with `onOutput`, streams its output (exec.output notifications) while it runs. */
  async execRun(p: ExecParams, onOutput?: (e: ExecOutputEvent) => void): Promise<ExecResult> {
    if (!onOutput) return this.call("exec.run", p);
    // The daemon tags each exec.output with the request's JSON-RPC id.
    let id = -1;
    try {
      return await this.rpc.request<ExecResult>("exec.run", { ...p, stream: true }, (i) => {
        id = i;
        this.streams.set(i, onOutput);
      });
    } finally {
      this.streams.delete(id);
    }
  }
  /** exec.run with streaming as an async iterator of output events; the result is the iterator's return value. */
  async *execStream(p: ExecParams): AsyncGenerator<ExecOutputEvent, ExecResult> {
    const queue: ExecOutputEvent[] = [];
    let wake: (() => void) | null = null;
    let result: ExecResult | undefined;
    let error: unknown;
    let finished = false;
    void this.execRun(p, (e) => {
      queue.push(e);
      wake?.();
    }).then(
      (r) => ((result = r), (finished = true), wake?.()),
      (e) => ((error = e), (finished = true), wake?.()),
    );
    while (true) {
      if (queue.length) {
        yield queue.shift()!;
        continue;
      }
      if (finished) break;
      await new Promise<void>((r) => (wake = r));
      wake = null;
    }
    if (error) throw error;
    return result!;
  }

  // job.*
  jobStart(p: { sandbox: string; command: string; cwd?: string; env?: Record<string, string>; stdin?: string; max_output?: number }): Promise<{ job_id: string }> {
    return this.call("job.start", p);
  }
  jobOutput(p: { job_id: string; stdout_offset?: number; stderr_offset?: number; max_bytes?: number }): Promise<JobOutput> {
    return this.call("job.output", p);
  }
  jobWait(job_id: string, timeout?: number): Promise<JobWaitResult> {
    return this.call("job.wait", timeout === undefined ? { job_id } : { job_id, timeout });
  }
  jobKill(job_id: string, signal?: string | number): Promise<{ killed: boolean }> {
    return this.call("job.kill", signal === undefined ? { job_id } : { job_id, signal });
  }
  jobList(sandbox?: string): Promise<{ jobs: JobInfo[] }> {
    return this.call("job.list", sandbox ? { sandbox } : {});
  }

  // fs.*
  fsRead(sandbox: string, path: string, opts: { offset?: number; limit?: number } = {}): Promise<FsReadText> {
    return this.call("fs.read", { sandbox, path, ...opts });
  }
  fsReadBytes(sandbox: string, path: string): Promise<{ content: Uint8Array; size: number }> {
    return this.call<FsReadBase64>("fs.read", { sandbox, path, encoding: "base64" }).then((r) => ({ content: new Uint8Array(Buffer.from(r.content, "base64")), size: r.size }));
  }
  fsWrite(sandbox: string, path: string, content: string | Uint8Array): Promise<{ bytes_written: number; created: boolean }> {
    if (typeof content === "string") return this.call("fs.write", { sandbox, path, content });
    return this.call("fs.write", { sandbox, path, content: Buffer.from(content).toString("base64"), encoding: "base64" });
  }
  /** fs.read's chunk form: at most `length` bytes (1 .. 10 MiB) from byte `offset`. */
  async fsReadChunk(sandbox: string, path: string, offset: number, length = FS_CHUNK_MAX): Promise<FsChunk> {
    const r = await this.call<{ content: string; size: number; offset: number; length: number; eof: boolean }>("fs.read", { sandbox, path, encoding: "base64", offset, length });
    return { ...r, content: new Uint8Array(Buffer.from(r.content, "base64")) };
  }
  /**
   * fs.copy_in: the host file `hostPath` (any size) becomes `path`, replaced atomically and
   * copied by the daemon's file worker in the kernel. Only where the daemon can open the file
   * itself (same machine, same uid): else invalid_params on host_path / host_id.
   */
  async fsCopyIn(sandbox: string, path: string, hostPath: string, host_id?: string): Promise<{ bytes_written: number; created: boolean }> {
    const host_path = resolve(hostPath);
    return this.call("fs.copy_in", { sandbox, path, host_path, host_id: host_id ?? (await hostId(host_path)) });
  }
  /** fs.copy_out: `path` copied over the host file `hostPath` (created or truncated here first). */
  async fsCopyOut(sandbox: string, path: string, hostPath: string): Promise<{ size: number }> {
    const host_path = resolve(hostPath);
    await fsp.writeFile(host_path, new Uint8Array(0));
    return this.call("fs.copy_out", { sandbox, path, host_path, host_id: await hostId(host_path) });
  }
  /** Whether @e says the daemon cannot open our files (the caller moves the file in chunks). */
  private copyRefused(e: unknown): boolean {
    if (!(e instanceof ConchError)) return false;
    const param = (e.data as any)?.param;
    if (e.code === -32601 || param === "host_id") {
      this.noCopy = true;
      return true;
    }
    return e.dataCode === "invalid_params" && param === "host_path";
  }
  /** Run @fn on a new private temporary file's path; the file and its directory go after.
   * In /dev/shm where there is one (memory, as the Python client's memfd: no disk writeback
   * for bytes that live a moment), else the system's temporary directory. */
  private async withTemp<T>(fn: (path: string) => Promise<T>): Promise<T> {
    let dir: string;
    try {
      dir = await fsp.mkdtemp("/dev/shm/conch-xfer-");
    } catch {
      dir = await fsp.mkdtemp(join(tmpdir(), "conch-xfer-"));
    }
    try {
      return await fn(join(dir, "data"));
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  }
  /** @content by fs.copy_in through a temporary file, or null when the daemon cannot open it. */
  private async copyIn(sandbox: string, path: string, content: Uint8Array): Promise<{ bytes_written: number; created: boolean } | null> {
    return this.withTemp(async (tmp) => {
      await fsp.writeFile(tmp, content, { mode: 0o600 });
      try {
        return await this.fsCopyIn(sandbox, path, tmp);
      } catch (e) {
        // busy: the sandbox's transfers are all taken; chunks queue instead
        if (this.copyRefused(e) || (e instanceof ConchError && e.dataCode === "busy")) return null;
        throw e;
      }
    });
  }
  /** @path by fs.copy_out through a temporary file, or null when the daemon cannot open it. */
  private async copyOut(sandbox: string, path: string): Promise<Uint8Array | null> {
    return this.withTemp(async (tmp) => {
      try {
        await this.fsCopyOut(sandbox, path, tmp);
      } catch (e) {
        // too_large: a workspace file above the sandbox's disk limit, which bounds what the
        // copy writes; chunks have no such bound
        if (this.copyRefused(e) || (e instanceof ConchError && (e.dataCode === "too_large" || e.dataCode === "busy"))) return null;
        throw e;
      }
      const b = await fsp.readFile(tmp);
      return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    });
  }
  /**
   * A whole file of any size: by fs.copy_out past FS_COPY_MIN where the daemon can open our
   * files, else in chunks of `chunk` bytes (default 10 MiB, the daemon's cap). A file over
   * `maxBytes` (default 1 GiB) is refused with too_large before it is read.
   */
  async fsReadFile(sandbox: string, path: string, opts: { chunk?: number; maxBytes?: number } = {}): Promise<Uint8Array> {
    const chunk = Math.max(1, Math.min(FS_CHUNK_MAX, opts.chunk ?? FS_CHUNK_DEFAULT));
    const max = opts.maxBytes ?? 1 << 30;
    const copy = !this.noCopy && opts.chunk === undefined;
    const first = await this.fsReadChunk(sandbox, path, 0, copy ? Math.min(chunk, FS_COPY_MIN) : chunk);
    if (first.eof) return first.content;
    if (first.size > max) throw new ConchError(-32017, `${path} has ${first.size} bytes, over the client's limit of ${max} bytes (maxBytes)`, { code: "too_large", kind: "usage", limit: max });
    if (copy) {
      const all = await this.copyOut(sandbox, path);
      if (all && all.length > max) throw new ConchError(-32017, `${path} grew past the client's limit of ${max} bytes (maxBytes) while read`, { code: "too_large", kind: "usage", limit: max });
      if (all) return all;
    }
    const parts = [first.content];
    let off = first.content.length;
    while (true) {
      const r = await this.fsReadChunk(sandbox, path, off, chunk);
      parts.push(r.content);
      off += r.content.length;
      if (r.eof || r.content.length === 0) break;
      if (off > max) throw new ConchError(-32017, `${path} grew past the client's limit of ${max} bytes (maxBytes) while read`, { code: "too_large", kind: "usage", limit: max });
    }
    const out = new Uint8Array(off);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
  /**
   * Create or replace a file of any size: by fs.copy_in past FS_COPY_MIN where the daemon can
   * open our files (atomic), else one fs.write when it fits in `chunk` bytes (atomic), else
   * the first chunk then appends (not atomic: a failure leaves a partial file). An explicit
   * `chunk` always moves the file in chunks.
   */
  async fsWriteFile(sandbox: string, path: string, content: Uint8Array, opts: { chunk?: number } = {}): Promise<{ bytes_written: number; created: boolean }> {
    if (!this.noCopy && opts.chunk === undefined && content.length >= FS_COPY_MIN) {
      const r = await this.copyIn(sandbox, path, content);
      if (r) return r;
    }
    const chunk = Math.max(1, Math.min(FS_CHUNK_MAX, opts.chunk ?? FS_CHUNK_DEFAULT));
    const b = Buffer.from(content.buffer, content.byteOffset, content.byteLength);
    let created = false;
    let written = 0;
    for (let off = 0; off === 0 || off < b.length; off += chunk) {
      const r = await this.call<{ bytes_written: number; created: boolean }>("fs.write", {
        sandbox,
        path,
        content: b.subarray(off, off + chunk).toString("base64"),
        encoding: "base64",
        ...(off > 0 ? { append: true } : {}),
      });
      if (off === 0) created = r.created;
      written += r.bytes_written;
    }
    return { bytes_written: written, created };
  }
  fsEdit(sandbox: string, path: string, old_string: string, new_string: string, replace_all = false): Promise<{ occurrences: number }> {
    return this.call("fs.edit", { sandbox, path, old_string, new_string, replace_all });
  }
  fsLs(sandbox: string, path?: string): Promise<{ entries: FsEntry[] }> {
    return this.call("fs.ls", path === undefined ? { sandbox } : { sandbox, path });
  }
  fsGlob(sandbox: string, pattern: string, opts: { path?: string; max_results?: number; details?: boolean } = {}): Promise<{ paths: string[]; truncated: boolean; entries?: FsGlobEntry[] }> {
    return this.call("fs.glob", { sandbox, pattern, ...opts });
  }
  fsGrep(sandbox: string, pattern: string, opts: { path?: string; glob?: string; fixed_string?: boolean; ignore_case?: boolean; max_matches?: number } = {}): Promise<{ matches: FsGrepMatch[]; truncated: boolean }> {
    return this.call("fs.grep", { sandbox, pattern, ...opts });
  }
  fsDelete(sandbox: string, path: string, recursive = false): Promise<{ deleted: boolean }> {
    return this.call("fs.delete", { sandbox, path, recursive });
  }
  fsUpload(sandbox: string, files: { path: string; content: Uint8Array }[]): Promise<{ results: { path: string; error?: FsFileError }[] }> {
    return this.call("fs.upload", { sandbox, files: files.map((f) => ({ path: f.path, content: Buffer.from(f.content).toString("base64") })) });
  }
  async fsDownload(sandbox: string, paths: string[]): Promise<{ files: { path: string; content?: Uint8Array; error?: FsFileError }[] }> {
    const r = await this.call<{ files: { path: string; content?: string; error?: FsFileError }[] }>("fs.download", { sandbox, paths });
    return { files: r.files.map((f) => ({ path: f.path, ...(f.content !== undefined ? { content: new Uint8Array(Buffer.from(f.content, "base64")) } : {}), ...(f.error ? { error: f.error } : {}) })) };
  }

  // workspace.*
  /** One page of the changes; `since`: a snapshot (id or name) of the sandbox's chain, for the
   * changes made after it, against the workspace as it was then; `mount`: an overlay mount's
   * target, for its changes instead of the workspace's. */
  workspaceChanges(sandbox: string, opts: { offset?: number; limit?: number; since?: string; mount?: string } = {}): Promise<{ changes: Change[]; changes_total: number; changes_truncated: boolean; next_offset?: number }> {
    return this.call("workspace.changes", { sandbox, ...opts });
  }
  /** `opts.since`, `opts.mount`: as for workspaceChanges. */
  workspaceDiff(sandbox: string, paths?: string[], opts: { since?: string; mount?: string } = {}): Promise<{ diff: string; files: { path: string; kind: string; binary: boolean; diff: string; omitted?: boolean }[]; omitted: number }> {
    return this.call("workspace.diff", { sandbox, ...(paths ? { paths } : {}), ...(opts.since !== undefined ? { since: opts.since } : {}), ...(opts.mount !== undefined ? { mount: opts.mount } : {}) });
  }
  /** `opts.mount`: an overlay mount's changes, applied to its source dir. */
  workspaceCommit(sandbox: string, paths?: string[], opts: { mount?: string } = {}): Promise<{ committed: string[]; skipped: { path: string; reason: string }[] }> {
    return this.call("workspace.commit", { sandbox, ...(paths ? { paths } : {}), ...(opts.mount !== undefined ? { mount: opts.mount } : {}) });
  }
  workspaceDiscard(sandbox: string, paths?: string[]): Promise<{ discarded: string[] }> {
    return this.call("workspace.discard", paths ? { sandbox, paths } : { sandbox });
  }
  /** Freeze the workspace's changes into a snapshot (in place when nothing runs, else by a restart of the sandbox; `busy` while commands, jobs or sessions run unless `force`). */
  workspaceSnapshot(sandbox: string, opts: { name?: string; force?: boolean } = {}): Promise<Snapshot> {
    return this.call("workspace.snapshot", { sandbox, ...opts });
  }
  /** Return the workspace to a snapshot (by id or name). */
  workspaceRestore(sandbox: string, snapshot: string, opts: { force?: boolean } = {}): Promise<{ sandbox: string; snapshot: string }> {
    return this.call("workspace.restore", { sandbox, snapshot, ...opts });
  }
  workspaceSnapshots(sandbox?: string): Promise<{ snapshots: Snapshot[] }> {
    return this.call("workspace.snapshots", sandbox ? { sandbox } : {});
  }
  workspaceSnapshotDelete(snapshot: string): Promise<{ snapshot: string; deleted: boolean }> {
    return this.call("workspace.snapshot_delete", { snapshot });
  }
  // store.* (named stores, mounted with {type: "store", name, target})
  storeList(): Promise<{ stores: StoreInfo[] }> {
    return this.call("store.list", {});
  }
  storeLs(store: string, path = ""): Promise<{ store: string; entries: StoreEntry[] }> {
    return this.call("store.ls", { store, path });
  }
  /** A file's content: UTF-8 text when it is, else base64 (or `encoding: "base64"` always). */
  storeRead(store: string, path: string, opts: { encoding?: "utf-8" | "base64" } = {}): Promise<StoreEntry & { content: string; encoding: "utf-8" | "base64" }> {
    return this.call("store.read", { store, path, ...opts });
  }
  /** Write a file (its parent dirs made; the store made if missing), in one transaction. */
  storeWrite(store: string, path: string, content: string, opts: { encoding?: "utf-8" | "base64"; mode?: number } = {}): Promise<{ store: string; path: string; size: number }> {
    return this.call("store.write", { store, path, content, ...opts });
  }
  /** Delete a file, or a dir with what is in it. */
  storeDelete(store: string, path: string): Promise<{ store: string; path: string }> {
    return this.call("store.delete", { store, path });
  }
  /** A new sandbox from a sandbox (snapshotted first) or from a snapshot; given both, the
   *  snapshot, which must be one of that sandbox's (else invalid_params). */
  sandboxFork(from: { sandbox: string; snapshot?: string } | { snapshot: string }, opts: { name?: string; force?: boolean } = {}): Promise<SandboxInfo & { snapshot: string }> {
    return this.call("sandbox.fork", { ...from, ...opts });
  }

  // js.* (JavaScript/TypeScript sessions in the sandbox)
  /** js.eval: run code in a JS session; it calls the sandbox's tools as `await tools.name(input)`. */
  jsEval(p: JsEvalParams): Promise<JsEvalResult> {
    return this.call("js.eval", p);
  }
  /** js.reset: the session's globals dropped (an eval in flight is cancelled). */
  jsReset(sandbox: string, session?: string): Promise<{ session: string; reset: boolean }> {
    return this.call("js.reset", session ? { sandbox, session } : { sandbox });
  }
  /** js.close: the session's worker stopped and the session forgotten. */
  jsClose(sandbox: string, session?: string): Promise<{ session: string; closed: boolean }> {
    return this.call("js.close", session ? { sandbox, session } : { sandbox });
  }
  jsList(sandbox: string): Promise<{ sessions: JsSessionInfo[] }> {
    return this.call("js.list", { sandbox });
  }

  // tools.* / agents.* (the tool bridge)
  toolsRegister(sandbox: string, tools: ToolSpec[]): Promise<{ registered: string[] }> {
    return this.call("tools.register", { sandbox, tools });
  }
  toolsUnregister(sandbox: string, names: string[]): Promise<{ removed: string[] }> {
    return this.call("tools.unregister", { sandbox, names });
  }
  toolsList(sandbox: string): Promise<{ tools: ToolSpec[]; agents: AgentSpec[] }> {
    return this.call("tools.list", { sandbox });
  }
  toolsTrace(sandbox: string, origin?: { kind: string; id: string }): Promise<{ calls: CallRecord[] }> {
    return this.call("tools.trace", origin ? { sandbox, origin } : { sandbox });
  }
  toolsPrompt(sandbox: string, languages?: ("bash" | "python" | "node" | "js")[]): Promise<{ text: string }> {
    return this.call("tools.prompt", languages ? { sandbox, languages } : { sandbox });
  }
  agentsRegister(sandbox: string, agents: AgentSpec[]): Promise<{ registered: string[] }> {
    return this.call("agents.register", { sandbox, agents });
  }
  agentsUnregister(sandbox: string, names: string[]): Promise<{ removed: string[] }> {
    return this.call("agents.unregister", { sandbox, names });
  }
  // session.* (persistent shells on a terminal of the sandbox)
  /** Open a session of `sandbox` as a ConchSession (run, write, attach, output, close). */
  openSession(sandbox: string, opts: Omit<SessionOpenParams, "sandbox"> = {}): Promise<ConchSession> {
    return ConchSession.open(this, sandbox, opts);
  }
  /** A ConchSession for an existing session (any client's), optionally attaching (see ConchSession.get). */
  getSession(session: string, opts: { attach?: boolean; write?: boolean } = {}): Promise<ConchSession> {
    return ConchSession.get(this, session, opts);
  }
  /** session.open: a long-lived bash on a pty of the sandbox. */
  sessionOpen(p: SessionOpenParams): Promise<SessionInfo> {
    return this.call("session.open", p);
  }
  /** session.run: a command in the session's shell; cwd, exports, functions, aliases and venvs persist. */
  sessionRun(p: SessionRunParams): Promise<SessionRunResult> {
    return this.call("session.run", p);
  }
  /** session.write: keys to the terminal (not_writer when another client writes). */
  sessionWrite(session: string, data: string): Promise<{ written: number }> {
    return this.call("session.write", { session, data });
  }
  /** session.attach: this client then receives session.output; `write: true` takes the keyboard. */
  sessionAttach(session: string, write?: boolean): Promise<SessionAttachResult> {
    return this.call("session.attach", write === undefined ? { session } : { session, write });
  }
  sessionDetach(session: string): Promise<{ detached: boolean }> {
    return this.call("session.detach", { session });
  }
  sessionResize(session: string, rows: number, cols: number): Promise<{ rows: number; cols: number }> {
    return this.call("session.resize", { session, rows, cols });
  }
  /** session.signal: to the terminal's foreground process group (default "INT"). */
  sessionSignal(session: string, signal?: string | number): Promise<{ signal: number }> {
    return this.call("session.signal", signal === undefined ? { session } : { session, signal });
  }
  sessionList(sandbox?: string): Promise<{ sessions: SessionInfo[] }> {
    return this.call("session.list", sandbox ? { sandbox } : {});
  }
  /** session.close: kills the shell and forgets the session. */
  sessionClose(session: string): Promise<{ closed: boolean }> {
    return this.call("session.close", { session });
  }
}
