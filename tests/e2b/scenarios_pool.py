"""Sandbox.create from a SandboxWarmPool: the template id names a pool in the key's
namespace, so the create is a claim (tests/e2b_pool.rs)."""

from e2b import Sandbox


def pool_create_and_run(args):
    """Sandbox.create(template=POOL) with per-task envs and metadata, then a command."""
    sbx = Sandbox.create(
        template=args["template"],
        timeout=args["timeout"],
        envs=args.get("envs"),
        metadata=args.get("metadata"),
        network=args.get("network"),
    )
    r = sbx.commands.run(args["cmd"])
    return {"sandbox_id": sbx.sandbox_id, "stdout": r.stdout, "exit_code": r.exit_code}


SCENARIOS = {
    "pool_create_and_run": pool_create_and_run,
}
