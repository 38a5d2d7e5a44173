"""`vk-provider demo`: the overflow story (docs/overflow.md), told on this machine.

1. A local control plane with native gang scheduling; four KWOK nodes x 8 GPUs are the
   cluster's own GPUs; kube-state-metrics and Prometheus give the flip its signal; the
   descheduler runs as a daemon with the shipped policy (``cluster.flip``).
2. The agent (``vk-provider run``) registers the virtual node with three simulated clouds
   (each takes ``start_delay_seconds``, 20 s by default, to start a pod, as a rented GPU
   does) and the overflow flip and its hand-over on.
3. Inference — a Deployment of six 1-GPU replicas at a low PriorityClass, with a
   PodDisruptionBudget — serves from the own nodes.
4. Training — a Kueue Job of four 8-GPU pods at a high PriorityClass (or, with
   ``kueue=False``, a PodGroup whose pods carry the hand-over's scheduling gate) — arrives
   and is held by the hand-over, Kueue's AdmissionCheck ``handover``: the overflow opens,
   inference moves to the virtual node at the cheapest clouds one replica at a time within
   its PDB, and only then the training binds to every own GPU. With ``handover=False``
   (``--no-handover``) the training preempts inference at once, as without the hand-over,
   so the two runs can be compared.
5. Training ends; the overflow closes; the descheduler moves inference home one pod per
   cycle; no cloud instance is left.

It prints a live timeline (``timeline.line``) and writes a picture of the run
(``timeline.render_svg``) whenever the phase changes and at the end; then it keeps the
cluster up for exploration until Ctrl-C. Invariant: every process it started is stopped
before it returns, and no simulated instance outlives it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from vk_provider.domain.endpointslices import MANAGED_BY, MANAGED_BY_LABEL
from vk_provider.domain.handoverstep import HANDOVER
from vk_provider.settings.paths import state_root
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.binaries import Binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.demo import (
    DEFAULT_REST_PORT,
    _quietly,
    _stop_local_instances,
    agent_log_path,
    start_agent,
)
from vk_provider_dev.cluster.flags import GANG_SCHEDULING
from vk_provider_dev.cluster.flip import workloads as w
from vk_provider_dev.cluster.flip.stack import FlipComponents, start_flip_components
from vk_provider_dev.cluster.flip.tools import FlipTools
from vk_provider_dev.cluster.ports import free_ports, port_is_free
from vk_provider_dev.cluster.timeline import HEADER, Sample, line, render_svg, snapshot

NODE_NAME = "vk-gpu"
NAMESPACE = "ml"
INFERENCE, TRAINING = "inference", "training"
GANG_SIZE, GANG_GPUS = 4, 8
# The model server: batches in the log; with a network of its own (pod networks on), HTTP on
# its port too, answering with its name (its readiness probe and its Service reach it there).
SERVER_SCRIPT = """\
import http.server, os, threading, time
name = os.environ["POD_NAME"]
if os.environ.get("HTTP_PORT"):
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"{name}\\n".encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *args): pass
    server = http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["HTTP_PORT"])), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"model server {name} serving", flush=True)
while True:
    time.sleep(5)
    print("served a batch", flush=True)
