// A scenario runner on the TypeScript MCP SDKs, for Sandgate's tests: it runs the same operations
// on one connected client against an upstream directly and through the gateway, and prints what
// the client saw, normalized, so that the two runs compare equal when the gateway is transparent.
//
//   node sdk-client.mjs --sdk v1|v2 --mode legacy|pin|auto --url http://127.0.0.1:PORT/mcp
//                       --scenarios FILE.json [--source-address 127.0.0.2] [--timeout-ms 10000]
//
// --sdk v1 is @modelcontextprotocol/sdk 1.32.2 (2025 revisions only: --mode legacy); --sdk v2 is
// @modelcontextprotocol/client 2.4.0 with versionNegotiation 'legacy', {pin:'2026-07-28'} or
// 'auto'. --source-address binds every TCP connection of the client to that (loopback) address:
// Sandgate tells sandboxes apart by source address.
//
// FILE.json is a JSON array of operations, run in order; one failing does not stop the others:
//   {"op":"listTools"} {"op":"listResources"} {"op":"listResourceTemplates"} {"op":"listPrompts"}
//   {"op":"callTool","name":..,"arguments":{..},"progress":true?,"logLevel":"debug"?}
//   {"op":"readResource","uri":..}  {"op":"getPrompt","name":..,"arguments":{..}}
//   {"op":"complete","ref":{..},"argument":{..}}
//   {"op":"subscribe","uri":..,"trigger":{"name":tool,"arguments":{}}?,"timeoutMs":5000?}
//   {"op":"task","name":..,"arguments":{..}}
// Output, one JSON document on stdout:
//   {"connect":{"ok","protocolVersion","error"?},
//    "ops":[{"op","ok","result"?,"error"?,"notifications":[{"method","params"}..]}]}
// The exit status is 0 whenever the runner itself worked, whatever the operations did.
//
// Notifications are taken from the wire (the response bodies the SDK reads, through its fetch):
// an operation's notifications are those that arrived on the response streams of the requests
// the operation made, in order. Notifications on a 2025 session's GET stream or on a listen
// stream are not attributed to an operation, because when they arrive relative to the
// operations depends on timing (the TypeScript reference server, for one, lists roots 350 ms
// after initialize); a subscribe operation reports the resources/updated it waits for in its
// result instead.
import { Agent, fetch as undiciFetch } from "undici";
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

const MODERN = "2026-07-28";
const TASKS = "io.modelcontextprotocol/tasks";
const META = "io.modelcontextprotocol/";
const CLIENT_INFO = { name: "sandgate-sdk-client", version: "1.0.0" };
const CAPABILITIES = { elicitation: { form: {} }, sampling: {}, roots: { listChanged: true } };

// ---- normalization -------------------------------------------------------------------------

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi;
const TIMESTAMP = /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?/g;
const LOOPBACK_ORIGIN = /https?:\/\/(127(\.\d{1,3}){3}|localhost|\[::1\]):\d+/g;

function normString(s) {
  return s.replace(UUID, "<id>").replace(TIMESTAMP, "<time>").replace(LOOPBACK_ORIGIN, "<origin>");
}

// norm makes a value comparable across runs and across a direct and a gateway connection:
// object keys sorted; the protocol's own _meta keys (serverInfo, subscription IDs, envelope)
// dropped; session, task and request IDs and timestamps replaced by placeholders.
function norm(v) {
  if (typeof v === "string") return normString(v);
  if (Array.isArray(v)) return v.map(norm);
  if (v === null || typeof v !== "object") return v;
  const out = {};
  for (const k of Object.keys(v).sort()) {
    const x = v[k];
    if (x === undefined || k === "serverInfo" || k === "sessionId") continue;
    if (k === "_meta" && x !== null && typeof x === "object") {
      const kept = Object.fromEntries(Object.entries(x).filter(([mk]) => !mk.startsWith(META)));
      if (Object.keys(kept).length > 0) out[k] = norm(kept);
      continue;
    }
    if (k === "taskId" || k === "requestId") out[k] = "<id>";
    else if (k === "createdAt" || k === "lastUpdatedAt") out[k] = "<time>";
    else out[k] = norm(x);
  }
  return out;
}

function normNotification({ method, params }) {
  let p = params;
  if (method === "notifications/progress" && params) {
    p = { progress: params.progress, total: params.total, message: params.message };
  } else if (method === "notifications/message" && params) {
    p = { level: params.level, data: params.data };
  }
  return p === undefined ? { method } : { method, params: norm(p) };
}

