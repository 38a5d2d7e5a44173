"""The Lambda Cloud provider: one Lambda VM per pod, running the whole pod on it.

Lambda rents whole VMs (API 1.8.3, its published document is
``tests/fixtures/provider-apis/lambda-cloud-openapi-1.8.3.json``).
The pod runs on the VM through cloud-init ``user_data`` built by ``vk_provider_adapters.cloud_init``
(Docker with the NVIDIA runtime, set up by ``vk_provider_adapters.boot_script``): every container as
a Docker container sharing one network namespace and the pod's emptyDir volumes, init containers in
order before the app containers, sidecars beside them, restarts by Docker as the pod's restartPolicy
says (``vk_provider_adapters.docker_run``). Hence the capabilities ``multi_container``,
``init_containers`` and ``sidecars``; ``probes`` stays ``none`` (the agent cannot reach the
containers' ports) and ``previous_logs`` false (Docker keeps one log per container across its
restarts). Offers come from ``GET /instance-types`` (``vk_provider_adapters.lambda_cloud.offers``).

Layers, top to bottom: ``LambdaCloudProvider`` (the contract) → pure builders and parsers of
the API's payloads (``offers``, ``instances``, ``sshkeys``, ``envelope``) → one thin call
(``_call``) that rate-limits (``ratelimit``), sends through ``vk_provider_adapters.http.JsonApi``
under the shared ``RetryPolicy`` and unwraps ``{"data": ...}``. Every failure becomes a
``domain.errors`` class in one function, ``envelope.classify_failure``. Beside the API, the VMs
themselves are read over SSH: ``vmwatch`` (what to ask, what it means, when to give up) → ``ssh``
(asyncssh, one connection per VM) with keys from ``agentkey``.

Decisions (each has a test):

- **Idempotent create.** Lambda has no idempotency key: ``create`` first lists the account
  and returns an instance already tagged with the request id. A launch this process made in
  the last ``LAUNCH_VISIBILITY_SECONDS`` counts too, so an instance the list does not show yet
  is not launched twice (``get`` reports it PENDING for that long instead of ``NotFound``).
  A launch is never retried after the request may have reached Lambda (5xx, read timeout):
  that raises ``Transient``, and the agent's next ``create`` looks for the instance first.
- **The containers' states come from the VM.** Lambda's API reports the VM, not the
  containers, and has no logs API: ``get`` and ``list_ours`` refine each active VM with one
  SSH probe of it (``docker inspect`` of every container of the pod, named for the request id
  and the container, and the boot script's phase; ``vmwatch``, ``vmstate``), so the instance
  reports each container as a kubelet would (state, exit code, restart count), is RUNNING
  once its containers are created, EXITED with the pod's exit code when the pod has ended
  (releasing the pod terminates the VM: nothing here keeps it), and ``logs`` streams ``docker
  logs`` of the container asked for over SSH. No Lambda credential goes to the VM.
- **The agent's own SSH key.** Launches name ``ssh_key_name``, the agent's public key, which
  ``create`` registers through the SSH-key API when the account has no key of that name (once
  per process; again after a launch failed, in case the key was deleted). A key of that name
  with another public key is ``AuthFailed``: every VM launched with it would be unreadable.
  People's keys reach the VMs through cloud-init (``authorized_keys``).
- **Secret env values** never sit in plain ``user_data``: they are sealed to a passphrase that
  only the agent can derive and that it delivers to the VM over SSH (the threat model is in
  ``vmwatch``).
- **Rate limits.** Requests are spaced ``request_interval`` (1 s) apart and launches
  ``launch_interval`` (12 s) apart, client-side; a 429 pushes every later request back by its
  ``Retry-After`` (or the first back-off). 429, 5xx and connection errors are retried a few
  times with capped exponential waits (``DEFAULT_RETRY``); a ``Retry-After`` longer than
  ``max_retry_after_seconds`` is handed to the agent as ``RateLimited`` instead.
- **Traffic follows the pods** (``Instance.endpoints``). Every declared container port is
  published on the same port of the VM (``vk_provider_adapters.docker_run``); a RUNNING
  instance lists, at the VM's public ``ip``, each TCP and UDP port its sandbox publishes
  right now, as the probe reads it from Docker (``vmstate``), never from the spec alone.
  With ``firewall`` configured, ``create`` first makes sure the adapter's own firewall
  ruleset of the offer's region lets ``source_cidrs`` in to the pod's ports and the agent to
  SSH, and names it in the launch (``firewall``, which says why a ruleset and not the
  account's rules); a firewall failure fails the create before any VM exists. Without it,
  the account's rules decide whether the listed ports are reachable.
- ``delete`` terminates the VM: Lambda has no graceful stop, so ``grace_seconds`` only buys
  what the VM's own shutdown gives Docker. A repeated delete within
  ``TERMINATE_REPEAT_SECONDS`` sends nothing (the agent polls delete while TERMINATING).
  "Not found" means done, except for an instance this process launched moments ago, which
  Lambda may not show yet: that is ``Transient``, so the agent terminates it again.

Invariants: the API key is read once (``SecretRef.resolve``) and lives only in the
``Authorization`` header; no message, log line or ``repr`` contains it (server-provided text
is scrubbed of it too), nor the agent's SSH private key. Nothing but ``domain.errors`` escapes
a public method.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import httpx

from vk_provider.sdk import (
    Capabilities,
    CapacityUnavailable,
    ConfigError,
    Instance,
    InstanceState,
    LogOptions,
    NotFound,
    Offer,
    ProviderError,
    RateLimited,
    Redactor,
    Transient,
    WorkloadSpec,
)
from vk_provider_adapters.cloud_init import STATE_DIR, build_user_data
from vk_provider_adapters.docker_run import all_ports, pod_containers
from vk_provider_adapters.http import Classify, ErrorAnswer, JsonApi, answered_status, never_sent
from vk_provider_adapters.lambda_cloud.agentkey import AgentKey
from vk_provider_adapters.lambda_cloud.config import LambdaProviderConfig
from vk_provider_adapters.lambda_cloud.envelope import Operation, classify_failure, parse_data
from vk_provider_adapters.lambda_cloud.firewall import (
    UNFIREWALLED_REGIONS,
    FirewallOperation,
    ensure_ruleset,
    wanted_rules,
)
from vk_provider_adapters.lambda_cloud.instances import (
    TAG_VALUE_MAX,
    launch_request,
    parse_instance,
    parse_instances,
    parse_launch,
)
from vk_provider_adapters.lambda_cloud.offers import parse_offers
from vk_provider_adapters.lambda_cloud.ratelimit import Clock, RateLimiter
from vk_provider_adapters.lambda_cloud.ssh import SshVmShell, VmShell
from vk_provider_adapters.lambda_cloud.sshkeys import KeyOperation, ensure_registered
from vk_provider_adapters.lambda_cloud.vmwatch import VmWatch
from vk_provider_adapters.transport import RetryPolicy, Sleep

log = logging.getLogger(__name__)

LAUNCH_VISIBILITY_SECONDS: Final = 300.0
TERMINATE_REPEAT_SECONDS: Final = 30.0
# Lambda's limits: backoff from 1 s doubling up to 16 s; a server asking for a pause longer
# than 30 s gets it from the agent's queue, not from a coroutine that holds a worker.
DEFAULT_RETRY: Final = RetryPolicy(
    attempts=4, backoff_seconds=1.0, max_backoff_seconds=16.0, max_retry_after_seconds=30.0
)


_FIREWALL_METHODS: Final[Mapping[FirewallOperation, Literal["GET", "POST", "PATCH"]]] = {
    "list firewall rulesets": "GET",
    "create firewall ruleset": "POST",
    "update firewall ruleset": "PATCH",
}


@dataclass(frozen=True, slots=True)
class _Call:
    operation: Operation
    method: Literal["GET", "POST", "PATCH"]
    path: str
    body: Mapping[str, object] | None = None

    @property
    def launch(self) -> bool:
        return self.operation == "launch"

    @property
    def idempotent(self) -> bool:
        # A launch (or a key or a ruleset added) that may have reached Lambda must not be sent
        # again: it could make a second VM or ruleset (or fail as a duplicate). Reads,
        # terminate and a ruleset's update (the whole rule list, again) are safe.
        return self.operation not in ("launch", "add ssh key", "create firewall ruleset")


@dataclass(frozen=True, slots=True)
class _Launched:
    instance: Instance
    at: float


class LambdaCloudProvider:
    """``domain.contract.Provider`` on Lambda Cloud VMs (see the module docstring)."""

    def __init__(
        self,
        config: LambdaProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        retry: RetryPolicy | None = None,
        request_interval: float = 1.0,
        launch_interval: float = 12.0,
        state_dir: Path | None = None,
        vm_shell: VmShell | None = None,
        vm_state_dir: str = STATE_DIR,
    ) -> None:
        """``state_dir`` keeps a generated SSH key; ``vm_shell`` is the test seam of SSH
        (None: ``SshVmShell``); ``vm_state_dir`` is the boot script's directory on the VM."""
        if len(config.name) > TAG_VALUE_MAX:
            raise ConfigError(
                f"provider {config.name[:40]!r}...: the name is a Lambda tag value, at most "
                f"{TAG_VALUE_MAX} characters"
            )
        api_key = config.api_key.resolve()  # ConfigError names the reference, not the value
        if not api_key:
            raise ConfigError(f"credential {config.api_key.ref}: is empty")
        self._agent_key = AgentKey.load(
            reference=config.ssh_private_key, state_dir=state_dir, provider=config.name
        )
        self._config = config
        self._clock = clock
        self._vm_state_dir = vm_state_dir
        self._watch = VmWatch(
            shell=vm_shell
            or SshVmShell(
                client_key=self._agent_key.ssh_key,
                provider=config.name,
                connect_timeout=config.ssh_connect_timeout_seconds,
                command_timeout=config.ssh_command_timeout_seconds,
            ),
            key=self._agent_key,
            user=config.ssh_user,
            port=config.ssh_port,
            state_dir=vm_state_dir,
            clock=clock,
            unreachable_seconds=config.ssh_unreachable_seconds,
            probe_seconds=config.ssh_connect_timeout_seconds + config.ssh_command_timeout_seconds,
            concurrency=config.ssh_concurrency,
        )
        self._key_registered = False
        self._unfirewalled_warned: set[str] = set()  # regions warned about, once each
        # One simulated clock in tests: the retries sleep as the rate limiters do.
        self._retry = dataclasses.replace(retry or DEFAULT_RETRY, sleep=sleep)
        self._requests = RateLimiter(request_interval, clock=clock, sleep=sleep)
        self._launches = RateLimiter(launch_interval, clock=clock, sleep=sleep)
        self._api = JsonApi(
            provider=config.name,
            label="Lambda",
            classify=self._classify("get instance"),
            redactor=Redactor((api_key,)),
            retry=self._retry,
            timeout=config.timeout_seconds,
            base_url=config.base_url,
            auth_headers={"Authorization": f"Bearer {api_key}"},
            headers={"User-Agent": "vk-provider"},
            transport=transport,
            logger=log,
        )
        # One create at a time: the look-up of a request id and its launch must not
        # interleave with another create of the same request (launches are 12 s apart anyway).
        self._create_lock = asyncio.Lock()
        self._launched: dict[str, _Launched] = {}  # by instance id
        self._terminate_sent: dict[str, float] = {}  # by instance id

    def __repr__(self) -> str:
        return f"LambdaCloudProvider(name={self.name!r}, base_url={self._config.base_url!r})"

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        # The whole pod runs on its VM (vk_provider_adapters.docker_run): Docker restarts each
        # container as the restartPolicy says and keeps no previous run's output apart from the
        # current one's, so --previous has nothing to show. Nobody can probe the containers: the
        # VM's ports are not the agent's to reach.
        return Capabilities(
            logs=True,
            follow_logs=True,
            log_timestamps=True,
            multi_container=True,
            init_containers=True,
            sidecars=True,
        )

    async def offers(self) -> list[Offer]:
        data = await self._call(_Call("list instance types", "GET", "/instance-types"))
        with self._api.readable("list instance types"):
            return parse_offers(
                data,
                provider=self.name,
                instance_types=self._config.instance_types,
                regions=self._config.regions,
                max_price_per_hour=self._config.max_price_per_hour,
            )

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        if offer.provider != self.name:
            raise CapacityUnavailable(f"offer {offer.key} is not {self.name}'s", provider=self.name)
        # Everything that can refuse the spec runs before any request.
        user_data = build_user_data(
            spec,
            gpus=spec.gpu_count > 0 and offer.gpu_count > 0,
            provider=self.name,
            state_dir=self._vm_state_dir,
            secret_passphrase=self._agent_key.env_passphrase(spec.request_id),
            host_key=self._agent_key.host_key(spec.request_id),
            authorized_keys=self._config.authorized_keys,
            pause_image=self._config.pause_image,
        )
        body = launch_request(spec, offer, config=self._config, user_data=user_data)
        # Every container's secret env values are only sealed in user_data; should an answer
        # echo any of them anyway, no log line or message may carry it.
        redact = self._api.redactor.with_secrets(spec.secret_values)
        async with self._create_lock:
            existing = await self._find(spec, redact)
            if existing is not None:
                return await self._watch.observe(existing, strict=False)
            await self._ensure_ssh_key()
            # Before the launch: a firewall that fails leaves no VM behind.
            ruleset = await self._ensure_firewall(spec, offer, redact)
            if ruleset is not None:
                body = launch_request(
                    spec, offer, config=self._config, user_data=user_data, own_ruleset=ruleset
                )
            try:
                data = await self._call(
                    _Call("launch", "POST", "/instance-operations/launch", body=body), redact
                )
            except CapacityUnavailable:
                self._key_registered = False  # the key may be what is missing: look again
                raise
            with self._api.readable("launch"):
                instance_id = parse_launch(data)
            log.info(
                "%s: launched %s (%s in %s) for pod %s attempt %d",
                self.name,
                instance_id,
                offer.sku,
                offer.region,
                spec.pod_uid,
                spec.attempt,
            )
            instance = Instance(
                provider=self.name,
                instance_id=instance_id,
                pod_uid=spec.pod_uid,
                attempt=spec.attempt,
                state=InstanceState.PENDING,
                offer_key=offer.key,
                message="launch requested",
                price_per_hour=offer.price_per_hour,
            )
            self._launched[instance_id] = _Launched(instance, self._clock())
            return instance

    async def get(self, instance_id: str) -> Instance:
        if not instance_id:
            raise NotFound("no Lambda instance has an empty id", provider=self.name)
        path = f"/instances/{urllib.parse.quote(instance_id, safe='')}"
        try:
            data = await self._call(_Call("get instance", "GET", path))
        except NotFound:
            recent = self._recent_launch(instance_id)
            if recent is None:
                raise
            return recent  # launched moments ago; Lambda's reads lag its writes
        with self._api.readable("get instance"):
            instance = parse_instance(data, provider=self.name)
        if instance is None:
            raise NotFound(f"Lambda instance {instance_id} is not one of ours", provider=self.name)
        return await self._watch.observe(instance, strict=True)

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        """Terminate the VM. Lambda has no graceful stop: ``grace_seconds`` cannot be honoured
        beyond what the VM's own shutdown gives Docker."""
        if not instance_id:
            return
        sent = self._terminate_sent.get(instance_id)
        if sent is not None and self._clock() - sent < TERMINATE_REPEAT_SECONDS:
            return  # asked moments ago; the termination is under way
        try:
            await self._call(
                _Call(
                    "terminate",
                    "POST",
                    "/instance-operations/terminate",
                    {"instance_ids": [instance_id]},
                )
            )
        except NotFound as exc:
            if self._recent_launch(instance_id) is not None:
                # Launched moments ago and not visible yet: "not found" is not "gone", and
                # taking it for done would leave a VM running.
                raise Transient(
                    f"Lambda does not show instance {instance_id} yet (launched moments ago); "
                    "terminate it again shortly",
                    provider=self.name,
                ) from exc
            return  # gone already: done
        self._launched.pop(instance_id, None)
        self._forget_old_terminations()
        self._terminate_sent[instance_id] = self._clock()
        log.info("%s: terminating %s", self.name, instance_id)
        await self._watch.forget(instance_id)

    async def list_ours(self) -> list[Instance]:
        """One API call, then at most one SSH probe per active VM, concurrently."""
        instances = await self._list()
        live = [i for i in instances if i.state is not InstanceState.TERMINATED]
        return await self._watch.observe_all(live)

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        """``docker logs`` of the container asked for, over SSH (``vmwatch``). There is no
        previous run's log (``Capabilities.previous_logs`` is false): Docker restarts a
        container in place and keeps one log across its runs."""
        if not instance_id:
            raise NotFound("no Lambda instance has an empty id", provider=self.name)
        if options.previous:
            raise NotFound(
                "Lambda keeps no previous run's log: Docker restarts a container in place, "
                "with one log across its runs",
                provider=self.name,
            )
        path = f"/instances/{urllib.parse.quote(instance_id, safe='')}"
        data = await self._call(_Call("get instance", "GET", path))
        with self._api.readable("get instance"):
            instance = parse_instance(data, provider=self.name)
        if instance is None:
            raise NotFound(f"Lambda instance {instance_id} is not one of ours", provider=self.name)
        async for chunk in self._watch.logs(instance, options):
            yield chunk

    async def close(self) -> None:
        try:
            await self._watch.close()
        finally:
            await self._api.aclose()

    # --- internals ------------------------------------------------------------------------

    async def _find(self, spec: WorkloadSpec, redact: Redactor) -> Instance | None:
        """The instance already made for ``spec.request_id``, if any (one list call)."""
        for instance in await self._list(redact):
            if (instance.pod_uid, instance.attempt) == (spec.pod_uid, spec.attempt):
                return instance
        # Not listed yet, but launched by this process moments ago: the list lags.
        self._forget_old_launches()
        for launched in self._launched.values():
            found = launched.instance
            if (found.pod_uid, found.attempt) == (spec.pod_uid, spec.attempt):
                return found
        return None

    async def _ensure_ssh_key(self) -> None:
        """The agent's public key is in the account under ``ssh_key_name`` (``sshkeys``)."""
        if self._key_registered:
            return

        async def call(operation: KeyOperation, body: Mapping[str, object] | None) -> object:
            method: Literal["GET", "POST"] = "GET" if body is None else "POST"
            return await self._call(_Call(operation, method, "/ssh-keys", body))

        with self._api.readable("ssh keys"):
            await ensure_registered(
                call, name=self._config.ssh_key_name, key=self._agent_key, provider=self.name
            )
        self._key_registered = True

    async def _ensure_firewall(
        self, spec: WorkloadSpec, offer: Offer, redact: Redactor
    ) -> str | None:
        """The id of the adapter's ruleset in the offer's region, letting in what the pod
        needs (``firewall``); None when no ruleset is to be named. ``redact``: the create's."""
        firewall = self._config.firewall
        if firewall is None:
            return None
        if offer.region in UNFIREWALLED_REGIONS:
            if offer.region not in self._unfirewalled_warned:
                self._unfirewalled_warned.add(offer.region)
                log.warning(
                    "%s: Lambda applies no firewall rules in %s; its VMs are launched without "
                    "the ruleset, and their ports are not limited to firewall.source_cidrs",
                    self.name,
                    offer.region,
                )
            return None
        wanted = wanted_rules(
            all_ports(pod_containers(spec)),
            ssh_port=self._config.ssh_port,
            source_cidrs=firewall.source_cidrs,
            ssh_source_cidrs=firewall.ssh_sources,
            provider=self.name,
        )

        async def call(
            operation: FirewallOperation, path: str, body: Mapping[str, object] | None
        ) -> object:
            method = _FIREWALL_METHODS[operation]
            return await self._call(_Call(operation, method, path, body), redact)

        with self._api.readable("firewall rulesets"):
            return await ensure_ruleset(
                call,
                name=firewall.name_for(self.name),
                region=offer.region,
                wanted=wanted,
                provider=self.name,
            )

    def _recent_launch(self, instance_id: str) -> Instance | None:
        self._forget_old_launches()
        launched = self._launched.get(instance_id)
        return None if launched is None else launched.instance

    def _forget_old_launches(self) -> None:
        now = self._clock()
        for key, launched in list(self._launched.items()):
            if now - launched.at > LAUNCH_VISIBILITY_SECONDS:
                del self._launched[key]

    def _forget_old_terminations(self) -> None:
        now = self._clock()
        for key, at in list(self._terminate_sent.items()):
            if now - at >= TERMINATE_REPEAT_SECONDS:
                del self._terminate_sent[key]

    async def _list(self, redact: Redactor | None = None) -> list[Instance]:
        data = await self._call(_Call("list instances", "GET", "/instances"), redact)
        with self._api.readable("list instances"):
            return parse_instances(data, provider=self.name)

    def _classify(self, operation: Operation) -> Classify:
        def classify(answer: ErrorAnswer) -> ProviderError:
            return classify_failure(operation, answer, provider=self.name, redact=answer.redact)

        return classify

    async def _call(self, call: _Call, redact: Redactor | None = None) -> object:
        """One API call: rate-limited, retried where safe; the ``data`` of its body.
        ``redact`` adds the secrets of the spec being created to the provider's."""

        async def attempt() -> httpx.Response:
            if call.launch:
                await self._launches.acquire()
            await self._requests.acquire()
            if call.launch:
                # The wait for the request slot delayed this launch: the next one counts from
                # now.
                self._launches.hold_off(self._launches.interval)
            try:
                return await self._api.send(
                    call.method,
                    call.path,
                    what=call.operation,
                    json_body=call.body,
                    classify=self._classify(call.operation),
                    redact=redact,
                )
            except RateLimited as exc:
                # Every caller waits, not just this one: the limit is the account's. Capped: a
                # longer pause is the agent's to take (RateLimited), not every caller's.
                pause = self._retry.backoff(1) if exc.retry_after is None else exc.retry_after
                self._requests.hold_off(min(pause, self._retry.max_retry_after_seconds))
                raise

        response = await self._api.retrying(attempt, retry=lambda exc: self._retryable(exc, call))
        document = self._api.decode(response, call.operation)
        with self._api.readable(call.operation):
            return parse_data(document)

    def _retryable(self, exc: BaseException, call: _Call) -> bool:
        """429 (when its pause is short) always; 5xx and lost connections only for calls
        that are safe to repeat; a connection that never opened even for a launch."""
        if isinstance(exc, RateLimited):
            return self._retry.waits_for(exc.retry_after)
        status = answered_status(exc)
        if status is not None:
            return status >= 500 and call.idempotent
        if isinstance(exc, Transient) and isinstance(exc.__cause__, httpx.TransportError):
            return call.idempotent or never_sent(exc)
        return False
