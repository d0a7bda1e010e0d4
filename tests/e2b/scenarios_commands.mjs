// envd's process service, driven by the JS SDK's `commands` and `pty` modules: the port of
// scenarios_commands.py, with its scenario names, arguments and JSON answers, so the Rust
// tests assert the same for both SDKs. Each scenario connects to an existing sandbox
// (args.sandbox_id) the way a second program would, so a reattach really comes from another
// client.

export default function scenarios(Sandbox, { CommandExitError }) {
  const connect = (args) => Sandbox.connect(args.sandbox_id);

  /** Sandbox.create, then a command at once: create answers once the sandbox runs. */
  async function createAndRun(args) {
    const sbx = await Sandbox.create({ timeoutMs: args.timeout * 1000 });
    const r = await sbx.commands.run("echo hi");
    return { sandbox_id: sbx.sandboxId, stdout: r.stdout, exit_code: r.exitCode };
  }

  /** The result of `run` or of `handle.wait()`, a non-zero exit (CommandExitError) included. */
  async function ended(promise) {
    try {
      const r = await promise;
      return { raised: false, exit_code: r.exitCode, stdout: r.stdout, stderr: r.stderr };
    } catch (e) {
      if (!(e instanceof CommandExitError)) throw e;
      return { raised: true, exit_code: e.exitCode, stdout: e.stdout, stderr: e.stderr };
    }
  }

  async function runForeground(args) {
    const sbx = await connect(args);
    const ok = await sbx.commands.run('echo out; echo err >&2; echo "$GREETING"; pwd', {
      envs: { GREETING: "hello" },
      cwd: "/tmp",
    });
    const failed = await ended(sbx.commands.run("echo partial; echo oops >&2; exit 3"));
    return { stdout: ok.stdout, stderr: ok.stderr, exit_code: ok.exitCode, failed };
  }

  /** Any command, its output and exit code (a non-zero exit is an answer, not an error). */
  async function run(args) {
    const sbx = await connect(args);
    return ended(sbx.commands.run(args.cmd));
  }

  async function startBackground(args) {
    const sbx = await connect(args);
    const handle = await sbx.commands.run(args.cmd, { background: true, stdin: true });
    return { pid: handle.pid };
  }

  async function listed(sbx) {
    return (await sbx.commands.list()).map((p) => ({ pid: p.pid, cmd: p.cmd, args: p.args }));
  }

  /** The processes envd lists. */
  async function processes(args) {
    return { listed: await listed(await connect(args)) };
  }

  /** Lists, reattaches by pid, sends stdin, and waits for the end. */
  async function reattach(args) {
    const sbx = await connect(args);
    const before = await listed(sbx);
    const handle = await sbx.commands.connect(args.pid);
    await sbx.commands.sendStdin(args.pid, args.stdin);
    const result = await handle.wait();
    return { listed: before, stdout: result.stdout, exit_code: result.exitCode };
  }

  /** `cat` reads what is sent, then ends at the end of its input: stdin closed. */
  async function closeStdin(args) {
    const sbx = await connect(args);
    const handle = await sbx.commands.run("cat", { background: true, stdin: true });
    await sbx.commands.sendStdin(handle.pid, "to cat\n");
    await sbx.commands.closeStdin(handle.pid);
    const result = await handle.wait();
    return { stdout: result.stdout, exit_code: result.exitCode };
  }

  async function connectUnknown(args) {
    const sbx = await connect(args);
    try {
      await sbx.commands.connect(args.pid);
      return { raised: false };
    } catch (e) {
      return { error: e?.name ?? "Error", message: String(e?.message ?? e) };
    }
  }

  const exitCode = async (handle) => (await ended(handle.wait())).exit_code;
  const has = async (sbx, pid) => (await sbx.commands.list()).some((p) => p.pid === pid);

  async function kill(args) {
    const sbx = await connect(args);
    const handle = await sbx.commands.run("sleep 300", { background: true });
    const listedBefore = await has(sbx, handle.pid);
    const killed = await sbx.commands.kill(handle.pid);
    const code = await exitCode(handle);
    return {
      listed_before: listedBefore,
      killed,
      exit_code: code,
      listed_after: await has(sbx, handle.pid),
      killed_again: await sbx.commands.kill(handle.pid),
    };
  }

  /** A PTY: its output collected as text, and a wait for `needle` with a deadline. */
  async function terminal(sbx, size) {
    const decoder = new TextDecoder();
    const term = { text: "" };
    term.handle = await sbx.pty.create({
      ...size,
      onData: (data) => {
        term.text += decoder.decode(data, { stream: true });
      },
    });
    term.until = async (needle) => {
      const deadline = Date.now() + 30_000;
      while (!term.text.includes(needle) && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      return term.text;
    };
    return term;
  }

  async function pty(args) {
    const sbx = await connect(args);
    const term = await terminal(sbx, { rows: 24, cols: 80 });
    const { pid } = term.handle;
    const typed = (s) => new TextEncoder().encode(s);
    // The terminal echoes what is typed: wait for what only the command prints.
    await sbx.pty.sendInput(pid, typed("stty size; echo first-$((1+1))\n"));
    const before = await term.until("first-2\r\n");
    await sbx.pty.resize(pid, { rows: 30, cols: 100 });
    await sbx.pty.sendInput(pid, typed("stty size; exit 0\n"));
    const code = await exitCode(term.handle);
    const after = term.text.slice(before.length);
    const other = await terminal(sbx, { rows: 24, cols: 80 });
    const killed = await sbx.pty.kill(other.handle.pid);
    return { before, after, exit_code: code, killed, killed_code: await exitCode(other.handle) };
  }

  async function token(args) {
    return { token: (await connect(args)).envdAccessToken };
  }

  /** kill, then a command through the same handle: the sandbox is gone, and the SDK says so
   * from the proxy's 502 (the error is the answer). */
  async function runAfterKill(args) {
    const sbx = await connect(args);
    await sbx.kill();
    await sbx.commands.run("true");
    return { ran: true };
  }

  return {
    create_and_run: createAndRun,
    run_after_kill: runAfterKill,
    run_foreground: runForeground,
    commands_run: run,
    start_background: startBackground,
    processes,
    reattach,
    close_stdin: closeStdin,
    connect_unknown: connectUnknown,
    commands_kill: kill,
    pty,
    token,
  };
}
