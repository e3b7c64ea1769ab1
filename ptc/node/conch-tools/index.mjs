// index.mjs - the ES module face of conch-tools: `import { tools, call } from 'conch-tools'`.
// The implementation (and its one connection per process) is index.js.
import cjs from './index.js';

export const { call, spawnAgent, listTools, tools, ToolError, UnknownTool, InvalidInput } = cjs;
export default cjs;
