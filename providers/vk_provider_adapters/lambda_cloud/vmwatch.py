"""What runs on each active Lambda VM: one SSH probe per VM per poll, remembered between polls.

Lambda's API only knows the VM. ``VmWatch`` refines each *active* instance (API state RUNNING)
with what its VM says over SSH (``remote``, through the ``ssh.VmShell`` seam) and the table of
``vmstate``; every other API state passes through as it is (booting → PENDING, terminating,
terminated, preempted). Per instance it remembers, in memory only:

- when it was first seen active and last reached, so that a VM the agent cannot reach for
  ``unreachable_seconds`` becomes LOST (its pod fails, the agent terminates it: an unobservable
  VM must not bill forever). Before that, a VM never reached reads PENDING ("waiting to reach
  it over SSH"); one reached before keeps its last state in ``list_ours`` and makes ``get``
  raise ``Transient`` (so the pod keeps its status; never ``NotFound``);
- its last verdict, every container's status and the published ports' endpoints included
  (a VM that stops answering for a while keeps them, as it keeps its containers' states:
  Docker keeps the ports published while the sandbox runs); an EXITED or LOST one is final (an
  ended pod never starts again on its VM: Docker restarted its containers while it ran), so
  an exited pod is reported EXITED even if the VM stops answering while it is released;
- whether the VM may still wait for its secret environment's passphrase, which is then sent on
  the probe's standard input (the probe stores it only while the boot script waits for it).

Cost: ``observe_all`` probes every active instance concurrently, at most ``concurrency`` at a
time, each probe within ``connect_timeout + command_timeout`` (waiting for a slot included),
so a poll is one Lambda API call plus at most one SSH round trip per active VM, bounded.

**Threat model of the secret env values** (``EnvVar.secret``):

- *Lambda's instance metadata and user_data* (kept by Lambda, readable by the VM's metadata
  service, by any process on the VM including the pod's container, and in cloud-init's files):
  they carry the secret values only sealed (``vk_provider_adapters.sealed_env``), never the
  passphrase.
- *The network between the agent and the VM*: the passphrase travels only over SSH to a host
  whose key the agent derived for that VM and handed to it in user_data
  (``agentkey``): a machine in the middle has no such key, so it learns nothing and the agent
  sends nothing to it. Residual risk, accepted: someone who can both read the VM's user_data
  (it holds the VM's private host key) *and* intercept the agent's traffic to that VM can
  impersonate it and get that one VM's passphrase. (Tools that skip host-key checking give
  it to the interceptor alone.)
- *The VM itself*: the opened values sit in root-only files until ``docker run`` has them,
  then only in Docker's own container config (root-only), as with any Docker secret in env.
  The container gets them, as it must.
- *The agent*: its SSH private key derives every VM's keys; it is the secret to protect (a
  ``SecretRef``, or a 0600 file in the provider's state directory).

Invariants: nothing here raises ``NotFound`` for an SSH failure; no secret is in a message.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from vk_provider.sdk import Instance, InstanceState, LogOptions, NotFound, Transient
from vk_provider_adapters.docker_run import sandbox_name_for
from vk_provider_adapters.lambda_cloud.agentkey import AgentKey
from vk_provider_adapters.lambda_cloud.remote import VmReport
from vk_provider_adapters.lambda_cloud.ssh import VmShell, VmTarget
from vk_provider_adapters.lambda_cloud.vmstate import verdict

Clock = Callable[[], float]

_FINAL: Final = frozenset({InstanceState.EXITED, InstanceState.LOST})
_GONE: Final = frozenset({InstanceState.TERMINATING, InstanceState.TERMINATED, InstanceState.LOST})
# Boot phases in which the VM may (still) wait for the passphrase.
_KEY_PHASES: Final = frozenset({"", "setup", "waiting-key"})


@dataclass(slots=True)
class _Seen:
    first_active: float
    last_reached: float | None = None
    last: Instance | None = None
    final: Instance | None = None
    key_due: bool = True


class VmWatch:
    """The SSH view of the active instances (see the module docstring)."""

    def __init__(
        self,
        *,
        shell: VmShell,
        key: AgentKey,
        user: str,
        port: int,
        state_dir: str,
        clock: Clock,
        unreachable_seconds: float,
        probe_seconds: float,
        concurrency: int,
    ) -> None:
        self._shell = shell
        self._key = key
        self._user = user
        self._port = port
        self._state_dir = state_dir
        self._clock = clock
        self._unreachable_seconds = unreachable_seconds
        self._probe_seconds = probe_seconds
        self._slots = asyncio.Semaphore(concurrency)
        self._seen: dict[str, _Seen] = {}

    def target(self, instance: Instance) -> VmTarget:
        request_id = f"{instance.pod_uid}.{instance.attempt}"
        return VmTarget(
            instance_id=instance.instance_id,
            host=instance.ip or "",
            port=self._port,
            user=self._user,
            host_key=self._key.host_key(request_id).public,
            container=sandbox_name_for(request_id),
            state_dir=self._state_dir,
        )

    async def observe(self, instance: Instance, *, strict: bool) -> Instance:
        """``instance`` (as Lambda's API reports it) refined by its VM. ``strict``: a VM
        reached before that does not answer now raises ``Transient`` instead of repeating
        its last state."""
        if instance.state is not InstanceState.RUNNING or not instance.ip:
            if instance.state in _GONE:
                await self.forget(instance.instance_id)
            return instance
        seen = self._seen.get(instance.instance_id)
        if seen is None:
            seen = self._seen[instance.instance_id] = _Seen(first_active=self._clock())
        if seen.final is not None:
            return seen.final
        target = self.target(instance)
        passphrase = self._key.env_passphrase(_request_id(instance)) if seen.key_due else None
        try:
            report = await asyncio.wait_for(self._probe(target, passphrase), self._probe_seconds)
        except TimeoutError:
            error = Transient(
                f"Lambda VM of {instance.instance_id}: no SSH answer within "
                f"{self._probe_seconds:g}s",
                provider=instance.provider,
            )
            return self._unreachable(instance, seen, error, strict=strict)
        except Transient as exc:
            return self._unreachable(instance, seen, exc, strict=strict)
        found = verdict(report, ip=instance.ip)
        if found.state is None:
            error = Transient(f"Lambda VM of {instance.instance_id}: {found.message}")
            return self._unreachable(instance, seen, error, strict=strict)
        seen.last_reached = self._clock()
        seen.key_due = not report.created and report.phase in _KEY_PHASES
        refined = dataclasses.replace(
            instance,
            state=found.state,
            message=_joined(instance.message, found.message),
            exit_code=found.exit_code,
            started_at=found.started_at,
            finished_at=found.finished_at,
            containers=found.containers,
            init_containers=found.init_containers,
            endpoints=found.endpoints,
        )
        seen.last = refined
        if refined.state in _FINAL:
            seen.final = refined
        return refined

    async def observe_all(self, instances: Sequence[Instance]) -> list[Instance]:
        """Every instance refined, the active ones probed concurrently; what is no longer
        listed is forgotten (its connection closed)."""
        refined = await asyncio.gather(*(self.observe(i, strict=False) for i in instances))
        listed = {i.instance_id for i in instances}
        for gone in [known for known in self._seen if known not in listed]:
            await self.forget(gone)
        return list(refined)

    async def logs(self, instance: Instance, options: LogOptions) -> AsyncIterator[bytes]:
        """One container's output (``docker logs`` on the VM of ``options.container``, the
        first app container when None), cut at ``limit_bytes``."""
        if instance.state is not InstanceState.RUNNING or not instance.ip:
            raise NotFound(
                f"Lambda instance {instance.instance_id} has no running VM to read logs from "
                f"({instance.message or instance.state.value})",
                provider=instance.provider,
            )
        left = options.limit_bytes
        async for chunk in self._shell.logs(self.target(instance), options):
            if left is not None:
                chunk = chunk[:left]
                left -= len(chunk)
            if chunk:
                yield chunk
            if left is not None and left <= 0:
                return

    async def forget(self, instance_id: str) -> None:
        self._seen.pop(instance_id, None)
        await self._shell.forget(instance_id)

    async def close(self) -> None:
        self._seen.clear()
        await self._shell.close()

    # --- internals ----------------------------------------------------------------------

    async def _probe(self, target: VmTarget, passphrase: str | None) -> VmReport:
        async with self._slots:  # bounded concurrency; the wait counts against the budget
            return await self._shell.probe(target, passphrase=passphrase)

    def _unreachable(
        self, instance: Instance, seen: _Seen, error: Transient, *, strict: bool
    ) -> Instance:
        since = seen.last_reached if seen.last_reached is not None else seen.first_active
        waited = self._clock() - since
        if waited >= self._unreachable_seconds:
            lost = dataclasses.replace(
                instance,
                state=InstanceState.LOST,
                message=f"the agent has not reached the VM over SSH for {waited:.0f}s "
                f"(is port {self._port} open to the agent?): {error}",
            )
            seen.final = lost
            return lost
        if seen.last is None:
            return dataclasses.replace(
                instance,
                state=InstanceState.PENDING,
                message=_joined(
                    instance.message, f"the VM is up; waiting to reach it over SSH: {error}"
                ),
            )
        if strict:
            raise error
        last = seen.last
        return dataclasses.replace(
            instance,
            state=last.state,
            exit_code=last.exit_code,
            started_at=last.started_at,
            finished_at=last.finished_at,
            containers=last.containers,
            init_containers=last.init_containers,
            endpoints=last.endpoints,
            message=_joined(last.message, f"not reachable over SSH just now: {error}"),
        )


def _request_id(instance: Instance) -> str:
    return f"{instance.pod_uid}.{instance.attempt}"


def _joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)
