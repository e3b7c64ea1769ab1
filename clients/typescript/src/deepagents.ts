// deepagents.ts - ConchSandbox: a deepagents SandboxBackendProtocolV2 implemented natively over
// conch's fs.* and exec.run (no shell round trips for file tools), returning errors and never
// throwing; its tool messages match deepagents' own LocalShellBackend/FilesystemBackend
// (virtualMode, the sandbox's "/" as root). Plus the tool-bridge helpers: register LangChain
// tools and deepagents sub-agents with a sandbox and answer tool.call / agent.spawn with them,
// a middleware that adds the `tools.prompt` text to the system prompt, and spawnInteractive.
import { SandboxError } from "deepagents";
import type {
  SandboxBackendProtocolV2,
  ExecuteResponse,
  LsResult,
  ReadResult,
  ReadRawResult,
  WriteResult,
  EditResult,
  DeleteResult,
  GrepResult,
  GlobResult,
  FileInfo,
  FileUploadResponse,
  FileDownloadResponse,
  FileOperationError,
} from "deepagents";
import { ConchClient, FS_CHUNK_MAX, FS_COPY_MIN, type JsEvalResult, type ExecResult, type CallRecord, type DetachedAgentRequest, type FsReadText, type ConnectOptions, type SandboxCreateParams, type ToolCallParams, type AgentSpawnParams } from "./client.js";
import { ConchError } from "./rpc.js";

const EMPTY_CONTENT_WARNING = "System reminder: File exists but has empty contents";

// deepagents' getMimeType table (by extension; unknown => text/plain).
const MIME: Record<string, string> = {
  ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp",
  ".svg": "image/svg+xml", ".heic": "image/heic", ".heif": "image/heif", ".mp3": "audio/mpeg", ".wav": "audio/wav",
  ".aiff": "audio/aiff", ".aac": "audio/aac", ".ogg": "audio/ogg", ".flac": "audio/flac", ".mp4": "video/mp4",
  ".webm": "video/webm", ".mpeg": "video/mpeg", ".mov": "video/quicktime", ".avi": "video/x-msvideo",
  ".flv": "video/x-flv", ".mpg": "video/mpeg", ".wmv": "video/x-ms-wmv", ".3gpp": "video/3gpp",
  ".pdf": "application/pdf", ".ppt": "application/vnd.ms-powerpoint",
  ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
  ".md": "text/markdown", ".markdown": "text/markdown", ".html": "text/html", ".htm": "text/html", ".css": "text/css",
  ".csv": "text/csv", ".xml": "text/xml", ".json": "application/json", ".js": "application/javascript",
  ".mjs": "application/javascript", ".cjs": "application/javascript",
};
export function getMimeType(path: string): string {
  const base = path.slice(path.lastIndexOf("/") + 1);
  const dot = base.lastIndexOf(".");
  if (dot <= 0) return "text/plain";
  return MIME[base.slice(dot).toLowerCase()] ?? "text/plain";
}
export function isTextMimeType(m: string): boolean {
  return m.startsWith("text/") || m === "application/json" || m === "application/javascript" || m === "image/svg+xml";
}

