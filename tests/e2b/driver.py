"""Drives the operator's E2B-compatible API with the official E2B Python SDK.

Usage: driver.py SCENARIO '{"json": "arguments"}'
       driver.py serve   (one {"scenario": NAME, "args": {...}} a line on stdin, one answer a
                          line on stdout: many scenarios for one start of Python and the SDK)

The SDK reads E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN from the environment
(set by tests/harness/e2b_sdk.rs). Each scenario prints one JSON object on stdout, which the
Rust test asserts on; an SDK exception is printed as {"error": CLASS, "message": TEXT}.
The scenarios here drive the REST API; each tests/e2b/scenarios_*.py module adds its own
(a dict SCENARIOS), so that commands, files and others each keep a file of their own.
"""

import importlib
import json
import pathlib
import sys

from e2b import Sandbox, SandboxQuery


def create(args):
    sandbox = Sandbox.create(
        template=args.get("template", "base"),
        timeout=args["timeout"],
        metadata=args.get("metadata"),
        envs=args.get("envs"),
        network=args.get("network"),
        lifecycle=args.get("lifecycle"),
    )
    return {
        "sandbox_id": sandbox.sandbox_id,
        "has_token": bool(sandbox._envd_access_token),
    }


def list_(args):
    query = SandboxQuery(metadata=args.get("metadata"), state=args.get("state"))
    paginator = Sandbox.list(query=query, limit=args.get("limit"))
    ids, pages = [], 0
    while paginator.has_next:
        ids.extend(s.sandbox_id for s in paginator.next_items())
        pages += 1
    return {"ids": ids, "pages": pages}


def info(args):
    i = Sandbox.get_info(args["sandbox_id"])
    return {
        "sandbox_id": i.sandbox_id,
        "template_id": i.template_id,
        "state": str(i.state.value),
        "metadata": i.metadata,
        "end_at": i.end_at.isoformat(),
        "started_at": i.started_at.isoformat(),
    }


def set_timeout(args):
    Sandbox.set_timeout(args["sandbox_id"], args["timeout"])
    return {"ok": True}


def pause(args):
    return {"paused": Sandbox.pause(args["sandbox_id"])}


def connect(args):
    sandbox = Sandbox.connect(args["sandbox_id"], timeout=args.get("timeout"))
    return {"sandbox_id": sandbox.sandbox_id}


def kill(args):
    return {"killed": Sandbox.kill(args["sandbox_id"])}


SCENARIOS = {
    "create": create,
    "list": list_,
    "info": info,
    "set_timeout": set_timeout,
    "pause": pause,
    "connect": connect,
    "kill": kill,
}


def all_scenarios():
    """These scenarios and every scenarios_*.py module's."""
    here = pathlib.Path(__file__).parent
    sys.path.insert(0, str(here))
    found = dict(SCENARIOS)
    for module in sorted(here.glob("scenarios_*.py")):
        added = importlib.import_module(module.stem).SCENARIOS
        taken = sorted(set(found) & set(added))
        if taken:  # a module's scenario must never replace another's (e.g. the REST "kill")
            raise SystemExit(f"{module.name}: scenario names already taken: {taken}")
        found.update(added)
    return found


def answer(scenarios, scenario, args):
    try:
        return scenarios[scenario](args)
    except Exception as e:  # the test asserts on the SDK's exception class and message
        return {"error": type(e).__name__, "message": str(e)}


def main():
    scenarios = all_scenarios()
    if sys.argv[1] == "serve":
        for line in sys.stdin:
            asked = json.loads(line)
            print(json.dumps(answer(scenarios, asked["scenario"], asked["args"])), flush=True)
        return
    args = json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    print(json.dumps(answer(scenarios, sys.argv[1], args)))


if __name__ == "__main__":
    main()
