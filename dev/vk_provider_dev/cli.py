"""The development commands of `vk-provider`: `cluster ...`, `demo` (and `local ...`, in
``local_cli``). They come from the vk-provider-dev distribution and join the product's
command line through the ``vk_provider.commands`` entry points (``vk_provider.cli.plugins``),
loaded only when one of them is asked for: `vk-provider run` imports none of this.

Exit codes as the product's: 0 success, 2 usage error, 1 runtime failure.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vk_provider.cli.output import console, out
from vk_provider.cli.output import fail as _fail
from vk_provider_dev.cluster.binaries import PINNED, Binaries, ensure_binaries
from vk_provider_dev.cluster.binaries import Progress as BuildProgress
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flags import requested_flags
from vk_provider_dev.cluster.flip.tools import FlipTools, ensure_flip_tools
from vk_provider_dev.cluster.helm import ensure_helm
from vk_provider_dev.cluster.kubeproxy import ensure_kube_proxy
from vk_provider_dev.cluster.metrics_server import ensure_metrics_server

cluster_app = typer.Typer(help="A real local Kubernetes control plane.", no_args_is_help=True)
demo_app = typer.Typer(add_completion=False)

NAME_OPTION = typer.Option(
    "vk-dev",
    "--name",
    envvar="VK_PROVIDER_CLUSTER",
    help="Cluster name; clusters run side by side.",
)


T = TypeVar("T")


def _stopped_by_signals() -> threading.Event:
    """An event set by Ctrl-C, a kill or the terminal going away: what runs until it is set
    stops everything it started."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return stop


def _with_progress(first: str, work: Callable[[BuildProgress], T]) -> T:
    """Run ``work(progress)`` showing its progress.

    On a terminal this is a progress bar; in a log (CI) it is one line per phase and per
    tenth of the packages compiled, so a person reading the log sees it move.
    """
    if not console.is_terminal:
        last: dict[str, int] = {}

        def report_lines(phase: str, done: int, total: int) -> None:
            step = (10 * done // total) if total else -1
            if last.get(phase) != step:
                last[phase] = step
                suffix = f" {done}/{total} packages" if total else ""
                console.print(f"  {phase}{suffix}", highlight=False)

        return work(report_lines)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(first, total=None)

        def report(phase: str, done: int, total: int) -> None:
            bar.update(task, description=phase, completed=done, total=total or None)

        return work(report)


def obtain_binaries() -> Binaries:
    """Find the control-plane binaries, building them with visible progress when needed."""
    binaries = _with_progress(
        "looking for control-plane binaries",
        lambda progress: ensure_binaries(PINNED, progress=progress),
    )
    prefix = "  " if not console.is_terminal else ""
    console.print(f"{prefix}binaries: {binaries.source}", highlight=False)
    return binaries


def obtain_flip_tools() -> FlipTools:
    """Find KWOK, the descheduler, kube-state-metrics and Prometheus, fetching what is missing."""
    return _with_progress(
        "looking for the flip components",
        lambda progress: ensure_flip_tools(progress=progress),
    )


@cluster_app.command("binaries")
def cluster_binaries(
    flip: bool = typer.Option(
        False,
        "--flip",
        help="Also fetch the overflow flip's components: KWOK, the descheduler, "
        "kube-state-metrics (built from the Go module proxy) and Prometheus (Debian's).",
    ),
    metrics_server: bool = typer.Option(
        False,
        "--metrics-server",
        help="Also build metrics-server (kubectl top against a local cluster).",
    ),
    helm: bool = typer.Option(
        False,
        "--helm",
        help="Also build Helm (the chart's tests: lint, template, install).",
    ),
    kube_proxy: bool = typer.Option(
        False,
        "--kube-proxy",
        help="Also build kube-proxy (the control plane's version) and fetch Debian's nft for "
        "its nftables mode (the data-path test).",
    ),
) -> None:
    """Find or build the control-plane binaries (pinned version) and print where they are."""
    try:
        binaries = obtain_binaries()
        tools = obtain_flip_tools() if flip else None
        metrics = (
            _with_progress(
                "looking for metrics-server",
                lambda progress: ensure_metrics_server(progress=progress),
            )
            if metrics_server
            else None
        )
        helm_binary = (
            _with_progress("looking for helm", lambda progress: ensure_helm(progress=progress))
            if helm
            else None
        )
        proxy = (
            _with_progress(
                "looking for kube-proxy", lambda progress: ensure_kube_proxy(progress=progress)
            )
            if kube_proxy
            else None
        )
    except ClusterError as exc:
        raise _fail(str(exc)) from exc
    out.print(binaries.kube_apiserver.parent)
    for name, path in tools.describe() if tools else ():
        out.print(f"{name}: {path}", highlight=False)
    if metrics is not None:
        out.print(f"metrics-server: {metrics}", highlight=False)
    if helm_binary is not None:
        out.print(f"helm: {helm_binary}", highlight=False)
    for name, path in proxy.describe() if proxy else ():
        out.print(f"{name}: {path}", highlight=False)


@cluster_app.command("up")
def cluster_up(
    name: str = NAME_OPTION,
    apiserver_port: int = typer.Option(
        0, "--apiserver-port", help="Fixed API server port (default: a free port, kept)."
    ),
    feature_gates: list[str] = typer.Option(
        [],
        "--feature-gates",
        help="[COMPONENT:]Gate=true|false[,...] (repeatable); without COMPONENT for "
        "kube-apiserver, kube-controller-manager and kube-scheduler alike. Kept by the cluster.",
    ),
    runtime_config: list[str] = typer.Option(
        [],
        "--runtime-config",
        help="group/version=true|false[,...] for the API server (repeatable). Kept.",
    ),
    gang_scheduling: bool = typer.Option(
        False,
        "--gang-scheduling",
        help="Native gang scheduling (GenericWorkload, WorkloadWithJob, "
        "scheduling.k8s.io/v1beta1) on the components that need it.",
    ),
) -> None:
    """Start the control plane (idempotent) and print the KUBECONFIG to use."""
    try:
        flags = requested_flags(feature_gates, runtime_config, gang_scheduling=gang_scheduling)
        cluster = LocalCluster(name)
        binaries = obtain_binaries()
        kubeconfig = cluster.up(
            binaries,
            apiserver_port=apiserver_port or None,
            flags=flags,
            say=lambda m: console.print(f"  {m}"),
        )
        for line in cluster.flags().describe():
            console.print(f"  {line}", highlight=False)
    except ClusterError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"cluster [bold]{name}[/] is up. Use it with:")
    out.print(f"export KUBECONFIG={kubeconfig}", highlight=False)