function errCode(e: unknown): string {
  return e instanceof ConchError ? e.data.code : SandboxError.isInstance(e) ? e.code : "transport";
}
function errMsg(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
/**
 * conch's data.code -> deepagents' FileOperationError, as FilesystemBackend maps errno. A
 * failure that is not about the path (a size or disk limit, the daemon gone...) keeps its real
 * cause, `"<code>: <message>"` (e.g. "limit: ..."), rather than passing for invalid_path.
 */
function toFileOpError(code: string, message = ""): FileOperationError {
  if (code === "file_not_found" || code === "permission_denied" || code === "is_directory") return code;
  if (code === "invalid_path" || code === "not_a_directory") return "invalid_path";
  return (message ? `${code}: ${message}` : code) as FileOperationError;
}
function errFileOp(e: unknown): FileOperationError {
  return toFileOpError(errCode(e), errMsg(e));
}

/** Bytes as text, as Node's fs.readFile(path, "utf-8") gives them (BOM kept, bad bytes U+FFFD). */
function utf8(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("utf8");
}

/**
 * FilesystemBackend.read's result from fs.read's text answer for lines [off, off + lim)
 * (lim > 0), or null where only the whole file can tell: FilesystemBackend splits the whole
 * text at "\n" and joins the lines it keeps with "\n", so the slice loses its last newline
 * unless it runs past the file's last line; a blank slice may be a blank file (its own
 * message) or an offset past the end; conch writes bytes that are not UTF-8 as one U+FFFD
 * each, Node's decoder per sequence.
 */
function linesResult(r: FsReadText, off: number, lim: number, mimeType: string): ReadResult | null {
  const c = r.content;
  if (typeof c !== "string" || c.trim() === "" || c.includes("\uFFFD")) return null;
  const total = r.total_lines;
  if (!(off < total)) return null;
  const endIdx = Math.min(off + lim, total);
  return {
    content: c.endsWith("\n") && off + lim <= total ? c.slice(0, -1) : c,
    mimeType,
    totalLines: total,
    startLine: off + 1,
    endLine: endIdx,
    nextOffset: endIdx < total ? endIdx : undefined,
  };
}

/** Same ordering as deepagents' `a.path.localeCompare(b.path)`. */
const byPath = (a: { path: string }, b: { path: string }) => a.path.localeCompare(b.path);

/** What ConchSandbox.close() does with the workspace's changes unless `onClose` says otherwise. */
export const DEFAULT_ON_CLOSE: "commit" | "discard" = "discard";

export interface ConchSandboxOptions extends ConnectOptions {
  /** An existing client to use (not closed by close()); else one is connected per sandbox. */
  client?: ConchClient;
  /** Attach to this existing sandbox instead of creating one (not destroyed by close()). */
  sandboxId?: string;
  /** sandbox.create params (workspace, mode, limits...). */
  sandbox?: SandboxCreateParams;
  /** What close() does with the workspace's changes: "commit" applies them to the host, "discard" (DEFAULT_ON_CLOSE) drops them. */
  onClose?: "commit" | "discard";
  /** Working directory of execute() commands (default /workspace). */
  cwd?: string;
  /**
   * The shell of execute() commands: "sh" (default: /bin/sh -c, as LocalShellBackend's
   * spawn with shell: true; 0.4 ms faster to start than bash) or "bash" (/bin/bash -c).
   */
  shell?: "sh" | "bash";
  /** execute() timeout in seconds (default 120, as LocalShellBackend). */
  timeout?: number;
  /** execute() output cap in characters (default 100000, as LocalShellBackend). */
  maxOutputBytes?: number;
  /** Extra environment of execute() commands. */
  env?: Record<string, string>;
  /**
   * Where grep and glob search when deepagents passes its default path "/" (default
   * "/workspace": the sandbox's "/" holds the whole system). Set "/" to search everything.
   */
  searchRoot?: string;
  /** Files written at create(): path -> text. */
  initialFiles?: Record<string, string>;
  /**
   * Largest file uploadFiles, downloadFiles, read, readRaw and write move (default 1 GiB):
   * they hold it in memory; larger files get `too_large`. Files over the daemon's 10 MiB per
   * request go in chunks (fs.read offset/length, fs.write append).
   */
  maxFileBytes?: number;
  /**
   * Called after execute() with the command's `spawn_agent --detach` requests (also in the
   * result's `detached_agents`): the daemon only records them; the harness runs them.
   */
  onDetachedAgents?: (requests: DetachedAgentRequest[], sandbox: ConchSandbox) => unknown;
}

/**
 * execute()'s result: deepagents' ExecuteResponse plus what the tool bridge recorded for the
 * command (present when it made calls): `tool_calls` (CallRecords, in order of completion),
 * `tools_summary` (the `[tools: ...]` line, also at the end of `output`) and
 * `detached_agents` (`spawn_agent --detach` requests, for the harness to run).
 */
export interface ConchExecuteResponse extends ExecuteResponse {
  tool_calls?: CallRecord[];
  tools_summary?: string;
  detached_agents?: DetachedAgentRequest[];
}

/** What spawnInteractive() returns (the shape deepagents' unpublished PTC engine uses). */
export interface InteractiveProcess {
  stdout: AsyncIterable<Uint8Array>;
  stderr: AsyncIterable<Uint8Array>;
  writeFile(path: string, content: string): Promise<void>;
  kill(): Promise<void>;
  waitForExit(): Promise<{ exitCode: number | null }>;
}

/**
 * A conch sandbox as a deepagents backend. `await ConchSandbox.create(opts)`, pass it as
 * `backend` to createDeepAgent, then `await sb.close()` (commit or discard per `onClose`).
 */
export class ConchSandbox implements SandboxBackendProtocolV2 {
  private opts: ConchSandboxOptions;
  private _client: ConchClient | null;
  private ownsClient: boolean;
  private _id = "";
  private initialized = false;
  private ownsSandbox: boolean;
  private readonly timeout: number;
  private readonly maxOutput: number;
  private readonly maxFile: number;

  constructor(opts: ConchSandboxOptions = {}) {
    this.opts = opts;
    this._client = opts.client ?? null;
    this.ownsClient = !opts.client;
    this.ownsSandbox = !opts.sandboxId;
    this.timeout = opts.timeout ?? 120;
    this.maxOutput = opts.maxOutputBytes ?? 100000;
    this.maxFile = opts.maxFileBytes ?? 1 << 30;
  }

  /** The conch sandbox id ("" before initialize()). */
  get id(): string {
    return this._id;
  }
  /** What close() does with the workspace's changes: the `onClose` option, else DEFAULT_ON_CLOSE. */
  get onClose(): "commit" | "discard" {
    return this.opts.onClose ?? DEFAULT_ON_CLOSE;
  }
  get isRunning(): boolean {
    return this.initialized;
  }
  get client(): ConchClient {
    if (!this._client) throw new SandboxError("ConchSandbox is not initialized: call initialize() or ConchSandbox.create()", "NOT_INITIALIZED");
    return this._client;
  }

  static async create(opts: ConchSandboxOptions = {}): Promise<ConchSandbox> {
    const sb = new ConchSandbox(opts);
    await sb.initialize();
    return sb;
  }

  /** Connect (spawning `conch serve --stdio` unless a client or socket is given) and create the sandbox. Throws SandboxError. */
  async initialize(): Promise<void> {
    if (this.initialized) throw new SandboxError("ConchSandbox is already initialized", "ALREADY_INITIALIZED");
    try {
      // A daemon spawned for one sandbox needs no pool and must not destroy work when idle.
      if (!this._client) this._client = await ConchClient.connect({ ...this.opts, args: this.opts.args ?? ["--pool", "0", "--idle-timeout", "0"] });
      if (this.opts.sandboxId) this._id = (await this._client.sandboxGet(this.opts.sandboxId)).id;
      else this._id = (await this._client.sandboxCreate(this.opts.sandbox ?? {})).id;
      this.initialized = true;
      if (this.opts.initialFiles) {
        const enc = new TextEncoder();
        const res = await this.uploadFiles(Object.entries(this.opts.initialFiles).map(([p, c]) => [p, enc.encode(c)]));
        const bad = res.find((r) => r.error);
        if (bad) throw new Error(`initial file ${bad.path}: ${bad.error}`);
      }
    } catch (e) {
      if (this.ownsClient && this._client) {
        await this._client.close().catch(() => {});
        this._client = null;
      }
      if (SandboxError.isInstance(e)) throw e;
      throw new SandboxError(`cannot start the conch sandbox: ${errMsg(e)}`, "NOT_INITIALIZED", e as Error);
    }
  }

  /**
   * Commit or discard the workspace's changes (`workspace` overrides `onClose`; "keep" leaves
   * them and the sandbox), destroy the sandbox we created, close the client we opened.
   */
  async close(opts: { workspace?: "commit" | "discard" | "keep"; paths?: string[] } = {}): Promise<{ committed?: string[] }> {
    if (!this.initialized || !this._client) return {};
    const what = opts.workspace ?? this.onClose;
    const out: { committed?: string[] } = {};
    try {
      if (what === "commit") out.committed = (await this._client.workspaceCommit(this._id, opts.paths)).committed;
      else if (what === "discard" && !this.ownsSandbox) await this._client.workspaceDiscard(this._id, opts.paths);
      if (this.ownsSandbox && what !== "keep") await this._client.sandboxDestroy(this._id);
    } finally {
      this.initialized = false;
      if (this.ownsClient) await this._client.close().catch(() => {});
    }
    return out;
  }
  /** Alias of close(). */
  stop(): Promise<{ committed?: string[] }> {
    return this.close();
  }

  // ---- execute: LocalShellBackend's output format ----
  async execute(command: string): Promise<ConchExecuteResponse> {
    if (!command || typeof command !== "string") return { output: "Error: Command must be a non-empty string.", exitCode: 1, truncated: false };
    let r;
    try {
      r = await this.client.execRun({
        sandbox: this._id,
        command,
        cwd: this.opts.cwd ?? "/workspace",
        timeout: this.timeout,
        max_output: Math.min(64 * 1024 * 1024, this.maxOutput * 4 + 16),
        // deepagents never sees the workspace's changes: the daemon need not scan for them.
        changes: false,
        shell: this.opts.shell ?? "sh",
        ...(this.opts.env ? { env: this.opts.env } : {}),
      });
    } catch (e) {
      return { output: `Error executing command: ${errMsg(e)}`, exitCode: 1, truncated: false };
    }
    if (r.timed_out) return this.withToolRecords(r, { output: `Error: Command timed out after ${this.timeout.toFixed(1)} seconds.${r.tools_summary ? `\n${r.tools_summary}` : ""}`, exitCode: 124, truncated: false });
    const parts: string[] = [];
    if (r.stdout) parts.push(r.stdout);
    if (r.stderr) parts.push(...r.stderr.trim().split("\n").map((l) => `[stderr] ${l}`));
    let output = parts.length > 0 ? parts.join("\n") : "<no output>";
    let truncated = !!(r.stdout_truncated || r.stderr_truncated);
    if (output.length > this.maxOutput) {
      output = output.slice(0, this.maxOutput) + `\n\n... Output truncated at ${this.maxOutput} bytes.`;
      truncated = true;
    } else if (truncated) output += `\n\n... Output truncated at ${this.maxOutput} bytes.`;
    // What the tool bridge recorded: its summary line after the output (as the daemon puts
    // it in exec.run's text), the call records and the detached spawn requests.
    if (r.tools_summary) output = `${output.replace(/\n+$/, "")}\n${r.tools_summary}`;
    const exitCode = r.exit_code ?? 1;
    if (exitCode !== 0) output = `${output.trimEnd()}\n\nExit code: ${exitCode}`;
    if (r.error && r.error.kind === "limit") output += `\n${r.error.message}`;
    return this.withToolRecords(r, { output, exitCode, truncated });
  }

  /** @res with what the bridge recorded for the command of @r; hands detached spawns to onDetachedAgents. */
  private async withToolRecords(r: ExecResult, res: ConchExecuteResponse): Promise<ConchExecuteResponse> {
    if (r.tool_calls?.length) res.tool_calls = r.tool_calls;
    if (r.tools_summary) res.tools_summary = r.tools_summary;
    if (r.detached_agents?.length) {
      res.detached_agents = r.detached_agents;
      try {
        await this.opts.onDetachedAgents?.(r.detached_agents, this);
      } catch (e) {
        // A backend that throws aborts the agent's whole run: the model is told instead.
        res.output += `\n[detached agents: the harness could not take them: ${errMsg(e)}]`;
      }
    }
    return res;
  }

  private searchPath(path: string | null | undefined): string {
    return !path || path === "/" ? this.opts.searchRoot ?? "/workspace" : path;
  }

  // ---- file tools ----
  async ls(path: string): Promise<LsResult> {
    try {
      const r = await this.client.fsLs(this._id, path || "/");
      const files: FileInfo[] = [];
      for (const e of r.entries) {
        const modified_at = new Date(e.mtime * 1000).toISOString();
        if (e.type === "d") files.push({ path: e.path + "/", is_dir: true, size: 0, modified_at });
        else if (e.type === "f" || e.type === "l") files.push({ path: e.path, is_dir: false, size: e.size, modified_at });
      }
      files.sort(byPath);
      return { files };
    } catch (e) {
      // FilesystemBackend lists a missing path or a file as nothing; other failures are errors.
      const c = errCode(e);
      if (c === "file_not_found" || c === "not_a_directory") return { files: [] };
      return { error: errMsg(e) };
    }
  }

  async read(filePath: string, offset = 0, limit = 500): Promise<ReadResult> {
    const mimeType = getMimeType(filePath);
    const off = Number.isFinite(offset) ? Math.max(0, Math.floor(offset)) : 0;
    const lim = Number.isFinite(limit) ? Math.max(0, Math.floor(limit)) : 0;
    // Text: fs.read in text mode sends only the lines asked for (no base64). What it cannot
    // answer exactly as FilesystemBackend would (an error, an empty or blank slice, bytes
    // that were not UTF-8) takes the whole-file path below.
    if (lim > 0 && lim <= 1e15 && off <= 1e15 && isTextMimeType(mimeType)) {
      try {
        const fast = linesResult(await this.client.fsRead(this._id, filePath, { offset: off, limit: lim }), off, lim, mimeType);
        if (fast) return fast;
      } catch {
        /* the whole-file path gives the error its usual form */
      }
    }
    let bytes: Uint8Array;
    try {
      bytes = await this.client.fsReadFile(this._id, filePath, { maxBytes: this.maxFile });
    } catch (e) {
      const c = errCode(e);
      if (c === "file_not_found" || c === "is_directory") return { error: `File '${filePath}' not found` };
      return { error: `Error reading file '${filePath}': ${errMsg(e)}` };
    }
    if (!isTextMimeType(mimeType)) return { content: bytes, mimeType };
    // As fs.readFile(path, "utf-8") decodes (a BOM is kept; TextDecoder would drop it).
    const content = utf8(bytes);
    if (!content || content.trim() === "") return { content: EMPTY_CONTENT_WARNING, mimeType };
    const lines = content.split("\n");
    const totalLines = lines[lines.length - 1] === "" ? lines.length - 1 : lines.length;
    const sliceEnd = Math.min(off + lim, lines.length);
    const endIdx = Math.min(off + lim, totalLines);
    if (off >= totalLines) return { error: `Line offset ${off} exceeds file length (${totalLines} lines)` };
    const selected = lines.slice(off, sliceEnd);
    if (selected.length === 0 || lim === 0) return { content: selected.join("\n"), mimeType };
    return {
      content: selected.join("\n"),
      mimeType,
      totalLines,
      startLine: off + 1,
      endLine: endIdx,
      nextOffset: endIdx < totalLines ? endIdx : undefined,
    };
  }

  async readRaw(filePath: string): Promise<ReadRawResult> {
    const mimeType = getMimeType(filePath);
    try {
      const content = await this.client.fsReadFile(this._id, filePath, { maxBytes: this.maxFile });
      const now = new Date().toISOString();
      return { data: { content: isTextMimeType(mimeType) ? utf8(content) : content, mimeType, created_at: now, modified_at: now } };
    } catch (e) {
      const c = errCode(e);
      if (c === "file_not_found" || c === "is_directory") return { error: `File '${filePath}' not found` };
      return { error: `Error reading file '${filePath}': ${errMsg(e)}` };
    }
  }

  async write(filePath: string, content: string): Promise<WriteResult> {
    try {
      const bytes = isTextMimeType(getMimeType(filePath)) ? Buffer.from(content, "utf8") : Buffer.from(content, "base64");
      if (bytes.length > this.maxFile) return { error: `Error writing file '${filePath}': ${this.tooLarge(bytes.length)}` };
      await this.client.fsWriteFile(this._id, filePath, bytes);
      return { path: filePath, filesUpdate: null };
    } catch (e) {
      return { error: `Error writing file '${filePath}': ${errMsg(e)}` };
    }
  }

  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    try {
      if (oldString === "") {
        // fs.edit refuses an empty old_string; deepagents allows it on an empty file only.
        const r = await this.readRaw(filePath);
        if (r.error) return { error: `Error: File '${filePath}' not found` };
        const text = typeof r.data!.content === "string" ? r.data!.content : utf8(r.data!.content as Uint8Array);
        if (text !== "") return { error: "Error: oldString cannot be empty when file has content" };
        await this.client.fsWrite(this._id, filePath, newString);
        return { path: filePath, filesUpdate: null, occurrences: 0 };
      }
      const r = await this.client.fsEdit(this._id, filePath, oldString, newString, replaceAll);
      return { path: filePath, filesUpdate: null, occurrences: r.occurrences };
    } catch (e) {
      const c = errCode(e);
      if (c === "file_not_found" || c === "is_directory") return { error: `Error: File '${filePath}' not found` };
      if (c === "string_not_found") return { error: `Error: String not found in file: '${oldString}'` };
      if (c === "ambiguous_match") {
        const n = (e as ConchError).data.occurrences;
        return { error: `Error: String '${oldString}' has multiple occurrences (appears ${n} times) in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context.` };
      }
      return { error: `Error editing file '${filePath}': ${errMsg(e)}` };
    }
  }

  async delete(filePath: string): Promise<DeleteResult> {
    try {
      await this.client.fsDelete(this._id, filePath, true);
      return { path: filePath, filesUpdate: null };
    } catch (e) {
      if (errCode(e) === "file_not_found") return { error: `Error: '${filePath}' not found` };
      return { error: `Error deleting '${filePath}': ${errMsg(e)}` };
    }
  }

  async grep(pattern: string, path: string | null = "/", glob: string | null = null, maxCount: number | null = null): Promise<GrepResult> {
    const want = maxCount == null ? 10000 : Math.min(10000, Math.max(1, Math.floor(maxCount) + 1));
    let r;
    try {
      r = await this.client.fsGrep(this._id, pattern, { path: this.searchPath(path), fixed_string: true, max_matches: want, ...(glob ? { glob } : {}) });
    } catch (e) {
      const c = errCode(e);
      if (c === "file_not_found" || c === "not_a_directory") return { matches: [] };
      return { error: errMsg(e) };
    }
    const matches = r.matches.filter((m) => isTextMimeType(getMimeType(m.path))).map((m) => ({ path: m.path, line: m.line, text: m.text }));
    if (maxCount != null && matches.length > maxCount) return { matches: matches.slice(0, maxCount), truncated: true };
    return r.truncated ? { matches, truncated: true } : { matches };
  }

  async glob(pattern: string, path = "/"): Promise<GlobResult> {
    // FilesystemBackend's glob: absolute paths of the matching files (not directories).
    if (pattern.startsWith("/")) pattern = pattern.slice(1);
    try {
      // details: each match's type, size and mtime in the same answer (one round trip).
      const r = await this.client.fsGlob(this._id, pattern, { path: this.searchPath(path), max_results: 10000, details: true });
      const files: FileInfo[] = (r.entries ?? [])
        .filter((e) => e.type === "f" || e.type === "l")
        .map((e) => ({ path: e.path, is_dir: false, size: e.size, modified_at: new Date(e.mtime * 1000).toISOString() }));
      files.sort(byPath);
      return r.truncated ? { files, truncated: true } : { files };
    } catch (e) {
      const c = errCode(e);
      if (c === "file_not_found" || c === "not_a_directory") return { files: [] };
      return { error: errMsg(e) };
    }
  }

  private tooLarge(n: number): string {
    return `too_large: ${n} bytes, over this backend's limit of ${this.maxFile} bytes (maxFileBytes)`;
  }

  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const out: FileUploadResponse[] = new Array(files.length);
    // Small files in batches of at most 1000 files and about 8 MiB of payload per request;
    // a big one goes alone (fsWriteFile: by fs.copy_in from FS_COPY_MIN where the daemon can
    // open our files, else over one request's 10 MiB in chunks).
    let batch: number[] = [];
    let size = 0;
    const flush = async () => {
      if (!batch.length) return;
      const b = batch;
      batch = [];
      size = 0;
      try {
        const r = await this.client.fsUpload(this._id, b.map((i) => ({ path: files[i][0], content: files[i][1] })));
        r.results.forEach((x, j) => (out[b[j]] = { path: files[b[j]][0], error: x.error ? toFileOpError(x.error.code, x.error.message) : null }));
      } catch (e) {
        for (const i of b) out[i] = { path: files[i][0], error: errFileOp(e) };
      }
    };
    for (let i = 0; i < files.length; i++) {
      const [path, content] = files[i];
      if (content.length > this.maxFile) {
        out[i] = { path, error: this.tooLarge(content.length) as FileOperationError };
        continue;
      }
      if (content.length > (this.client.noCopy ? FS_CHUNK_MAX : FS_COPY_MIN)) {
        try {
          await this.client.fsWriteFile(this._id, path, content);
          out[i] = { path, error: null };
        } catch (e) {
          out[i] = { path, error: errFileOp(e) };
        }
        continue;
      }
      if (batch.length >= 1000 || (batch.length && size + content.length > 8 << 20)) await flush();
      batch.push(i);
      size += content.length;
    }
    await flush();
    return out;
  }

  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const out: FileDownloadResponse[] = [];
    for (let i = 0; i < paths.length; i += 1000) {
      const chunk = paths.slice(i, i + 1000);
      let files: { path: string; content?: Uint8Array; error?: { code: string; message: string } }[];
      try {
        files = (await this.client.fsDownload(this._id, chunk)).files;
      } catch (e) {
        for (const p of chunk) out.push({ path: p, content: null, error: errFileOp(e) });
        continue;
      }
      for (let j = 0; j < chunk.length; j++) {
        const f = files[j];
        if (f?.error?.code === "too_large") {
          // Over one request's 10 MiB, or past fs.download's 64 MiB in all: read it in chunks.
          try {
            out.push({ path: chunk[j], content: await this.client.fsReadFile(this._id, chunk[j], { maxBytes: this.maxFile }), error: null });
          } catch (e) {
            out.push({ path: chunk[j], content: null, error: errFileOp(e) });
          }
        } else if (f?.error) out.push({ path: chunk[j], content: null, error: toFileOpError(f.error.code, f.error.message) });
        else out.push({ path: chunk[j], content: f?.content ?? null, error: f?.content ? null : "file_not_found" });
      }
    }
    return out;
  }

  // ---- interactive processes (job.* underneath) ----
  /** Start `bash -c command` as a job; stream its output; kill it or wait for it. */
  async spawnInteractive(command: string, opts: { cwd?: string; env?: Record<string, string>; pollMs?: number } = {}): Promise<InteractiveProcess> {
    const client = this.client;
    const { job_id } = await client.jobStart({ sandbox: this._id, command, cwd: opts.cwd ?? this.opts.cwd ?? "/workspace", ...(opts.env ?? this.opts.env ? { env: opts.env ?? this.opts.env } : {}) });
    const poll = opts.pollMs ?? 20;
    const qs: { stdout: Uint8Array[]; stderr: Uint8Array[] } = { stdout: [], stderr: [] };
    let done = false;
    let exitCode: number | null = null;
    let failure: unknown = null;
    const waiters = new Set<() => void>();
    const wakeAll = () => {
      for (const w of [...waiters]) w();
    };
    const enc = new TextEncoder();
    void (async () => {
      let so = 0,
        se = 0;
      try {
        while (true) {
          const o = await client.jobOutput({ job_id, stdout_offset: so, stderr_offset: se, max_bytes: 1 << 20 });
          if (o.stdout) qs.stdout.push(enc.encode(o.stdout));
          if (o.stderr) qs.stderr.push(enc.encode(o.stderr));
          const progressed = o.stdout_offset !== so || o.stderr_offset !== se;
          so = o.stdout_offset;
          se = o.stderr_offset;
          if (progressed) wakeAll();
          if (!o.running && !progressed) {
            exitCode = o.exit_code;
            break;
          }
          if (!progressed) await new Promise((r) => setTimeout(r, poll));
        }
      } catch (e) {
        failure = e;
      }
      done = true;
      wakeAll();
    })();
    const iter = (q: Uint8Array[]): AsyncIterable<Uint8Array> => ({
      async *[Symbol.asyncIterator]() {
        while (true) {
          if (q.length) {
            yield q.shift()!;
            continue;
          }
          if (done) return;
          await new Promise<void>((r) => {
            const w = () => (waiters.delete(w), r());
            waiters.add(w);
          });
        }
      },
    });
    return {
      stdout: iter(qs.stdout),
      stderr: iter(qs.stderr),
      writeFile: async (path, content) => {
        await client.fsWrite(this._id, path, content);
      },
      kill: async () => {
        await client.jobKill(job_id, "KILL").catch(() => {});
      },
      waitForExit: async () => {
        while (!done)
          await new Promise<void>((r) => {
            const w = () => (waiters.delete(w), r());
            waiters.add(w);
          });
        if (failure) throw failure;
        return { exitCode };
      },
    };
  }

  // ---- tool bridge ----
  /** The generated documentation of the registered tools (tools.prompt). */
  async toolsPrompt(languages?: ("bash" | "python" | "node")[]): Promise<string> {
    return (await this.client.toolsPrompt(this._id, languages)).text;
  }
}

