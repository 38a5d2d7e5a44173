"""Contract harness for the Modal provider: the adapter on the in-memory fake of its client.

Modal's native states are what ``poll()`` reports (None while running, else the exit code, 124
after a timeout, 137 after a termination); failures are the fake raising what the real client
(``vk_provider_adapters.modal.sdk.translate_error``) makes of Modal's exceptions. Retries wait
nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Literal

from tests.contract.harness import FailureKind
from tests.unit.fake_modal import FakeSandboxClient
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import InstanceState, Offer, WorkloadSpec
from vk_provider_adapters.modal.adapter import ModalProvider
from vk_provider_adapters.modal.config import ModalProviderConfig
from vk_provider_adapters.modal.identity import MANAGED_BY_TAG, POD_UID_TAG
from vk_provider_adapters.transport import RetryPolicy

# Enough failures to outlast every retry of one call.
_PERSISTENT = 100
_NO_WAIT = RetryPolicy(attempts=4, backoff_seconds=0.0, max_backoff_seconds=0.0)

# What the real client raises for each kind (see translate_error's table).
_FAILURES: Mapping[FailureKind, Callable[[], ProviderError]] = {
    "capacity": lambda: CapacityUnavailable("modal create: GPU quota exhausted"),
    "rate_limit": lambda: RateLimited("modal create: rate limit exceeded"),
    "transient": lambda: Transient("modal create: UNAVAILABLE"),
    "auth": lambda: AuthFailed("modal create: token is invalid"),
    "invalid": lambda: InvalidSpec("modal create: Invalid GPU config"),
}
_RETRIED = frozenset({"rate_limit", "transient"})


def contract_config() -> ModalProviderConfig:
    return ModalProviderConfig.model_validate(
        {
            "type": "modal",
            "name": "modal-contract",
            "token_id": "env:MODAL_TOKEN_ID",
            "token_secret": "env:MODAL_TOKEN_SECRET",
            "offers": [{"gpu": "H100", "price_per_hour": 3.95}],
        }
    )


class ModalHarness:
    name = "modal"
    native_states: Mapping[str, InstanceState] = {
        "running": InstanceState.RUNNING,
        "exit 0": InstanceState.EXITED,
        "exit 1": InstanceState.EXITED,
        "exit 124 (timeout)": InstanceState.LOST,
        "exit 137 (terminated by Modal)": InstanceState.LOST,
    }
    failure_kinds: frozenset[FailureKind] = frozenset(_FAILURES)

    def __init__(self) -> None:
        self._fake: FakeSandboxClient | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Provider]:
        self._fake = FakeSandboxClient()
        provider = ModalProvider(contract_config(), client=self._fake, retry=_NO_WAIT)
        try:
            yield provider
        finally:
            self._fake.clear_failures()
            await provider.close()
            self._fake = None

    def spec(self, pod_uid: str, attempt: int = 0) -> WorkloadSpec:
        return WorkloadSpec(
            pod_uid=pod_uid,
            namespace="ns",
            pod_name="p",
            containers=(
                ContainerSpec(
                    name="c",
                    image="vllm/vllm-openai:latest",
                    command=("python", "-m", "http.server"),
                ),
            ),
            gpu_count=1,
            attempt=attempt,
        )

    async def offer(self, provider: Provider) -> Offer:
        return (await provider.offers())[0]

    def unknown_instance_id(self) -> str:
        # "sb-" and 22 base62 characters, as Modal's sandbox ids (the fake's are all digits);
        # the fake raises what the real client makes of Modal's NotFoundError.
        sandbox_id = "sb-NeverCreatedSandbox000"
        assert sandbox_id not in self._require_fake().sandboxes
        return sandbox_id

    def add_foreign_instance(self) -> None:
        fake = self._require_fake()
        fake.add_foreign(name="someone-else")
        fake.add_foreign(tags={MANAGED_BY_TAG: "another-agent", POD_UID_TAG: "uid-other"})

    def set_native_state(self, instance_id: str, native: str) -> None:
        fake = self._require_fake()
        if native == "running":
            fake.revive(instance_id)
        else:
            fake.finish(instance_id, int(native.split()[1]))

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        times = _PERSISTENT if kind in _RETRIED else 1
        self._require_fake().fail(operation, _FAILURES[kind](), times=times)

    def _require_fake(self) -> FakeSandboxClient:
        assert self._fake is not None, "use inside running()"
        return self._fake


HARNESS = ModalHarness()
