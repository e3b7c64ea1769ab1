// deepagents_backend.mjs - one run: deepagents' read, ls, grep, glob, edit, write and execute("true")
// through ConchSandbox (conch serve --stdio, native fs.*) against deepagents' own
// LocalShellBackend on the host (no sandbox), on the same small tree. The two backends take
// turns in blocks of BENCH_BLOCK operations (so that a change of load hits both alike);
// prints the median time per operation of each, the ratio conch / local (goal: <= 1.0) and
// the load average before and after.
// Usage: (cd clients/typescript && npm ci && npm run build) && node bench/deepagents_backend.mjs [N]
// N timed operations per backend and row (default 200). CONCH_BIN picks the binary (default
// build/conch); BENCH_BLOCK the block size (default 20); BENCH_OPS=write,execute times only
// those rows.
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir, loadavg } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = join(root, "clients/typescript");
const require = createRequire(join(pkg, "package.json"));
const { LocalShellBackend } = await import(require.resolve("deepagents"));
const { ConchSandbox } = await import(join(pkg, "dist/deepagents.js"));

const N = Number(process.argv[2] ?? 200);
const bin = process.env.CONCH_BIN ?? join(root, "build/conch");

// The tree: 40 source files of 200 lines in 4 directories.
function makeTree(dir) {
  for (let d = 0; d < 4; d++) {
    mkdirSync(join(dir, `pkg${d}`), { recursive: true });
    for (let f = 0; f < 10; f++) {
      const lines = Array.from({ length: 200 }, (_, i) => (i % 50 === 7 ? `  needle_${d}_${f} = ${i}` : `  line ${i} of file ${f} in pkg${d}: some ordinary source text`));
      writeFileSync(join(dir, `pkg${d}`, `mod${f}.py`), lines.join("\n") + "\n");
    }
  }
  writeFileSync(join(dir, "README.md"), "# bench\n" + "text\n".repeat(100));
}

const localRoot = mkdtempSync(join(tmpdir(), "conch-bench-local-"));
mkdirSync(join(localRoot, "workspace"));
makeTree(join(localRoot, "workspace"));
const ws = mkdtempSync(join(tmpdir(), "conch-bench-ws-"));
makeTree(ws);

const local = new LocalShellBackend({ rootDir: localRoot, virtualMode: true, inheritEnv: true });
await local.initialize();
const stateDir = mkdtempSync(join(tmpdir(), "conch-bench-state-"));
const conch = await ConchSandbox.create({ bin, args: ["--state-dir", stateDir, "--pool", "0"], sandbox: { workspace: ws } });

const W = "/workspace";
let k = 0;
const ops = {
  read: (b) => b.read(`${W}/pkg1/mod3.py`, 0, 100),
  ls: (b) => b.ls(`${W}/pkg2`),
  grep: (b) => b.grep("needle_3_", W, null, 1000),
  glob: (b) => b.glob("**/*.py", W),
  edit: (b) => b.edit(`${W}/pkg3/mod${k % 10}.py`, `line ${k % 200} of file`, `line ${k++ % 200} of file`),
  write: (b) => b.write(`${W}/out/w${k++ % 10}.txt`, "hello\n".repeat(50)),
  'execute("true")': (b) => b.execute("true"),
};

const BLOCK = Math.max(1, Number(process.env.BENCH_BLOCK ?? 20));

/** Times @fn on both backends in alternating blocks, after a checked warm-up of each. */
async function timeBoth(fn) {
  const t = { local: [], conch: [] };
  for (const [name, b] of [["local", local], ["conch", conch]]) {
    const r0 = await fn(b); // warm-up, and a check that it works
    if (r0?.error || (r0?.exitCode !== undefined && r0.exitCode !== 0)) throw new Error(`${name}: warm-up failed: ${JSON.stringify(r0).slice(0, 200)}`);
    for (let i = 0; i < 10; i++) await fn(b);
  }
  for (let done = 0; done < N; done += BLOCK) {
    const n = Math.min(BLOCK, N - done);
    // Which one goes first alternates too.
    const order = (done / BLOCK) % 2 ? [["conch", conch], ["local", local]] : [["local", local], ["conch", conch]];
    for (const [name, b] of order)
      for (let i = 0; i < n; i++) {
        const s = process.hrtime.bigint();
        await fn(b);
        t[name].push(Number(process.hrtime.bigint() - s) / 1e6);
      }
  }
  const median = (a) => (a.sort((x, y) => x - y), a[Math.floor(a.length / 2)]);
  return { l: median(t.local), c: median(t.conch) };
}

const load = () => loadavg().map((x) => x.toFixed(2)).join(" ");
console.log(`deepagents backend operations, median of ${N} each, in alternating blocks of ${BLOCK} (ms); ratio = ConchSandbox / LocalShellBackend`);
console.log(`load average before: ${load()}`);
console.log(`${"operation".padEnd(18)}${"LocalShellBackend".padStart(18)}${"ConchSandbox".padStart(14)}${"ratio".padStart(8)}`);
try {
  const only = process.env.BENCH_OPS ? process.env.BENCH_OPS.split(",") : null;
  for (const [name, fn] of Object.entries(ops)) {
    if (only && !only.some((o) => name.startsWith(o))) continue;
    const { l, c } = await timeBoth(fn);
    console.log(`${name.padEnd(18)}${l.toFixed(3).padStart(18)}${c.toFixed(3).padStart(14)}${(c / l).toFixed(2).padStart(8)}`);
  }
} finally {
  await conch.close();
  for (const d of [localRoot, ws, stateDir]) rmSync(d, { recursive: true, force: true });
}
console.log(`load average after: ${load()}`);
