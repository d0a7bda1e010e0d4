#!/usr/bin/env python3
"""A counting pass-through proxy for the Docker engine's unix socket (bench helper).

    dockerproxy.py --listen /tmp/x/docker.sock --upstream /var/run/docker.sock --counts FILE

Every byte is forwarded unchanged in both directions (long-lived event streams and hijacked
exec/attach connections included). On the client-to-engine side it recognises HTTP request
lines and counts them by normalised endpoint (API version prefix dropped, container/volume/
image/exec ids replaced by `{id}`, query string dropped), e.g. `GET /containers/{id}/json`.
The counts are rewritten atomically to FILE (JSON: {"total": N, "by_endpoint": {...}}) every
0.1 s and at exit, so a benchmark can diff two snapshots and see exactly which engine calls the
operator made in between — independently of the operator's own metrics.

Python 3.11 standard library only.
"""

import argparse
import asyncio
import json
import os
import re
import signal
from collections import Counter

VERSION_PREFIX = re.compile(r"^/v\d+\.\d+")
ID_AFTER = re.compile(r"^/(containers|volumes|images|exec|networks)/([^/]+)")

counts: Counter = Counter()
total = 0


def normalise(method: str, target: str) -> str:
    path = target.split("?", 1)[0]
    path = VERSION_PREFIX.sub("", path)
    m = ID_AFTER.match(path)
    if m and m.group(2) not in ("json", "create", "prune"):
        path = f"/{m.group(1)}/{{id}}" + path[m.end():]
    return f"{method} {path}"


class Scanner:
    """Parses the client-to-engine byte stream as HTTP/1.1 requests (request line, headers,
    Content-Length or chunked body) and counts each request. After a request that upgrades
    the connection (Docker's hijacked attach / exec start) the rest is raw stream: ignored."""

    def __init__(self) -> None:
        self.buf = b""
        self.state = "head"  # head | body | chunk-size | chunk-data | raw
        self.left = 0

    def feed(self, data: bytes) -> None:
        global total
        if self.state == "raw":
            return
        self.buf += data
        while True:
            if self.state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].decode("latin-1").split("\r\n")
                self.buf = self.buf[end + 4:]
                parts = head[0].split(" ")
                if len(parts) >= 2:
                    counts[normalise(parts[0], parts[1])] += 1
                    total += 1
                headers = {}
                for line in head[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                if "upgrade" in headers.get("connection", "").lower():
                    self.state, self.buf = "raw", b""
                    return
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    self.state = "chunk-size"
                else:
                    self.left = int(headers.get("content-length", "0") or 0)
                    self.state = "body"
            elif self.state == "body":
                take = min(self.left, len(self.buf))
                self.buf = self.buf[take:]
                self.left -= take
                if self.left:
                    return
                self.state = "head"
            elif self.state == "chunk-size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(self.buf[:end].split(b";")[0] or b"0", 16)
                self.buf = self.buf[end + 2:]
                # data + CRLF; the last chunk (0) is followed by (no trailers) CRLF
                self.left, self.state = size + 2, ("chunk-data" if size else "body")
            elif self.state == "chunk-data":
                take = min(self.left, len(self.buf))
                self.buf = self.buf[take:]
                self.left -= take
                if self.left:
                    return
                self.state = "chunk-size"


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, scanner) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if scanner is not None:
                scanner.feed(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass


TASKS: set = set()  # strong references: asyncio only keeps weak ones to running tasks


async def handle(client_r, client_w, upstream: str) -> None:
    me = asyncio.current_task()
    TASKS.add(me)
    try:
        try:
            up_r, up_w = await asyncio.open_unix_connection(upstream)
        except OSError:
            client_w.close()
            return
        to_engine = asyncio.create_task(pump(client_r, up_w, Scanner()))
        to_client = asyncio.create_task(pump(up_r, client_w, None))
        TASKS.update((to_engine, to_client))
        # The client half-closing (end of a hijacked stdin) must not cut the engine's answer
        # short; the engine closing its side ends the connection.
        await to_client
        if not to_engine.done():
            to_engine.cancel()
        await asyncio.gather(to_engine, return_exceptions=True)
        TASKS.difference_update((to_engine, to_client))
        for w in (up_w, client_w):
            try:
                w.close()
            except OSError:
                pass
    finally:
        TASKS.discard(me)


def dump(path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"total": total, "by_endpoint": dict(sorted(counts.items()))}, f)
    os.replace(tmp, path)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--upstream", default="/var/run/docker.sock")
    ap.add_argument("--counts", required=True)
    args = ap.parse_args()
    if os.path.exists(args.listen):
        os.unlink(args.listen)
    server = await asyncio.start_unix_server(lambda r, w: handle(r, w, args.upstream), path=args.listen)
    os.chmod(args.listen, 0o660)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    dump(args.counts)
    async with server:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
            dump(args.counts)
    dump(args.counts)
    os.unlink(args.listen)
    os._exit(0)  # do not wait for (or warn about) connections still open


if __name__ == "__main__":
    asyncio.run(main())
