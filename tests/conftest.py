"""Shared fixtures.

The control plane is real and started once per test session (``control_plane``); each
integration test gets its own namespace (``namespace``) and API client (``kube``). Tests clean
up cluster-scoped objects they create; namespaced objects go with the namespace.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real etcd + kube-apiserver + controller-manager + scheduler for the whole session."""
    root = tmp_path_factory.mktemp("state")
    cluster = LocalCluster(f"vkt-{os.getpid()}", root=root)
    try:
        cluster.up(ensure_binaries())
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def kubeconfig(control_plane: LocalCluster) -> Path:
    return control_plane.kubeconfig


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[ApiClient]:
    """An API client with admin rights, closed after the test."""
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@contextlib.asynccontextmanager
async def fresh_namespace(kube: ApiClient) -> AsyncIterator[str]:
    """A fresh namespace whose default ServiceAccount exists (so pods can be admitted),
    deleted afterwards."""
    core = client.CoreV1Api(kube)
    name = f"t-{uuid.uuid4().hex[:10]}"
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    async def default_sa_exists() -> bool:
        accounts = await core.list_namespaced_service_account(name)
        return any(sa.metadata.name == "default" for sa in accounts.items)

    await wait_for(default_sa_exists, what=f"ServiceAccount default in {name}")
    try:
        yield name
    finally:
        await core.delete_namespace(name)


@pytest.fixture
async def namespace(kube: ApiClient) -> AsyncIterator[str]:
    """A fresh namespace for the test (``fresh_namespace``)."""
    async with fresh_namespace(kube) as name:
        yield name
