"""envd's process service, driven by the SDK's `commands` and `pty` modules. Each scenario
connects to an existing sandbox (args["sandbox_id"]) the way a second program would, so a
reattach really comes from another client."""

from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize


def _sandbox(args):
    return Sandbox.connect(args["sandbox_id"])


def create_and_run(args):
    """Sandbox.create, then a command at once: create answers once the sandbox runs."""
    sbx = Sandbox.create(timeout=args["timeout"])
    r = sbx.commands.run("echo hi")
    return {"sandbox_id": sbx.sandbox_id, "stdout": r.stdout, "exit_code": r.exit_code}


def run_foreground(args):
    sbx = _sandbox(args)
    ok = sbx.commands.run(
        'echo out; echo err >&2; echo "$GREETING"; pwd',
        envs={"GREETING": "hello"},
        cwd="/tmp",
    )
    try:
        sbx.commands.run("echo partial; echo oops >&2; exit 3")
        failed = {"raised": False}
    except CommandExitException as e:
        failed = {"raised": True, "exit_code": e.exit_code, "stdout": e.stdout, "stderr": e.stderr}
    return {
        "stdout": ok.stdout,
        "stderr": ok.stderr,
        "exit_code": ok.exit_code,
        "failed": failed,
    }


def run(args):
    """Any command, its output and exit code (a non-zero exit is an answer, not an error)."""
    sbx = _sandbox(args)
    try:
        r = sbx.commands.run(args["cmd"])
        return {"raised": False, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr}
    except CommandExitException as e:
        return {"raised": True, "exit_code": e.exit_code, "stdout": e.stdout, "stderr": e.stderr}


def processes(args):
    """The processes envd lists."""
    listed = _sandbox(args).commands.list()
    return {"listed": [{"pid": p.pid, "cmd": p.cmd, "args": p.args} for p in listed]}


def start_background(args):
    sbx = _sandbox(args)
    handle = sbx.commands.run(args["cmd"], background=True, stdin=True)
    return {"pid": handle.pid}


def reattach(args):
    """Lists, reattaches by pid, sends stdin, and waits for the end."""
    sbx = _sandbox(args)
    listed = [{"pid": p.pid, "cmd": p.cmd, "args": p.args} for p in sbx.commands.list()]
    handle = sbx.commands.connect(args["pid"])
    sbx.commands.send_stdin(args["pid"], args["stdin"])
    result = handle.wait()
    return {"listed": listed, "stdout": result.stdout, "exit_code": result.exit_code}


def close_stdin(args):
    """`cat` reads what is sent, then ends at the end of its input: stdin closed."""
    sbx = _sandbox(args)
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "to cat\n")
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    return {"stdout": result.stdout, "exit_code": result.exit_code}


def kill_pid(args):
    """Kills a process another client started, then reattaches to learn how it ended."""
    sbx = _sandbox(args)
    killed = sbx.commands.kill(args["pid"])
    code = _exit_code(sbx.commands.connect(args["pid"]))
    return {
        "killed": killed,
        "exit_code": code,
        "listed_after": args["pid"] in [p.pid for p in sbx.commands.list()],
    }


def connect_unknown(args):
    sbx = _sandbox(args)
    try:
        sbx.commands.connect(args["pid"])
        return {"raised": False}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}


def _exit_code(handle):
    """The exit code `handle.wait()` ends with (raised as CommandExitException when not 0)."""
    try:
        return handle.wait().exit_code
    except CommandExitException as e:
        return e.exit_code


def kill(args):
    sbx = _sandbox(args)
    handle = sbx.commands.run("sleep 300", background=True)
    listed = handle.pid in [p.pid for p in sbx.commands.list()]
    killed = sbx.commands.kill(handle.pid)
    code = _exit_code(handle)
    return {
        "listed_before": listed,
        "killed": killed,
        "exit_code": code,
        "listed_after": handle.pid in [p.pid for p in sbx.commands.list()],
        "killed_again": sbx.commands.kill(handle.pid),
    }


def _read_until(events, needle):
    """PTY output from the handle's events until `needle` has appeared."""
    seen = b""
    for _, _, pty in events:
        if pty is not None:
            seen += pty
            if needle in seen:
                return seen.decode(errors="replace")
    return seen.decode(errors="replace")


def pty(args):
    sbx = _sandbox(args)
    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    events = iter(handle)
    # The terminal echoes what is typed: wait for what only the command prints.
    sbx.pty.send_stdin(handle.pid, b"stty size; echo first-$((1+1))\n")
    before = _read_until(events, b"first-2\r\n")
    sbx.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(handle.pid, b"stty size; exit 0\n")
    after = "".join(
        p.decode(errors="replace") for _, _, p in events if p is not None
    )
    other = sbx.pty.create(PtySize(rows=24, cols=80))
    killed = sbx.pty.kill(other.pid)
    other_code = _exit_code(other)
    return {
        "before": before,
        "after": after,
        "exit_code": handle._result.exit_code if handle._result else None,
        "killed": killed,
        "killed_code": other_code,
    }


def token(args):
    return {"token": _sandbox(args)._envd_access_token}


def run_after_kill(args):
    """kill, then a command through the same handle: the sandbox is gone, and the SDK says so
    from the proxy's 502 (the error is the answer)."""
    sbx = _sandbox(args)
    sbx.kill()
    sbx.commands.run("true")
    return {"ran": True}


SCENARIOS = {
    "create_and_run": create_and_run,
    "run_after_kill": run_after_kill,
    "run_foreground": run_foreground,
    "commands_run": run,
    "processes": processes,
    "start_background": start_background,
    "reattach": reattach,
    "close_stdin": close_stdin,
    "connect_unknown": connect_unknown,
    "kill_pid": kill_pid,
    "commands_kill": kill,
    "pty": pty,
    "token": token,
}