"""
HTTP_PORT = 8000
SERVICE = "infer"  # the Service over the inference replicas
SLICES_ARGS = [
    "get",
    "endpointslices",
    "-n",
    NAMESPACE,
    "-l",
    f"kubernetes.io/service-name={SERVICE}",
]
SLICES_COMMAND = "kubectl " + " ".join(SLICES_ARGS)
SLICES_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
POD_NETWORKS = ipaddress.IPv4Network("10.215.0.0/16")  # each cloud's pod_network: a /24 of it

# Three simulated clouds; the two cheapest can hold every replica between them.
CLOUDS: list[dict[str, Any]] = [
    {
        "name": "sim-lambda",
        "offers": [
            {
                "sku": "gpu_1x_a100",
                "gpu_model": "A100-80GB",
                "gpu_count": 1,
                "gpu_memory_gib": 80,
                "vcpus": 30,
                "memory_gib": 200,
                "price_per_hour": 1.29,
                "capacity": 3,
                "region": "us-east-1",
                "startup_seconds": 2,
            }
        ],
    },
    {
        "name": "sim-runpod",
        "offers": [
            {
                "sku": "a100-80gb",
                "gpu_model": "A100-80GB",
                "gpu_count": 1,
                "gpu_memory_gib": 80,
                "vcpus": 8,
                "memory_gib": 64,
                "price_per_hour": 1.39,
                "capacity": 4,
                "region": "eu-ro-1",
                "startup_seconds": 3,
            }
        ],
    },
    {
        "name": "sim-modal",
        "offers": [
            {
                "sku": "h100",
                "gpu_model": "H100",
                "gpu_count": 1,
                "gpu_memory_gib": 80,
                "vcpus": 8,
                "memory_gib": 64,
                "price_per_hour": 3.95,
                "capacity": 4,
                "region": "us-west",
                "startup_seconds": 1,
            }
        ],
    },
]


@dataclass(frozen=True, slots=True)
class StoryOptions:
    replicas: int = 6
    own_nodes: int = 4
    training_seconds: float = 45.0
    descheduling_interval: str = "10s"
    sample_seconds: float = 2.0
    phase_timeout_seconds: float = 300.0
    handover: bool = True  # False: the training preempts inference, as without a hand-over
    kueue: bool = True  # the hand-over as Kueue's AdmissionCheck; False: a gated PodGroup
    start_delay_seconds: float = 20.0  # how long a simulated cloud takes to start a pod


def story_config(
    *,
    kubelet_port: int,
    rest_port: int,
    token_file: Path,
    state_dir: Path,
    client_ca: Path,
    prometheus_url: str,
    handover: bool = True,
    start_delay_seconds: float = 20.0,
    pod_networks: list[str] | None = None,
) -> dict[str, Any]:
    """The agent's configuration; with ``pod_networks`` (one CIDR per cloud) each rented
    replica gets an address of its own and traffic follows the pods (EndpointSlices)."""
    clouds = [
        {
            **cloud,
            "offers": [
                {**offer, "startup_seconds": start_delay_seconds} for offer in cloud["offers"]
            ],
            **({"pod_network": pod_networks[index]} if pod_networks else {}),
        }
        for index, cloud in enumerate(CLOUDS)
    ]
    return {
        "node": {"name": NODE_NAME, "address": "127.0.0.1"},
        # Self-signed serving certificate, configured: the dev API server does not verify it.
        "kubelet_api": {
            "listen": f"127.0.0.1:{kubelet_port}",
            "client_ca_file": str(client_ca),
            "serving": {"source": "self-signed"},
        },
        "rest": {"listen": f"127.0.0.1:{rest_port}", "static_token": f"file:{token_file}"},
        "providers": [
            {"type": "local", "enabled": True, "state_dir": str(state_dir / c["name"]), **c}
            for c in clouds
        ],
        "overflow": {
            "enabled": True,
            "prometheus": {"url": prometheus_url},
            "interval_seconds": 2,
            "open_after_seconds": 4,
            "close_after_seconds": 10,
            "handover": {"enabled": handover, "interval_seconds": 1},
        },
        "endpoint_slices": {"enabled": bool(pod_networks)},
    }


def free_pod_networks(count: int) -> list[str] | None:
    """``count`` /24s of ``POD_NETWORKS`` that overlap nothing of this machine's, or None when
    pod networks cannot be made here (they need root and iproute2)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None
    try:
        busy = netns.networks_in_use()
    except (netns.NetnsUnavailable, RuntimeError):
        return None
    free = [
        str(candidate)
        for candidate in POD_NETWORKS.subnets(new_prefix=24)
        if not any(candidate.overlaps(network) for network in busy)
    ]
    return free[:count] if len(free) >= count else None


