"""The raw-client baseline: the least a node agent can do to make its pods Running.

Run as its own process (so its CPU is its own, like the agent's)::

    python -m bench.raw --node NAME --server URL --ca CA --cert CERT --key KEY [--workers 16]

It watches the pods bound to ``NAME`` and writes, once per pod, a ``/status`` merge patch
that says Running (phase, Ready conditions, one running container) — nothing else: no GET,
no Event, no provider. Writes go out with at most ``--workers`` in flight, the agent's
default pod concurrency, so the two are compared at the same concurrency. This is the
limit the agent is measured against; it is written here, by the benchmark, not taken from
the agent.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.kube import JSON, Endpoint, check, watch_pods


def running_status(pod: JSON) -> JSON:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    containers = pod["spec"]["containers"]
    return {
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        }
    }


async def serve(endpoint: Endpoint, node: str, workers: int) -> None:
    async with endpoint.client(connections=workers + 2) as client:
        queue: asyncio.Queue[JSON] = asyncio.Queue()
        done: set[str] = set()

        async def worker() -> None:
            while True:
                pod = await queue.get()
                meta = pod["metadata"]
                await check(
                    await client.patch(
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        json=running_status(pod),
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                )

        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        try:
            async for kind, pod in watch_pods(client, node):
                uid = pod["metadata"]["uid"]
                if kind == "DELETED":
                    done.discard(uid)
                    continue
                status = pod.get("status") or {}
                if uid in done or status.get("phase") == "Running":
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                done.add(uid)
                queue.put_nowait(pod)
        finally:
            for task in tasks:
                task.cancel()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.raw", description=__doc__)
    parser.add_argument("--node", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args(argv)
    endpoint = Endpoint(args.server, args.ca, args.cert, args.key)
    asyncio.run(serve(endpoint, args.node, args.workers))


if __name__ == "__main__":
    main()
