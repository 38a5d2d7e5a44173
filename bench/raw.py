"""The raw-client baseline: the least a node agent can do to make its pods Running.

Run as its own process (so its CPU is its own, like the agent's)::

    python -m bench.raw --node NAME --server URL --ca CA --cert CERT --key KEY [--workers 16]

It watches the pods bound to ``NAME`` and writes, once per pod, a ``/status`` merge patch
that says Running (phase, Ready conditions, one running container) — nothing else: no GET,
no Event, no provider. Writes go out with at most ``--workers`` in flight, the agent's
default pod concurrency, so the two are compared at the same concurrency.

It speaks HTTP through aiohttp, the agent's own stack (kubernetes_asyncio is built on it):
one session, one TLS context, ``trust_env`` off, pooled keep-alive connections — so the
baseline's cost per request is the least that stack allows, not a different library's.
This is the limit the agent is measured against; it is written here, by the benchmark, not
taken from the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.kube import JSON, Endpoint

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
LISTED = "bench.raw: listed its node's pods, watching"


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


def session(endpoint: Endpoint, connections: int) -> aiohttp.ClientSession:
    context = ssl.create_default_context(cafile=str(endpoint.ca))
    context.load_cert_chain(str(endpoint.cert), str(endpoint.key))
    return aiohttp.ClientSession(
        base_url=endpoint.server,
        connector=aiohttp.TCPConnector(ssl=context, limit=connections),
        trust_env=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
    )


async def _json(response: aiohttp.ClientResponse) -> Any:
    if response.status >= 400:
        raise RuntimeError(
            f"{response.method} {response.url.path}: HTTP {response.status} "
            f"{(await response.text())[:300]}"
        )
    return await response.json()


async def watch_node_pods(
    client: aiohttp.ClientSession, node: str
) -> AsyncIterator[tuple[str, JSON]]:
    """(type, pod) of every list item and watch event of the pods bound to ``node``."""
    selector = f"spec.nodeName={node}"
    version = ""
    while True:
        if not version:
            async with client.get("/api/v1/pods", params={"fieldSelector": selector}) as got:
                listed = await _json(got)
            version = listed["metadata"]["resourceVersion"]
            print(LISTED, flush=True)  # the driver starts timing after this line
            for pod in listed.get("items") or []:
                yield "ADDED", pod
        params = {
            "fieldSelector": selector,
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "300",
        }
        async with client.get("/api/v1/pods", params=params) as stream:
            if stream.status >= 400:
                await _json(stream)
            async for line in stream.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    version = ""  # expired: list again
                    break
                version = obj["metadata"].get("resourceVersion", version)
                if kind != "BOOKMARK":
                    yield kind, obj


async def serve(endpoint: Endpoint, node: str, workers: int) -> None:
    async with session(endpoint, connections=workers + 2) as client:
        queue: asyncio.Queue[JSON] = asyncio.Queue()
        done: set[str] = set()

        async def worker() -> None:
            while True:
                pod = await queue.get()
                meta = pod["metadata"]
                path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
                body = json.dumps(running_status(pod))
                async with client.patch(path, data=body, headers=MERGE_PATCH) as answer:
                    await _json(answer)

        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        try:
            async for kind, pod in watch_node_pods(client, node):
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
