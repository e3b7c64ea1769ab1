// jsmiddleware.test.mjs - createConchJsMiddleware (the drop-in for @langchain/quickjs's
// createCodeInterpreterMiddleware) in a REAL createDeepAgent run driven by a scripted fake model:
// the "eval" tool runs in the sandbox's JS session named by the thread id, state persists within
// the run, a `ptc` tool is `tools.add`, an agent tool outside `ptc` is not in `tools`, `task()`
// runs deepagents' own general-purpose sub-agent through the bridge, the result text is
// formatReplResult's, the system prompt has the REPL section and the `tools` declarations, and
// the session is closed when the run ends.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { tool } from "@langchain/core/tools";
import { fakeModel } from "@langchain/core/testing";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { createDeepAgent } from "deepagents";
import { ConchSandbox, createConchJsMiddleware, formatJsResult, jsSessionName } from "../dist/deepagents.js";
import { conchBin, haveConch, stdioArgs } from "./helpers.mjs";

const skip = haveConch ? false : `no conch binary at ${conchBin} (build it or set CONCH_BIN)`;
let sb;
before(async () => {
  if (!skip) sb = await ConchSandbox.create({ bin: conchBin, args: stdioArgs() });
});
after(async () => {
  await sb?.close();
});

const add = tool(async ({ a, b }) => String(a + b), { name: "add", description: "Add two numbers.", schema: z.object({ a: z.number(), b: z.number() }) });
const lookup = tool(async ({ key }) => key.toUpperCase(), { name: "lookup", description: "Look a key up.", schema: z.object({ key: z.string() }) });

const evalCall = (id, code) => new AIMessage({ content: "", tool_calls: [{ name: "eval", args: { code }, id, type: "tool_call" }] });

test("the JS middleware in a real deepagents run: ptc tools, task(), per-thread state, result text", { skip }, async () => {
  const model = fakeModel()
    .respond(evalCall("c1", "const s: string = await tools.add({ a: 40, b: 2 });\nconst r = await task({ description: 'say hi', subagentType: 'general-purpose' });\nconsole.log('sum', s);\n({ s, r })"))
    .respond(new AIMessage("hi from the sub-agent")) // the general-purpose sub-agent's turn
    .respond(evalCall("c2", "[typeof tools.lookup, 'lookup' in tools, Object.keys(tools).sort().join()]"))
    .respond(evalCall("c3", "s + '!'"))
    .respond(evalCall("c4", "throw new RangeError('no ' + s)"))
    .respond(new AIMessage("done"));
  const mw = await createConchJsMiddleware(sb, { ptc: ["add"] });
  const agent = createDeepAgent({ model, backend: sb, tools: [add, lookup], systemPrompt: "Base prompt.", middleware: [mw] });
  const out = await agent.invoke({ messages: [{ role: "user", content: "go" }] }, { configurable: { thread_id: "thread-1" } });
  const tms = out.messages.filter((m) => ToolMessage.isInstance(m)).map((m) => [m.name, m.content]);
  assert.deepEqual(tms, [
    ["eval", 'sum 42\n→ {\n  "s": "42",\n  "r": "hi from the sub-agent"\n}'],
    ["eval", '→ [\n  "undefined",\n  false,\n  "add,task"\n]'],
    ["eval", "→ 42!"],
    ["eval", tms[3][1]],
  ]);
  assert.match(tms[3][1], /^RangeError: no 42\n/);
  // The system prompt: the base, the REPL section, the sub-agent line, the tools declarations.
  const sys = model.calls[0].messages[0];
  const text = typeof sys.content === "string" ? sys.content : sys.content.map((b) => b.text ?? "").join("");
  assert.ok(text.startsWith("Base prompt."), text.slice(0, 60));
  assert.match(text, /An `eval` tool is available/);
  assert.match(text, /await task\(\{ description, subagentType \}\)/);
  assert.match(text, /declare const tools: \{/);
  assert.match(text, /  add\(input/);
  // The session was the thread's, and the run's end closed it.
  const trace = (await sb.client.toolsTrace(sb.id, { kind: "js", id: "thread-1" })).calls.map((c) => c.name).sort();
  assert.deepEqual(trace, ["add", "task"]);
  assert.deepEqual((await sb.client.jsList(sb.id)).sessions, []);
});

test("formatJsResult and session names", () => {
  const base = { console: [], tool_calls: [], writes: [], text: "", session: "s", restarted: false };
  assert.equal(formatJsResult({ ...base, ok: true, type: "undefined" }), "(no output)");
  assert.equal(formatJsResult({ ...base, ok: true, value: "x", console: [{ level: "log", text: "a" }], console_dropped: 5 }), "a\n[truncated 5 chars]\n→ x");
  assert.equal(formatJsResult({ ...base, ok: true, value: "y".repeat(10) }, 4), "→ yy\n[truncated 8 chars]");
  assert.equal(jsSessionName("abc-1.2_x"), "abc-1.2_x");
  const odd = jsSessionName("user:42/thread with spaces");
  assert.match(odd, /^[A-Za-z0-9._-]{1,64}$/);
  assert.notEqual(odd, jsSessionName("user:42/thread with spaces!"));
});