// ---------------- tool bridge helpers ----------------

/** The parts of a LangChain tool the bridge uses (StructuredToolInterface satisfies it). */
export interface BridgeTool {
  name: string;
  description: string;
  schema?: unknown;
  invoke(input: any, config?: any): Promise<unknown>;
  /** If present, the bridge calls this instead of invoke, with the whole tool.call (its origin). */
  bridgeInvoke?(p: ToolCallParams, signal: AbortSignal): Promise<unknown>;
}

/** A JSON Schema for a LangChain tool's schema (zod v3/v4 or JSON schema already). */
export async function toolInputSchema(schema: unknown): Promise<Record<string, unknown>> {
  if (!schema) return { type: "object", properties: {} };
  const { toJsonSchema } = await import("@langchain/core/utils/json_schema");
  const js = toJsonSchema(schema as any) as Record<string, unknown>;
  const { $schema: _s, ...rest } = js;
  return rest;
}

/** Text of a tool's result: strings as they are, a ToolMessage's / message's content, else the value. */
function toolResultValue(v: any): unknown {
  if (v && typeof v === "object" && "content" in v && (v.lc_namespace || v._getType || v.type === "tool")) {
    const c = v.content;
    if (typeof c === "string") return c;
    if (Array.isArray(c)) return c.map((b: any) => (typeof b === "string" ? b : b?.text ?? "")).join("");
    return c;
  }
  return v;
}

