"""The E2B SDK's `files` module (envd's filesystem service and /files) against the operator.

Each scenario connects to an existing sandbox (args["sandbox_id"]) and works below
args["dir"], answering what the SDK returned so the Rust test can assert on it.
"""

import asyncio
import time

from e2b import AsyncSandbox, Sandbox
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

ALL_BYTES = bytes(range(256)) * 4


def _sandbox(args):
    return Sandbox.connect(args["sandbox_id"])


def _entry(e):
    return {
        "name": e.name,
        "type": e.type.value if e.type else None,
        "path": e.path,
        "size": e.size,
        "mode": e.mode,
        "permissions": e.permissions,
        "owner": e.owner,
        "group": e.group,
        "modified": e.modified_time.timestamp(),
        "symlink_target": e.symlink_target,
    }


def write_read(args):
    s, d = _sandbox(args), args["dir"]
    info = s.files.write(f"{d}/new/sub/hello.txt", "hello, files\n")
    s.files.write(f"{d}/all.bin", ALL_BYTES)
    return {
        "written": {"name": info.name, "type": info.type.value, "path": info.path},
        "text": s.files.read(f"{d}/new/sub/hello.txt"),
        "bytes_equal": bytes(s.files.read(f"{d}/all.bin", format="bytes")) == ALL_BYTES,
        "bytes_len": len(s.files.read(f"{d}/all.bin", format="bytes")),
    }


def write_many(args):
    s, d = _sandbox(args), args["dir"]
    entries = [{"path": f"{d}/many/{n}.txt", "data": f"file {n}"} for n in ("a", "b", "c")]
    written = s.files.write_files(entries)
    return {
        "paths": [w.path for w in written],
        "contents": [s.files.read(e["path"]) for e in entries],
    }


def list_(args):
    s, d = _sandbox(args), args["dir"]
    return {
        "depth1": [_entry(e) for e in s.files.list(d, depth=1)],
        "depth2": [_entry(e) for e in s.files.list(d, depth=2)],
    }


def inspect(args):
    s, d = _sandbox(args), args["dir"]
    s.files.write(f"{d}/inspect/file.txt", "12345")
    return {
        "exists": s.files.exists(f"{d}/inspect/file.txt"),
        "exists_missing": s.files.exists(f"{d}/inspect/nothing"),
        "info": _entry(s.files.get_info(f"{d}/inspect/file.txt")),
        "dir_info": _entry(s.files.get_info(f"{d}/inspect")),
        "make_dir": s.files.make_dir(f"{d}/inspect/made/deep"),
        "make_dir_again": s.files.make_dir(f"{d}/inspect/made/deep"),
        "renamed": _entry(s.files.rename(f"{d}/inspect/file.txt", f"{d}/inspect/moved.txt")),
        "old_exists": s.files.exists(f"{d}/inspect/file.txt"),
        "moved_text": s.files.read(f"{d}/inspect/moved.txt"),
        "removed": s.files.remove(f"{d}/inspect/made") is None,
        "removed_exists": s.files.exists(f"{d}/inspect/made"),
    }


def read(args):
    s = _sandbox(args)
    return {"text": s.files.read(args["path"], user=args.get("user"))}


def info(args):
    s = _sandbox(args)
    return _entry(s.files.get_info(args["path"]))


def _until(handle, wanted, deadline):
    """Events until one of type `wanted` is seen (or the deadline passes)."""
    seen = []
    while time.monotonic() < deadline:
        seen += handle.get_new_events()
        if any(e.type == wanted for e in seen):
            break
        time.sleep(0.1)
    return [{"name": e.name, "type": e.type.value} for e in seen]


def watch(args):
    s, d = _sandbox(args), args["dir"]
    s.files.make_dir(f"{d}/watched")
    handle = s.files.watch_dir(f"{d}/watched")
    deadline = time.monotonic() + 30
    s.files.write(f"{d}/watched/w.txt", "one")
    created = _until(handle, FilesystemEventType.CREATE, deadline)
    s.files.write(f"{d}/watched/w.txt", "two, longer")
    written = _until(handle, FilesystemEventType.WRITE, deadline)
    s.files.remove(f"{d}/watched/w.txt")
    removed = _until(handle, FilesystemEventType.REMOVE, deadline)
    handle.stop()
    return {"created": created, "written": written, "removed": removed}


async def _watch_stream(args):
    s, d = await AsyncSandbox.connect(args["sandbox_id"]), args["dir"]
    await s.files.make_dir(f"{d}/streamed")
    seen, exits = [], []
    handle = await s.files.watch_dir(
        f"{d}/streamed", on_event=seen.append, on_exit=exits.append, timeout=60
    )

    async def until(wanted, after=0):
        """Waits for an event of type `wanted` past index `after`; the index past all seen."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e.type == wanted for e in seen[after:]):
            await asyncio.sleep(0.1)
        return len(seen)

    # Each step waits for its own event, so the next one is seen apart: a write the watcher
    # has not polled yet would make the rename's file a new one (remove, create).
    await s.files.write(f"{d}/streamed/s.txt", "one")
    await until(FilesystemEventType.CREATE)
    n = await until(FilesystemEventType.WRITE)  # the first content, with the create or after
    await s.files.write(f"{d}/streamed/s.txt", "two, longer")
    n = await until(FilesystemEventType.WRITE, n)
    await s.files.rename(f"{d}/streamed/s.txt", f"{d}/streamed/t.txt")
    n = await until(FilesystemEventType.RENAME, n)
    await s.files.remove(f"{d}/streamed/t.txt")
    await until(FilesystemEventType.REMOVE, n)
    await handle.stop()
    return {
        "events": [{"name": e.name, "type": e.type.value} for e in seen],
        "exit_errors": [str(e) for e in exits if e is not None],
    }


def watch_stream(args):
    """`AsyncSandbox.files.watch_dir`: envd's WatchDir server stream."""
    return asyncio.run(_watch_stream(args))


SCENARIOS = {
    "files_write_read": write_read,
    "files_write_many": write_many,
    "files_list": list_,
    "files_inspect": inspect,
    "files_read": read,
    "files_info": info,
    "files_watch": watch,
    "files_watch_stream": watch_stream,
}
