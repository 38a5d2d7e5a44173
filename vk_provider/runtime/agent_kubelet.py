"""Wiring the kubelet API: the address the node advertises, its serving certificate, and the
server over the agent's pods, instances and providers (``api.kubelet``).

``node_address`` is the address every part that names the node uses (its status, the pods'
``hostIP``, the certificate); ``kubelet_api_server`` builds the server the leader runs.

Invariants: wiring only (nothing is served or listened on here); the address is
``node.address``, else the API's listening host unless it is a wildcard, else the machine's
default address, and a loopback one is warned about (the API server refuses to proxy to it);
the serving certificate is the configured pair, else (``serving.source: self-signed``) one
made for that address and kept in the state directory, else (``cluster``, the default) the
cluster-signed one: none until it is signed, then the one saved there; clients are verified
against ``client_ca_file``, else the cluster's CA when running in a pod.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509

from vk_provider.api.authn import Authenticator, Authorizer
from vk_provider.api.kubelet import KubeletApiServer, KubeletSources
from vk_provider.api.kubelet_agent import AgentPods, AgentStreams
from vk_provider.api.nodestats import UsageCollector
from vk_provider.api.podlogs import AttemptHistory, PodLogSource
from vk_provider.api.tls import (
    build_server_ssl_context,
    ensure_serving_certificate,
    serving_certificate_fits,
)
from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.node import default_address
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain.contract import Provider
from vk_provider.kube.client import KubeClient
from vk_provider.kube.nodeidentity import NodeCertificate
from vk_provider.kube.servingcert import SERVING_STEM, ServingCertificate
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
    cert: Path | None
    key: Path | None
    if api_cfg.tls_cert_file and api_cfg.tls_key_file:
        cert, key = api_cfg.tls_cert_file, api_cfg.tls_key_file
    elif api_cfg.serving_source == "self-signed":
        cert, key = ensure_serving_certificate(
            state_dir / "kubelet-tls", node_name=config.node.name, ip_addresses=(address,)
        )
    else:
        # Cluster-signed: no certificate until serving_certificate loads one (handshakes fail).
        cert = key = None
    in_cluster_ca = IN_CLUSTER_CA if IN_CLUSTER_CA.exists() else None  # once, at start-up
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
    into ``server``'s SSL context whenever it is (re)issued, starting with one saved by an
    earlier run while it is still valid; None with a self-signed or configured one."""
    serving = config.kubelet_api.serving
    if config.kubelet_api.serving_source != "cluster":
        return None

    def load(certificate: NodeCertificate) -> None:
        server.ssl_context.load_cert_chain(certificate.cert_file, certificate.key_file)

    directory = state_dir / "kubelet-tls"
    saved = saved_serving_certificate(directory, node_name=config.node.name, address=address)
    if saved is not None:
        load(saved)
        log.info(
            "kubelet API: serving certificate %s from an earlier run, valid until %s",
            saved.cert_file,
            saved.not_after.isoformat(),
        )
    return ServingCertificate(
        kube,
        node_name=config.node.name,
        addresses=(address,),
        directory=directory,
        expiration_seconds=serving.certificate_seconds,
        renew_fraction=serving.renew_fraction,
        approval_seconds=serving.approval_timeout_seconds,
        self_approve=serving.self_approve,
        on_renewed=load,
        certificate=saved,
    )


def saved_serving_certificate(
    directory: Path, *, node_name: str, address: str
) -> NodeCertificate | None:
    """The cluster-signed pair saved by an earlier run, when it still fits this node and is
    valid for another minute; its modification time stands for when it was received."""
    cert_file, key_file = directory / f"{SERVING_STEM}.crt", directory / f"{SERVING_STEM}.key"
    if not serving_certificate_fits(
        cert_file,
        key_file,
        node_name=node_name,
        ip_addresses=(address,) if _is_ip(address) else (),
        valid_for=timedelta(minutes=1),
    ):
        return None
    parsed = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return NodeCertificate(
        cert_file=cert_file,
        key_file=key_file,
        not_before=parsed.not_valid_before_utc,
        not_after=parsed.not_valid_after_utc,
        received=datetime.fromtimestamp(cert_file.stat().st_mtime, UTC),
    )


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True
