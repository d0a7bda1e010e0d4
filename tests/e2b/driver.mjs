// Drives the operator's E2B-compatible API with the official E2B JS SDK (`e2b` from npm,
// the version pinned in tests/setup/e2b-js.sh; E2B_JS_MODULES names its node_modules).
//
// Usage: node driver.mjs SCENARIO '{"json": "arguments"}'
//        node driver.mjs serve   (one {"scenario": NAME, "args": {...}} a line on stdin, one
//                                 answer a line on stdout: many scenarios for one start of Node)
//
// The scenario names, their arguments and their JSON answers are those of driver.py's REST
// scenarios (and each tests/e2b/scenarios_*.mjs module ports the scenarios_*.py of its name),
// so the Rust tests run one body with either SDK: arguments keep Python's
// spelling (`timeout` in seconds, `lifecycle.on_timeout`, `network.allow_out`) and are
// translated here to the JS SDK's (`timeoutMs`, `onTimeout`, `allowOut`). An SDK error is
// printed as {"error": ERROR_NAME, "message": TEXT}; the JS SDK names its errors `...Error`
// where Python's are `...Exception`, and the harness knows both.

import { readdirSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const modules = process.env.E2B_JS_MODULES;
const require = createRequire(path.join(modules ?? process.cwd(), "driver.cjs"));
const sdk = await import(require.resolve("e2b"));
const { Sandbox } = sdk;

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

/** These scenarios and every scenarios_*.mjs module's (its default export, given the SDK). */
async function allScenarios() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const found = { ...SCENARIOS };
  const names = readdirSync(here).filter((f) => /^scenarios_.*\.mjs$/.test(f));
  for (const name of names.sort()) {
    const module = await import(pathToFileURL(path.join(here, name)).href);
    const added = module.default(Sandbox, sdk);
    // A module's scenario must never replace another's (e.g. the REST "kill").
    const taken = Object.keys(added).filter((k) => k in found);
    if (taken.length) throw new Error(`${name}: scenario names already taken: ${taken}`);
    Object.assign(found, added);
  }
  return found;
}

async function answer(scenarios, scenario, args) {
  try {
    const run = scenarios[scenario];
    if (!run) throw new Error(`no scenario ${JSON.stringify(scenario)}`);
    return await run(args);
  } catch (e) {
    // The test asserts on the SDK's error name and message.
    return { error: e?.name ?? "Error", message: String(e?.message ?? e) };
  }
}

async function main() {
  const [scenario, raw] = process.argv.slice(2);
  const scenarios = await allScenarios();
  if (scenario === "serve") {
    const { createInterface } = await import("node:readline");
    for await (const line of createInterface({ input: process.stdin })) {
      const asked = JSON.parse(line);
      const result = await answer(scenarios, asked.scenario, asked.args);
      await new Promise((done) => process.stdout.write(`${JSON.stringify(result)}\n`, done));
    }
    process.exit(0);
  }
  const result = await answer(scenarios, scenario, JSON.parse(raw ?? "{}"));
  // Exit once the answer is out: an open stream (a background command, a watch) would keep
  // Node running, where a Python driver's process ends with its main thread.
  process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
}

await main();
