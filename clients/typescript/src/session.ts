// session.ts - ConchSession: one persistent shell of a sandbox (session.* of docs/PROTOCOL.md)
// as an object: commands whose cwd, exports, functions and venvs persist (run), and the raw
// terminal (attach, write, resize, signal, output). It keeps the session.* notifications of
// its own id from the moment it is opened.
import type {
  ConchClient,
  SessionAttachResult,
  SessionEndedEvent,
  SessionInfo,
  SessionOpenParams,
  SessionOutputEvent,
  SessionRunResult,
  SessionStartedEvent,
  SessionWriterEvent,
} from "./client.js";
import { ConchError } from "./rpc.js";

const METHODS = ["session.output", "session.started", "session.writer", "session.ended"] as const;

export interface SessionRunOptions {
  /** Seconds (daemon default 120): the command is interrupted, the shell stays (`session_usable`). */
  timeout?: number;
  /** Text given to the command's stdin (else /dev/null). */
  stdin?: string;
  grace?: number;
  max_output?: number;
}

export interface OutputOptions {
  /** End the iteration when no output came for this many milliseconds. */
  idleMs?: number;
  signal?: AbortSignal;
}

/**
 * A persistent bash of a sandbox. `ConchSession.open(client, sandbox)` (or
 * `client.openSession`); `close()` kills the shell and forgets the session.
 */
export class ConchSession {
  readonly client: ConchClient;
  readonly id: string;
  readonly sandbox: string;
  /** The session object as last seen (open, attach, refresh). */
  info: SessionInfo;
  /** This client is the writer (attach with write, lost on a takeover). */
  youWrite = false;
  /** The session.ended event once the shell is gone (the next run starts a new shell). */
  ended: SessionEndedEvent | null = null;
  /** Shells started so far. */
  shells: number;
  /** session.writer events received (a takeover: `{writer: false, reason}`). */
  readonly writerEvents: SessionWriterEvent[] = [];
  closed = false;
  private queue: (SessionOutputEvent | null)[] = [];
  private wake: (() => void) | null = null;
  private listeners: [string, (p: any) => void][] = [];

  private constructor(client: ConchClient, info: SessionInfo, early: [string, any][]) {
    this.client = client;
    this.id = info.session;
    this.sandbox = info.sandbox;
    this.info = info;
    this.shells = info.shells ?? 0;
    for (const m of METHODS) {
      const fn = (p: any) => this.onEvent(m, p);
      client.on(m, fn);
      this.listeners.push([m, fn]);
    }
    for (const [m, p] of early) this.onEvent(m, p);
  }

  /** session.open, then a ConchSession that receives the session's notifications. */
  static async open(client: ConchClient, sandbox: string, opts: Omit<SessionOpenParams, "sandbox"> = {}): Promise<ConchSession> {
    // Notifications that arrive before the answer (attach: true) are kept and replayed.
    const early: [string, any][] = [];
    const keep = (m: string, p: any) => {
      if ((METHODS as readonly string[]).includes(m)) early.push([m, p]);
    };
    client.on("notification", keep);
    try {
      const info = await client.sessionOpen({ ...opts, sandbox });
      const s = new ConchSession(client, info, early.filter(([, p]) => p?.session === info.session));
      s.youWrite = !!opts.attach;
      return s;
    } finally {
      client.off("notification", keep);
    }
  }

  /**
   * A ConchSession for a session that already exists (opened by this or another client, e.g.
   * one a person or another harness started), found by id with session.list. With `attach`
   * (or `write`, which takes the keyboard) this client attaches, so that output() yields the
   * terminal's output from then on; the scrollback is in `info.scrollback`. Rejects with
   * session_not_found. close() ends the session for everyone; detach() just lets go.
   */
  static async get(client: ConchClient, session: string, opts: { attach?: boolean; write?: boolean } = {}): Promise<ConchSession> {
    const info = (await client.sessionList()).sessions.find((x) => x.session === session);
    if (!info) throw new ConchError(-32003, `no session '${session}'`, { code: "session_not_found", kind: "usage" });
    const s = new ConchSession(client, info, []); // listening before attaching: no output is lost
    if (opts.attach || opts.write) {
      try {
        await s.attach({ write: !!opts.write });
      } catch (e) {
        s.release();
        throw e;
      }
    }
    return s;
  }

  /** Stop listening to the session's notifications (the session goes on). */
  private release(): void {
    for (const [m, fn] of this.listeners) this.client.off(m, fn);
    this.listeners = [];
  }

