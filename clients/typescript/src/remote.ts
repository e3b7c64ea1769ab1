// remote.ts - the remote transport: JSON-RPC over WebSocket on TLS to a `conch serve --listen`
// gateway (docs/PROTOCOL.md, "Remote transport"), with the `ws` package. One JSON-RPC message
// per text message; presented as the line streams RpcConnection reads and writes. The
// server's certificate and hostname are always verified; a private CA is added to Node's.
import { readFileSync } from "node:fs";
import { rootCertificates } from "node:tls";
import { PassThrough, Writable } from "node:stream";
import WebSocket from "ws";
import { ConchError, TRANSPORT_ERROR, type Transport } from "./rpc.js";

/** Messages up to this size, either way (the gateway's limit too). */
export const MAX_MESSAGE = 64 * 1024 * 1024;

export interface RemoteOptions {
  /** `wss://HOST:PORT` (path /rpc implied when absent). Default: $CONCH_URL. */
  url?: string;
  /** The bearer token. Default: $CONCH_TOKEN. */
  token?: string;
  /** A PEM file of a private CA, added to Node's CAs. Default: $CONCH_CA. */
  ca?: string;
  /** Seconds to wait for the TLS and WebSocket handshakes (default 10). */
  connectTimeout?: number;
}

function transportError(message: string): ConchError {
  return new ConchError(TRANSPORT_ERROR, message, { code: "transport", kind: "infrastructure" });
}

/** The URL with /rpc added when it has no path; refuses anything but wss:// and tokens in it. */
export function remoteUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw transportError(`remote URL '${url}' is not a URL (wss://HOST:PORT)`);
  }
  if (u.protocol !== "wss:") throw transportError(`remote URL '${url}': the scheme must be wss:// (TLS); a token is never sent in the clear`);
  if (u.username || u.password) throw transportError("remote URL: put the token in CONCH_TOKEN or the token option, not in the URL");
  if (u.pathname === "/" || u.pathname === "") u.pathname = "/rpc";
  return u.toString();
}

/** Options resolved against the environment: null when no remote daemon is named. */
export function remoteOptions(opts: RemoteOptions & { socket?: string }): Required<Pick<RemoteOptions, "url">> & RemoteOptions | null {
  const url = opts.url ?? (opts.socket ? undefined : process.env.CONCH_URL || undefined);
  if (!url) return null;
  return {
    url: remoteUrl(url),
    token: opts.token ?? (process.env.CONCH_TOKEN || undefined),
    ca: opts.ca ?? (process.env.CONCH_CA || undefined),
    connectTimeout: opts.connectTimeout,
  };
}

/** Connect to a remote daemon. Rejects with a ConchError (code -32099) saying why. */
export function remoteTransport(opts: RemoteOptions): Promise<Transport> {
  const o = remoteOptions(opts);
  if (!o) return Promise.reject(transportError("no remote URL: pass url or set CONCH_URL"));
  let ca: (string | Buffer)[] | undefined;
  if (o.ca) {
    try {
      ca = [...rootCertificates, readFileSync(o.ca)];
    } catch (e) {
      return Promise.reject(transportError(`cannot read the CA bundle '${o.ca}' (CONCH_CA / ca): ${(e as Error).message}`));
    }
  }
  const headers: Record<string, string> = {};
  if (o.token) {
    if (/[\r\n]/.test(o.token)) return Promise.reject(transportError("the token (CONCH_TOKEN / token) holds a line break"));
    headers.Authorization = `Bearer ${o.token}`;
  }
  const url = o.url;
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, {
      headers,
      ca,
      rejectUnauthorized: true,
      minVersion: "TLSv1.2",
      maxPayload: MAX_MESSAGE,
      perMessageDeflate: false,
      handshakeTimeout: (o.connectTimeout ?? 10) * 1000,
      followRedirects: false,
    });
    let opened = false;
    ws.once("unexpected-response", (_req, res) => {
      const s = res.statusCode;
      res.resume();
      ws.terminate();
      reject(
        transportError(
          s === 401
            ? o.token
              ? `${url}: unauthorized (HTTP 401): the server refused the token (CONCH_TOKEN / token)`
              : `${url}: unauthorized (HTTP 401): no token given (set CONCH_TOKEN or token)`
            : s === 429
              ? `${url}: rate limited (HTTP 429): too many failed authentications from this address; wait a minute`
              : `${url}: the server did not accept the WebSocket upgrade (HTTP ${s})`,
        ),
      );
    });
    ws.once("error", (e: Error & { code?: string }) => {
      if (opened) return;
      const cert = /certificate|self.signed|altnames|issuer/i.test(`${e.code} ${e.message}`);
      reject(
        transportError(
          cert
            ? `cannot connect to ${url}: the server's certificate was refused: ${e.message} (a private CA: set CONCH_CA or the ca option to its PEM file)`
            : `cannot connect to ${url}: ${e.message}`,
        ),
      );
    });
    ws.once("open", () => {
      opened = true;
      resolve(wrap(ws));
    });
  });
}

/** The WebSocket as the line streams of a Transport. */
function wrap(ws: WebSocket): Transport {
  const readable = new PassThrough();
  let partial = "";
  const writable = new Writable({
    decodeStrings: false,
    write(chunk: string | Buffer, _enc, cb) {
      const text = partial + (typeof chunk === "string" ? chunk : chunk.toString("utf8"));
      const lines = text.split("\n");
      partial = lines.pop() ?? "";
      if (ws.readyState !== WebSocket.OPEN) return cb(new Error("connection lost"));
      const sends = lines.filter((l) => l.length > 0);
      if (!sends.length) return cb();
      let left = sends.length;
      let failed = false;
      for (const l of sends) {
        if (Buffer.byteLength(l) > MAX_MESSAGE) {
          failed = true;
          return cb(new Error(`a message over the remote transport's ${MAX_MESSAGE >> 20} MiB`));
        }
        ws.send(l, { binary: false }, (err) => {
          if (failed) return;
          if (err) {
            failed = true;
            return cb(err);
          }
          if (--left === 0) cb();
        });
      }
    },
  });
  ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
    const text = Buffer.isBuffer(data) ? data.toString("utf8") : Array.isArray(data) ? Buffer.concat(data).toString("utf8") : Buffer.from(data).toString("utf8");
    // A raw line break in JSON is whitespace between tokens: a space keeps one line.
    readable.write((isBinary ? text : text).replace(/[\r\n]/g, " ") + "\n");
  });
  let lost: string | undefined;
  ws.on("error", (e: Error) => {
    lost = e.message;
  });
  ws.on("close", (code: number, reason: Buffer) => {
    if (!lost && code !== 1000) lost = `WebSocket closed (${code}${reason.length ? ` ${reason.toString()}` : ""})`;
    readable.end();
  });
  return {
    readable,
    writable,
    exitInfo: async () => lost,
    close: () =>
      new Promise<void>((res) => {
        if (ws.readyState === WebSocket.CLOSED) return res();
        ws.once("close", () => res());
        ws.close(1000);
        setTimeout(() => {
          ws.terminate();
          res();
        }, 2000).unref();
      }),
  };
}