/**
 * Register LangChain tools with the sandbox and answer their `tool.call`s on this client.
 * Returns the names registered. Calls of other names (registered elsewhere) get an error.
 */
export async function registerTools(sandbox: ConchSandbox, tools: BridgeTool[]): Promise<string[]> {
  const specs = await Promise.all(tools.map(async (t) => ({ name: t.name, description: t.description ?? "", input_schema: await toolInputSchema(t.schema) })));
  const reg = bridgeState(sandbox);
  for (const t of tools) reg.tools.set(t.name, t);
  installHandlers(sandbox);
  return (await sandbox.client.toolsRegister(sandbox.id, specs)).registered;
}

/** A sub-agent the sandbox's commands may spawn (`spawn_agent TASK TYPE`). */
export interface BridgeAgent {
  name: string;
  description: string;
  /** Runs the task, returns the answer. */
  run(task: string, signal: AbortSignal): Promise<unknown>;
}

/** A deepagents SubAgent definition (name, description, systemPrompt, tools?, model?). */
export interface SubAgentLike {
  name: string;
  description: string;
  systemPrompt: string;
  tools?: any[];
  model?: any;
  [key: string]: unknown;
}

/** A BridgeAgent that runs a deepagents sub-agent (createDeepAgent) with the sandbox as its backend. */
export function deepAgentRunner(sandbox: ConchSandbox, sub: SubAgentLike, defaults: { model?: any; middleware?: any[] } = {}): BridgeAgent {
  let agent: any = null;
  return {
    name: sub.name,
    description: sub.description,
    async run(task, signal) {
      if (!agent) {
        const { createDeepAgent } = await import("deepagents");
        agent = createDeepAgent({ model: sub.model ?? defaults.model, systemPrompt: sub.systemPrompt, tools: sub.tools ?? [], backend: sandbox, ...(defaults.middleware ? { middleware: defaults.middleware } : {}) } as any);
      }
      const out = await agent.invoke({ messages: [{ role: "user", content: task }] }, { signal });
      const last = out.messages[out.messages.length - 1];
      return toolResultValue(last) ?? "";
    },
  };
}

