"""A real local Kubernetes control plane: etcd, kube-apiserver, controller-manager, scheduler.

``up`` is idempotent: it reuses the cluster's key material, ports and etcd data, restarts only
components that are not running, and returns once every component reports healthy. ``down``
stops every process the cluster started and removes its state unless asked to keep it.
Clusters are named, each with its own state directory and ports, so several run side by side.

Invariants:
- All state of a cluster lives under ``state_root()/clusters/<name>``; nothing else is written.
- Ports are chosen once (free ports, or the ones asked for) and kept, so a kubeconfig printed
  by an earlier ``up`` stays valid.
- Operations on one cluster are serialised by a lock file, so two concurrent ``up`` calls do
  not start two API servers.
- The API server serves TLS, authorises with Node,RBAC, signs service-account tokens, and holds
  a client certificate for kubelet APIs whose user is bound to ``system:kubelet-api-admin``.
- Feature gates and runtime-config (``flags.ClusterFlags``) are saved with the cluster and
  kept by ``up`` again and by ``restart``; asking a running cluster for other flags fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from vk_provider.settings.paths import state_root
from vk_provider_adapters.local.processes import (
    ProcessRecord,
    is_running,
    start_process,
    stop_process,
)
from vk_provider_dev.cluster import components
from vk_provider_dev.cluster import pki as pki_mod
from vk_provider_dev.cluster.binaries import Binaries
from vk_provider_dev.cluster.components import ClusterPorts
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flags import ClusterFlags, choose_flags
from vk_provider_dev.cluster.ports import free_ports, port_is_free

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
# Start order; `down` stops in reverse.
COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

Say = Callable[[str], None]


def _quiet(_message: str) -> None:
    return None


def validate_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ClusterError(
            f"cluster name {name!r} is invalid: use 1-40 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    name: str
    exists: bool
    components: tuple[ComponentStatus, ...]
    apiserver_ready: bool
    kubeconfig: Path
    server: str | None

    @property
    def healthy(self) -> bool:
        return self.exists and self.apiserver_ready and all(c.running for c in self.components)


class LocalCluster:
    """One named local control plane, identified by its state directory."""

    def __init__(self, name: str = "vk-dev", *, root: Path | None = None) -> None:
        self.name = validate_name(name)
        self.directory = (root or state_root()) / "clusters" / name
        self.pki = pki_mod.ClusterPKI(self.directory / "pki")

    # ------------------------------------------------------------------ paths and state

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def _state_file(self) -> Path:
        return self.directory / "cluster.json"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log of the agent's ServiceAccounts (components.audit_policy)."""
        return self.directory / "audit.log"

    def log_file(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    def _load_state(self) -> dict[str, object]:
        try:
            data = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise ClusterError(f"{self._state_file} is corrupt ({exc}); run `down` first") from exc
        if not isinstance(data, dict):
            raise ClusterError(f"{self._state_file} is corrupt; run `down` first")
        return data

    def _save_state(self, state: dict[str, object]) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        tmp.replace(self._state_file)

    def _records(self, state: dict[str, object]) -> dict[str, ProcessRecord]:
        raw = state.get("processes", {})
        if not isinstance(raw, dict):
            return {}
        return {name: ProcessRecord.from_json(value) for name, value in raw.items()}

    def _ports(self, state: dict[str, object]) -> ClusterPorts | None:
        raw = state.get("ports")
        if not isinstance(raw, dict):
            return None
        return ClusterPorts(**{k: int(v) for k, v in raw.items()})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ public operations

    def up(
        self,
        binaries: Binaries,
        *,
        apiserver_port: int | None = None,
        flags: ClusterFlags | None = None,
        say: Say = _quiet,
        timeout: float = 90.0,
    ) -> Path:
        """Start (or finish starting) the cluster; return the admin kubeconfig path.

        ``flags``: feature gates and runtime-config; None keeps the saved ones (none at first).
        """
        with self._locked():
            state = self._load_state()
            records = self._records(state)
            ports = self._ports(state)
            flags = choose_flags(
                saved=ClusterFlags.from_json(state.get("flags")),
                requested=flags,
                running=any(is_running(r) for r in records.values()),
                cluster=self.name,
            )
            if ports is not None and apiserver_port and ports.apiserver != apiserver_port:
                raise ClusterError(
                    f"cluster {self.name!r} already uses API server port {ports.apiserver}; "
                    f"run `vk-provider cluster down --name {self.name}` to change it"
                )
            if ports is None:
                ports = self._choose_ports(apiserver_port)
            running = {n for n, r in records.items() if is_running(r)}
            self._check_ports_free(ports, skip=running)

            pki_mod.ensure_pki(self.pki, cluster_name=self.name, service_ip=SERVICE_IP)
            self._write_configs(ports)
            state = {
                "name": self.name,
                "ports": {
                    "apiserver": ports.apiserver,
                    "etcd_client": ports.etcd_client,
                    "etcd_peer": ports.etcd_peer,
                    "controller_manager": ports.controller_manager,
                    "scheduler": ports.scheduler,
                },
                "binaries": binaries.source,
                "flags": flags.to_json(),
                "processes": {n: r.to_json() for n, r in records.items() if n in running},
            }
            self._save_state(state)

            commands = self._commands(binaries, ports, flags)
            health = self._health_checks(ports)
            for component in COMPONENT_ORDER:
                record = records.get(component)
                if record is not None and component in running:
                    say(f"{component} already running (pid {record.pid})")
                else:
                    say(f"starting {component}")
                    record = start_process(
                        component,
                        commands[component],
                        log_file=self.log_file(component),
                        cwd=self.directory,
                    )
                    processes = state["processes"]
                    assert isinstance(processes, dict)
                    processes[component] = record.to_json()
                    self._save_state(state)
                self._wait_healthy(component, record, health[component], timeout=timeout)
                say(f"{component} healthy")
            self._bootstrap()
            return self.kubeconfig

    def down(self, *, keep_state: bool = False, say: Say = _quiet) -> None:
        """Stop every process of the cluster; remove its state unless ``keep_state``."""
        if not self.directory.exists():
            return
        with self._locked():
            state = self._load_state()
            records = self._records(state)
            for component in reversed(COMPONENT_ORDER):
                record = records.get(component)
                if record is None:
                    continue
                if is_running(record):
                    say(f"stopping {component} (pid {record.pid})")
                stop_process(record)
            if keep_state:
                state["processes"] = {}
                self._save_state(state)
        if not keep_state:
            shutil.rmtree(self.directory, ignore_errors=True)
            say(f"removed {self.directory}")

    def restart(self, component: str, binaries: Binaries, *, timeout: float = 90.0) -> None:
        """Stop one component and start it again (fault tests: an API server restart)."""
        if component not in COMPONENT_ORDER:
            raise ClusterError(f"unknown component {component!r}")
        with self._locked():
            state = self._load_state()
            ports = self._ports(state)
            if ports is None:
                raise ClusterError(f"cluster {self.name!r} has not been started")
            record = self._records(state).get(component)
            if record is not None:
                stop_process(record)
            flags = ClusterFlags.from_json(state.get("flags"))
            record = start_process(
                component,
                self._commands(binaries, ports, flags)[component],
                log_file=self.log_file(component),
                cwd=self.directory,
            )
            processes = state.setdefault("processes", {})
            assert isinstance(processes, dict)
            processes[component] = record.to_json()
            self._save_state(state)
            self._wait_healthy(
                component, record, self._health_checks(ports)[component], timeout=timeout
            )

    def status(self) -> ClusterStatus:
        state = self._load_state() if self.directory.exists() else {}
        records = self._records(state)
        components = tuple(
            ComponentStatus(
                name=name,
                pid=records[name].pid if name in records else None,
                running=name in records and is_running(records[name]),
            )
            for name in COMPONENT_ORDER
        )
        ports = self._ports(state)
        server = f"https://127.0.0.1:{ports.apiserver}" if ports else None
        ready = ports is not None and components[1].running and self._apiserver_ready(ports)
        return ClusterStatus(
            name=self.name,
            exists=bool(state),
            components=components,
            apiserver_ready=ready,
            kubeconfig=self.kubeconfig,
            server=server,
        )

    def flags(self) -> ClusterFlags:
        """The feature gates and runtime-config the cluster runs (or will run) with."""
        return ClusterFlags.from_json(self._load_state().get("flags"))

    def pids(self) -> list[int]:
        """The pids of this cluster's running processes (used by tests and `status`)."""
        return [r.pid for r in self._records(self._load_state()).values() if is_running(r)]

    # ------------------------------------------------------------------ internals

    def _choose_ports(self, apiserver_port: int | None) -> ClusterPorts:
        free = free_ports(5)
        if apiserver_port:
            free[0] = apiserver_port
        return ClusterPorts(*free)

    def _check_ports_free(self, ports: ClusterPorts, *, skip: set[str]) -> None:
        for component, numbers in ports.by_component().items():
            if component in skip:
                continue
            for port in numbers:
                if not port_is_free(port):
                    raise ClusterError(
                        f"port {port} for {component} of cluster {self.name!r} is taken by "
                        "another process; stop that process, or run "
                        f"`vk-provider cluster down --name {self.name}` and `up` again to "
                        "choose new ports"
                    )

    def _write_configs(self, ports: ClusterPorts) -> None:
        kubeconfigs = {
            self.kubeconfig: (self.pki.admin, "admin"),
            self.directory / "controller-manager.kubeconfig": (
                self.pki.controller_manager,
                "kube-controller-manager",
            ),
            self.directory / "scheduler.kubeconfig": (self.pki.scheduler, "kube-scheduler"),
        }
        for path, (pair, user) in kubeconfigs.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(
                    components.kubeconfig_text(
                        self.name, ports.apiserver, ca=self.pki.ca.cert, client=pair, user=user
                    )
                )
        (self.directory / "scheduler-config.yaml").write_text(
            components.scheduler_config(self.directory / "scheduler.kubeconfig")
        )
        (self.directory / "audit-policy.yaml").write_text(components.audit_policy())

    def _commands(
        self, binaries: Binaries, ports: ClusterPorts, flags: ClusterFlags
    ) -> dict[str, list[str]]:
        return flags.apply(
            components.commands(self.name, self.directory, self.pki, binaries, ports, SERVICE_CIDR)
        )

    def _client(self, *, verify: bool = True) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        context.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        if not verify:
            # Controller-manager and scheduler serve with self-signed certificates of their own.
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return httpx.Client(verify=context, timeout=3.0)

    def _health_checks(self, ports: ClusterPorts) -> dict[str, Callable[[], bool]]:
        def probe(url: str, *, verify: bool = True) -> Callable[[], bool]:
            def check() -> bool:
                try:
                    if url.startswith("http://"):
                        response = httpx.get(url, timeout=3.0)
                    else:
                        with self._client(verify=verify) as client:
                            response = client.get(url)
                except httpx.HTTPError:
                    return False
                return response.status_code == 200

            return check

        return {
            "etcd": probe(f"http://127.0.0.1:{ports.etcd_client}/health"),
            "kube-apiserver": probe(f"https://127.0.0.1:{ports.apiserver}/readyz"),
            "kube-controller-manager": probe(
                f"https://127.0.0.1:{ports.controller_manager}/healthz", verify=False
            ),
            "kube-scheduler": probe(f"https://127.0.0.1:{ports.scheduler}/healthz", verify=False),
        }

    def _apiserver_ready(self, ports: ClusterPorts) -> bool:
        return self._health_checks(ports)["kube-apiserver"]()

    def _wait_healthy(
        self, component: str, record: ProcessRecord, check: Callable[[], bool], *, timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if not is_running(record):
                raise ClusterError(
                    f"{component} of cluster {self.name!r} exited during start-up; last lines "
                    f"of {self.log_file(component)}:\n{self._log_tail(component)}"
                )
            time.sleep(0.25)
        raise ClusterError(
            f"{component} of cluster {self.name!r} was not healthy after {timeout:.0f}s; last "
            f"lines of {self.log_file(component)}:\n{self._log_tail(component)}"
        )

    def _log_tail(self, component: str, lines: int = 20) -> str:
        try:
            text = self.log_file(component).read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _bootstrap(self) -> None:
        """Objects every cluster of ours needs: the kubelet-client binding (as kubeadm does)."""
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "vk-provider:apiserver-kubelet-client"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:kubelet-api-admin",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": pki_mod.KUBELET_CLIENT_USER,
                }
            ],
        }
        self.create_object("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)

    def request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """One API request as the admin: the status and the JSON answer (``{}`` if none)."""
        ports = self._ports(self._load_state())
        if ports is None:
            raise ClusterError(f"cluster {self.name!r} has not been started")
        with self._client() as client:
            response = client.request(
                method, f"https://127.0.0.1:{ports.apiserver}{path}", json=body
            )
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        return response.status_code, answer if isinstance(answer, dict) else {}

    def create_object(self, collection: str, body: Mapping[str, Any]) -> None:
        """POST ``body`` to the API collection path as the admin; an existing object is fine."""
        ports = self._ports(self._load_state())
        if ports is None:
            raise ClusterError(f"cluster {self.name!r} has not been started")
        with self._client() as client:
            response = client.post(f"https://127.0.0.1:{ports.apiserver}{collection}", json=body)
        if response.status_code not in (200, 201, 409):
            raise ClusterError(
                f"creating {body.get('kind')} at {collection} failed: "
                f"HTTP {response.status_code} {response.text[:300]}"
            )