// errorText keeps a JSON-RPC error's code only (its message is the peer's wording); any other
// failure keeps its (normalized) message, with the SDK's error code when it has one.
function errorText(e, sdk) {
  if (e && typeof e.code === "number" && sdk.isJsonRpcError(e)) return `jsonrpc error ${e.code}`;
  const msg = normString(String(e?.message ?? e));
  if (e && typeof e.code === "string") return `${e.code}: ${msg}`;
  if (e && typeof e.code === "number") return `${e.name ?? "Error"} ${e.code}: ${msg}`;
  return msg;
}

// ---- the wire: fetch bound to the source address, response streams observed -------------------

// The operation that the requests being sent belong to (-1: connecting).
let currentOp = -1;
const opNotifications = new Map(); // op index → [{method, params}]

function recordNotification(op, msg) {
  if (!opNotifications.has(op)) opNotifications.set(op, []);
  opNotifications.get(op).push(msg);
}

// sseObserver parses the SSE events passing through a response body and hands each JSON-RPC
// notification to onNote, before the SDK reads the bytes (so a notification is recorded before
// the SDK can act on anything after it).
function sseObserver(onNote) {
  const decoder = new TextDecoder();
  let buf = "";
  const drain = (final) => {
    buf = buf.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0 || (final && buf.length > 0 && (cut = buf.length) > 0)) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data === "") continue;
      try {
        const msg = JSON.parse(data);
        if (msg && typeof msg.method === "string" && msg.id === undefined) onNote({ method: msg.method, params: msg.params });
      } catch {
        // Not JSON: the SDK reports it; the observer only watches.
      }
    }
  };
  return new TransformStream({
    transform(chunk, ctl) {
      buf += decoder.decode(chunk, { stream: true });
      drain(false);
      ctl.enqueue(chunk);
    },
    flush() {
      buf += decoder.decode();
      drain(true);
    },
  });
}

function rpcMethodOf(body) {
  if (typeof body !== "string") return undefined;
  try {
    return JSON.parse(body)?.method;
  } catch {
    return undefined;
  }
}

function makeFetch(sourceAddress) {
  // undici takes the source address at the top level (a connect.localAddress would be overridden).
  const dispatcher = new Agent(sourceAddress ? { localAddress: sourceAddress } : {});
  return async (url, init = {}) => {
    const op = currentOp;
    const method = (init.method ?? "GET").toUpperCase();
    const rpcMethod = method === "POST" ? rpcMethodOf(init.body) : undefined;
    const res = await undiciFetch(url, { ...init, dispatcher });
    const sse = (res.headers.get("content-type") ?? "").includes("text/event-stream");
    // Only a POST's own response stream carries notifications of the operation that sent it;
    // the GET stream and a subscriptions/listen stream are observed by the SDK only.
    if (!sse || res.body === null || method !== "POST" || rpcMethod === "subscriptions/listen") return res;
    const body = res.body.pipeThrough(sseObserver((n) => recordNotification(op, n)));
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

// ---- deterministic answers to the server's requests -----------------------------------------

function answerFor(prop) {
  const firstConst = (alts) => (Array.isArray(alts) && alts.length > 0 ? alts[0].const : undefined);
  if (Array.isArray(prop?.enum) && prop.enum.length > 0) return prop.enum[0];
  if (prop?.oneOf || prop?.anyOf) return firstConst(prop.oneOf ?? prop.anyOf);
  switch (prop?.type) {
    case "string": return "answer";
    case "number":
    case "integer": return 7;
    case "boolean": return true;
    case "array": {
      const items = prop.items ?? {};
      const first = Array.isArray(items.enum) ? items.enum[0] : firstConst(items.anyOf ?? items.oneOf);
      return first === undefined ? [] : [first];
    }
    default: return "answer";
  }
}

function elicitAnswer(params) {
  const props = params?.requestedSchema?.properties ?? {};
  const content = {};
  for (const k of Object.keys(props)) content[k] = answerFor(props[k]);
  return { action: "accept", content };
}

function textOf(content) {
  if (Array.isArray(content)) return content.filter((c) => c?.type === "text").map((c) => c.text).join("");
  return content?.type === "text" ? content.text : "";
}

function samplingAnswer(params) {
  const messages = params?.messages ?? [];
  const last = messages.length > 0 ? messages[messages.length - 1] : undefined;
  return { role: "assistant", content: { type: "text", text: "sampled: " + textOf(last?.content) }, model: "test-model", stopReason: "endTurn" };
}

const ROOTS = { roots: [{ uri: "file:///workspace", name: "workspace" }] };

// ---- the two SDKs behind one interface ------------------------------------------------------

const updatedWaiters = new Set();
function onResourceUpdated(uri) {
  for (const w of updatedWaiters) if (w.uri === uri) w.resolve(true);
}

async function connectV1({ url, fetch, timeout }) {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
  const types = await import("@modelcontextprotocol/sdk/types.js");
  const client = new Client(CLIENT_INFO, { capabilities: CAPABILITIES });
  client.setRequestHandler(types.ElicitRequestSchema, async (r) => elicitAnswer(r.params));
  client.setRequestHandler(types.CreateMessageRequestSchema, async (r) => samplingAnswer(r.params));
  client.setRequestHandler(types.ListRootsRequestSchema, async () => ROOTS);
  client.setNotificationHandler(types.ResourceUpdatedNotificationSchema, (n) => onResourceUpdated(n.params.uri));
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch });
  await client.connect(transport, { timeout });
  return {
    client,
    isJsonRpcError: (e) => e instanceof types.McpError,
    protocolVersion: () => transport.protocolVersion,
    modern: () => false,
    callTool: (params, opts) => client.callTool(params, undefined, opts),
    list: (what, opts) => client[what](undefined, opts),
    readResource: (params, opts) => client.readResource(params, opts),
    listen: undefined,
    task: (op, opts) => taskV1(client, op, opts),
  };
}

