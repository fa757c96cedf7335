// An MCP server on the TypeScript SDK v2 (2.4.0): the protocol revision 2026-07-28 through
// createMcpHandler, with the SDK's default stateless fallback for 2025-era clients. Sandgate's
// tests run sdk-client.mjs against it directly and through the gateway and compare.
//
//   PORT=8123 node --import ./loopback-only.mjs v2-server.mjs    (serves http://127.0.0.1:8123/mcp)
//
// What it offers, each answer deterministic:
//   tools     echo {message}; progress {steps} (progress notifications and one log message);
//             deploy {env} (MRTR elicitation, HMAC'd requestState); ask_model {question} (MRTR
//             sampling); roots (MRTR roots/list); touch (publishes resources/updated for
//             config://app); slow (a task for a request that declares the tasks extension,
//             else a plain result)
//   resource  config://app (subscribable)
//   prompt    greeting {name} (name completes from a fixed list)
//   tasks     the io.modelcontextprotocol/tasks extension: tasks/get, tasks/cancel
//
// On the stateless legacy path the SDK cannot send server-to-client requests, and it serves no
// GET stream: deploy, ask_model and roots answer isError there, and a 2025 subscription gets no
// resources/updated. That is the SDK's behaviour, kept as it is.
import { serve } from "@hono/node-server";
import {
  McpServer,
  acceptedContent,
  completable,
  createMcpHandler,
  createRequestStateCodec,
  inputRequired,
  inputResponse,
} from "@modelcontextprotocol/server";
import { randomBytes, randomUUID } from "node:crypto";
import * as z from "zod/v4";

const TASKS = "io.modelcontextprotocol/tasks";
const CONFIG_URI = "config://app";

// One process serves every round of a flow, so a per-process key is enough.
const stateCodec = createRequestStateCodec({ key: randomBytes(32), ttlSeconds: 300 });

// Tasks live beside the per-request server instances the factory builds.
const tasks = new Map();

const text = (t) => ({ content: [{ type: "text", text: t }] });

function registerTools(s, notify) {
  s.registerTool("echo", { description: "Echoes its message", inputSchema: z.object({ message: z.string() }) },
    async ({ message }) => text(`echo: ${message}`));

  s.registerTool("progress", {
    description: "Reports `steps` progress notifications and one log message, then answers",
    inputSchema: z.object({ steps: z.number().int().min(0).max(100) }),
  }, async ({ steps }, ctx) => {
    await ctx.mcpReq.log("info", `progress: ${steps} steps`, "v2-server");
    const progressToken = ctx.mcpReq._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      if (progressToken !== undefined) {
        await ctx.mcpReq.notify({
          method: "notifications/progress",
          params: { progressToken, progress: i, total: steps, message: `step ${i} of ${steps}` },
        });
      }
    }
    return text(`progress done: ${steps} steps`);
  });

  const answerSchema = z.object({ answer: z.string() });
  s.registerTool("deploy", { description: "Asks the user to confirm (MRTR elicitation)", inputSchema: z.object({ env: z.string() }) },
    async ({ env }, ctx) => {
      const got = acceptedContent(ctx.mcpReq.inputResponses, "confirm", answerSchema);
      const state = ctx.mcpReq.requestState();
      if (got && state?.env === env) return text(`deployed to ${env}: ${got.answer}`);
      return inputRequired({
        inputRequests: {
          confirm: inputRequired.elicit({ message: `Deploy to ${env}?`, requestedSchema: answerSchema }),
        },
        requestState: await stateCodec.mint({ env }),
      });
    });

  s.registerTool("ask_model", { description: "Asks the client's model (MRTR sampling)", inputSchema: z.object({ question: z.string() }) },
    async ({ question }, ctx) => {
      const answer = inputResponse(ctx.mcpReq.inputResponses, "model");
      if (answer.kind === "sampling") {
        const said = answer.result.content;
        return text(`model says: ${said?.type === "text" ? said.text : "(no text)"}`);
      }
      return inputRequired({
        inputRequests: {
          model: inputRequired.createMessage({
            messages: [{ role: "user", content: { type: "text", text: question } }],
            maxTokens: 50,
          }),
        },
      });
    });

  s.registerTool("roots", { description: "Lists the client's roots (MRTR roots/list)", inputSchema: z.object({}) },
    async (_args, ctx) => {
      const listed = inputResponse(ctx.mcpReq.inputResponses, "roots");
      if (listed.kind === "roots") return text(`roots: ${listed.roots.map((r) => r.uri).join(", ")}`);
      return inputRequired({ inputRequests: { roots: inputRequired.listRoots() } });
    });

  s.registerTool("touch", { description: `Updates ${CONFIG_URI} (subscribers get resources/updated)`, inputSchema: z.object({}) },
    async () => {
      notify.resourceUpdated(CONFIG_URI);
      return text(`touched ${CONFIG_URI}`);
    });

  s.registerTool("slow", { description: "A task when the request declares the tasks extension", inputSchema: z.object({}) },
    async (_args, ctx) => {
      const declared = ctx.mcpReq.envelope?.["io.modelcontextprotocol/clientCapabilities"];
      if (declared?.extensions?.[TASKS] === undefined) return text("slow done");
      const now = new Date().toISOString();
      const task = { taskId: randomUUID(), status: "working", createdAt: now, lastUpdatedAt: now, ttlMs: 60000, pollIntervalMs: 50 };
      tasks.set(task.taskId, { task, polls: 0 });
      return { resultType: "task", ...task };
    });
}

