"""Container logs behind the kubelet API (``PodLogSource``): which provider, which instance,
which container, and ``kubectl logs --previous`` for both kinds of provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.unit.fake_kube import FakeKube
from vk_provider.api.kubelet import LogsNotFound, LogsUnavailable
from vk_provider.api.podlogs import AttemptHistory, PodLogSource
from vk_provider.domain.errors import NotFound
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    WorkloadSpec,
)
from vk_provider.domain.podview import PodView
from vk_provider.kube.client import KubeClient

NODE = "vk-node"


@dataclass
class LogProvider:
    name: str
    capabilities: Capabilities
    logs_by_instance: dict[tuple[str, bool], list[bytes]] = field(default_factory=dict)
    asked: list[tuple[str, LogOptions]] = field(default_factory=list)

    async def offers(self) -> list[Offer]:
        return []

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        raise NotImplementedError

    async def get(self, instance_id: str) -> Instance:
        raise NotImplementedError

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        return None

    async def list_ours(self) -> list[Instance]:
        return []

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        self.asked.append((instance_id, options))
        chunks = self.logs_by_instance.get((instance_id, options.previous))
        if chunks is None:
            raise NotFound(f"no logs of {instance_id}")
        for chunk in chunks:
            yield chunk

    async def close(self) -> None:
        return None


def a_view(instance: str, provider: str) -> PodView:
    return PodView.parse(a_pod(instance, provider))


def a_pod(instance_id: str, provider: str, uid: str = "u-1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web",
            "uid": uid,
            "annotations": {
                "vk-provider.io/provider": provider,
                "vk-provider.io/instance-id": instance_id,
            },
        },
        "spec": {
            "nodeName": NODE,
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "main"}, {"name": "side"}],
        },
    }


async def read(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def source(
    kube: FakeKube, *providers: LogProvider, history: AttemptHistory | None = None,
    instances: list[Instance] | None = None,
) -> PodLogSource:  # fmt: skip
    return PodLogSource(
        cast(KubeClient, kube),
        {p.name: p for p in providers},
        node_name=NODE,
        history=history,
        instances=lambda uid: [i for i in instances or [] if i.pod_uid == uid],
    )


async def test_the_container_asked_for_is_passed_to_the_provider(kube: FakeKube) -> None:
    local = LogProvider("local-a", Capabilities(previous_logs=True))
    local.logs_by_instance[("i-1", False)] = [b"side says hi\n"]
    await kube.create_pod(a_pod("i-1", "local-a"))
    chunks = await source(kube, local).open_logs("ns", "web", "side", LogOptions(follow=True))
    assert await read(chunks) == b"side says hi\n"
    assert local.asked == [("i-1", LogOptions(follow=True, container="side"))]


async def test_init_containers_have_logs_unknown_containers_do_not(kube: FakeKube) -> None:
    local = LogProvider("local-a", Capabilities())
    local.logs_by_instance[("i-1", False)] = [b"fetched\n"]
    await kube.create_pod(a_pod("i-1", "local-a"))
    logs = source(kube, local)
    assert await read(await logs.open_logs("ns", "web", "init", LogOptions())) == b"fetched\n"
    with pytest.raises(LogsNotFound, match="container db is not valid"):
        await logs.open_logs("ns", "web", "db", LogOptions())


async def test_previous_from_a_provider_that_restarts_containers_itself(kube: FakeKube) -> None:
    local = LogProvider("local-a", Capabilities(previous_logs=True))
    local.logs_by_instance[("i-1", True)] = [b"the run before\n"]
    await kube.create_pod(a_pod("i-1", "local-a"))
    asked = LogOptions(previous=True, follow=True, tail_lines=5)
    chunks = await source(kube, local).open_logs("ns", "web", "main", asked)
    assert await read(chunks) == b"the run before\n"
    # Never followed: that run is over.
    assert local.asked == [("i-1", LogOptions(previous=True, tail_lines=5, container="main"))]


async def test_no_previous_run_is_an_error_before_the_response(kube: FakeKube) -> None:
    local = LogProvider("local-a", Capabilities(previous_logs=True))
    await kube.create_pod(a_pod("i-1", "local-a"))
    with pytest.raises(LogsUnavailable, match='previous terminated container "main" in pod'):
        await source(kube, local).open_logs("ns", "web", "main", LogOptions(previous=True))


async def test_previous_of_a_single_container_provider_is_the_previous_instance(
    kube: FakeKube,
) -> None:
    cloud = LogProvider("cloud-b", Capabilities())
    cloud.logs_by_instance[("i-1", False)] = [b"attempt 0 crashed\n"]
    cloud.logs_by_instance[("i-2", False)] = [b"attempt 1 runs\n"]
    history = AttemptHistory()
    history.observe(a_view("i-1", "cloud-b"))
    history.observe(a_view("i-2", "cloud-b"))
    await kube.create_pod(a_pod("i-2", "cloud-b"))
    logs = source(kube, cloud, history=history)
    chunks = await logs.open_logs("ns", "web", "main", LogOptions(previous=True))
    assert await read(chunks) == b"attempt 0 crashed\n"
    assert cloud.asked[-1] == ("i-1", LogOptions(container="main"))
    assert await read(await logs.open_logs("ns", "web", "main", LogOptions())) == (
        b"attempt 1 runs\n"
    )


async def test_previous_instance_gone_at_its_provider_is_a_clear_400(kube: FakeKube) -> None:
    cloud = LogProvider("cloud-b", Capabilities())
    history = AttemptHistory()
    history.observe(a_view("i-1", "cloud-b"))
    history.observe(a_view("i-2", "cloud-b"))
    await kube.create_pod(a_pod("i-2", "cloud-b"))
    with pytest.raises(LogsUnavailable, match="previous terminated container"):
        await source(kube, cloud, history=history).open_logs(
            "ns", "web", "main", LogOptions(previous=True)
        )


async def test_after_an_agent_restart_an_older_attempt_still_listed_will_do(
    kube: FakeKube,
) -> None:
    cloud = LogProvider("cloud-b", Capabilities())
    cloud.logs_by_instance[("i-old", False)] = [b"older\n"]
    await kube.create_pod(a_pod("i-new", "cloud-b"))
    listed = [
        Instance("cloud-b", "i-old", "u-1", attempt=3, state=InstanceState.EXITED),
        Instance("cloud-b", "i-older", "u-1", attempt=2, state=InstanceState.EXITED),
        Instance("cloud-b", "i-new", "u-1", attempt=4, state=InstanceState.RUNNING),
        Instance("cloud-b", "i-other", "u-2", attempt=3, state=InstanceState.EXITED),
    ]
    chunks = await source(kube, cloud, instances=listed).open_logs(
        "ns", "web", "main", LogOptions(previous=True)
    )
    assert await read(chunks) == b"older\n"


async def test_a_first_attempt_has_no_previous(kube: FakeKube) -> None:
    cloud = LogProvider("cloud-b", Capabilities())
    history = AttemptHistory()
    history.observe(a_view("i-1", "cloud-b"))
    await kube.create_pod(a_pod("i-1", "cloud-b"))
    with pytest.raises(LogsUnavailable, match="previous terminated container"):
        await source(kube, cloud, history=history).open_logs(
            "ns", "web", "main", LogOptions(previous=True)
        )


def test_the_history_keeps_a_few_attempts_per_pod() -> None:
    history = AttemptHistory()
    for attempt in range(10):
        history.observe(a_view(f"i-{attempt}", "cloud-b"))
        history.observe(a_view(f"i-{attempt}", "cloud-b"))  # the same twice: once
    assert history.before("u-1", ("cloud-b", "i-9")) == ("cloud-b", "i-8")
    assert history.before("u-1", ("cloud-b", "i-6")) is None  # forgotten: only four kept
    history.observe(None)
    history.observe(
        PodView.parse({"metadata": {"uid": "u-2"}})
    )  # not placed yet: nothing to remember
    assert history.before("u-2", ("cloud-b", "x")) is None
    history.forget("u-1")
    assert history.before("u-1", ("cloud-b", "i-9")) is None