@cluster_app.command("down")
def cluster_down(
    name: str = NAME_OPTION,
    keep_state: bool = typer.Option(
        False, "--keep-state", help="Keep certificates and etcd data for the next `up`."
    ),
) -> None:
    """Stop every process of the cluster and remove its state."""
    try:
        LocalCluster(name).down(keep_state=keep_state, say=lambda m: console.print(f"  {m}"))
    except ClusterError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"cluster [bold]{name}[/] is down.")


@cluster_app.command("status")
def cluster_status(name: str = NAME_OPTION) -> None:
    """Show whether each component runs and the API server is ready (exit 1 if not healthy)."""
    try:
        status = LocalCluster(name).status()
    except ClusterError as exc:
        raise _fail(str(exc)) from exc
    if not status.exists:
        raise _fail(f"cluster {name!r} does not exist; start it with `vk-provider cluster up`")
    table = Table(title=f"cluster {name}")
    table.add_column("component")
    table.add_column("pid", justify="right")
    table.add_column("state")
    for component in status.components:
        state = "[green]running[/]" if component.running else "[red]stopped[/]"
        table.add_row(component.name, str(component.pid or "-"), state)
    out.print(table)
    ready = "[green]ready[/]" if status.apiserver_ready else "[red]not ready[/]"
    out.print(f"API server {status.server}: {ready}")
    for line in LocalCluster(name).flags().describe():
        out.print(f"extra flags of {line}", highlight=False)
    out.print(f"KUBECONFIG={status.kubeconfig}", highlight=False)
    if not status.healthy:
        raise typer.Exit(1)