// tasks/get answers "working" to the first poll and "completed" (with the result) after it.
function registerTasks(s) {
  const taskParams = { params: z.object({ taskId: z.string() }).passthrough() };
  const known = (taskId) => {
    const entry = tasks.get(taskId);
    if (entry === undefined) throw Object.assign(new Error(`unknown task ${taskId}`), { code: -32602 });
    return entry;
  };
  s.server.setRequestHandler("tasks/get", taskParams, async ({ taskId }) => {
    const entry = known(taskId);
    entry.polls++;
    if (entry.polls > 1 && entry.task.status === "working") {
      entry.task = { ...entry.task, status: "completed", lastUpdatedAt: new Date().toISOString() };
      entry.result = { content: [{ type: "text", text: "slow done" }], isError: false };
    }
    return { ...entry.task, ...(entry.result !== undefined && { result: entry.result }) };
  });
  s.server.setRequestHandler("tasks/cancel", taskParams, async ({ taskId }) => {
    const entry = known(taskId);
    if (entry.task.status === "working") {
      entry.task = { ...entry.task, status: "cancelled", lastUpdatedAt: new Date().toISOString() };
    }
    return {};
  });
}

function newServer(notify) {
  const s = new McpServer({ name: "sandgate-v2-test-server", version: "1.0.0" }, {
    capabilities: {
      tools: {},
      resources: { subscribe: true },
      prompts: {},
      completions: {},
      logging: {},
      extensions: { [TASKS]: {} },
    },
    requestState: { verify: stateCodec.verify },
  });
  registerTools(s, notify);
  registerTasks(s);
  s.registerResource("config", CONFIG_URI, { mimeType: "text/plain", description: "The app's configuration" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "text/plain", text: "mode=test" }] }));
  s.registerPrompt("greeting", {
    description: "Greets someone",
    argsSchema: z.object({
      name: completable(z.string(), (value) => ["Alice", "Bob", "Carol"].filter((n) => n.startsWith(value ?? ""))),
    }),
  }, async ({ name }) => ({
    messages: [{ role: "user", content: { type: "text", text: `Hello, ${name}!` } }],
  }));
  return s;
}

const handler = createMcpHandler(() => newServer(handler.notify), {
  onerror: (err) => console.error("v2-server:", err.message),
});

const port = Number(process.env.PORT);
if (!Number.isInteger(port) || port <= 0) {
  console.error("v2-server: set PORT to the port to listen on (127.0.0.1)");
  process.exit(2);
}
const server = serve({
  hostname: "127.0.0.1",
  port,
  fetch: (req) => {
    if (new URL(req.url).pathname !== "/mcp") return new Response("not found\n", { status: 404 });
    return handler.fetch(req);
  },
});
server.on("listening", () => console.error(`v2-server: listening on http://127.0.0.1:${port}/mcp`));
const stop = () => server.close(() => process.exit(0));
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
