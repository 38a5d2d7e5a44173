"""EndpointSlices for Services over pods on the virtual node (``domain.endpointslices``)."""

from __future__ import annotations

from typing import Any

from vk_provider.domain.endpointslices import (
    MAX_ENDPOINTS,
    DeclaredPort,
    ExposedPod,
    changes,
    exposed_pod,
    reachable_pod_ip,
    slices_for,
    unreached,
)
from vk_provider.domain.models import PortEndpoint
from vk_provider.domain.podview import PodView

NODE = "vk-gpu"


def service(*ports: dict[str, Any], selector: dict[str, str] | None = None, **spec: Any) -> Any:
    return {
        "metadata": {"name": "infer", "namespace": "ml", "uid": "svc-uid"},
        "spec": {
            "selector": {"app": "infer"} if selector is None else selector,
            "ports": list(ports),
            **spec,
        },
    }


def pod(
    name: str,
    *exposed: PortEndpoint,
    ready: bool = True,
    terminating: bool = False,
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
) -> ExposedPod:
    return ExposedPod(
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        labels={"app": "infer"} if labels is None else labels,
        ready=ready,
        terminating=terminating,
        declared=(DeclaredPort("http", 8000), DeclaredPort("metrics", 9090)),
        exposed=exposed,
    )


HTTP = {"name": "web", "port": 80, "targetPort": "http", "protocol": "TCP"}