/**
 * Register sub-agent types with the sandbox and answer `agent.spawn` with them. Items are
 * BridgeAgents or deepagents SubAgent definitions (run with `defaults.model`). `defaultAgent`
 * answers spawns with type null.
 */
export async function registerSubagents(
  sandbox: ConchSandbox,
  agents: Array<BridgeAgent | SubAgentLike>,
  opts: { model?: any; defaultAgent?: BridgeAgent | SubAgentLike } = {},
): Promise<string[]> {
  const asRunner = (a: BridgeAgent | SubAgentLike): BridgeAgent => (typeof (a as BridgeAgent).run === "function" ? (a as BridgeAgent) : deepAgentRunner(sandbox, a as SubAgentLike, { model: opts.model }));
  const reg = bridgeState(sandbox);
  for (const a of agents) reg.agents.set(a.name, asRunner(a));
  if (opts.defaultAgent) reg.defaultAgent = asRunner(opts.defaultAgent);
  installHandlers(sandbox);
  return (await sandbox.client.agentsRegister(sandbox.id, agents.map((a) => ({ name: a.name, description: a.description })))).registered;
}

interface BridgeState {
  tools: Map<string, BridgeTool>;
  agents: Map<string, BridgeAgent>;
  defaultAgent?: BridgeAgent;
}
const bridges = new WeakMap<ConchClient, Map<string, BridgeState>>();
function bridgeState(sb: ConchSandbox): BridgeState {
  let m = bridges.get(sb.client);
  if (!m) bridges.set(sb.client, (m = new Map()));
  let s = m.get(sb.id);
  if (!s) m.set(sb.id, (s = { tools: new Map(), agents: new Map() }));
  return s;
}
function installHandlers(sb: ConchSandbox): void {
  const client = sb.client;
  const m = bridges.get(client)!;
  client.onRequest("tool.call", async (p: ToolCallParams, { signal }) => {
    const t = m.get(p.sandbox)?.tools.get(p.name);
    if (!t) throw new ConchError(-32000, `no tool '${p.name}' is registered by this client`, { code: "unknown_tool", kind: "usage" });
    if (t.bridgeInvoke) return toolResultValue(await t.bridgeInvoke(p, signal));
    return toolResultValue(await t.invoke(p.input ?? {}, { signal }));
  });
  client.onRequest("agent.spawn", async (p: AgentSpawnParams, { signal }) => {
    const s = m.get(p.sandbox);
    const a = p.type == null ? s?.defaultAgent : s?.agents.get(p.type);
    if (!a) throw new ConchError(-32000, p.type == null ? "no default agent is registered by this client" : `no agent type '${p.type}' is registered by this client`, { code: "unknown_agent", kind: "usage" });
    return a.run(p.task, signal);
  });
}

