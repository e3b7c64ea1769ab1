// index.ts - @conch/client: the JSON-RPC client of the conch daemon. The deepagents backend
// (ConchSandbox) lives in "@conch/client/deepagents" so that this entry needs no LangChain.
export * from "./rpc.js";
export * from "./client.js";
export * from "./session.js";
export * from "./remote.js";
