// bench/js_quickjs.mjs - @langchain/quickjs (QuickJS in WASM inside Node, ReplSession) on the
// rows bench/js.py measures for conch: the first eval of the first session, a new session's
// first eval, one eval, one tool call (100 sequential calls in one eval, less one eval), 100
// parallel tool calls. Prints one JSON line of medians in ms. Run by bench/js.py with
// NODE_PATH pointing at a node_modules that has @langchain/quickjs and @langchain/core.
import { join } from "node:path";
import { pathToFileURL } from "node:url";
const nm = process.env.NODE_PATH.split(":")[0];
const entry = async (pkg, sub) => {
  const ex = (await import(pathToFileURL(join(nm, pkg, "package.json")), { with: { type: "json" } })).default.exports[sub];
  const e = typeof ex === "string" ? ex : ex.import?.default ?? ex.import ?? ex.default;
  return import(pathToFileURL(join(nm, pkg, e)));
};
const { ReplSession } = await entry("@langchain/quickjs", ".");
const { tool } = await entry("@langchain/core", "./tools");

const rounds = Number(process.argv[2] || 200);
const echo = tool(async (input) => JSON.stringify(input), {
  name: "echo", description: "returns its input", schema: { type: "object", properties: {} },
});
const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const time = async (f) => { const t = performance.now(); await f(); return performance.now() - t; };
const opts = { tools: [echo], maxPtcCalls: 1000 };
let k = 0;
const fresh = async () => {
  const id = `s${k++}`;
  const ms = await time(() => ReplSession.getOrCreate(id, opts).eval("1", 10000));
  ReplSession.deleteSession(id);
  return ms;
};
const first = await fresh();
const news = [];
for (let i = 0; i < Math.min(rounds, 50); i++) news.push(await fresh());
const s = ReplSession.getOrCreate("main", opts);
await s.eval("var n = 0", 10000);
const evals = [];
for (let i = 0; i < rounds; i++) evals.push(await time(() => s.eval("n = n + 1", 10000)));
const seq = [], par = [];
for (let i = 0; i < 5; i++) {
  const r = await s.eval("for (let i = 0; i < 100; i++) await tools.echo({ i }); 1", 60000);
  if (!r.ok) throw new Error(JSON.stringify(r.error));
  seq.push(await time(() => s.eval("for (let i = 0; i < 100; i++) await tools.echo({ i }); 1", 60000)));
  par.push(await time(() => s.eval("(await Promise.all(Array.from({ length: 100 }, (_, i) => tools.echo({ i })))).length", 60000)));
}
const ev = median(evals);
console.log(JSON.stringify({ first_ms: first, new_session_ms: median(news), eval_ms: ev, tool_call_ms: (median(seq) - ev) / 100, parallel100_ms: median(par) }));