/**
 * A LangChain agent middleware that appends the sandbox's `tools.prompt` text (how commands
 * call the registered tools) to the system prompt of every model call. Fetched once, lazily.
 */
export async function createToolsPromptMiddleware(sandbox: ConchSandbox, opts: { languages?: ("bash" | "python" | "node")[] } = {}): Promise<any> {
  const { createMiddleware } = await import("langchain");
  let text: string | null = null;
  return createMiddleware({
    name: "ConchToolsPromptMiddleware",
    wrapModelCall: async (request: any, handler: any) => {
      if (text === null) text = await sandbox.toolsPrompt(opts.languages).catch(() => "");
      if (!text) return handler(request);
      const base = request.systemPrompt ? `${request.systemPrompt}\n\n` : "";
      return handler({ ...request, systemPrompt: base + text });
    },
  } as any);
}

/** The system prompt with the sandbox's tools.prompt text appended (for harnesses without middleware). */
export async function withToolsPrompt(sandbox: ConchSandbox, systemPrompt: string, languages?: ("bash" | "python" | "node")[]): Promise<string> {
  const text = await sandbox.toolsPrompt(languages);
  return text ? `${systemPrompt}\n\n${text}` : systemPrompt;
}

// ---------------- the JS REPL middleware (a drop-in for @langchain/quickjs's) ----------------

