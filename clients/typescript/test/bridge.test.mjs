// bridge.test.mjs - the tool bridge from the harness side: LangChain tools and sub-agents
// registered with a ConchSandbox and called from inside it (tool_call, spawn_agent), $/cancel
// reaching the tool's AbortSignal, the tools.prompt middleware, and a deepagents agent whose
// `execute` runs tool_call. Skips only when the daemon answers tools.register with
// method_not_found (a daemon without the bridge).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { tool } from "@langchain/core/tools";
import { fakeModel } from "@langchain/core/testing";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { createDeepAgent } from "deepagents";
import { ConchError } from "../dist/index.js";
import { ConchSandbox, registerTools, registerSubagents, createToolsPromptMiddleware, withToolsPrompt, toolInputSchema } from "../dist/deepagents.js";
import { conchBin, haveConch, stdioArgs } from "./helpers.mjs";

let sb;
let bridge = haveConch ? null : `no conch binary at ${conchBin}`;
let slowSignal = null;

const add = tool(async ({ a, b }) => String(a + b), {
  name: "add",
  description: "Add two numbers.",
  schema: z.object({ a: z.number().describe("first"), b: z.number() }),
});
const fail = tool(async () => {
  throw new Error("the database is down");
}, { name: "fail_tool", description: "Always fails.", schema: z.object({}) });
const slow = tool(
  async (_in, config) =>
    new Promise((resolve, reject) => {
      slowSignal = config?.signal ?? null;
      const t = setTimeout(() => resolve("slow done"), 20000);
      config?.signal?.addEventListener("abort", () => (clearTimeout(t), reject(new Error("aborted"))));
    }),
  { name: "slow", description: "Takes 20 s unless cancelled.", schema: z.object({}) },
);
const lookup = tool(async ({ key }) => ({ key, value: key.toUpperCase(), n: 3 }), {
  name: "lookup",
  description: "Look a key up.",
  schema: z.object({ key: z.string() }),
});

before(async () => {
  if (bridge) return;
  sb = await ConchSandbox.create({ bin: conchBin, args: stdioArgs() });
  try {
    await sb.client.toolsList(sb.id);
  } catch (e) {
    if (e instanceof ConchError && e.data.code === "method_not_found") bridge = "this conch daemon has no tool bridge (tools.* is method_not_found)";
    else throw e;
  }
});
after(async () => {
  await sb?.close();
});

// The bridge's presence is known only once before() ran: each test skips itself.
const skipped = (t) => (bridge ? (t.skip(bridge), true) : false);

test("LangChain tools are registered with their JSON schemas and listed", async (t) => {
  if (skipped(t)) return;
  const names = await registerTools(sb, [add, fail, slow, lookup]);
  assert.deepEqual(names.sort(), ["add", "fail_tool", "lookup", "slow"]);
  const { tools } = await sb.client.toolsList(sb.id);
  const a = tools.find((t) => t.name === "add");
  assert.equal(a.description, "Add two numbers.");
  assert.deepEqual(a.input_schema.required.sort(), ["a", "b"]);
  assert.equal(a.input_schema.properties.a.type, "number");
  assert.deepEqual(await toolInputSchema(add.schema), a.input_schema);
});

test("tool_call inside the sandbox reaches the LangChain tool and prints its result", async (t) => {
  if (skipped(t)) return;
  const r = await sb.execute(`tool_call add '{"a": 2, "b": 3}'; tool_call lookup '{"key": "abc"}'`);
  assert.equal(r.exitCode, 0, r.output);
  assert.match(r.output, /^5\n\{"key":"abc","value":"ABC","n":3\}\n\[tools: 2 calls \(add=1, lookup=1\), 2 ok, 0 failed, \d+\.\d s\]$/);
  const bad = await sb.execute(`tool_call add '{"a": "x", "b": 1}'`);
  assert.equal(bad.exitCode, 2);
  assert.match(bad.output, /input\.a/);
  const err = await sb.execute("tool_call fail_tool");
  assert.equal(err.exitCode, 1);
  assert.match(err.output, /the database is down/);
  const trace = await sb.client.toolsTrace(sb.id);
  assert.ok(trace.calls.some((c) => c.name === "add" && c.ok && c.result === "5"));
  assert.ok(trace.calls.some((c) => c.name === "fail_tool" && !c.ok && c.error.kind === "tool_error"));
});

test("$/cancel aborts the tool's signal when the command gives up", async (t) => {
  if (skipped(t)) return;
  slowSignal = null;
  const r = await sb.client.execRun({ sandbox: sb.id, command: "timeout 1 tool_call slow; echo rc=$?", timeout: 30 });
  assert.match(r.stdout, /rc=124/);
  for (let i = 0; i < 100 && !slowSignal?.aborted; i++) await new Promise((res) => setTimeout(res, 50));
  assert.ok(slowSignal, "the slow tool was called");
  assert.equal(slowSignal.aborted, true, "its signal was aborted by $/cancel");
});

