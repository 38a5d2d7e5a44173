"""The tests' node address (``cluster/netns``) and metrics-server's registration
(``cluster/metrics_server``): the pure parts, and a real veth pair when this runs as root."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.metrics_server import (
    APISERVICE,
    RESOLUTION_SECONDS,
    command,
    registration_objects,
)
from vk_provider_dev.cluster.pki import CertPair


def net(text: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(text)


def test_a_network_is_a_free_slash_30_of_10_213() -> None:
    assert netns.choose_network(0, []) == net("10.213.0.0/30")
    assert netns.choose_network(3, []) == net("10.213.0.12/30")
    # Taken by an address or a route of the machine: the next one.
    assert netns.choose_network(3, [net("10.213.0.12/32")]) == net("10.213.0.16/30")
    assert netns.choose_network(3, [net("10.213.0.0/24")]) == net("10.213.1.0/30")
    # The seed wraps around the /16.
    assert netns.choose_network(16384, []) == net("10.213.0.0/30")
    with pytest.raises(netns.NetnsUnavailable):
        netns.choose_network(0, [net("10.0.0.0/8")])


def test_addresses_of_a_link() -> None:
    link = netns.VethNamespace("vk-t", "vkht", "vknt", net("10.213.4.8/30"))
    assert (link.host_address, link.peer_address) == ("10.213.4.9", "10.213.4.10")


def test_names_are_checked() -> None:
    with pytest.raises(ValueError, match="11 lowercase"):
        netns.create("Too-Long-Name", seed=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_a_pair_is_made_and_removed_whole() -> None:
    try:
        link = netns.create(f"u{os.getpid() % 10**8}", seed=os.getpid() + 7)
    except netns.NetnsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        assert netns.exists(link)
        assert any(ipaddress.ip_address(link.host_address) in n for n in netns.networks_in_use())
    finally:
        netns.remove(link)
    assert not netns.exists(link)
    netns.remove(link)  # again: no error


def test_metrics_server_is_registered_as_its_manifests_do_with_an_external_name() -> None:
    objects = dict(
        (body["kind"], body) for _, body in registration_objects(port=4443, ca_bundle="Q0E=")
    )
    service = objects["Service"]
    assert service["spec"] == {
        "type": "ExternalName",
        "externalName": "localhost",
        "ports": [{"name": "https", "port": 4443}],
    }
    apiservice = objects["APIService"]
    assert apiservice["metadata"]["name"] == APISERVICE
    assert apiservice["spec"]["service"] == {
        "name": "metrics-server",
        "namespace": "kube-system",
        "port": 4443,
    }
    assert (
        apiservice["spec"]["caBundle"] == "Q0E="
        and "insecureSkipTLSVerify" not in apiservice["spec"]
    )
    rules = objects["ClusterRole"]["rules"]
    assert {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]} in rules
    roles = {body["roleRef"]["name"] for _, body in registration_objects(port=1, ca_bundle="")
             if "roleRef" in body}  # fmt: skip
    assert roles == {
        "system:metrics-server",
        "system:auth-delegator",
        "extension-apiserver-authentication-reader",
    }


def test_metrics_server_scrapes_nodes_at_their_internal_ip_verifying_the_cluster_ca() -> None:
    line = command(
        Path("/bin/ms"),
        port=4443,
        kubeconfig=Path("/k"),
        cert=CertPair(Path("/c.crt"), Path("/c.key")),
        ca=Path("/ca.crt"),
    )
    assert "--kubelet-preferred-address-types=InternalIP" in line
    assert "--kubelet-use-node-status-port" in line
    assert "--kubelet-certificate-authority=/ca.crt" in line
    assert "--kubelet-insecure-tls" not in line
    assert f"--metric-resolution={RESOLUTION_SECONDS}s" in line
    assert "--bind-address=127.0.0.1" in line and "--secure-port=4443" in line