async function connectV2({ url, fetch, timeout, mode }) {
  const sdk = await import("@modelcontextprotocol/client");
  const negotiation = { legacy: "legacy", pin: { pin: MODERN }, auto: "auto" }[mode];
  const client = new sdk.Client(CLIENT_INFO, {
    capabilities: CAPABILITIES,
    versionNegotiation: { mode: negotiation, probe: { timeoutMs: timeout } },
  });
  client.setRequestHandler("elicitation/create", async (r) => elicitAnswer(r.params));
  client.setRequestHandler("sampling/createMessage", async (r) => samplingAnswer(r.params));
  client.setRequestHandler("roots/list", async () => ROOTS);
  client.setNotificationHandler("notifications/resources/updated", (n) => onResourceUpdated(n.params.uri));
  const transport = new sdk.StreamableHTTPClientTransport(new URL(url), { fetch });
  await client.connect(transport, { timeout });
  const modern = () => client.getProtocolEra?.() === "modern" || client.getNegotiatedProtocolVersion() >= MODERN;
  // The cacheable verbs always go to the wire: the runner compares what the server says.
  const bypass = (opts) => ({ ...opts, cacheMode: "bypass" });
  return {
    client,
    isJsonRpcError: (e) => e instanceof sdk.ProtocolError,
    protocolVersion: () => client.getNegotiatedProtocolVersion(),
    modern,
    callTool: (params, opts) => client.callTool(params, opts),
    list: (what, opts) => client[what](undefined, bypass(opts)),
    readResource: (params, opts) => client.readResource(params, bypass(opts)),
    listen: (filter, opts) => client.listen(filter, opts),
    task: (op, opts) => taskV2(client, { url, fetch, modern }, op, opts),
  };
}

// ---- tasks -----------------------------------------------------------------------------------

const TERMINAL = new Set(["completed", "failed", "cancelled"]);

// collapse keeps each status once per run of equal ones: how often a poll saw "working" depends
// on timing, the sequence of states does not.
function collapse(statuses) {
  return statuses.filter((s, i) => i === 0 || statuses[i - 1] !== s);
}

// taskV1 runs a 2025-11-25 task-augmented tools/call with the SDK's experimental tasks API
// (tools/call with params.task, tasks/get until terminal, tasks/result).
async function taskV1(client, op, opts) {
  const statuses = [];
  let result;
  const stream = client.experimental.tasks.callToolStream({ name: op.name, arguments: op.arguments ?? {} }, undefined, { ...opts, task: { ttl: 60000 } });
  for await (const m of stream) {
    if (m.type === "taskCreated" || m.type === "taskStatus") statuses.push(m.task.status);
    else if (m.type === "result") result = m.result;
    else if (m.type === "error") throw m.error;
  }
  return { task: statuses.length > 0, statuses: collapse(statuses), result: norm(result) };
}

// Mcp-Name and Mcp-Param-* values: plain when they are safe header text, else the sentinel form.
function headerValue(s) {
  const plain = /^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$/.test(s) && !/^=\?base64\?.*\?=$/i.test(s);
  return plain ? s : `=?base64?${Buffer.from(s, "utf8").toString("base64")}?=`;
}

