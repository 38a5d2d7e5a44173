"""`vk-provider demo`: the embedded default run.

Today it brings up a real local control plane named ``vk-demo``, prints how to look at it, and
tears everything down on Ctrl-C (or SIGTERM). Invariant: every process it starts is stopped
before it returns, whatever happened in between.
"""

from __future__ import annotations

import threading

from rich.console import Console

from vk_provider.localcluster.binaries import Binaries
from vk_provider.localcluster.cluster import LocalCluster


def run_demo(
    *, name: str, binaries: Binaries, stop: threading.Event, console: Console, out: Console
) -> None:
    cluster = LocalCluster(name)
    try:
        kubeconfig = cluster.up(binaries, say=lambda m: console.print(f"  {m}"))
        status = cluster.status()
        out.print(f"\n[bold]vk-provider demo[/]: local control plane {name!r} is running.")
        out.print(f"  API server   {status.server}")
        out.print(f"  binaries     {binaries.source}")
        out.print(f"  state        {cluster.directory}")
        out.print("\nLook at it from another terminal:", highlight=False)
        out.print(f"  export KUBECONFIG={kubeconfig}", highlight=False)
        out.print("  kubectl get --raw /readyz", highlight=False)
        out.print("  kubectl get namespaces,serviceaccounts -A", highlight=False)
        out.print("\nPress Ctrl-C to stop everything.")
        stop.wait()
    finally:
        console.print("\nstopping the demo cluster")
        cluster.down(say=lambda m: console.print(f"  {m}"))
