// pack.test.mjs - the package as npm users get it: `npm pack` of a fresh checkout (no dist/:
// the prepack script builds it) gives a tarball with the compiled entries; installed with
// `npm install TARBALL` into a new project (with deepagents, its peer), both entries import
// and drive the real daemon, and ConchSandbox's onClose default is there in the code.
// Run once, as root (the unprivileged pass runs the behaviour tests, not the packaging).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, readdirSync, symlinkSync, writeFileSync, existsSync } from "node:fs";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { conchBin, haveConch, tmp } from "./helpers.mjs";

const pkg = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const skip = !haveConch ? `no conch binary at ${conchBin}` : process.getuid?.() !== 0 ? "packaging is checked in the root pass" : false;
const npm = (args, cwd) => execFileSync("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 300_000 });

test("npm pack of a fresh checkout installs into a new project and works", { skip, timeout: 600_000 }, async () => {
  // A checkout as git gives it: sources, no dist/; node_modules (devDependencies) as npm ci left it.
  const src = join(tmp("conch-ts-pack-"), "typescript");
  cpSync(pkg, src, { recursive: true, filter: (p) => !/\/(node_modules|dist)$/.test(p) });
  symlinkSync(join(pkg, "node_modules"), join(src, "node_modules"));
  assert.equal(existsSync(join(src, "dist")), false);
  const out = tmp("conch-ts-tgz-");
  npm(["pack", "--silent", "--pack-destination", out], src);
  const [tgz] = readdirSync(out).filter((f) => f.endsWith(".tgz"));
  assert.ok(tgz, "npm pack made a tarball");
  const files = execFileSync("tar", ["tzf", join(out, tgz)], { encoding: "utf8" }).split("\n");
  for (const f of ["index.js", "index.d.ts", "deepagents.js", "deepagents.d.ts", "client.js", "rpc.js", "session.js"])
    assert.ok(files.includes(`package/dist/${f}`), `the tarball has dist/${f}: ${files.join(" ")}`);

  const proj = tmp("conch-ts-proj-");
  writeFileSync(join(proj, "package.json"), JSON.stringify({ name: "user-project", version: "1.0.0", type: "module", private: true }));
  npm(["install", "--prefer-offline", join(out, tgz), "deepagents@1.14.1", "@langchain/core@1.4.0"], proj);
  writeFileSync(
    join(proj, "use.mjs"),
    `import { ConchClient } from "@conch/client";
import { ConchSandbox, DEFAULT_ON_CLOSE } from "@conch/client/deepagents";
const bin = process.argv[2];
const c = await ConchClient.connect({ bin, args: ["--pool", "0"] });
const id = (await c.sandboxCreate({})).id;
const r = await c.execRun({ sandbox: id, command: "echo client-$((40+2))" });
await c.close();
const sb = await ConchSandbox.create({ bin });
const e = await sb.execute("echo backend-ok");
const onClose = sb.onClose;
await sb.close();
console.log(JSON.stringify({ out: r.stdout, backend: e.output, onClose, DEFAULT_ON_CLOSE }));
`,
  );
  const res = JSON.parse(execFileSync(process.execPath, ["use.mjs", conchBin], { cwd: proj, encoding: "utf8", timeout: 120_000 }));
  assert.deepEqual(res, { out: "client-42\n", backend: "backend-ok\n", onClose: "discard", DEFAULT_ON_CLOSE: "discard" });
});