/** Options of createConchJsMiddleware: @langchain/quickjs 0.6's createCodeInterpreterMiddleware options that apply. */
export interface ConchJsMiddlewareOptions {
  /** Agent tools the REPL may call as `tools.<camelCase>(input)` (names of the agent's tools, or tool objects); default none. Not "task": sub-agents are `task()` and `spawnAgent()`. */
  ptc?: (string | BridgeTool)[];
  /** The whole eval's wall deadline, pending promises included (default 5000). */
  executionTimeoutMs?: number;
  /** Replaces the REPL section of the system prompt. */
  systemPrompt?: string | null;
  /** The tool result's length, past which it is cut with a note (default 4000). */
  maxResultChars?: number;
  /** The eval tool's name (default "eval", as @langchain/quickjs's). */
  toolName?: string;
  /** Offer the agent's `task` tool to the REPL as `task({description, subagentType})` and `spawnAgent(task, type?)` (default true). */
  subagents?: boolean;
}

/** An eval's result as @langchain/quickjs's formatReplResult words it: console lines, `→ value` or `Name: message` and the stack, or "(no output)". */
export function formatJsResult(r: JsEvalResult, maxChars = 4000): string {
  const parts: string[] = [];
  if (r.console.length > 0) {
    let logs = r.console.map((l) => l.text).join("\n");
    if (r.console_dropped) logs += `\n[truncated ${r.console_dropped} chars]`;
    parts.push(logs);
  }
  if (r.ok) {
    if (r.value !== undefined && r.type !== "undefined") parts.push(`→ ${typeof r.value === "string" ? r.value : JSON.stringify(r.value, null, 2)}`);
  } else if (r.error) {
    parts.push(`${r.error.name || "Error"}: ${r.error.message || "Unknown error"}`);
    if (r.error.stack) parts.push(r.error.stack);
  }
  const text = parts.join("\n") || "(no output)";
  return text.length > maxChars ? `${text.slice(0, maxChars)}\n[truncated ${text.length - maxChars} chars]` : text;
}

/** A JS session name for a thread id: the id itself when it is one (1-64 of A-Za-z0-9-_.), else a digest of it. */
export function jsSessionName(threadId: string): string {
  if (/^[A-Za-z0-9._-]{1,64}$/.test(threadId)) return threadId;
  let h1 = 0x811c9dc5, h2 = 0x01000193;
  for (let i = 0; i < threadId.length; i++) {
    const c = threadId.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 0x01000193) >>> 0;
    h2 = Math.imul(h2 ^ c, 0x5bd1e995) >>> 0;
  }
  return `t-${threadId.replace(/[^A-Za-z0-9._-]/g, "").slice(0, 40)}-${h1.toString(16)}${h2.toString(16)}`;
}

/** LangChain's Command / ToolMessage envelopes to their content (deepagents' task tool returns a Command). */
function unwrapEnvelope(v: any): unknown {
  const msgs = v && typeof v === "object" && v.update && Array.isArray(v.update.messages) ? v.update.messages : null;
  if (msgs) for (let i = msgs.length - 1; i >= 0; i--) if (msgs[i]?.content != null) return toolResultValue(msgs[i]);
  return toolResultValue(v);
}