def test_a_named_target_port_maps_to_each_replicas_own_reachable_port() -> None:
    """Two replicas of a RunPod-like provider: the same container port, mapped to different
    public ports, so one slice each; the Service's port name is kept."""
    a = pod("a", PortEndpoint(8000, "TCP", "203.0.113.7", 40123))
    b = pod("b", PortEndpoint(8000, "TCP", "203.0.113.9", 40777))
    slices = slices_for(service(HTTP), [a, b], node=NODE)
    assert len(slices) == 2
    seen = {
        (s["endpoints"][0]["addresses"][0], s["ports"][0]["port"], s["ports"][0]["name"])
        for s in slices
    }
    assert seen == {("203.0.113.7", 40123, "web"), ("203.0.113.9", 40777, "web")}
    first = slices[0]
    assert first["addressType"] == "IPv4"
    assert first["metadata"]["labels"] == {
        "kubernetes.io/service-name": "infer",
        "endpointslice.kubernetes.io/managed-by": "vk-provider.io",
        "vk-provider.io/node": NODE,
    }
    assert first["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"
    assert first["endpoints"][0]["nodeName"] == NODE
    assert first["endpoints"][0]["targetRef"]["kind"] == "Pod"


def test_replicas_with_the_same_mapping_share_one_slice_and_numbers_work_too() -> None:
    same = [pod(n, PortEndpoint(8000, "TCP", f"10.9.0.{i}", 8000)) for i, n in enumerate("abc")]
    (only,) = slices_for(service({"port": 8000, "protocol": "TCP"}), same, node=NODE)
    assert [e["targetRef"]["name"] for e in only["endpoints"]] == ["a", "b", "c"]
    assert only["ports"] == [{"name": "", "port": 8000, "protocol": "TCP"}]


def test_conditions_follow_readiness_and_deletion() -> None:
    up = PortEndpoint(8000, "TCP", "10.9.0.1", 8000)
    pods = [
        pod("ready", up),
        pod("loading", up, ready=False),
        pod("leaving", up, terminating=True),
    ]
    (only,) = slices_for(service(HTTP), pods, node=NODE)
    conditions = {e["targetRef"]["name"]: e["conditions"] for e in only["endpoints"]}
    assert conditions == {
        "ready": {"ready": True, "serving": True, "terminating": False},
        "loading": {"ready": False, "serving": False, "terminating": False},
        "leaving": {"ready": False, "serving": True, "terminating": True},
    }


def test_only_selected_pods_of_the_services_namespace_with_an_exposed_port() -> None:
    up = PortEndpoint(8000, "TCP", "10.9.0.1", 8000)
    pods = [
        pod("other-app", up, labels={"app": "train"}),
        pod("other-namespace", up, namespace="web"),
        pod("nothing-exposed"),
        pod("udp-only", PortEndpoint(8000, "UDP", "10.9.0.2", 8000)),
        pod("chosen", up),
    ]
    (only,) = slices_for(service(HTTP), pods, node=NODE)
    assert [e["targetRef"]["name"] for e in only["endpoints"]] == ["chosen"]


def test_no_slices_for_services_without_selector_or_of_type_external_name() -> None:
    up = [pod("a", PortEndpoint(8000, "TCP", "10.9.0.1", 8000))]
    assert slices_for(service(HTTP, selector={}), up, node=NODE) == []
    assert slices_for(service(HTTP, type="ExternalName"), up, node=NODE) == []


def test_an_unknown_named_port_leaves_that_port_out_and_other_ports_stay() -> None:
    a = pod(
        "a",
        PortEndpoint(8000, "TCP", "10.9.0.1", 31000),
        PortEndpoint(9090, "TCP", "10.9.0.1", 31001),
    )
    ports = [
        HTTP,
        {"name": "m", "port": 9090, "targetPort": "metrics"},
        {"name": "x", "port": 1, "targetPort": "grpc"},
    ]
    (only,) = slices_for(service(*ports), [a], node=NODE)
    assert sorted((p["name"], p["port"]) for p in only["ports"]) == [("m", 31001), ("web", 31000)]


def test_ports_at_different_addresses_are_one_endpoint_each_and_hostnames_are_fqdn() -> None:
    """A RunPod-like pod: TCP on the public IP, HTTP only through the provider's proxy."""
    a = pod(
        "a",
        PortEndpoint(8000, "TCP", "abc123-8000.proxy.example.net", 443),
        PortEndpoint(9090, "TCP", "203.0.113.7", 40999),
    )
    ports = [HTTP, {"name": "m", "port": 9090, "targetPort": "metrics"}]
    slices = slices_for(service(*ports), [a], node=NODE)
    by_type = {s["addressType"]: s for s in slices}
    assert set(by_type) == {"FQDN", "IPv4"}
    assert by_type["FQDN"]["ports"] == [{"name": "web", "port": 443, "protocol": "TCP"}]
    assert by_type["IPv4"]["ports"] == [{"name": "m", "port": 40999, "protocol": "TCP"}]


def test_large_groups_are_split_at_the_endpoint_limit_with_stable_names() -> None:
    pods = [
        pod(f"p{i:03}", PortEndpoint(8000, "TCP", f"10.9.{i // 250}.{i % 250}", 8000))
        for i in range(MAX_ENDPOINTS + 5)
    ]
    slices = slices_for(service(HTTP), pods, node=NODE)
    assert [len(s["endpoints"]) for s in slices] == [MAX_ENDPOINTS, 5]
    again = slices_for(service(HTTP), list(reversed(pods)), node=NODE)
    assert [s["metadata"]["name"] for s in again] == [s["metadata"]["name"] for s in slices]


def test_changes_create_replace_and_delete_only_what_differs() -> None:
    up = PortEndpoint(8000, "TCP", "10.9.0.1", 8000)
    before = slices_for(service(HTTP), [pod("a", up)], node=NODE)
    assert changes(before, before).create == changes(before, before).replace == ()
    after = slices_for(service(HTTP), [pod("a", up, ready=False)], node=NODE)
    assert [s["metadata"]["name"] for s in changes(after, before).replace] == [
        before[0]["metadata"]["name"]
    ]
    gone = changes([], before)
    assert gone.delete == (before[0]["metadata"]["name"],) and not gone.create
    assert changes(before, []).create == tuple(before)


def test_a_pod_object_gives_its_readiness_deletion_and_declared_ports() -> None:
    pod_object = {
        "metadata": {
            "namespace": "ml",
            "name": "infer-1",
            "uid": "u1",
            "labels": {"app": "infer"},
            "deletionTimestamp": "2026-12-03T10:00:00Z",
        },
        "spec": {
            "initContainers": [
                {"name": "setup", "ports": [{"containerPort": 1}]},  # not a sidecar: no port
                {"name": "proxy", "restartPolicy": "Always", "ports": [{"containerPort": 15001}]},
            ],
            "containers": [
                {"name": "main", "ports": [{"name": "http", "containerPort": 8000}]},
                {"name": "dns", "ports": [{"containerPort": 53, "protocol": "UDP"}]},
            ],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    up = PortEndpoint(8000, "TCP", "10.9.0.1", 8000)
    seen = exposed_pod(pod_object, [up])
    assert (seen.namespace, seen.name, seen.uid, dict(seen.labels)) == (
        "ml", "infer-1", "u1", {"app": "infer"},
    )  # fmt: skip
    assert seen.ready and seen.terminating and seen.exposed == (up,)
    assert seen.declared == (
        DeclaredPort(None, 15001, "TCP"),
        DeclaredPort("http", 8000, "TCP"),
        DeclaredPort(None, 53, "UDP"),
    )
    pod_object["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
    assert not exposed_pod(pod_object, []).ready


def test_each_port_that_reaches_nothing_of_a_pod_says_why() -> None:
    up = pod("a", PortEndpoint(8000, "TCP", "10.9.0.1", 8000))
    svc = service(
        HTTP,
        {"name": "metrics", "port": 9090, "targetPort": "metrics"},  # declared, not exposed
        {"name": "admin", "port": 81, "targetPort": "admin"},  # not declared at all
        {"port": 53, "targetPort": 8000, "protocol": "UDP"},  # exposed over TCP only
    )
    assert unreached(svc, up) == [
        ("metrics", "its provider does not expose container port 9090/TCP"),
        ("admin", "the pod declares no TCP port named 'admin'"),
        ("53", "its provider does not expose container port 8000/UDP"),
    ]
    assert unreached(service(HTTP), up) == []


def _pod_object(*ports: tuple[int, str]) -> frozenset[tuple[int, str]]:
    """The declared ports as a pod object's view gives them."""
    declared = [{"containerPort": number, "protocol": protocol} for number, protocol in ports]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "ports": declared}]}}
    return PodView.parse(pod).declared_ports


