// rpc.ts - newline-delimited JSON-RPC 2.0 over a byte stream (a unix socket or the stdio of
// `conch serve --stdio`): concurrent requests matched by id, notifications as events, and
// requests FROM the daemon (tool.call, agent.spawn) dispatched to registered handlers whose
// AbortSignal fires on `$/cancel`.
import { EventEmitter } from "node:events";
import { spawn, type ChildProcess } from "node:child_process";
import { createConnection } from "node:net";
import type { Readable, Writable } from "node:stream";

/** The `data` member every conch error carries (docs/PROTOCOL.md, "Errors"). */
export interface ConchErrorData {
  code: string;
  kind: "usage" | "infrastructure" | "limit" | "internal" | string;
  param?: string;
  occurrences?: number;
  limit?: number;
  [key: string]: unknown;
}

/** A JSON-RPC error answered by the daemon, or a transport failure (code -32099, data.code "transport"). */
export class ConchError extends Error {
  readonly code: number;
  readonly data: ConchErrorData;
  constructor(code: number, message: string, data?: Partial<ConchErrorData>) {
    super(message);
    this.name = "ConchError";
    this.code = code;
    this.data = { code: "unknown", kind: "internal", ...(data ?? {}) } as ConchErrorData;
  }
  /** The stable string to branch on, e.g. "file_not_found". */
  get dataCode(): string {
    return this.data.code;
  }
  get kind(): string {
    return this.data.kind;
  }
  static isInstance(e: unknown): e is ConchError {
    return e instanceof ConchError;
  }
}

/** Error code used for failures of the connection itself (never sent by the daemon). */
export const TRANSPORT_ERROR = -32099;

/** What the handler of a daemon->client request gets besides its params. */
export interface IncomingRequestContext {
  /** The JSON-RPC id of the daemon's request. */
  id: number | string;
  /** Aborted when the daemon sends `$/cancel` for this call's `call_id`, or the connection closes. */
  signal: AbortSignal;
}
export type RequestHandler = (params: any, ctx: IncomingRequestContext) => unknown | Promise<unknown>;

/** A bidirectional byte stream carrying newline-delimited JSON. */
export interface Transport {
  readable: Readable;
  writable: Writable;
  close(): Promise<void>;
  /** Why the other end went away, when the transport knows (a spawned daemon's exit status and last log lines). */
  exitInfo?(): Promise<string | undefined>;
}

/** Connect to a daemon's unix socket. */
export function socketTransport(path: string): Promise<Transport> {
  return new Promise((resolve, reject) => {
    const sock = createConnection(path);
    sock.once("error", reject);
    sock.once("connect", () => {
      sock.off("error", reject);
      resolve({
        readable: sock,
        writable: sock,
        close: () =>
          new Promise<void>((res) => {
            if (sock.destroyed) return res();
            sock.once("close", () => res());
            sock.end();
            setTimeout(() => sock.destroy(), 2000).unref();
          }),
      });
    });
  });
}

export interface StdioOptions {
  /** Path of the conch binary (default: $CONCH_BIN, else `conch` on PATH). */
  bin?: string;
  /** Extra arguments after `serve --stdio`, e.g. ["--state-dir", dir, "--pool", "0"]. */
  args?: string[];
  env?: NodeJS.ProcessEnv;
  /** Where the daemon's stderr (its log) goes: "inherit", "ignore" (default) or a callback per chunk. */
  stderr?: "inherit" | "ignore" | ((chunk: string) => void);
}