async function readRpcResponse(res, id) {
  const type = res.headers.get("content-type") ?? "";
  const text = await res.text();
  if (!type.includes("text/event-stream")) {
    try {
      return JSON.parse(text);
    } catch {
      throw new Error(`HTTP ${res.status} without a JSON-RPC body`);
    }
  }
  for (const event of text.replace(/\r\n?/g, "\n").split("\n\n")) {
    const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
    if (data === "") continue;
    const msg = JSON.parse(data);
    if (msg.id === id) return msg;
  }
  throw new Error("the response stream ended without a response");
}

// taskV2 runs the io.modelcontextprotocol/tasks extension on a 2026-07-28 connection. SDK 2.4.0
// has no tasks API and rejects a result of resultType "task", so the tools/call that declares
// the extension is sent as the SDK would send it (same fetch, headers and envelope) and read
// here; tasks/get goes through client.request with a schema of its own.
async function taskV2(client, conn, op, opts) {
  if (!conn.modern()) throw new Error("tasks not supported by this client");
  const { z } = await import("zod");
  const version = client.getNegotiatedProtocolVersion();
  const capabilities = { ...CAPABILITIES, extensions: { [TASKS]: {} } };
  const envelope = {
    [`${META}protocolVersion`]: version,
    [`${META}clientInfo`]: CLIENT_INFO,
    [`${META}clientCapabilities`]: capabilities,
  };
  const id = "task-call-1";
  const res = await conn.fetch(conn.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": version,
      "mcp-method": "tools/call",
      "mcp-name": headerValue(op.name),
    },
    body: JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params: { name: op.name, arguments: op.arguments ?? {}, _meta: envelope } }),
    signal: AbortSignal.timeout(opts.timeout),
  });
  const msg = await readRpcResponse(res, id);
  if (msg.error) throw Object.assign(new Error(msg.error.message), { code: msg.error.code, jsonrpc: true });
  const created = msg.result;
  if (created?.resultType !== "task") {
    const { resultType, ...result } = created ?? {};
    return { task: false, resultType, result: norm(result) };
  }
  const taskSchema = z.object({ taskId: z.string(), status: z.string() }).passthrough();
  const statuses = [created.status];
  const deadline = Date.now() + opts.timeout;
  let current = created;
  while (!TERMINAL.has(current.status)) {
    if (Date.now() > deadline) throw new Error(`task still ${current.status} after ${opts.timeout} ms`);
    // Polling is the protocol here: the server says how often (bounded, and never past the deadline).
    const wait = Math.min(Math.max(current.pollIntervalMs ?? 100, 10), 500, Math.max(deadline - Date.now(), 0));
    await new Promise((r) => setTimeout(r, wait));
    current = await client.request({ method: "tasks/get", params: { taskId: created.taskId, _meta: envelope } }, taskSchema, opts);
    statuses.push(current.status);
  }
  return { task: true, statuses: collapse(statuses), result: norm(current.result), error: current.error ? norm(current.error) : undefined };
}

// ---- operations -------------------------------------------------------------------------------

const sortedBy = (key) => (list) => list.map((x) => x[key]).sort();

async function subscribe(conn, op, opts) {
  const waitMs = op.timeoutMs ?? 5000;
  let resolve;
  const updated = new Promise((r) => (resolve = r));
  const waiter = { uri: op.uri, resolve };
  updatedWaiters.add(waiter);
  const out = {};
  let sub;
  try {
    if (conn.modern()) {
      sub = await conn.listen({ resourceSubscriptions: [op.uri] }, opts);
      out.honored = norm(sub.honoredFilter);
    } else {
      await conn.client.subscribeResource({ uri: op.uri }, opts);
    }
    if (op.trigger) out.trigger = norm(await conn.callTool({ name: op.trigger.name, arguments: op.trigger.arguments ?? {} }, opts));
    let timer;
    const timedOut = new Promise((r) => (timer = setTimeout(() => r(false), waitMs)));
    out.updated = await Promise.race([updated, timedOut]);
    clearTimeout(timer);
  } finally {
    updatedWaiters.delete(waiter);
    if (sub) await sub.close();
    else if (!conn.modern()) await conn.client.unsubscribeResource({ uri: op.uri }, opts).catch(() => {});
  }
  return out;
}

