// deepagents_backend.mjs - one run: deepagents' read, ls, grep, write and execute("true")
// through ConchSandbox (conch serve --stdio, native fs.*) against deepagents' own
// LocalShellBackend on the host (no sandbox), on the same small tree. Prints the median time
// per operation of each and the ratio conch / local (goal: <= 1.0).
// Usage: (cd clients/typescript && npm ci && npm run build) && node bench/deepagents_backend.mjs [N]
// CONCH_BIN picks the binary (default build/conch).
import { mkdtempSync, mkdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
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
const conch = await ConchSandbox.create({ bin, args: ["--state-dir", mkdtempSync(join(tmpdir(), "conch-bench-state-")), "--pool", "0"], sandbox: { workspace: ws } });

const W = "/workspace";
let k = 0;
const ops = {
  read: (b) => b.read(`${W}/pkg1/mod3.py`, 0, 100),
  ls: (b) => b.ls(`${W}/pkg2`),
  grep: (b) => b.grep("needle_3_", W, null, 1000),
  write: (b) => b.write(`${W}/out/w${k++ % 10}.txt`, "hello\n".repeat(50)),
  'execute("true")': (b) => b.execute("true"),
};

async function time(b, fn) {
  const r0 = await fn(b); // warm-up, and a check that it works
  if (r0?.error || (r0?.exitCode !== undefined && r0.exitCode !== 0)) throw new Error(`warm-up failed: ${JSON.stringify(r0).slice(0, 200)}`);
  const t = [];
  for (let i = 0; i < N; i++) {
    const s = process.hrtime.bigint();
    await fn(b);
    t.push(Number(process.hrtime.bigint() - s) / 1e6);
  }
  t.sort((a, c) => a - c);
  return t[Math.floor(t.length / 2)];
}

console.log(`deepagents backend operations, median of ${N} (ms); ratio = ConchSandbox / LocalShellBackend`);
console.log(`${"operation".padEnd(18)}${"LocalShellBackend".padStart(18)}${"ConchSandbox".padStart(14)}${"ratio".padStart(8)}`);
try {
  for (const [name, fn] of Object.entries(ops)) {
    const l = await time(local, fn);
    const c = await time(conch, fn);
    console.log(`${name.padEnd(18)}${l.toFixed(3).padStart(18)}${c.toFixed(3).padStart(14)}${(c / l).toFixed(2).padStart(8)}`);
  }
} finally {
  await conch.close();
}