/** Spawn `conch serve --stdio` and talk to it over its stdin/stdout. */
export function stdioTransport(opts: StdioOptions = {}): Promise<Transport & { child: ChildProcess }> {
  const bin = opts.bin ?? process.env.CONCH_BIN ?? "conch";
  const child = spawn(bin, ["serve", "--stdio", ...(opts.args ?? [])], {
    stdio: ["pipe", "pipe", opts.stderr === "inherit" ? "inherit" : "pipe"],
    env: opts.env ?? process.env,
  });
  let tail = "";
  if (child.stderr) {
    const cb = typeof opts.stderr === "function" ? opts.stderr : null;
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d: string) => {
      tail = (tail + d).slice(-2000);
      cb?.(d);
    });
  }
  const exited = new Promise<string>((res) => child.once("exit", (code, sig) => res(sig ? `killed by ${sig}` : `status ${code}`)));
  const exitInfo = async () => {
    const how = await Promise.race([exited, new Promise<null>((r) => setTimeout(() => r(null), 500).unref())]);
    if (how === null) return undefined;
    const log = tail.trim().split("\n").slice(-3).join(" | ");
    return `conch serve --stdio exited with ${how}${log ? `: ${log}` : ""}`;
  };
  return new Promise((resolve, reject) => {
    child.once("error", (e) => reject(new ConchError(TRANSPORT_ERROR, `cannot start '${bin} serve --stdio': ${e.message} (set CONCH_BIN or the bin option)`, { code: "transport", kind: "infrastructure" })));
    child.once("spawn", () =>
      resolve({
        child,
        exitInfo,
        readable: child.stdout!,
        writable: child.stdin!,
        close: () =>
          new Promise<void>((res) => {
            if (child.exitCode !== null || child.signalCode !== null) return res();
            child.once("exit", () => res());
            child.stdin!.end();
            const t = setTimeout(() => child.kill("SIGTERM"), 5000);
            t.unref();
          }),
      }),
    );
  });
}

interface Pending {
  resolve: (v: any) => void;
  reject: (e: unknown) => void;
  method: string;
}

/**
 * One JSON-RPC connection. Events: "notification" (method, params), "<method>" (params) for each
 * notification, "close" (error?), and "protocol-error" (line, error) for lines it cannot parse.
 */
export class RpcConnection extends EventEmitter {
  private nextId = 1;
  private pending = new Map<number | string, Pending>();
  private handlers = new Map<string, RequestHandler>();
  /** In-flight daemon->client requests: JSON-RPC id -> controller, and call_id -> controller. */
  private incoming = new Map<string, AbortController>();
  private incomingByCallId = new Map<string, AbortController>();
  /** The pieces of a line not yet ended by "\n" (joined once, when its end comes). */
  private partial: string[] = [];
  private closed: Error | null = null;
  /** The live transport; null while a reconnecting connection is down. */
  private current: Transport | null = null;
  private dialing: Promise<void> | null = null;

  /**
   * @param transport the connection's stream.
   * @param opts.reconnect when given, a dropped transport does not close the connection: the
   *   requests in flight fail ("connection lost"), and the next request dials again with it
   *   (opts.tries times, waiting opts.delayMs, doubled after each failure).
   */
  constructor(
    transport: Transport,
    private readonly opts: { reconnect?: () => Promise<Transport>; tries?: number; delayMs?: number } = {},
  ) {
    super();
    this.attach(transport);
  }

  /** The transport in use (the last one, after a reconnect). */
  get transport(): Transport {
    return this.current ?? this.last!;
  }
  private last: Transport | null = null;

  private attach(transport: Transport): void {
    this.current = transport;
    this.last = transport;
    this.partial = [];
    transport.readable.setEncoding?.("utf8");
    transport.readable.on("data", (chunk: string | Buffer) => {
      if (this.current === transport) this.onData(typeof chunk === "string" ? chunk : chunk.toString("utf8"));
    });
    let ending = false;
    const end = (why: string) => {
      if (this.closed || ending || this.current !== transport) return;
      ending = true;
      const fail = (info?: string) => {
        if (this.opts.reconnect) return this.lost(transport, info ? `connection lost: ${info}` : "connection lost: the server closed the connection");
        this.fail(new ConchError(TRANSPORT_ERROR, info ? `${why} (${info})` : why, { code: "transport", kind: "infrastructure" }));
      };
      if (transport.exitInfo) transport.exitInfo().then(fail, () => fail());
      else fail();
    };
    transport.readable.on("end", () => end("the conch daemon closed the connection"));
    transport.readable.on("close", () => end("the conch daemon closed the connection"));
    transport.readable.on("error", (e: Error) => end(`connection to the conch daemon failed: ${e.message}`));
    transport.writable.on("error", (e: Error) => end(`connection to the conch daemon failed: ${e.message}`));
  }

