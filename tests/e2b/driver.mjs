// Drives the operator's E2B-compatible API with the official E2B JS SDK (`e2b` from npm,
// the version pinned in tests/setup/e2b-js.sh; E2B_JS_MODULES names its node_modules).
//
// Usage: node driver.mjs SCENARIO '{"json": "arguments"}'
//
// The scenario names, their arguments and their JSON answers are those of driver.py's REST
// scenarios, so tests/e2b_api.rs runs one body with either SDK: arguments keep Python's
// spelling (`timeout` in seconds, `lifecycle.on_timeout`, `network.allow_out`) and are
// translated here to the JS SDK's (`timeoutMs`, `onTimeout`, `allowOut`). An SDK error is
// printed as {"error": ERROR_NAME, "message": TEXT}; the JS SDK names its errors `...Error`
// where Python's are `...Exception`, and the harness knows both.

import { createRequire } from "node:module";
import path from "node:path";

const modules = process.env.E2B_JS_MODULES;
const require = createRequire(path.join(modules ?? process.cwd(), "driver.cjs"));
const { Sandbox } = await import(require.resolve("e2b"));

const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** `value` with every object key in camelCase (Python's option names in the JS SDK's). */
function camelKeys(value) {
  if (Array.isArray(value)) return value.map(camelKeys);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [camel(k), camelKeys(v)]));
}

const seconds = (s) => (s === undefined || s === null ? undefined : s * 1000);

async function create(args) {
  const sandbox = await Sandbox.create(args.template ?? "base", {
    timeoutMs: seconds(args.timeout),
    metadata: args.metadata ?? undefined,
    envs: args.envs ?? undefined,
    network: args.network ? camelKeys(args.network) : undefined,
    lifecycle: args.lifecycle ? camelKeys(args.lifecycle) : undefined,
  });
  return { sandbox_id: sandbox.sandboxId, has_token: Boolean(sandbox.envdAccessToken) };
}

async function list(args) {
  const query = { metadata: args.metadata ?? undefined, state: args.state ?? undefined };
  const paginator = Sandbox.list({ query, limit: args.limit ?? undefined });
  const ids = [];
  let pages = 0;
  while (paginator.hasNext) {
    ids.push(...(await paginator.nextItems()).map((s) => s.sandboxId));
    pages += 1;
  }
  return { ids, pages };
}

async function info(args) {
  const i = await Sandbox.getInfo(args.sandbox_id);
  return {
    sandbox_id: i.sandboxId,
    template_id: i.templateId,
    state: i.state,
    metadata: i.metadata,
    end_at: i.endAt.toISOString(),
    started_at: i.startedAt.toISOString(),
  };
}

async function setTimeout_(args) {
  await Sandbox.setTimeout(args.sandbox_id, seconds(args.timeout));
  return { ok: true };
}

async function pause(args) {
  return { paused: await Sandbox.pause(args.sandbox_id) };
}

async function connect(args) {
  const sandbox = await Sandbox.connect(args.sandbox_id, { timeoutMs: seconds(args.timeout) });
  return { sandbox_id: sandbox.sandboxId };
}

async function kill(args) {
  return { killed: await Sandbox.kill(args.sandbox_id) };
}

const SCENARIOS = {
  create,
  list,
  info,
  set_timeout: setTimeout_,
  pause,
  connect,
  kill,
};

async function main() {
  const [scenario, raw] = process.argv.slice(2);
  const args = JSON.parse(raw ?? "{}");
  let result;
  try {
    const run = SCENARIOS[scenario];
    if (!run) throw new Error(`no scenario ${JSON.stringify(scenario)}`);
    result = await run(args);
  } catch (e) {
    // The test asserts on the SDK's error name and message.
    result = { error: e?.name ?? "Error", message: String(e?.message ?? e) };
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

await main();