@cluster_app.command("flip-components")
def cluster_flip_components(
    name: str = NAME_OPTION,
    nodes: int = typer.Option(4, "--nodes", min=1, help="Own GPU nodes for KWOK to play."),
    gpus: int = typer.Option(8, "--gpus-per-node", min=1, help="nvidia.com/gpu per node."),
) -> None:
    """Run the flip's components beside a running cluster until Ctrl-C: KWOK with own GPU
    nodes (gpu-node-0..), kube-state-metrics, Prometheus with deploy/prometheus's rules."""
    from vk_provider_dev.cluster.flip.deployfiles import descheduler_policy_file
    from vk_provider_dev.cluster.flip.descheduler import descheduler_command
    from vk_provider_dev.cluster.flip.stack import start_flip_components

    cluster = LocalCluster(name)
    if not cluster.status().healthy:
        raise _fail(f"cluster {name!r} is not up: run `vk-provider cluster up --name {name}`")
    stop = _stopped_by_signals()
    try:
        tools = obtain_flip_tools()
        directory = cluster.directory / "flip"
        console.print(f"starting KWOK ({nodes} nodes), kube-state-metrics and Prometheus")
        with start_flip_components(
            cluster, directory=directory, own_nodes=nodes, gpus_per_node=gpus, tools=tools
        ) as parts:
            out.print(f"own GPU nodes: {', '.join(parts.nodes)}", highlight=False)
            out.print(f"Prometheus: {parts.prometheus.url}", highlight=False)
            out.print(f"kube-state-metrics: {parts.ksm.metrics_url}", highlight=False)
            out.print(f"logs: {directory}", highlight=False)
            once = descheduler_command(
                tools.descheduler,
                kubeconfig=cluster.kubeconfig,
                policy=descheduler_policy_file(),
                interval="0",
                port=0,
                cert_dir=directory / "descheduler-certs",
            )
            out.print(f"one descheduler cycle: {' '.join(once)}", highlight=False)
            console.print("Ctrl-C stops them and removes the nodes.")
            stop.wait()
    except ClusterError as exc:
        raise _fail(str(exc)) from exc


@demo_app.command("demo")
def demo(
    name: str = typer.Option("vk-demo", "--name", help="Name of the demo's local cluster."),
    short: bool = typer.Option(
        False,
        "--short",
        help="The short demo: three pods pinned to the virtual node on three simulated "
        "clouds, no overflow story.",
    ),
    training_seconds: float = typer.Option(
        45, "--training-seconds", min=0, help="How long the training gang holds the GPUs."
    ),
    descheduling_interval: str = typer.Option(
        "10s", "--descheduling-interval", help="The descheduler's pace (one pod per cycle)."
    ),
    no_handover: bool = typer.Option(
        False,
        "--no-handover",
        help="Without the hand-over: the training preempts inference at once (to compare).",
    ),
    native_gang: bool = typer.Option(
        False,
        "--native-gang",
        help="Training as a native PodGroup held by the hand-over's scheduling gate, not as "
        "a Kueue Job held by its AdmissionCheck.",
    ),
    start_delay: float = typer.Option(
        20,
        "--start-delay",
        min=0,
        max=600,
        help="Seconds a simulated cloud takes to start a pod (a rented GPU takes minutes).",
    ),
) -> None:
    """Tell the overflow story on this machine (or, with --short, the short demo), keep the
    cluster up until Ctrl-C, then tear everything down."""
    from vk_provider_dev.cluster.demo import run_demo
    from vk_provider_dev.cluster.story import StoryOptions, run_story

    stop = _stopped_by_signals()
    try:
        binaries = obtain_binaries()
        if short:
            run_demo(name=name, binaries=binaries, stop=stop, console=console, out=out)
            return
        options = StoryOptions(
            training_seconds=training_seconds,
            descheduling_interval=descheduling_interval,
            handover=not no_handover,
            kueue=not native_gang,
            start_delay_seconds=start_delay,
        )
        run_story(
            name=name,
            binaries=binaries,
            tools=obtain_flip_tools(),
            stop=stop,
            console=console,
            out=out,
            options=options,
        )
    except (ClusterError, RuntimeError) as exc:
        raise _fail(str(exc)) from exc