  /** A reconnecting connection's transport dropped: what was in flight fails; the next request dials. */
  private lost(transport: Transport, why: string): void {
    if (this.current !== transport) return;
    this.current = null;
    void transport.close().catch(() => undefined);
    const err = new ConchError(TRANSPORT_ERROR, why, { code: "transport", kind: "infrastructure" });
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const c of this.incoming.values()) c.abort(err);
    this.incoming.clear();
    this.incomingByCallId.clear();
    this.emit("lost", err);
  }

  private dial(): Promise<void> {
    if (this.dialing) return this.dialing;
    const reconnect = this.opts.reconnect!;
    const tries = this.opts.tries ?? 5;
    this.dialing = (async () => {
      let delay = this.opts.delayMs ?? 200;
      let why = "";
      for (let i = 0; i < tries; i++) {
        if (i) {
          await new Promise((r) => setTimeout(r, delay));
          delay *= 2;
        }
        if (this.closed) throw this.closed;
        try {
          const t = await reconnect();
          if (this.closed) {
            await t.close();
            throw this.closed;
          }
          this.attach(t);
          return;
        } catch (e) {
          if (e === this.closed) throw e;
          why = (e as Error).message;
        }
      }
      throw new ConchError(TRANSPORT_ERROR, `connection lost, and ${tries} tries to reconnect failed: ${why}`, { code: "transport", kind: "infrastructure" });
    })().finally(() => {
      this.dialing = null;
    });
    return this.dialing;
  }

  get isClosed(): boolean {
    return this.closed !== null;
  }

  /** Answer daemon->client requests of `method` (e.g. "tool.call") with `handler`. */
  setRequestHandler(method: string, handler: RequestHandler | null): void {
    if (handler) this.handlers.set(method, handler);
    else this.handlers.delete(method);
  }

  /** Send a request; `onId` learns its id before it is sent (to match notifications tagged with it). */
  request<T = any>(method: string, params: object = {}, onId?: (id: number) => void): Promise<T> {
    if (this.closed) return Promise.reject(this.closed);
    if (!this.current && this.opts.reconnect) return this.dial().then(() => this.request<T>(method, params, onId));
    const id = this.nextId++;
    onId?.(id);
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.send({ jsonrpc: "2.0", id, method, params });
    });
  }

  notify(method: string, params: object = {}): void {
    if (this.closed) return;
    this.send({ jsonrpc: "2.0", method, params });
  }

  async close(): Promise<void> {
    const t = this.current;
    this.current = null;
    if (t) await t.close();
    this.fail(new ConchError(TRANSPORT_ERROR, "the connection was closed", { code: "transport", kind: "infrastructure" }));
  }

  private send(msg: object): void {
    const t = this.current;
    if (!t) {
      const id = (msg as { id?: number | string }).id;
      const p = id !== undefined && "method" in msg ? this.pending.get(id) : undefined;
      if (p) {
        this.pending.delete(id!);
        p.reject(new ConchError(TRANSPORT_ERROR, "connection lost", { code: "transport", kind: "infrastructure" }));
      }
      return;
    }
    try {
      t.writable.write(JSON.stringify(msg) + "\n");
    } catch (e) {
      this.fail(new ConchError(TRANSPORT_ERROR, `cannot write to the conch daemon: ${(e as Error).message}`, { code: "transport", kind: "infrastructure" }));
    }
  }

  private fail(err: Error): void {
    if (this.closed) return;
    this.closed = err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const c of this.incoming.values()) c.abort(err);
    this.incoming.clear();
    this.incomingByCallId.clear();
    this.emit("close", err);
  }

  private onData(chunk: string): void {
    // Only the new chunk is searched for line ends, and a line that came in many chunks is
    // joined once: a 10 MiB answer arriving in 64 KiB pieces is not copied over and over.
    let start = 0;
    let nl: number;
    while ((nl = chunk.indexOf("\n", start)) >= 0) {
      let line = chunk.slice(start, nl);
      start = nl + 1;
      if (this.partial.length) {
        this.partial.push(line);
        line = this.partial.join("");
        this.partial = [];
      }
      this.onLine(line);
    }
    if (start < chunk.length) this.partial.push(start === 0 ? chunk : chunk.slice(start));
  }

  private onLine(line: string): void {
    if (line.length === 0 || (line.charCodeAt(0) <= 32 && line.trim() === "")) return;
    let msg: any;
    try {
      msg = JSON.parse(line);
    } catch (e) {
      this.emit("protocol-error", line, e);
      return;
    }
    if (Array.isArray(msg)) for (const m of msg) this.dispatch(m);
    else this.dispatch(msg);
  }

  private dispatch(msg: any): void {
    if (msg === null || typeof msg !== "object") return;
    if (typeof msg.method === "string") {
      if (msg.id === undefined) this.onNotification(msg.method, msg.params ?? {});
      else void this.onRequest(msg.id, msg.method, msg.params ?? {});
      return;
    }
    const p = this.pending.get(msg.id);
    if (!p) {
      // An answer with id null (a parse error on our side of the line) cannot be matched.
      this.emit("protocol-error", JSON.stringify(msg), new Error("response to no pending request"));
      return;
    }
    this.pending.delete(msg.id);
    if (msg.error) {
      const e = msg.error;
      p.reject(new ConchError(typeof e.code === "number" ? e.code : -32603, String(e.message ?? "error"), e.data));
    } else p.resolve(msg.result);
  }

  private onNotification(method: string, params: any): void {
    if (method === "$/cancel") {
      const c =
        (params?.call_id !== undefined ? this.incomingByCallId.get(String(params.call_id)) : undefined) ??
        (params?.id !== undefined ? this.incoming.get(JSON.stringify(params.id)) : undefined);
      c?.abort(new ConchError(-32800, `cancelled by the daemon: ${params?.reason ?? "no reason given"}`, { code: "cancelled", kind: "usage" }));
    }
    this.emit("notification", method, params);
    this.emit(method, params);
  }

  private async onRequest(id: number | string, method: string, params: any): Promise<void> {
    const handler = this.handlers.get(method);
    if (!handler) {
      this.send({ jsonrpc: "2.0", id, error: { code: -32601, message: `this client does not answer '${method}'`, data: { code: "method_not_found", kind: "usage" } } });
      return;
    }
    const ctl = new AbortController();
    const key = JSON.stringify(id);
    this.incoming.set(key, ctl);
    const callId = params?.call_id !== undefined ? String(params.call_id) : null;
    if (callId !== null) this.incomingByCallId.set(callId, ctl);
    try {
      const result = await handler(params, { id, signal: ctl.signal });
      if (!ctl.signal.aborted) this.send({ jsonrpc: "2.0", id, result: result === undefined ? null : result });
    } catch (e) {
      if (!ctl.signal.aborted) {
        const err = e as any;
        const code = typeof err?.code === "number" ? err.code : -32000;
        const data = err instanceof ConchError ? err.data : { code: "tool_error", kind: "usage" };
        this.send({ jsonrpc: "2.0", id, error: { code, message: String(err?.message ?? err), data } });
      }
    } finally {
      this.incoming.delete(key);
      if (callId !== null && this.incomingByCallId.get(callId) === ctl) this.incomingByCallId.delete(callId);
    }
  }
}
