// bench/transfer.mjs - upload and download MB/s of one big file through the TypeScript client
// over `conch serve --stdio`: ConchClient.fsWriteFile / fsReadFile by fs.copy_in / fs.copy_out
// (the default where the daemon can open our files) and in chunks at a few chunk sizes (an
// explicit chunk), ConchSandbox.uploadFiles / downloadFiles, beside a host write and `cp` of
// the same bytes as the reference; each transfer checked byte for byte.
// Run: cd clients/typescript && npm run build && node ../../bench/transfer.mjs
// See bench/README.md ("transfer.py / transfer.mjs").
import { randomBytes, createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync, unlinkSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dist = resolve(here, "../clients/typescript/dist");
const { ConchSandbox } = await import(join(dist, "deepagents.js"));
const bin = process.env.CONCH_BIN ?? resolve(here, "../build/conch");
const MiB = 1 << 20;
const size = Number(process.env.BENCH_MIB ?? 100) * MiB;
const runs = Number(process.env.BENCH_RUNS ?? 3);
const chunks = (process.env.BENCH_CHUNKS_MIB ?? "10").split(",").filter(Boolean).map(Number);
const sha = (b) => createHash("sha256").update(b).digest("hex");

const data = randomBytes(size);
const digest = sha(data);
const state = mkdtempSync(join(tmpdir(), "conch-bench-xfer-"));
const sb = await ConchSandbox.create({ bin, args: ["--state-dir", state, "--pool", "0"] });
const best = async (f) => {
  let t = Infinity;
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await f();
    t = Math.min(t, (performance.now() - t0) / 1000);
  }
  return ((size / t) / 1e6).toFixed(0);
};
try {
  console.log(`typescript client, ${size / MiB} MiB, best of ${runs} (MB/s = 10^6 bytes/s)`);
  console.log(`${"path".padEnd(32)} ${"upload MB/s".padStart(12)} ${"download MB/s".padStart(14)}`);
  {
    const src = join(state, "ref.bin"), dst = join(state, "ref2.bin");
    const up = await best(async () => writeFileSync(src, data));
    const down = await best(async () => execFileSync("cp", [src, dst]));
    console.log(`${"host write / cp (reference)".padEnd(32)} ${up.padStart(12)} ${down.padStart(14)}`);
    unlinkSync(src);
    unlinkSync(dst);
  }
  {
    const up = await best(() => sb.client.fsWriteFile(sb.id, "/workspace/big.bin", data));
    const down = await best(async () => {
      const got = await sb.client.fsReadFile(sb.id, "/workspace/big.bin");
      if (sha(got) !== digest) throw new Error("download differs");
    });
    if (sb.client.noCopy) throw new Error("the daemon refused fs.copy_in: this measured chunks");
    console.log(`${"fsWriteFile/fsReadFile copy".padEnd(32)} ${up.padStart(12)} ${down.padStart(14)}`);
  }
  for (const chunk of chunks) {
    const up = await best(() => sb.client.fsWriteFile(sb.id, "/workspace/big.bin", data, { chunk: chunk * MiB }));
    const down = await best(async () => {
      const got = await sb.client.fsReadFile(sb.id, "/workspace/big.bin", { chunk: chunk * MiB });
      if (sha(got) !== digest) throw new Error("download differs");
    });
    console.log(`${`fsWriteFile/fsReadFile ${chunk} MiB`.padEnd(32)} ${up.padStart(12)} ${down.padStart(14)}`);
  }
  const up = await best(async () => {
    const [r] = await sb.uploadFiles([["/workspace/big.bin", data]]);
    if (r.error) throw new Error(r.error);
  });
  const down = await best(async () => {
    const [r] = await sb.downloadFiles(["/workspace/big.bin"]);
    if (r.error || sha(r.content) !== digest) throw new Error(r.error ?? "download differs");
  });
  console.log(`${"uploadFiles/downloadFiles (copy)".padEnd(32)} ${up.padStart(12)} ${down.padStart(14)}`);
} finally {
  await sb.close();
  rmSync(state, { recursive: true, force: true });
}