  private onEvent(method: string, p: any): void {
    if (p?.session !== this.id) return;
    if (method === "session.output") this.push(p as SessionOutputEvent);
    else if (method === "session.started") this.shells = (p as SessionStartedEvent).shell ?? this.shells;
    else if (method === "session.writer") {
      this.youWrite = !!p.writer;
      this.writerEvents.push(p as SessionWriterEvent);
    } else if (method === "session.ended") {
      this.ended = p as SessionEndedEvent;
      this.push(null);
    }
  }

  private push(e: SessionOutputEvent | null): void {
    this.queue.push(e);
    this.wake?.();
  }

  /**
   * Run `command` in the session's shell: exec.run's result (output in `stdout`, `text` ending
   * with `[exit code: N]`) plus `new_shell`, `shell_exited` and, after a timeout, `session_usable`.
   */
  run(command: string, opts: SessionRunOptions = {}): Promise<SessionRunResult> {
    return this.client.sessionRun({ ...opts, session: this.id, command });
  }

  /** Keys to the terminal ("ls\n", "\x03") -> bytes written. */
  async write(data: string): Promise<number> {
    return (await this.client.sessionWrite(this.id, data)).written;
  }

  resize(rows: number, cols: number): Promise<{ rows: number; cols: number }> {
    return this.client.sessionResize(this.id, rows, cols);
  }

  /** A signal to the terminal's foreground process group -> its number. */
  async signal(signal: string | number = "INT"): Promise<number> {
    return (await this.client.sessionSignal(this.id, signal)).signal;
  }

  /** Attach: output() then yields the terminal's output; the answer carries the scrollback. */
  async attach(opts: { write?: boolean } = {}): Promise<SessionAttachResult> {
    const r = await this.client.sessionAttach(this.id, opts.write);
    this.youWrite = !!r.you_write;
    this.info = r;
    return r;
  }

  async detach(): Promise<boolean> {
    this.youWrite = false;
    return (await this.client.sessionDetach(this.id)).detached;
  }

  /** The session object as the daemon has it now (session.list). */
  async refresh(): Promise<SessionInfo> {
    const s = (await this.client.sessionList(this.sandbox)).sessions.find((x) => x.session === this.id);
    if (!s) throw new ConchError(-32003, `no session '${this.id}'`, { code: "session_not_found", kind: "usage" });
    this.info = s;
    return s;
  }

  /**
   * The terminal's output (session.output events, in order) once attached. Ends when the session
   * ends or is closed, the connection closes, `signal` aborts, or nothing came for `idleMs`.
   */
  async *output(opts: OutputOptions = {}): AsyncGenerator<SessionOutputEvent> {
    const stop = () => this.wake?.();
    opts.signal?.addEventListener("abort", stop, { once: true });
    this.client.rpc.once("close", stop);
    try {
      while (true) {
        if (this.queue.length) {
          const e = this.queue[0];
          if (e === null) return; // the end stays queued: later iterations end too
          this.queue.shift();
          yield e;
          continue;
        }
        if (this.closed || this.client.rpc.isClosed || opts.signal?.aborted) return;
        let timer: NodeJS.Timeout | undefined;
        let idle = false;
        await new Promise<void>((r) => {
          this.wake = r;
          if (opts.idleMs !== undefined) timer = setTimeout(() => ((idle = true), r()), opts.idleMs);
        });
        this.wake = null;
        clearTimeout(timer);
        if (idle && !this.queue.length) return;
      }
    } finally {
      opts.signal?.removeEventListener("abort", stop);
      this.client.rpc.off("close", stop);
    }
  }

  /** Read output until `text` shows -> the output read (consumed); rejects after `timeoutMs`. */
  async waitFor(text: string, timeoutMs = 10_000): Promise<string> {
    let buf = "";
    const deadline = Date.now() + timeoutMs;
    while (!buf.includes(text)) {
      const left = deadline - Date.now();
      let got = false;
      if (left > 0) {
        for await (const e of this.output({ idleMs: left })) {
          buf += e.data;
          got = true;
          break;
        }
      }
      if (!got) throw new Error(`'${text}' not seen in the session's output within ${timeoutMs} ms; got ${JSON.stringify(buf.slice(-500))}`);
    }
    return buf;
  }

  /** session.close: kill the shell and forget the session (idempotent). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.release();
    this.wake?.();
    try {
      await this.client.sessionClose(this.id);
    } catch (e) {
      if (!(e instanceof ConchError && (e.data.code === "session_not_found" || e.data.code === "transport"))) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