async function runOp(conn, op, timeout) {
  const opts = { timeout };
  switch (op.op) {
    case "listTools": return sortedBy("name")((await conn.list("listTools", opts)).tools);
    case "listPrompts": return sortedBy("name")((await conn.list("listPrompts", opts)).prompts);
    case "listResources": return sortedBy("uri")((await conn.list("listResources", opts)).resources);
    case "listResourceTemplates": return sortedBy("uriTemplate")((await conn.list("listResourceTemplates", opts)).resourceTemplates);
    case "callTool": {
      const params = { name: op.name, arguments: op.arguments ?? {} };
      if (op.logLevel) {
        if (conn.modern()) params._meta = { [`${META}logLevel`]: op.logLevel };
        else await conn.client.setLoggingLevel(op.logLevel, opts);
      }
      // onprogress makes the SDK send a progressToken; the notifications are read off the wire.
      return norm(await conn.callTool(params, op.progress ? { ...opts, onprogress: () => {} } : opts));
    }
    case "readResource": return norm(await conn.readResource({ uri: op.uri }, opts));
    case "getPrompt": return norm(await conn.client.getPrompt({ name: op.name, arguments: op.arguments ?? {} }, opts));
    case "complete": return norm(await conn.client.complete({ ref: op.ref, argument: op.argument }, opts));
    case "subscribe": return subscribe(conn, op, opts);
    case "task": return conn.task(op, opts);
    default: throw new Error(`unknown op ${JSON.stringify(op.op)}`);
  }
}

// withDeadline bounds an operation even if an SDK call ignores its timeout option.
function withDeadline(p, ms) {
  let timer;
  const deadline = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)));
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer));
}

async function main() {
  const { values } = parseArgs({
    options: {
      sdk: { type: "string" },
      mode: { type: "string", default: "legacy" },
      url: { type: "string" },
      scenarios: { type: "string" },
      "source-address": { type: "string" },
      "timeout-ms": { type: "string", default: "10000" },
    },
  });
  const timeout = Number(values["timeout-ms"]);
  const usage = "usage: sdk-client.mjs --sdk v1|v2 --mode legacy|pin|auto --url URL --scenarios FILE.json [--source-address ADDR] [--timeout-ms N]";
  if (!["v1", "v2"].includes(values.sdk) || !["legacy", "pin", "auto"].includes(values.mode) || !values.url || !values.scenarios || !(timeout > 0)) {
    throw new Error(usage);
  }
  if (values.sdk === "v1" && values.mode !== "legacy") throw new Error("--sdk v1 speaks the 2025 revisions only: use --mode legacy");
  const ops = JSON.parse(readFileSync(values.scenarios, "utf8"));
  if (!Array.isArray(ops)) throw new Error(`${values.scenarios}: not a JSON array of operations`);

  const fetch = makeFetch(values["source-address"]);
  const out = { connect: { ok: false }, ops: [] };
  let conn;
  try {
    const connectArgs = { url: values.url, fetch, timeout, mode: values.mode };
    conn = await withDeadline(values.sdk === "v1" ? connectV1(connectArgs) : connectV2(connectArgs), timeout + 1000);
    conn.url = values.url;
    conn.fetch = fetch;
    out.connect = { ok: true, protocolVersion: conn.protocolVersion() };
  } catch (e) {
    const JsonRpcError = values.sdk === "v1"
      ? (await import("@modelcontextprotocol/sdk/types.js")).McpError
      : (await import("@modelcontextprotocol/client")).ProtocolError;
    out.connect = { ok: false, error: errorText(e, { isJsonRpcError: (x) => x instanceof JsonRpcError }) };
  }
  for (const [i, op] of ops.entries()) {
    const rec = { op: op.op, ...(op.name !== undefined && { name: op.name }), ...(op.uri !== undefined && { uri: op.uri }) };
    currentOp = i;
    if (!conn) {
      out.ops.push({ ...rec, ok: false, error: "not connected", notifications: [] });
      continue;
    }
    try {
      const result = await withDeadline(runOp(conn, op, timeout), (op.timeoutMs ?? 0) + timeout + 1000);
      Object.assign(rec, { ok: true, result });
    } catch (e) {
      Object.assign(rec, { ok: false, error: e?.jsonrpc ? `jsonrpc error ${e.code}` : errorText(e, conn) });
    }
    rec.notifications = (opNotifications.get(i) ?? []).map(normNotification);
    out.ops.push(rec);
  }
  currentOp = ops.length;
  if (conn) await withDeadline(conn.client.close(), 2000).catch(() => {});
  process.stdout.write(JSON.stringify(out, null, 2) + "\n");
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`sdk-client: ${e?.stack ?? e}`);
    process.exit(2);
  },
);
