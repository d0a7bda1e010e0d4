// The JS SDK's `files` module (envd's filesystem service and /files) against the operator:
// the port of scenarios_files.py, with its scenario names, arguments and JSON answers, so
// the Rust tests assert the same for both SDKs. Each scenario connects to an existing sandbox
// (args.sandbox_id) and works below args.dir.

const ALL_BYTES = new Uint8Array(1024).map((_, i) => i % 256);

const entry = (e) => ({
  name: e.name,
  type: e.type ?? null,
  path: e.path,
  size: e.size,
  mode: e.mode,
  permissions: e.permissions,
  owner: e.owner,
  group: e.group,
  modified: e.modifiedTime ? e.modifiedTime.getTime() / 1000 : null,
  symlink_target: e.symlinkTarget ?? null,
});

const sameBytes = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);

/** Waits until `seen` holds an event of type `wanted` from index `from` on, or the deadline
 * passes; the index past what was seen then. */
async function until(seen, wanted, deadline, from = 0) {
  while (!seen.slice(from).some((e) => e.type === wanted) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return seen.length;
}

const named = (events) => events.map((e) => ({ name: e.name, type: e.type }));

export default function scenarios(Sandbox) {
  const connect = (args) => Sandbox.connect(args.sandbox_id);

  async function writeRead(args) {
    const s = await connect(args);
    const d = args.dir;
    const info = await s.files.write(`${d}/new/sub/hello.txt`, "hello, files\n");
    await s.files.write(`${d}/all.bin`, ALL_BYTES.buffer);
    const bytes = await s.files.read(`${d}/all.bin`, { format: "bytes" });
    return {
      written: { name: info.name, type: info.type, path: info.path },
      text: await s.files.read(`${d}/new/sub/hello.txt`),
      bytes_equal: sameBytes(bytes, ALL_BYTES),
      bytes_len: bytes.length,
    };
  }

  async function writeMany(args) {
    const s = await connect(args);
    const entries = ["a", "b", "c"].map((n) => ({
      path: `${args.dir}/many/${n}.txt`,
      data: `file ${n}`,
    }));
    const written = await s.files.write(entries);
    const contents = [];
    for (const e of entries) contents.push(await s.files.read(e.path));
    return { paths: written.map((w) => w.path), contents };
  }

  async function list(args) {
    const s = await connect(args);
    return {
      depth1: (await s.files.list(args.dir, { depth: 1 })).map(entry),
      depth2: (await s.files.list(args.dir, { depth: 2 })).map(entry),
    };
  }

  async function inspect(args) {
    const s = await connect(args);
    const d = `${args.dir}/inspect`;
    await s.files.write(`${d}/file.txt`, "12345");
    const answer = {};
    answer.exists = await s.files.exists(`${d}/file.txt`);
    answer.exists_missing = await s.files.exists(`${d}/nothing`);
    answer.info = entry(await s.files.getInfo(`${d}/file.txt`));
    answer.dir_info = entry(await s.files.getInfo(d));
    answer.make_dir = await s.files.makeDir(`${d}/made/deep`);
    answer.make_dir_again = await s.files.makeDir(`${d}/made/deep`);
    answer.renamed = entry(await s.files.rename(`${d}/file.txt`, `${d}/moved.txt`));
    answer.old_exists = await s.files.exists(`${d}/file.txt`);
    answer.moved_text = await s.files.read(`${d}/moved.txt`);
    answer.removed = (await s.files.remove(`${d}/made`)) === undefined;
    answer.removed_exists = await s.files.exists(`${d}/made`);
    return answer;
  }

  async function read(args) {
    const s = await connect(args);
    return { text: await s.files.read(args.path, { user: args.user ?? undefined }) };
  }

  async function info(args) {
    return entry(await (await connect(args)).files.getInfo(args.path));
  }

  /** The JS SDK watches with envd's WatchDir stream only: the phases of Python's watch. */
  async function watch(args) {
    const s = await connect(args);
    const d = `${args.dir}/watched`;
    await s.files.makeDir(d);
    const seen = [];
    const handle = await s.files.watchDir(d, (e) => seen.push(e));
    const deadline = Date.now() + 30_000;
    // Each phase counts from before its action: the watcher can see the change before the
    // action's own response arrives.
    const phase = async (action, wanted) => {
      const from = seen.length;
      await action();
      await until(seen, wanted, deadline, from);
      return named(seen.slice(from));
    };
    const created = await phase(() => s.files.write(`${d}/w.txt`, "one"), "create");
    const written = await phase(() => s.files.write(`${d}/w.txt`, "two, longer"), "write");
    const removed = await phase(() => s.files.remove(`${d}/w.txt`), "remove");
    await handle.stop();
    return { created, written, removed };
  }

  async function watchStream(args) {
    const s = await connect(args);
    const d = `${args.dir}/streamed`;
    await s.files.makeDir(d);
    const seen = [];
    const exits = [];
    const handle = await s.files.watchDir(d, (e) => seen.push(e), {
      onExit: (err) => exits.push(err),
      timeoutMs: 60_000,
    });
    const deadline = () => Date.now() + 30_000;
    // Each step waits for its own event, so the next one is seen apart: a write the watcher
    // has not polled yet would make the rename's file a new one (remove, create).
    await s.files.write(`${d}/s.txt`, "one");
    await until(seen, "create", deadline());
    let from = await until(seen, "write", deadline()); // the first content, with the create or after
    await s.files.write(`${d}/s.txt`, "two, longer");
    from = await until(seen, "write", deadline(), from);
    await s.files.rename(`${d}/s.txt`, `${d}/t.txt`);
    from = await until(seen, "rename", deadline(), from);
    await s.files.remove(`${d}/t.txt`);
    await until(seen, "remove", deadline(), from);
    await handle.stop();
    return {
      events: named(seen),
      exit_errors: exits.filter((e) => e != null).map(String),
    };
  }

  return {
    files_write_read: writeRead,
    files_write_many: writeMany,
    files_list: list,
    files_inspect: inspect,
    files_read: read,
    files_info: info,
    files_watch: watch,
    files_watch_stream: watchStream,
  };
}
