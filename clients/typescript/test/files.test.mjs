// files.test.mjs - files over the daemon's 10 MiB per request through ConchSandbox
// (uploadFiles, downloadFiles, readRaw, read, write) and ConchClient (fsReadFile,
// fsWriteFile): by fs.copy_in / fs.copy_out where the daemon can open our files, else in
// chunks, both ways, byte for byte; a real failure keeps its cause.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes, createHash } from "node:crypto";
import { ConchSandbox } from "../dist/deepagents.js";
import { conchBin, haveConch, stdioArgs } from "./helpers.mjs";

const skip = haveConch ? false : `no conch binary at ${conchBin} (build it or set CONCH_BIN)`;
const MiB = 1 << 20;
const sha = (b) => createHash("sha256").update(b).digest("hex");
let sb;

before(async () => {
  if (skip) return;
  sb = await ConchSandbox.create({ bin: conchBin, args: stdioArgs() });
});
after(async () => {
  await sb?.close();
});

test("uploadFiles and downloadFiles move files over 10 MiB whole, beside small ones", { skip }, async () => {
  const big = randomBytes(25 * MiB + 123);
  const small = new TextEncoder().encode("small\n");
  const up = await sb.uploadFiles([["/workspace/big.bin", big], ["/workspace/small.txt", small], ["/workspace/exact.bin", big.subarray(0, 10 * MiB)]]);
  assert.deepEqual(up, [{ path: "/workspace/big.bin", error: null }, { path: "/workspace/small.txt", error: null }, { path: "/workspace/exact.bin", error: null }]);
  const r = await sb.execute("stat -c %s big.bin exact.bin && sha256sum big.bin | cut -c1-64");
  assert.equal(r.output, `${big.length}\n${10 * MiB}\n${sha(big)}\n`);
  const down = await sb.downloadFiles(["/workspace/big.bin", "/workspace/small.txt", "/workspace/nope"]);
  assert.equal(down[0].error, null);
  assert.equal(down[0].content.length, big.length);
  assert.equal(sha(down[0].content), sha(big));
  assert.deepEqual([down[1].error, Buffer.from(down[1].content).toString()], [null, "small\n"]);
  assert.deepEqual([down[2].content, down[2].error], [null, "file_not_found"]);
});

test("readRaw, read and write of a text file over 10 MiB", { skip }, async () => {
  const line = "0123456789abcdef".repeat(8) + "\n"; // 129 bytes
  const n = Math.ceil((12 * MiB) / line.length);
  const text = line.repeat(n - 1) + "the last line\n";
  const w = await sb.write("/workspace/big.txt", text);
  assert.deepEqual(w, { path: "/workspace/big.txt", filesUpdate: null });
  const raw = await sb.readRaw("/workspace/big.txt");
  assert.equal(raw.error, undefined);
  assert.equal(raw.data.content.length, text.length);
  assert.ok(raw.data.content === text);
  const tail = await sb.read("/workspace/big.txt", n - 1, 5);
  assert.match(tail.content, /^the last line\n?$/);
  assert.equal(tail.totalLines, n);
});

test("a real failure names its cause, and the backend's own limit is a stated too_large", { skip }, async () => {
  const small = await ConchSandbox.create({ client: sb.client, sandbox: { disk: 4 * MiB }, maxFileBytes: 30 * MiB });
  try {
    const up = await small.uploadFiles([["/workspace/fill.bin", randomBytes(12 * MiB)], ["/workspace/huge.bin", new Uint8Array(31 * MiB)]]);
    // The sandbox's disk limit, named as such (it passed for "invalid_path" before).
    assert.match(up[0].error, /^(limit|too_large): .*disk/, up[0].error);
    assert.match(up[1].error, /^too_large: 32505856 bytes, over this backend's limit of 31457280 bytes \(maxFileBytes\)$/);
    const w = await small.write("/workspace/huge.txt", "x".repeat(31 * MiB));
    assert.match(w.error, /too_large/);
  } finally {
    await small.close();
  }
});

/** The methods @client sends from now on. */
function spy(client) {
  const sent = [];
  const orig = client.call.bind(client);
  client.call = (m, p, ...rest) => {
    sent.push(m);
    return orig(m, p, ...rest);
  };
  return { sent, undo: () => delete client.call };
}

test("100 MiB up and down by fs.copy_in / fs.copy_out, sparse and binary", { skip }, async () => {
  const big = Buffer.concat([randomBytes(40 * MiB), Buffer.alloc(40 * MiB), randomBytes(20 * MiB)]);
  const s = spy(sb.client);
  try {
    const up = await sb.uploadFiles([["/workspace/huge.bin", big]]);
    assert.deepEqual(up, [{ path: "/workspace/huge.bin", error: null }]);
    const r = await sb.execute("sha256sum huge.bin | cut -c1-64");
    assert.equal(r.output, `${sha(big)}\n`);
    const down = await sb.downloadFiles(["/workspace/huge.bin"]);
    assert.equal(down[0].error, null);
    assert.equal(sha(down[0].content), sha(big));
    assert.ok(s.sent.includes("fs.copy_in") && s.sent.includes("fs.copy_out") && !s.sent.includes("fs.write"), s.sent.join(","));
    // an explicit chunk size keeps the chunked form
    s.sent.length = 0;
    await sb.client.fsWriteFile(sb.id, "/workspace/c.bin", big.subarray(0, 3 * MiB), { chunk: MiB });
    assert.deepEqual(s.sent, ["fs.write", "fs.write", "fs.write"]);
  } finally {
    s.undo();
  }
});

test("a daemon that cannot open our files gets chunks, and is not asked again", { skip }, async () => {
  const other = await ConchSandbox.create({ bin: conchBin, args: stdioArgs() });
  try {
    const c = other.client;
    const orig = c.fsCopyIn.bind(c);
    c.fsCopyIn = (s, p, h) => orig(s, p, h, "1:2"); // as a daemon on another host sees it
    const s = spy(c);
    const data = randomBytes(12 * MiB);
    assert.deepEqual(await other.uploadFiles([["/workspace/a.bin", data]]), [{ path: "/workspace/a.bin", error: null }]);
    assert.equal(c.noCopy, true);
    const down = await other.downloadFiles(["/workspace/a.bin"]);
    assert.equal(sha(down[0].content), sha(data));
    assert.equal(s.sent.filter((m) => m === "fs.copy_in").length, 1, s.sent.join(","));
    assert.ok(!s.sent.includes("fs.copy_out") && s.sent.includes("fs.write"), s.sent.join(","));
  } finally {
    await other.close();
  }
});