test("sub-agents: a BridgeAgent and a deepagents sub-agent answer spawn_agent", async (t) => {
  if (skipped(t)) return;
  const subModel = fakeModel().respond(new AIMessage("the sub-agent's answer"));
  const names = await registerSubagents(
    sb,
    [
      { name: "echoer", description: "Echoes the task.", run: async (task) => `echo: ${task}` },
      { name: "analyst", description: "A deepagents sub-agent.", systemPrompt: "You analyse." },
    ],
    { model: subModel },
  );
  assert.deepEqual(names.sort(), ["analyst", "echoer"]);
  const r = await sb.execute("spawn_agent 'count the files' echoer; spawn_agent 'analyse it' analyst");
  assert.equal(r.exitCode, 0, r.output);
  assert.match(r.output, /^echo: count the files\nthe sub-agent's answer\n\[tools: 2 calls \(echoer=1, analyst=1\), 2 ok, 0 failed, \d+\.\d s\]$/);
  assert.ok((await sb.client.toolsList(sb.id)).agents.some((a) => a.name === "analyst"));
});

test("the tools.prompt middleware puts the tool documentation in the system prompt", async (t) => {
  if (skipped(t)) return;
  const text = (await sb.client.toolsPrompt(sb.id)).text;
  assert.match(text, /add/);
  assert.equal(await withToolsPrompt(sb, "Base."), `Base.\n\n${text}`);
  const model = fakeModel()
    .respond(new AIMessage({ content: "", tool_calls: [{ name: "execute", args: { command: `tool_call add '{"a": 40, "b": 2}'` }, id: "c1", type: "tool_call" }] }))
    .respond(new AIMessage("done"));
  const agent = createDeepAgent({ model, backend: sb, systemPrompt: "Base prompt.", middleware: [await createToolsPromptMiddleware(sb)] });
  const out = await agent.invoke({ messages: [{ role: "user", content: "add them" }] });
  const sys = model.calls[0].messages[0];
  const sysText = typeof sys.content === "string" ? sys.content : sys.content.map((b) => b.text ?? "").join("");
  assert.ok(sysText.startsWith("Base prompt."), sysText.slice(0, 80));
  assert.ok(sysText.includes(text), "tools.prompt text in the system prompt");
  const tm = out.messages.find((m) => ToolMessage.isInstance(m));
  assert.match(tm.content, /^42\n\[tools: 1 call \(add=1\), 1 ok, 0 failed, \d+\.\d s\]\n\[Command succeeded with exit code 0\]$/);
});

test("execute keeps what the bridge recorded: the [tools: …] line, tool_calls, detached spawns", async (t) => {
  if (skipped(t)) return;
  await registerTools(sb, [add, fail]);
  const handed = [];
  const sb2 = await ConchSandbox.create({ client: sb.client, sandboxId: sb.id, onDetachedAgents: (reqs) => handed.push(...reqs) });
  const r = await sb2.execute(`tool_call add '{"a": 1, "b": 2}'; tool_call fail_tool 2>/dev/null; spawn_agent --detach 'watch the build' echoer >/dev/null; echo end`);
  assert.equal(r.exitCode, 0, r.output);
  assert.match(r.output, /^3\nend\n\[tools: 3 calls \(add=1, fail_tool=1, echoer=1\), 2 ok, 1 failed, \d+\.\d s\]$/);
  assert.equal(r.tools_summary, r.output.split("\n").pop());
  assert.deepEqual(r.tool_calls.map((c) => [c.name, c.ok]), [["add", true], ["fail_tool", false], ["echoer", true]]);
  assert.equal(r.tool_calls[0].result, "3");
  assert.deepEqual(r.detached_agents.map((d) => [d.task, d.type]), [["watch the build", "echoer"]]);
  assert.deepEqual(handed, r.detached_agents);
  // A command that called nothing has no summary line and no records.
  const plain = await sb2.execute("echo plain");
  assert.equal(plain.output, "plain\n");
  assert.equal(plain.tool_calls, undefined);
  assert.equal(plain.detached_agents, undefined);
});

test("js.eval: a script calls the LangChain tools, fans out, catches a tool's error", async (t) => {
  if (skipped(t)) return;
  await registerTools(sb, [add, fail, lookup]);
  const r = await sb.client.jsEval({
    sandbox: sb.id,
    session: "ts",
    code:
      "const sums: string[] = await Promise.all([1, 2, 3].map((a) => tools.add({ a, b: 10 })));\n" +
      "let why = '';\n" +
      "try { await tools.failTool({}) } catch (e) { why = (e as Error).message }\n" +
      "({ sums, why, key: (await tools.lookup({ key: 'k' })).value })",
  });
  assert.equal(r.ok, true, r.text);
  assert.deepEqual(r.value, { sums: ["11", "12", "13"], why: "the database is down", key: "K" });
  assert.deepEqual(r.tool_calls.map((c) => [c.name, c.ok]).sort(), [["add", true], ["add", true], ["add", true], ["fail_tool", false], ["lookup", true]]);
  assert.deepEqual(r.tool_calls[0].origin, { kind: "js", id: "ts" });
  assert.match(r.text, /\[tools: 5 calls/);
  assert.deepEqual((await sb.client.jsEval({ sandbox: sb.id, session: "ts", code: "sums.length" })).value, 3);
  assert.deepEqual((await sb.client.jsList(sb.id)).sessions.map((s) => [s.session, s.evals]), [["ts", 2]]);
  assert.equal((await sb.client.jsReset(sb.id, "ts")).reset, true);
  assert.equal((await sb.client.jsEval({ sandbox: sb.id, session: "ts", code: "typeof sums" })).value, "undefined");
  assert.equal((await sb.client.jsClose(sb.id, "ts")).closed, true);
});
