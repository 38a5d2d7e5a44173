"""The local provider: runs every container of a pod as a process on this machine.

For development, the demo and end-to-end tests. There are no images: each container's
``command`` + ``args`` run as a local program under the pod runner (``runner.py``), which
runs init containers in order, sidecars beside the app, and restarts containers per the pod's
restart policy with kubelet's back-off, as a kubelet does (so this provider runs whole pods:
``Capabilities.multi_container``); each runner is forked from the provider's spawner
(``spawner.py``: one interpreter start per provider, not per pod). Offers are simulated from
the configuration (prices, capacity, launch latency); faults are injected by ``injector.py``
as configured and as ``faults.py`` overrides them. Every instance is a directory of files
(``records.py``, ``layout.py``), so a fresh ``LocalProvider`` (an agent restart) finds every
instance again, and the processes, like cloud machines, keep running while no agent watches
them. Logs are CRI log lines per container (``logs.py``), the previous run's kept for
``kubectl logs --previous``. ``kubectl exec``, ``port-forward`` and usage for ``kubectl top``
are ``exec.py``, ``portforward.py`` and ``usage.py``.

Invariants:
- One instance per ``spec.request_id``: the directory name is derived from it, so a second
  create of the same request returns the first instance and starts no process.
- The state of an instance is derived from its files and the liveness of its runner, in one
  place (``observe.py``), which also escalates an overdue termination to SIGKILL.
- ``teardown.py`` ends an instance on disk: SIGTERM goes to the runner, which stops the
  containers (app containers first, then the sidecars), as a kubelet stops a pod; SIGKILL
  goes to every process group of the pod.
- ``list_ours`` scans the state dir (and forgets instances it finds TERMINATED by removing
  their directory) and rebuilds the index of active instances per sku; ``offers`` and the
  capacity check of ``create`` count the index (no file is read), so ``create``, ``get`` and
  ``offers`` cost the same however many instances exist. The index may still count an
  instance that ended on its own since the last scan (never one too few of ours), so only a
  create that finds its sku full looks at that sku's instances before it says no capacity
  (and ``get`` drops an instance it finds ended). ``delete`` of an instance that no longer
  runs removes its directory; ``get`` then raises ``NotFound``. The logs of a released
  instance stay until it is deleted once more (the agent does that when the pod goes), so
  `kubectl logs` works for completed pods.
- A create claims its room in the index before it writes anything, then writes the files and
  forks the runner in a worker thread (file-system operations are slow on some disks; the
  event loop goes on meanwhile). Until it answers, the scan skips its directory and keeps its
  claim, and a second create of the same request, a ``get`` or a ``delete`` waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

from vk_provider.sdk import (
    Capabilities,
    CapacityUnavailable,
    ConfigError,
    ContainerUsage,
    ExecSession,
    Instance,
    InstanceState,
    InvalidSpec,
    LogOptions,
    NotFound,
    Offer,
    PortStream,
    Transient,
    WorkloadSpec,
)
from vk_provider_adapters.local import podnet
from vk_provider_adapters.local.config import LocalProviderConfig
from vk_provider_adapters.local.exec import start_exec
from vk_provider_adapters.local.injector import FaultInjector
from vk_provider_adapters.local.launch import PACKAGE_ROOT, local_containers, write_pod
from vk_provider_adapters.local.layout import (
    CONTAINER_LOG,
    CONTAINER_RESTART,
    PREVIOUS_LOG,
    container_dir,
    container_names,
    container_spec,
)
from vk_provider_adapters.local.logs import stream_log
from vk_provider_adapters.local.netns import namespace_path, reached_at
from vk_provider_adapters.local.observations import Observations
from vk_provider_adapters.local.observe import exposed_ports, observe
from vk_provider_adapters.local.portforward import open_local_port
from vk_provider_adapters.local.processes import signal_runner
from vk_provider_adapters.local.records import (
    ENDPOINTS_FILE,
    INSTANCE_FILE,
    INSTANCE_ID,
    RUNNER_LOG_FILE,
    Record,
    read_record,
    write_json,
)
from vk_provider_adapters.local.spawner import Spawner
from vk_provider_adapters.local.teardown import (
    ACTIVE,
    Outcome,
    release,
    retained_dir,
    terminate,
)
from vk_provider_adapters.local.usage import instance_usage
from vk_provider_adapters.simulated import SimulatedOffer, simulated_offer

log = logging.getLogger(__name__)

# A liveness-probe restart: SIGTERM, then SIGKILL after this long (kubelet uses the pod's
# grace period; a local program that ignores SIGTERM should not hold a restart up for long).
RESTART_GRACE_SECONDS = 10.0


class LocalProviderDisabled(RuntimeError):
    """The configuration did not opt in to running commands on this machine."""


@contextlib.contextmanager
def _io_errors_as_transient(provider: str) -> Iterator[None]:
    """The contract lets only ``domain.errors`` escape: a failing disk is worth a retry."""
    try:
        yield
    except OSError as exc:
        raise Transient(f"local provider state I/O failed: {exc}", provider=provider) from exc


# --- the provider -------------------------------------------------------------------------


class LocalProvider:
    """``domain.contract.Provider`` running a pod's containers as local processes."""

    def __init__(
        self,
        config: LocalProviderConfig,
        *,
        state_dir: Path,
        rng: random.Random | None = None,
    ) -> None:
        if not config.enabled:
            raise LocalProviderDisabled(
                f"provider {config.name!r} (type local) runs commands on this machine; "
                "set enabled: true to allow it"
            )
        namespace = config.network_namespace
        if namespace is not None and not namespace_path(namespace).exists():
            raise ConfigError(
                f"provider {config.name!r}: network_namespace {namespace!r} does not exist "
                f"({namespace_path(namespace)}; create it with ip netns add)"
            )
        self._config = config
        self._state_dir = config.state_dir if config.state_dir is not None else state_dir
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self._offers: dict[str, SimulatedOffer] = {offer.sku: offer for offer in config.offers}
        # The rng is injectable so tests decide which creates the failure rate fails.
        self._faults = FaultInjector(
            config.name,
            config.faults,
            self._state_dir,
            rng if rng is not None else random.Random(),  # noqa: S311 - not crypto
        )
        # Sku -> ids of every instance that may still hold capacity: built by each scan, kept
        # by create and release. A create's capacity check counts it (no file read) and
        # looks at the sku's instances only when the count says full.
        self._index: dict[str, set[str]] | None = None
        self._observations = Observations()  # the listing's, one read per change
        # Forks each instance's runner from one waiting process (``spawner.py``).
        self._spawner = Spawner(self._state_dir, namespace=config.network_namespace)
        # Where the agent's probes and port-forwards reach this provider's processes.
        self._host = reached_at(config.network_namespace, config.address)
        self._networks = threading.Lock()  # creates run in worker threads
        # Creates under way (their files are written off the event loop): the answer each
        # will give, and the sku each has claimed in the index.
        self._creating: dict[str, asyncio.Future[Instance]] = {}  # the create tasks
        self._claims: dict[str, str] = {}

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            logs=True,
            follow_logs=True,
            log_timestamps=True,
            previous_logs=True,
            multi_container=True,
            init_containers=True,
            sidecars=True,
            probes="agent",  # the containers listen on this machine: the agent probes them
            exec=True,
            port_forward=True,
            usage=True,
        )

    @property
    def state_dir(self) -> Path:
        """Where instances live; pass it to ``inject_loss`` and ``set_faults``."""
        return self._state_dir

    async def offers(self) -> list[Offer]:
        await self._delay()
        with _io_errors_as_transient(self.name):
            active = self._active_by_sku()
        return [self._offer(offer, active.get(offer.sku, 0)) for offer in self._offers.values()]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        await self._delay()
        instance_id = f"local-{spec.pod_uid}-{spec.attempt}"
        pending = self._creating.get(instance_id)
        if pending is None:  # else the same request is being created: its answer is ours
            pending = asyncio.ensure_future(self._create(spec, offer, instance_id))
            self._creating[instance_id] = pending
            pending.add_done_callback(lambda done: self._created(instance_id, done))
        # Shielded: a caller that gives up does not stop a create half-way (its files, its
        # runner); the create finishes, and a retry of the same request finds its instance.
        created = await asyncio.shield(pending)
        if self._faults.answer_lost():
            raise Transient("injected timeout after the create went through", provider=self.name)
        return created

    async def _create(self, spec: WorkloadSpec, offer: Offer, instance_id: str) -> Instance:
        try:
            # No await until the claim is made: the capacity check and the claim (the
            # instance counted in the index) happen without another create in between.
            with _io_errors_as_transient(self.name):
                claimed = self._claim(spec, offer, instance_id)
            if isinstance(claimed, Instance):
                return claimed
            # The files and the fork (a dozen file-system operations, slow on some disks)
            # off the event loop; the index already counts the instance.
            try:
                with _io_errors_as_transient(self.name):
                    return await asyncio.to_thread(self._launch, spec, claimed, instance_id)
            except Exception:
                self._unindex(instance_id)
                raise
        finally:
            self._claims.pop(instance_id, None)

    def _created(self, instance_id: str, done: asyncio.Future[Instance]) -> None:
        """A create ended: forget it (and retrieve its error: its caller may have left)."""
        self._creating.pop(instance_id, None)
        if not done.cancelled():
            done.exception()

    async def _settled(self, instance_id: str) -> None:
        """Wait for a create of ``instance_id`` that is under way (its files are not whole)."""
        pending = self._creating.get(instance_id)
        if pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)

    async def get(self, instance_id: str) -> Instance:
        await self._delay()
        await self._settled(instance_id)
        with _io_errors_as_transient(self.name):
            instance = self._observe(self._directory(instance_id))
        if instance is None or instance.state not in ACTIVE:
            self._unindex(instance_id)
        if instance is None:
            raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        await self._delay()
        if not INSTANCE_ID.fullmatch(instance_id):
            return  # not a name we ever give, so it does not exist: done
        await self._settled(instance_id)
        with _io_errors_as_transient(self.name):
            if terminate(self._state_dir / instance_id, grace_seconds, provider=self.name) in (
                Outcome.RELEASED,
                Outcome.GONE,
            ):
                self._unindex(instance_id)

    async def list_ours(self) -> list[Instance]:
        await self._delay()
        with _io_errors_as_transient(self.name):
            return [instance for _, instance in self._scan()]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        await self._delay()
        directory = self._directory(instance_id)
        with _io_errors_as_transient(self.name):
            live = read_record(directory) is not None
            base = directory if live else retained_dir(self._state_dir, instance_id)
            if not base.is_dir():
                raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
            path = self._log_path(base, instance_id, options)

        def active() -> bool:
            instance = self._observe(directory) if live else None
            return instance is not None and instance.state in ACTIVE

        async for chunk in stream_log(path, options, active=active):
            yield chunk

    async def restart_container(self, instance_id: str, container: str) -> None:
        """Stop ``container`` (a failed liveness probe): SIGTERM, SIGKILL after a grace; the
        pod runner then restarts it as the pod's restart policy says."""
        await self._delay()
        directory = self._directory(instance_id)
        with _io_errors_as_transient(self.name):
            record = read_record(directory)
            if record is None:
                raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
            if container not in container_names(directory):
                raise NotFound(
                    f"instance {instance_id} has no container {container!r}", provider=self.name
                )
            request = container_dir(directory, container) / CONTAINER_RESTART
            write_json(request, {"grace_seconds": RESTART_GRACE_SECONDS})
            if record.process is not None:
                signal_runner(record.process, signal.SIGUSR1)  # look at the requests now

    def _observe(self, directory: Path) -> Instance | None:
        network = podnet.read(directory) if self._config.pod_network is not None else None
        ip = network.address if network is not None else self._host
        return observe(directory, provider=self.name, ip=ip)

    def _read(self, directory: Path) -> tuple[Record, Instance] | None:
        """The instance's record and its observation, read afresh."""
        record = read_record(directory)
        instance = self._observe(directory) if record is not None else None
        return (record, instance) if record is not None and instance is not None else None

    def _reserve_network(self, directory: Path) -> podnet.PodNetwork | None:
        """A /30 of ``pod_network`` for the instance in ``directory``, recorded there."""
        cidr = self._config.pod_network
        if cidr is None:
            return None
        with self._networks:  # one /30 per pod: choose and record under one lock
            instances = [d for d in self._state_dir.iterdir() if INSTANCE_ID.fullmatch(d.name)]
            try:
                network = podnet.choose(cidr, podnet.taken(instances), directory)
            except podnet.PodNetworkError as exc:
                shutil.rmtree(directory, ignore_errors=True)
                raise CapacityUnavailable(str(exc), provider=self.name) from exc
            podnet.reserve(directory, network)
        return network

    def _namespace(self, directory: Path) -> str | None:
        """The network namespace the instance's processes run in, if not this machine's."""
        network = podnet.read(directory) if self._config.pod_network is not None else None
        return network.namespace if network is not None else self._config.network_namespace

    # --- optional operations: exec.py, portforward.py, usage.py ---------------------------

    async def exec(
        self, instance_id: str, container: str, command: list[str], *, tty: bool
    ) -> ExecSession:
        directory = self._directory(instance_id)
        with _io_errors_as_transient(self.name):
            return await start_exec(
                directory,
                container,
                command,
                tty=tty,
                provider=self.name,
                namespace=self._namespace(directory),
            )

    async def open_port(self, instance_id: str, port: int) -> PortStream:
        directory = self._directory(instance_id)
        with _io_errors_as_transient(self.name):
            instance = self._observe(directory)
            host = instance.ip if instance is not None and instance.ip else self._host
            return await open_local_port(directory, port, provider=self.name, host=host)

    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        directory = self._directory(instance_id)
        with _io_errors_as_transient(self.name):
            return await asyncio.to_thread(instance_usage, directory)

    async def close(self) -> None:
        """Let the runner spawner go; like cloud machines, instances outlive the agent."""
        self._spawner.close()

    # --- internals ------------------------------------------------------------------------

    def _log_path(self, base: Path, instance_id: str, options: LogOptions) -> Path:
        """The log file `kubectl logs` asks for: the container's current or previous run."""
        names = container_names(base)
        apps = [n for n in names if not (container_spec(base, n) or {}).get("init")]
        name = options.container or (apps[0] if apps else None)
        if name is None or name not in names:
            raise NotFound(
                f"container {options.container!r} is not valid for instance {instance_id}",
                provider=self.name,
            )
        path = container_dir(base, name) / (PREVIOUS_LOG if options.previous else CONTAINER_LOG)
        if options.previous and not path.exists():
            raise NotFound(
                f"previous terminated container {name!r} of instance {instance_id} not found",
                provider=self.name,
            )
        return path

    async def _delay(self) -> None:
        with _io_errors_as_transient(self.name):
            faults = self._faults.current()
        await self._faults.before_call(faults)

    def _release(self, directory: Path) -> None:
        self._unindex(directory.name)
        release(directory)

    def _claim(
        self, spec: WorkloadSpec, offer: Offer, instance_id: str
    ) -> Instance | SimulatedOffer:
        """The existing instance of this request, or the offer it may launch on: then the
        index counts it already (the caller launches it, or unindexes it on failure)."""
        if not INSTANCE_ID.fullmatch(instance_id):
            raise InvalidSpec(
                f"pod uid {spec.pod_uid!r} cannot name a local instance",
                provider=self.name,
                field="metadata.uid",
            )
        directory = self._state_dir / instance_id
        existing = self._observe(directory)
        if existing is not None:
            return existing
        local_containers(spec, provider=self.name)  # refuse what cannot run before any claim
        configured = self._offers.get(offer.sku)
        if configured is None or offer.provider != self.name:
            raise CapacityUnavailable(f"no offer {offer.key} here", provider=self.name)
        self._faults.fail_create()
        active = self._active_by_sku().get(configured.sku, 0)
        if active >= configured.capacity:
            active = self._active_by_sku(configured.sku).get(configured.sku, 0)
        if active >= configured.capacity:
            raise CapacityUnavailable(
                f"offer {offer.key} is at capacity ({configured.capacity} running)",
                provider=self.name,
            )
        self._claims[instance_id] = configured.sku
        if self._index is not None:
            self._index.setdefault(configured.sku, set()).add(instance_id)
        return configured

    def _offer(self, offer: SimulatedOffer, active: int) -> Offer:
        return simulated_offer(self.name, offer, active=active)

    def _directory(self, instance_id: str) -> Path:
        # The id names a directory: refuse anything that could point outside the state dir.
        if not INSTANCE_ID.fullmatch(instance_id):
            raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
        return self._state_dir / instance_id

    def _launch(self, spec: WorkloadSpec, offer: SimulatedOffer, instance_id: str) -> Instance:
        """Write the instance and fork its runner (in a worker thread: only files, the
        spawner and the log are touched here, never the index)."""
        directory = self._state_dir / instance_id
        # A directory without instance.json is what an interrupted create left; start over.
        podnet.remove(directory)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        inits, apps = local_containers(spec, provider=self.name)
        write_pod(
            directory,
            pod_name=spec.pod_name,
            restart_policy=spec.restart_policy,
            backoff_seconds=self._config.restart_backoff_seconds,
            inits=inits,
            apps=apps,
        )
        record = Record(
            instance_id=directory.name,
            pod_uid=spec.pod_uid,
            attempt=spec.attempt,
            sku=offer.sku,
            offer_key=self._offer(offer, 0).key,
            price_per_hour=offer.price_per_hour,
            created_at=time.time(),
            process=None,
        )
        network = self._reserve_network(directory)
        address = network.address if network is not None else self._config.address
        if address is not None:
            write_json(directory / ENDPOINTS_FILE, exposed_ports(spec, address))
        # Recorded after the plan and before the process starts: an agent dying in between
        # leaves an instance that reports LOST instead of a directory nobody recognises.
        write_json(directory / INSTANCE_FILE, record.to_json())
        try:
            if network is not None:
                podnet.create(directory, network)
            process = self._spawner.start_runner(
                directory,
                startup_seconds=offer.startup_seconds,
                log_file=directory / RUNNER_LOG_FILE,
                cwd=PACKAGE_ROOT,
                namespace=network.namespace if network is not None else None,
            )
        except (OSError, RuntimeError) as exc:  # PodNetworkError included
            podnet.remove(directory)
            shutil.rmtree(directory, ignore_errors=True)
            raise Transient(f"cannot start the local pod: {exc}", provider=self.name) from exc
        record = dataclasses.replace(record, process=process)
        write_json(directory / INSTANCE_FILE, record.to_json())
        log.info("started %s for pod %s (pid %d)", directory.name, spec.pod_uid, process.pid)
        instance = self._observe(directory)
        assert instance is not None  # we just wrote it
        return instance

    def _scan(self) -> list[tuple[Record, Instance]]:
        """Every instance in one directory scan; TERMINATED ones are forgotten on the way.
        Rebuilds the index (another process may have made or removed instances)."""
        found: list[tuple[Record, Instance]] = []
        index: dict[str, set[str]] = {}
        with os.scandir(self._state_dir) as entries:  # names and types in one read
            names = sorted(
                e.name
                for e in entries
                if INSTANCE_ID.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
            )
        for name in names:
            if name in self._claims:
                continue  # being written by a create under way: listed once it is whole
            directory = self._state_dir / name
            observed = self._observations.observe(directory, partial(self._read, directory))
            if observed is None:
                continue
            record, instance = observed
            if instance.state is InstanceState.TERMINATED:
                self._release(directory)
                continue
            found.append((record, instance))
            if instance.state in ACTIVE:
                index.setdefault(record.sku, set()).add(record.instance_id)
        for instance_id, sku in self._claims.items():  # creates under way hold their room
            index.setdefault(sku, set()).add(instance_id)
        self._index = index
        self._observations.keep_only(self._state_dir / r.instance_id for r, _ in found)
        return found

    def _unindex(self, instance_id: str) -> None:
        for ids in (self._index or {}).values():
            ids.discard(instance_id)

    def _active_by_sku(self, look_at: str | None = None) -> dict[str, int]:
        """Active instances per sku, from the index. With ``look_at``, that sku's indexed
        instances are looked at first and the ended ones leave the index (only that sku's
        files are read); otherwise nothing is read."""
        if self._index is None:
            self._scan()
        assert self._index is not None
        if look_at is not None:
            ids = self._index.get(look_at, set())
            for instance_id in list(ids):
                if instance_id in self._claims:
                    continue  # a create under way: not whole yet, and it holds its room
                instance = self._observe(self._state_dir / instance_id)
                if instance is None or instance.state not in ACTIVE:
                    ids.discard(instance_id)
        return {sku: len(ids) for sku, ids in self._index.items()}