def test_the_pod_ip_is_the_address_that_exposes_every_declared_port_on_its_own_number() -> None:
    """1:1 at one IP (a VM publishing its ports, a flat network): that IP is the podIP, so
    the cluster's own slices (podIP and container port) reach the pod too."""
    pod_object = _pod_object((8000, "TCP"), (9090, "TCP"))
    endpoints = [PortEndpoint(8000, "TCP", "198.51.100.4", 8000)]
    assert reachable_pod_ip(pod_object, endpoints) is None  # 9090 not exposed
    endpoints.append(PortEndpoint(9090, "TCP", "198.51.100.4", 9090))
    assert reachable_pod_ip(pod_object, endpoints) == "198.51.100.4"


def test_no_pod_ip_where_the_cluster_would_reach_nothing_at_it() -> None:
    """Mapped ports, a proxy hostname, ports at two addresses, or nothing declared: no
    podIP, so no slice of the cluster's points at an unreachable address."""
    web = _pod_object((8000, "TCP"))
    assert reachable_pod_ip(web, [PortEndpoint(8000, "TCP", "203.0.113.7", 40123)]) is None
    proxied = [PortEndpoint(8000, "TCP", "abc-8000.proxy.runpod.net", 8000)]
    assert reachable_pod_ip(web, proxied) is None
    assert reachable_pod_ip(web, []) is None
    two = _pod_object((8000, "TCP"), (9090, "TCP"))
    split = [
        PortEndpoint(8000, "TCP", "10.0.0.1", 8000),
        PortEndpoint(9090, "TCP", "10.0.0.2", 9090),
    ]
    assert reachable_pod_ip(two, split) is None
    assert reachable_pod_ip(_pod_object(), [PortEndpoint(8000, "TCP", "10.0.0.1", 8000)]) is None
    udp = _pod_object((5353, "UDP"))
    assert reachable_pod_ip(udp, [PortEndpoint(5353, "TCP", "10.0.0.1", 5353)]) is None
