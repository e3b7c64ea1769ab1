// network.test.mjs - the network policy through ConchClient against the real build/conch:
// sandboxCreate's net/allow/deny/mounts, networkSet, networkLog, and exec.run's `network`
// records (no outside network needed: the proxy refuses the denied name itself).
import { test } from "node:test";
import assert from "node:assert/strict";
import { ConchClient, ConchError } from "../dist/index.js";
import { conchBin, haveConch, stdioArgs } from "./helpers.mjs";

const skip = haveConch ? false : `no conch binary at ${conchBin} (build it or set CONCH_BIN)`;

test("network rules: create, set, log, and a denied request's record", { skip }, async () => {
  const c = await ConchClient.connect({ bin: conchBin, args: stdioArgs() });
  try {
    const sb = await c.sandboxCreate({ allow: ["Example.invalid."], mounts: [{ type: "tmpfs", target: "/scratch" }] });
    assert.equal(sb.net, "allow");
    assert.deepEqual([sb.allow, sb.deny], [["example.invalid"], []]);

    const pol = await c.networkSet(sb.id, { allow: ["example.invalid", "*.pkg.invalid"], deny: ["blocked.invalid"] });
    assert.deepEqual(pol, { sandbox: sb.id, net: "allow", allow: ["example.invalid", "*.pkg.invalid"], deny: ["blocked.invalid"] });
    let log = await c.networkLog(sb.id);
    assert.deepEqual([log.deny, log.total, log.records], [["blocked.invalid"], 0, []]);

    const r = await c.execRun({ sandbox: sb.id, command: "touch /scratch/x && curl -sS -o /dev/null -w '%{http_code}' http://blocked.invalid/" });
    assert.equal(r.exit_code, 0, r.text);
    assert.equal(r.stdout, "403");
    assert.ok(Array.isArray(r.network) && r.network.length === 1, JSON.stringify(r.network));
    const rec = r.network[0];
    assert.deepEqual([rec.host, rec.allowed, rec.rule], ["blocked.invalid", false, "blocked.invalid"]);
    assert.match(rec.error, /denied/);
    log = await c.networkLog(sb.id);
    assert.equal(log.total, 1);
    assert.deepEqual(log.records.map((x) => x.host), ["blocked.invalid"]);

    assert.equal((await c.networkSet(sb.id, { net: "none" })).net, "none");
    await assert.rejects(c.networkSet(sb.id, { net: "host" }), (e) => e instanceof ConchError && e.data.code === "invalid_params");

    const plain = await c.sandboxCreate();
    assert.equal(plain.net, "none");
    assert.equal((await c.execRun({ sandbox: plain.id, command: "true" })).network, undefined);
  } finally {
    await c.close();
  }
});

test("path rules: readonly and hidden paths of sandboxCreate", { skip }, async () => {
  const { mkdtempSync, mkdirSync, writeFileSync, readFileSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const ws = mkdtempSync(join(tmpdir(), "conch-rules-"));
  mkdirSync(join(ws, ".git", "hooks"), { recursive: true });
  writeFileSync(join(ws, ".git", "hooks", "pre-commit"), "hook\n");
  writeFileSync(join(ws, ".env"), "TOKEN=secret\n");
  const c = await ConchClient.connect({ bin: conchBin, args: stdioArgs() });
  try {
    const sb = await c.sandboxCreate({ workspace: ws, readonly: [".git/hooks"], hidden: [".env"] });
    const r = await c.execRun({ sandbox: sb.id, command: "cat .env 2>/dev/null; echo x > .git/hooks/pre-commit || echo refused" });
    assert.ok(!r.stdout.includes("secret") && r.stdout.endsWith("refused\n"), r.text);
    await assert.rejects(c.sandboxCreate({ workspace: ws, hidden: ["/abs"] }), (e) => e instanceof ConchError && e.data.code === "invalid_params");
  } finally {
    await c.close();
  }
  assert.equal(readFileSync(join(ws, ".git", "hooks", "pre-commit"), "utf8"), "hook\n");
});

test("sockets: a host unix socket passed in, with no network", { skip }, async () => {
  const { mkdtempSync, chmodSync, writeFileSync, rmSync } = await import("node:fs");
  const { createServer } = await import("node:net");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const dir = mkdtempSync(join(tmpdir(), "conch-ts-sock-"));
  chmodSync(dir, 0o755);
  const path = join(dir, "db.sock");
  const srv = createServer((s) => s.once("data", (d) => s.end(Buffer.concat([Buffer.from("db:"), d]))));
  await new Promise((res) => srv.listen(path, res));
  const c = await ConchClient.connect({ bin: conchBin, args: stdioArgs() });
  try {
    const sb = await c.sandboxCreate({ net: "none", sockets: [{ host: path, path: "/run/db.sock" }] });
    assert.deepEqual(sb.sockets, [{ host: path, path: "/run/db.sock" }]);
    const r = await c.execRun({ sandbox: sb.id, command: "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/run/db.sock'); s.sendall(b'ping'); print(s.recv(100).decode())\"" });
    assert.equal(r.exit_code, 0, r.text);
    assert.equal(r.stdout, "db:ping\n");
    writeFileSync(join(dir, "plain"), "x");
    await assert.rejects(c.sandboxCreate({ sockets: [`${join(dir, "plain")}:/run/x.sock`] }), (e) => e instanceof ConchError && e.data.code === "invalid_params");
  } finally {
    await c.close();
    srv.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