def inference_deployment(replicas: int, *, serve_http: bool = False) -> dict[str, Any]:
    """The inference replicas; with ``serve_http`` each serves HTTP on ``HTTP_PORT`` (a
    declared port named ``http``) and is Ready once its readiness probe gets an answer."""
    deployment = w.gpu_deployment(
        "infer",
        namespace=NAMESPACE,
        replicas=replicas,
        gpus=1,
        priority_class_name=INFERENCE,
        command=[sys.executable, "-c", SERVER_SCRIPT],
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    if serve_http:
        container["env"].append({"name": "HTTP_PORT", "value": str(HTTP_PORT)})
        container["ports"] = [{"name": "http", "containerPort": HTTP_PORT}]
        container["readinessProbe"] = {
            "httpGet": {"path": "/", "port": "http"},
            "periodSeconds": 1,
        }
    return deployment


def inference_service() -> dict[str, Any]:
    """A Service over the inference replicas: its slices follow them wherever they run."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {
            "selector": {"app": "infer"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }


def picture_path(name: str) -> Path:
    return state_root() / "demo" / name / "story.svg"


class Stopped(Exception):
    """Ctrl-C during the story."""


class Story:
    """Samples the cluster, prints the timeline and keeps the picture current."""

    def __init__(
        self,
        parts: FlipComponents,
        *,
        options: StoryOptions,
        stop: threading.Event,
        out: Console,
        picture: Path,
        agent: subprocess.Popen[bytes],
        log_path: Path,
        serve_http: bool = False,
    ) -> None:
        self.parts, self.api = parts, parts.api
        self.options = options
        self.stop = stop
        self.out = out
        self.picture = picture
        self.agent = agent
        self.log_path = log_path
        self.samples: list[Sample] = []
        self.phase = ""
        self.start = time.monotonic()
        self.held_seconds = 0.0
        self.arrived_at = 0
        self.serve_http = serve_http

    def sample(self) -> Sample:
        pods = self.api.items(w.pods_path(NAMESPACE))
        inference = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "infer"]
        training = [p for p in pods if (p["metadata"].get("labels") or {}).get("gang") == "train"]
        current = snapshot(
            t=time.monotonic() - self.start,
            phase=self.phase,
            virtual_node=self.api.get(f"/api/v1/nodes/{NODE_NAME}"),
            own_nodes=self.parts.nodes,
            own_gpus=float(len(self.parts.nodes) * GANG_GPUS),
            inference=inference,
            training=training,
            training_queued=self._queued(),
        )
        self.samples.append(current)
        self.out.print(line(current), highlight=False)
        return current

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.out.print(f"[bold]── {phase}[/]")
        self.draw()

    def until(self, done: Callable[[Sample], bool], *, within: float | None = None) -> Sample:
        deadline = time.monotonic() + (within or self.options.phase_timeout_seconds)
        while True:
            if self.stop.is_set():
                raise Stopped
            if self.agent.poll() is not None:
                raise RuntimeError(
                    f"the agent exited with code {self.agent.returncode}; see {self.log_path}"
                )
            current = self.sample()
            if done(current):
                return current
            if time.monotonic() > deadline:
                raise RuntimeError(f"the story got stuck at {self.phase!r}; see {self.log_path}")
            self.stop.wait(self.options.sample_seconds)

    def _rented_endpoints(self) -> list[str]:
        """The ready endpoints the agent published for the Service (address:port)."""
        selector = f"kubernetes.io/service-name={SERVICE},{MANAGED_BY_LABEL}={MANAGED_BY}"
        found = []
        for slice_ in self.api.items(SLICES_PATH, labelSelector=selector):
            for port in slice_.get("ports") or []:
                for endpoint in slice_.get("endpoints") or []:
                    if (endpoint.get("conditions") or {}).get("ready"):
                        found += [f"{a}:{port['port']}" for a in endpoint.get("addresses") or []]
        return sorted(found)

    def _show_traffic(self) -> None:
        """Once the Service's slices list every rented replica: what ``kubectl get
        endpointslices`` shows, and one request to each listed endpoint."""
        deadline = time.monotonic() + 60
        while len(endpoints := self._rented_endpoints()) < self.options.replicas:
            if time.monotonic() > deadline or self.stop.wait(1.0):
                self.out.print(f"  Service {SERVICE}: {len(endpoints)} rented endpoints ready")
                return
        kubectl = shutil.which("kubectl", path=f"{Path(sys.executable).parent}:{os.defpath}")
        if kubectl is not None:
            shown = subprocess.run(
                [kubectl, "--kubeconfig", str(self.parts.cluster.kubeconfig), *SLICES_ARGS],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            self.out.print(f"  $ {SLICES_COMMAND}", highlight=False)
            for row in (shown.stdout or shown.stderr).splitlines():
                self.out.print(f"  {row}", highlight=False)
        for endpoint in endpoints:
            try:
                with urllib.request.urlopen(f"http://{endpoint}/", timeout=5) as answer:
                    said = answer.read().decode().strip()
            except OSError as exc:
                said = f"no answer ({exc})"
            self.out.print(f"  GET http://{endpoint}/ -> {said}", highlight=False)

    def draw(self) -> None:
        self.picture.parent.mkdir(parents=True, exist_ok=True)
        title = "vk-provider: training takes the GPUs, inference overflows, then moves home"
        self.picture.write_text(
            render_svg(
                self.samples,
                title=title,
                replicas=self.options.replicas,
                minimum=self.options.replicas - 1,  # the PDB's maxUnavailable: 1
            )
        )

    def _queued(self) -> int:
        """Training pods Kueue holds back (its Job suspended, pods not created yet)."""
        if not self._through_kueue:
            return 0
        job = self.api.get(f"{w.jobs_path(NAMESPACE)}/train") or {}
        return GANG_SIZE if (job.get("spec") or {}).get("suspend") else 0

    @property
    def _through_kueue(self) -> bool:
        return self.options.handover and self.options.kueue

    def _gang(self) -> None:
        if self._through_kueue:
            job = w.kueue_training_job(
                "train",
                namespace=NAMESPACE,
                count=GANG_SIZE,
                gpus=GANG_GPUS,
                priority_class_name=TRAINING,
            )
            self.api.create(w.jobs_path(NAMESPACE), job)
            return
        group = w.pod_group(
            "train", namespace=NAMESPACE, min_count=GANG_SIZE, priority_class_name=TRAINING
        )
        self.api.create(w.pod_groups_path(NAMESPACE), group)
        for pod in w.gang_pods(
            "train",
            namespace=NAMESPACE,
            count=GANG_SIZE,
            gpus=GANG_GPUS,
            priority_class_name=TRAINING,
            gates=(HANDOVER,) if self.options.handover else (),
        ):
            self.api.create(w.pods_path(NAMESPACE), pod)

    def run(self) -> None:
        replicas = self.options.replicas
        self.out.print("\n" + HEADER, highlight=False)
        self.enter("inference serves at home")
        self.until(lambda s: s.home == replicas)
        arrived = time.monotonic()
        self.arrived_at = len(self.samples)  # serving counts from here (before: starting)
        if self.options.handover:
            self.enter("training arrives, held for the hand-over")
            self._gang()
            self.until(lambda s: s.overflow == "open")
            self.enter("hand-over: inference moves to rented GPUs")
            self.until(lambda s: s.training == GANG_SIZE)
        else:
            self.enter("training arrives (a gang)")
            self._gang()
            self.until(lambda s: s.training == GANG_SIZE)
            self.enter("overflow opens")
        self.held_seconds = time.monotonic() - arrived
        self.until(lambda s: s.overflow == "open" and s.virtual == replicas)
        self.enter("inference on rented GPUs")
        held = time.monotonic() + self.options.training_seconds
        if self.serve_http:
            self._show_traffic()
        self.until(lambda s: time.monotonic() >= held)
        self.enter("training ends")
        if self._through_kueue:
            self.api.delete(f"{w.jobs_path(NAMESPACE)}/train")  # orphans its pods: below
        else:
            self.api.delete(f"{w.pod_groups_path(NAMESPACE)}/train")
        for pod in self.api.items(w.pods_path(NAMESPACE), labelSelector="gang=train"):
            self.api.delete(f"{w.pods_path(NAMESPACE)}/{pod['metadata']['name']}", grace_seconds=0)
        self.until(lambda s: s.training == 0)
        self.enter("overflow closes")
        self.until(lambda s: s.overflow == "closed")
        self.enter("inference moves home")
        self.until(lambda s: s.home == replicas and s.virtual == 0)
        self.enter("done")
        self.sample()
        self.draw()


def _wait_node_ready(parts: FlipComponents, agent: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError(f"the agent exited at start-up; see {log}")
        node = parts.api.get(f"/api/v1/nodes/{NODE_NAME}") or {}
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                return
        time.sleep(0.5)
    raise RuntimeError(f"the virtual node did not become Ready; see {log}")


def run_story(
    *,
    name: str,
    binaries: Binaries,
    tools: FlipTools,
    stop: threading.Event,
    console: Console,
    out: Console,
    options: StoryOptions = StoryOptions(),
) -> None:
    cluster = LocalCluster(name)
    parts: FlipComponents | None = None
    agent: subprocess.Popen[bytes] | None = None
    config_path = cluster.directory / "demo-agent.yaml"
    say = _quietly(console)
    picture = picture_path(name)
    try:
        kubeconfig = cluster.up(binaries, flags=GANG_SCHEDULING, say=lambda m: say(f"  {m}"))
        say("  starting KWOK (own GPU nodes), kube-state-metrics and Prometheus")
        parts = start_flip_components(
            cluster,
            directory=cluster.directory / "flip",
            own_nodes=options.own_nodes,
            tools=tools,
        )
        state_dir = cluster.directory / "agent"
        kubelet_port, spare = free_ports(2)
        rest_port = DEFAULT_REST_PORT if port_is_free(DEFAULT_REST_PORT) else spare
        token_file = cluster.directory / "rest-token"
        token_file.write_text(secrets.token_urlsafe(24))
        token_file.chmod(0o600)
        # Traffic follows the pods when each rented replica can have an address of its own.
        pod_networks = free_pod_networks(len(CLOUDS))
        if pod_networks is None:
            say("  (not root: rented replicas get no address of their own, so no traffic)")
        config = story_config(
            kubelet_port=kubelet_port,
            rest_port=rest_port,
            token_file=token_file,
            state_dir=state_dir,
            client_ca=cluster.pki.ca.cert,
            prometheus_url=parts.prometheus.url,
            handover=options.handover,
            start_delay_seconds=options.start_delay_seconds,
            pod_networks=pod_networks,
        )
        config_path.write_text(yaml.safe_dump(config))
        # Inference first, at home, so the flip's first reading already sees pods (requests
        # read 0 only while kube-state-metrics exports some pod: docs/overflow.md#the-signal).
        api = parts.api
        api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}, exist_ok=True)
        api.create(w.PRIORITY_CLASSES, w.priority_class(INFERENCE, 100), exist_ok=True)
        api.create(w.PRIORITY_CLASSES, w.priority_class(TRAINING, 1000), exist_ok=True)
        serve_http = pod_networks is not None
        api.create(
            w.deployments_path(NAMESPACE),
            inference_deployment(options.replicas, serve_http=serve_http),
        )
        api.create(f"/api/v1/namespaces/{NAMESPACE}/services", inference_service())
        api.create(
            w.pdbs_path(NAMESPACE),
            w.pod_disruption_budget("infer", namespace=NAMESPACE, app="infer"),
        )
        if options.handover and options.kueue:
            say("  starting Kueue (training is queued; the hand-over is its AdmissionCheck)")
            parts.start_kueue()
            for path, body in w.kueue_queue(
                "demo",
                namespace=NAMESPACE,
                gpus=options.own_nodes * GANG_GPUS,
                admission_check="handover",
            ):
                api.create(path, body, exist_ok=True)
        log_path = agent_log_path(name)
        say(f"  starting the agent (log: {log_path})")
        agent = start_agent(config_path, kubeconfig, state_dir, log_path)
        _wait_node_ready(parts, agent, log_path)
        parts.start_descheduler(interval=options.descheduling_interval)
        bin_dir = Path(sys.executable).parent
        out.print(f"\n[bold]vk-provider demo[/]: the overflow story on cluster {name!r}")
        out.print(f"  own GPU nodes  {', '.join(parts.nodes)} (KWOK, 8 GPUs each)")
        out.print(f"  virtual node   {NODE_NAME}, clouds {', '.join(c['name'] for c in CLOUDS)}")
        out.print(f"  Prometheus     {parts.prometheus.url}")
        out.print(f"  picture        {picture}")
        out.print("  Watch from another terminal:", highlight=False)
        out.print(f"    export PATH={bin_dir}:$PATH KUBECONFIG={kubeconfig}", highlight=False)
        out.print(f"    kubectl get pods -n {NAMESPACE} -o wide -w", highlight=False)
        out.print(
            f"    {SLICES_COMMAND}   # where Service {SERVICE} sends traffic", highlight=False
        )
        story = Story(
            parts,
            options=options,
            stop=stop,
            out=out,
            picture=picture,
            agent=agent,
            log_path=log_path,
            serve_http=serve_http,
        )
        try:
            story.run()
            instances = _wait_no_instances(config_path, stop)
        except Stopped:
            story.draw()
            return
        out.print(
            f"\n[bold green]The story is over[/]: inference is home, the overflow is closed, "
            f"{instances} cloud instance(s) left."
        )
        serving = min(s.ready for s in story.samples[story.arrived_at :])
        how = "held for the hand-over" if options.handover else "waiting to bind"
        out.print(
            f"  training {how} {story.held_seconds:.0f} s; inference Ready never below "
            f"{serving} of {options.replicas} (PDB minimum {options.replicas - 1})"
        )
        out.print(f"  picture of the run: {picture}  (open it in a browser)")
        out.print("\nExplore (the cluster stays up until Ctrl-C):", highlight=False)
        out.print(f"  export PATH={bin_dir}:$PATH KUBECONFIG={kubeconfig}", highlight=False)
        out.print(
            f"  kubectl describe node {NODE_NAME}   # the Overflow condition", highlight=False
        )
        out.print(
            "  kubectl get events -n default --field-selector involvedObject.kind=Node",
            highlight=False,
        )
        out.print(f"  export VK_PROVIDER_URL=http://127.0.0.1:{rest_port}", highlight=False)
        out.print(f"  export VK_PROVIDER_TOKEN=$(cat {token_file})", highlight=False)
        out.print(
            "  vk-provider overflow; vk-provider pods; vk-provider providers", highlight=False
        )
        out.print(f"  {SLICES_COMMAND}", highlight=False)
        out.print("\nPress Ctrl-C to stop everything.")
        while not stop.is_set():
            if agent.poll() is not None:
                raise RuntimeError(f"the agent exited; its log is kept at {log_path}")
            stop.wait(1.0)
    finally:
        say("\nstopping the demo")
        if parts is not None:
            with contextlib.suppress(Exception):
                parts.stop_descheduler()
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        if config_path.exists():
            with contextlib.suppress(Exception):
                _stop_local_instances(config_path)
        if parts is not None:
            with contextlib.suppress(Exception):
                parts.stop()
        cluster.down(say=lambda m: say(f"  {m}"))


def _wait_no_instances(config_path: Path, stop: threading.Event, within: float = 60) -> int:
    """Cloud instances left once the last termination finished (0, unless one is stuck)."""
    deadline = time.monotonic() + within
    while True:
        left = _count_local_instances(config_path)
        if left == 0 or time.monotonic() > deadline or stop.is_set():
            return left
        stop.wait(1.0)


def _count_local_instances(config_path: Path) -> int:
    import asyncio

    from vk_provider.runtime.registry import Registry
    from vk_provider_adapters.local.adapter import LocalProvider
    from vk_provider_adapters.local.config import LocalProviderConfig

    async def count() -> int:
        config = Registry.default().load_config(config_path)
        total = 0
        for entry in config.providers:
            if isinstance(entry, LocalProviderConfig):
                provider = LocalProvider(entry, state_dir=Path(str(entry.state_dir)))
                total += len(await provider.list_ours())
        return total

    return asyncio.run(count())