// Defines @langchain/quickjs's `task({description, subagentType, responseSchema?})` global over spawnAgent.
const TASK_PRELUDE =
  "globalThis.task = (o) => spawnAgent(o.description, o.subagentType).then((r) => {\n" +
  "  if (o.responseSchema != null && typeof r === 'string') { try { return JSON.parse(r) } catch {} }\n" +
  "  return r;\n" +
  "}); undefined";

/**
 * A LangChain agent middleware adding a JavaScript/TypeScript REPL tool that runs in the
 * sandbox's JS sessions (native QuickJS inside the sandbox, its files readable with
 * readFile/writeFile): a drop-in for @langchain/quickjs's createCodeInterpreterMiddleware
 * (same tool name "eval", input {code}, result text, `ptc` tools as `tools.*`, sub-agents as
 * `task()`), one session per thread (the thread id as the session name), closed when the
 * agent's run ends. Its system prompt carries the `tools` declarations (tools.prompt's js form).
 */
export async function createConchJsMiddleware(sandbox: ConchSandbox, options: ConchJsMiddlewareOptions = {}): Promise<any> {
  const { createMiddleware, tool } = await import("langchain");
  const { ptc, executionTimeoutMs = 5000, systemPrompt = null, maxResultChars = 4000, toolName = "eval", subagents = true } = options;
  const configs = new Map<string, any>(); // session -> the eval tool's latest RunnableConfig
  const prepared = new Set<string>();
  let offered: string[] = [];
  let registeredKey = "";
  let promptText = "";

  const wrap = (t: BridgeTool): BridgeTool => ({
    name: t.name,
    description: t.description ?? "",
    schema: t.schema,
    invoke: (input, config) => t.invoke(input, config),
    async bridgeInvoke(p, signal) {
      const cfg = configs.get(p.origin?.kind === "js" ? p.origin.id : "") ?? {};
      return unwrapEnvelope(await t.invoke(p.input ?? {}, { ...cfg, signal }));
    },
  });

  async function offer(agentTools: BridgeTool[]): Promise<void> {
    const byName = new Map(agentTools.filter((t) => t.name !== toolName).map((t) => [t.name, t]));
    const chosen: BridgeTool[] = [];
    for (const item of ptc ?? []) {
      const name = typeof item === "string" ? item : item.name;
      if (name === "task") throw new Error("The sub-agent `task` tool cannot be in `ptc`: it is the REPL's `task()` and `spawnAgent()`. Remove \"task\" from `ptc`.");
      const t = typeof item === "string" ? byName.get(item) : item;
      if (t) chosen.push(t);
    }
    const task = subagents ? byName.get("task") : undefined;
    if (task) chosen.push(task);
    const key = chosen.map((t) => t.name).sort().join("\n");
    if (key === registeredKey) return;
    offered = chosen.length ? await registerTools(sandbox, chosen.map(wrap)) : [];
    registeredKey = key;
    promptText = offered.some((n) => n !== "task") ? await sandbox.client.toolsPrompt(sandbox.id, ["js"]).then((r) => r.text, () => "") : "";
  }

  const evalTool = tool(
    async (input: { code: string }, config: any) => {
      const session = jsSessionName(String(config?.configurable?.thread_id || "__default__"));
      configs.set(session, config);
      const params = { sandbox: sandbox.id, session, timeout: executionTimeoutMs / 1000, tools: { include: offered } };
      if (!prepared.has(session) && offered.includes("task")) {
        await sandbox.client.jsEval({ ...params, code: TASK_PRELUDE });
        prepared.add(session);
      }
      return formatJsResult(await sandbox.client.jsEval({ ...params, code: input.code }), maxResultChars);
    },
    {
      name: toolName,
      description:
        "Evaluate TypeScript/JavaScript code in a sandboxed REPL. State persists across calls.\n" +
        "Use console.log() for output. Returns the result of the last expression.\n" +
        "If file or other tools are available, call them via the tools namespace: await tools.readFile({ path }).",
      metadata: { ls_code_input_language: "javascript" },
      schema: { type: "object", properties: { code: { type: "string", description: "TypeScript/JavaScript code to evaluate in the sandboxed REPL" } }, required: ["code"] },
    } as any,
  );

  return createMiddleware({
    name: "ConchJsMiddleware",
    tools: [evalTool],
    wrapModelCall: async (request: any, handler: any) => {
      await offer((request.tools ?? []) as BridgeTool[]);
      const repl =
        systemPrompt ??
        `### Interpreter\n\nAn \`${toolName}\` tool is available. It runs JavaScript or TypeScript in a persistent REPL inside the sandbox.\n` +
          "- State (variables, functions) persists across tool calls within a single turn of conversation. They DO NOT persist across multiple turns.\n" +
          "- Top-level `await` works; Promises resolve before the call returns.\n" +
          "- `await readFile(path)` and `await writeFile(path, data)` reach the sandbox's files (relative to /workspace); writes apply only when the call succeeds. No `fetch`, `require` or network.\n" +
          `- Timeout: ${executionTimeoutMs / 1000}s per call.\n` +
          "- `console.log` output is captured and returned alongside the result.\n" +
          (offered.includes("task") ? "- Sub-agents: `await task({ description, subagentType })` (or `spawnAgent(description, type?)`) runs one and resolves to its answer; `Promise.all` runs several at once.\n" : "");
      const base = request.systemPrompt ? `${request.systemPrompt}\n\n` : "";
      return handler({ ...request, systemPrompt: base + repl + (promptText ? `\n\n${promptText}` : "") });
    },
    afterAgent: async (_state: any, runtime: any) => {
      const session = jsSessionName(String(runtime?.configurable?.thread_id || "__default__"));
      configs.delete(session);
      prepared.delete(session);
      await sandbox.client.jsClose(sandbox.id, session).catch(() => undefined);
    },
  } as any);
}

/** The name @langchain/quickjs 0.6 exports, for a drop-in import. */
export const createCodeInterpreterMiddleware = createConchJsMiddleware;
