// helpers.mjs - shared by the tests: a fake daemon on in-memory streams, and the real
// build/conch (CONCH_BIN overrides) spawned as `conch serve --stdio` with a temp state dir.
import { PassThrough } from "node:stream";
import { mkdtempSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const conchBin = process.env.CONCH_BIN ?? resolve(here, "../../../build/conch");
export const haveConch = existsSync(conchBin);

const made = [];
process.on("exit", () => {
  for (const d of made) {
    try {
      rmSync(d, { recursive: true, force: true });
    } catch {
      /* a daemon's leftovers: best effort */
    }
  }
});

/** A temp dir, removed when the test process exits. */
export function tmp(prefix = "conch-ts-") {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}

/** Args for a private daemon: its own state dir, no pool. */
export function stdioArgs(stateDir = tmp("conch-ts-state-")) {
  return ["--state-dir", stateDir, "--pool", "0"];
}

/**
 * A fake daemon: `transport` goes to a client; `requests` yields what the client sent;
 * `send(obj)` writes a line to the client.
 */
export function fakeDaemon() {
  const toClient = new PassThrough();
  const fromClient = new PassThrough();
  const received = [];
  let waiters = [];
  let buf = "";
  fromClient.setEncoding("utf8");
  fromClient.on("data", (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const msg = JSON.parse(buf.slice(0, i));
      buf = buf.slice(i + 1);
      received.push(msg);
      for (const w of waiters.splice(0)) w();
    }
  });
  let closed = false;
  return {
    received,
    transport: {
      readable: toClient,
      writable: fromClient,
      close: async () => {
        closed = true;
        toClient.end();
      },
    },
    get closed() {
      return closed;
    },
    send(obj) {
      toClient.write(JSON.stringify(obj) + "\n");
    },
    sendRaw(s) {
      toClient.write(s);
    },
    /** Wait until a message matching pred was received; returns it. */
    async next(pred = () => true, timeoutMs = 2000) {
      const deadline = Date.now() + timeoutMs;
      let seen = 0;
      while (true) {
        for (; seen < received.length; seen++) if (pred(received[seen])) return received.splice(seen, 1)[0];
        if (Date.now() > deadline || this.stopped) throw new Error("fake daemon: no matching message");
        await new Promise((r) => {
          waiters.push(r);
          setTimeout(r, 50);
        });
      }
    },
    end() {
      toClient.end();
    },
  };
}

/** Answer every request of the client with handler(method, params) (its return = result, or throw {code,message,data}). */
export function serveFake(fd, handler) {
  let stop = false;
  (async () => {
    while (!stop) {
      let m;
      try {
        m = await fd.next((x) => x.method !== undefined && x.id !== undefined, 100000);
      } catch {
        return;
      }
      try {
        const result = await handler(m.method, m.params);
        fd.send({ jsonrpc: "2.0", id: m.id, result });
      } catch (e) {
        fd.send({ jsonrpc: "2.0", id: m.id, error: { code: e.code ?? -32603, message: e.message, data: e.data ?? { code: "internal_error", kind: "internal" } } });
      }
    }
  })();
  return () => {
    stop = true;
    fd.stopped = true;
  };
}
