"""The local control plane is real: controllers, scheduler and RBAC all act.

Each test would fail against an API server without the component it names.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _deployment(name: str, replicas: int) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="main", image="example/inference:1")],
                    # No node can run these pods; keep the scheduler from binding them anywhere.
                    node_selector={"vk-test/none": "true"},
                ),
            ),
        ),
    )


async def test_deployment_creates_replicaset_and_pods(kube: ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(kube)
    core = client.CoreV1Api(kube)
    await apps.create_namespaced_deployment(namespace, _deployment("web", replicas=3))

    async def replica_sets() -> list[client.V1ReplicaSet]:
        return list((await apps.list_namespaced_replica_set(namespace)).items)

    (rs,) = await wait_for(replica_sets, what="the Deployment controller to create a ReplicaSet")
    assert rs.metadata.owner_references[0].kind == "Deployment"

    async def pods() -> list[client.V1Pod] | None:
        items = (await core.list_namespaced_pod(namespace, label_selector="app=web")).items
        return items if len(items) == 3 else None

    created = await wait_for(pods, what="the ReplicaSet controller to create 3 pods")
    assert {p.metadata.owner_references[0].name for p in created} == {rs.metadata.name}


async def test_scheduler_binds_pod_to_registered_node(kube: ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    node_name = f"node-{namespace}"
    taint = client.V1Taint(key="vk-test/dedicated", value=namespace, effect="NoSchedule")
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name=node_name, labels={"vk-test/node": namespace}),
        spec=client.V1NodeSpec(taints=[taint]),
    )
    await core.create_node(node)
    try:
        now = datetime.now(UTC)
        status = {
            "status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "TestReady",
                        "message": "registered by the test",
                        "lastHeartbeatTime": now.isoformat(),
                        "lastTransitionTime": now.isoformat(),
                    }
                ],
            }
        }
        await core.patch_node_status(node_name, status)
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="bound"),
            spec=client.V1PodSpec(
                containers=[client.V1Container(name="main", image="example/inference:1")],
                node_selector={"vk-test/node": namespace},
                tolerations=[
                    client.V1Toleration(key="vk-test/dedicated", operator="Equal", value=namespace),
                    client.V1Toleration(key="node.kubernetes.io/not-ready", operator="Exists"),
                ],
            ),
        )
        await core.create_namespaced_pod(namespace, pod)

        async def bound_node() -> str | None:
            found = await core.read_namespaced_pod("bound", namespace)
            return str(found.spec.node_name) if found.spec.node_name else None

        assert await wait_for(bound_node, what="the scheduler to bind the pod") == node_name
        await core.delete_namespaced_pod("bound", namespace, grace_period_seconds=0)
    finally:
        await core.delete_node(node_name)


async def test_failed_pod_is_replaced_by_its_replicaset(kube: ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(kube)
    core = client.CoreV1Api(kube)
    await apps.create_namespaced_deployment(namespace, _deployment("api", replicas=1))

    async def one_pod() -> client.V1Pod | None:
        items = (await core.list_namespaced_pod(namespace, label_selector="app=api")).items
        return items[0] if len(items) == 1 else None

    first = await wait_for(one_pod, what="the first pod")
    await core.patch_namespaced_pod_status(
        first.metadata.name,
        namespace,
        {"status": {"phase": "Failed", "reason": "InstanceLost", "message": "test"}},
    )

    async def replacement() -> client.V1Pod | None:
        items = (await core.list_namespaced_pod(namespace, label_selector="app=api")).items
        fresh = [p for p in items if p.metadata.uid != first.metadata.uid]
        return fresh[0] if fresh else None

    new = await wait_for(replacement, what="the ReplicaSet to replace the Failed pod")
    assert new.status.phase == "Pending"
    old = await core.read_namespaced_pod(first.metadata.name, namespace)
    assert old.status.phase == "Failed"
    assert old.status.reason == "InstanceLost"


async def test_rbac_denies_service_account_without_permissions(
    kube: ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    name = f"nobody-{uuid.uuid4().hex[:6]}"
    await core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    )
    token = (await core.create_namespaced_service_account_token(name, namespace, request)).status
    configuration = client.Configuration()
    configuration.host = kube.configuration.host
    configuration.ssl_ca_cert = kube.configuration.ssl_ca_cert
    configuration.api_key = {"BearerToken": token.token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    async with ApiClient(configuration) as restricted:
        restricted_core = client.CoreV1Api(restricted)
        with pytest.raises(ApiException) as denied:
            await restricted_core.list_namespaced_pod(namespace)
        # 403, not 401: the token authenticates, RBAC refuses.
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:{name}" in denied.value.body

        review = client.V1SelfSubjectReview()
        who = await client.AuthenticationV1Api(restricted).create_self_subject_review(review)
        assert who.status.user_info.username == f"system:serviceaccount:{namespace}:{name}"
