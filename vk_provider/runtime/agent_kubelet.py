"""Wiring the kubelet API: the address the node advertises, its serving certificate, and the
server over the agent's pods, instances and providers (``api.kubelet``).

``node_address`` is the address every part that names the node uses (its status, the pods'
``hostIP``, the certificate); ``kubelet_api_server`` builds the server the leader runs.

Invariants: wiring only (nothing is served or listened on here); the address is
``node.address``, else the API's listening host unless it is a wildcard, else the machine's
default address, and a loopback one is warned about (the API server refuses to proxy to it);
the serving certificate is the configured pair, else one made for that address and kept in
the state directory; clients are verified against ``client_ca_file``, else the cluster's CA
when running in a pod.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from pathlib import Path

from vk_provider.api.authn import Authenticator, Authorizer
from vk_provider.api.kubelet import KubeletApiServer, KubeletSources
from vk_provider.api.kubelet_agent import AgentPods, AgentStreams
from vk_provider.api.nodestats import UsageCollector
from vk_provider.api.podlogs import AttemptHistory, PodLogSource
from vk_provider.api.tls import build_server_ssl_context, ensure_serving_certificate
from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.node import default_address
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain.contract import Provider
from vk_provider.kube.client import KubeClient
from vk_provider.kube.nodeidentity import NodeCertificate
from vk_provider.kube.servingcert import ServingCertificate
from vk_provider.settings.agent import AgentConfig

log = logging.getLogger(__name__)

IN_CLUSTER_CA = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


def node_address(config: AgentConfig) -> str:
    """The address the node advertises (see the module's invariants)."""
    api_cfg = config.kubelet_api
    address = config.node.address or (
        api_cfg.host if api_cfg.host not in ("0.0.0.0", "::", "") else default_address()  # noqa: S104
    )
    if is_loopback(address):
        log.warning(
            "node %s advertises the loopback address %s: the API server refuses to proxy "
            "nodes/%s/proxy to it, and only a metrics-server on this machine could scrape "
            "it; set node.address to an address the API server and metrics-server reach",
            config.node.name,
            address,
            config.node.name,
        )
    return address


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def kubelet_api_server(
    config: AgentConfig,
    kube: KubeClient,
    *,
    address: str,
    state_dir: Path,
    providers: Mapping[str, Provider],
    store: PodStore,
    tracker: InstanceTracker,
    history: AttemptHistory,
    authenticator: Authenticator,
    authorizer: Authorizer,
) -> KubeletApiServer:
    """The kubelet API server of the node at ``address`` (not started)."""
    api_cfg = config.kubelet_api
    if api_cfg.tls_cert_file and api_cfg.tls_key_file:
        cert, key = api_cfg.tls_cert_file, api_cfg.tls_key_file
    else:
        cert, key = ensure_serving_certificate(
            state_dir / "kubelet-tls", node_name=config.node.name, ip_addresses=(address,)
        )
    in_cluster_ca = IN_CLUSTER_CA if IN_CLUSTER_CA.exists() else None  # once, at start-up
    # With serving.source cluster the self-signed pair is only a placeholder: the cluster's
    # certificate is loaded into this context before the server serves (serving_certificate).
    ssl_context = build_server_ssl_context(cert, key, api_cfg.client_ca_file or in_cluster_ca)
    return KubeletApiServer(
        node_name=config.node.name,
        host=api_cfg.host,
        port=api_cfg.port,
        ssl_context=ssl_context,
        authenticator=authenticator,
        authorizer=authorizer,
        logs=PodLogSource(
            kube,
            providers,
            node_name=config.node.name,
            history=history,
            instances=tracker.for_pod,
        ),
        sources=KubeletSources(
            pods=AgentPods(store, tracker),
            stats=UsageCollector(
                node_name=config.node.name,
                store=store,
                tracker=tracker,
                providers=providers,
            ),
            streams=AgentStreams(store, providers, node_name=config.node.name),
        ),
    )


def serving_certificate(
    config: AgentConfig,
    kube: KubeClient,
    server: KubeletApiServer,
    *,
    address: str,
    state_dir: Path,
) -> ServingCertificate | None:
    """The cluster-signed serving certificate of the kubelet API (``kube.servingcert``), loaded
    into ``server``'s SSL context whenever it is (re)issued; None with a self-signed one."""
    serving = config.kubelet_api.serving
    if serving.source != "cluster":
        return None

    def load(certificate: NodeCertificate) -> None:
        server.ssl_context.load_cert_chain(certificate.cert_file, certificate.key_file)

    return ServingCertificate(
        kube,
        node_name=config.node.name,
        addresses=(address,),
        directory=state_dir / "kubelet-tls",
        expiration_seconds=serving.certificate_seconds,
        renew_fraction=serving.renew_fraction,
        approval_seconds=serving.approval_timeout_seconds,
        self_approve=serving.self_approve,
        on_renewed=load,
    )
