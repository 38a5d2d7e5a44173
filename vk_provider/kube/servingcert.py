"""The kubelet API's serving certificate, signed by the cluster as a kubelet's is.

With ``kubelet_api.serving.source: cluster`` the agent asks for it as kubelet does with
``serverTLSBootstrap``: a fresh EC P-256 key and a request for ``system:node:<name>`` in
``system:nodes`` whose subject alternative names are the node's address and name, as a
CertificateSigningRequest with signer ``kubernetes.io/kubelet-serving`` and usages
``digital signature`` + ``server auth``. kube-controller-manager signs it with the cluster CA
once it is approved: nobody approves that signer by default, so an approver must (an
operator's ``kubectl certificate approve``, a controller such as kubelet-csr-approver), or,
with ``self_approve``, the agent itself (deploy/rbac-serving.yaml grants ``approve`` on that
signer only). Then the API server can verify the kubelet API with
``--kubelet-certificate-authority`` set to the cluster CA, as it does real kubelets.

``ServingCertificate.run`` (a root task of the leader) first waits for the certificate while
the node runs: until it is signed the kubelet API refuses every handshake, as a kubelet's does
while its request is pending, and a request nobody approves within ``approval_seconds`` is
logged (naming it and how to approve it) and made again. A certificate this node was given
before (the state directory, kept over a container restart) is used at once while valid, so
a restart needs no new approval. It then renews at ``renew_fraction`` of the certificate's life
(as ``kube.nodeidentity``) and loads the new pair into the server's SSL context: connections
made from then on get it, those open keep theirs. A failed renewal is retried while the old
certificate is valid.

Invariants: the key never leaves the state directory (0600, written by rename); the files
are replaced only once a certificate is signed.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509

from vk_provider.kube.client import ApiError, KubeClient
from vk_provider.kube.nodeidentity import (
    NodeCertificate,
    NodeIdentityError,
    key_and_request,
    received,
    retry_or_expire,
    signed_certificate,
)

log = logging.getLogger(__name__)
_RETRY_SECONDS = 10.0
_RETRY_MAX_SECONDS = 300.0

SERVING_SIGNER = "kubernetes.io/kubelet-serving"
SERVING_USAGES = ("digital signature", "server auth")
SERVING_STEM = "kubelet-serving"  # <stem>.crt / <stem>.key in the state directory


def subject_names(node_name: str, addresses: Sequence[str]) -> list[x509.GeneralName]:
    """The node's name as DNS name and its addresses as IP addresses (or DNS names)."""
    names: list[x509.GeneralName] = [x509.DNSName(node_name)]
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    return names


async def request_serving_certificate(
    kube: KubeClient,
    *,
    node_name: str,
    addresses: Sequence[str],
    directory: Path,
    expiration_seconds: int,
    approval_seconds: float,
    self_approve: bool,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> NodeCertificate:
    key_pem, request_pem = key_and_request(node_name, subject_names(node_name, addresses))
    name = f"kubelet-serving-{node_name}-{uuid.uuid4().hex[:8]}"[:253]
    cert_pem = await signed_certificate(
        kube,
        name=name,
        spec={
            "request": base64.b64encode(request_pem).decode(),
            "signerName": SERVING_SIGNER,
            "usages": list(SERVING_USAGES),
            "expirationSeconds": expiration_seconds,
        },
        labels={"vk-provider.io/node": node_name},
        approval_seconds=approval_seconds,
        approve=self_approve,
        not_signed=(
            f"approve it (kubectl certificate approve {name}, or an approver such as "
            "kubelet-csr-approver), or set kubelet_api.serving.self_approve with "
            "deploy/rbac-serving.yaml"
        ),
    )
    certificate = received(directory, SERVING_STEM, key_pem, cert_pem, now=now())
    log.info(
        "kubelet API: serving certificate from %s (signer %s) valid until %s",
        name,
        SERVING_SIGNER,
        certificate.not_after.isoformat(),
    )
    return certificate


class ServingCertificate:
    """The cluster-signed serving certificate and the loop that renews it."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        addresses: Sequence[str],
        directory: Path,
        expiration_seconds: int,
        renew_fraction: float,
        approval_seconds: float,
        self_approve: bool,
        on_renewed: Callable[[NodeCertificate], None],
        certificate: NodeCertificate | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._addresses = tuple(addresses)
        self._directory = directory
        self._expiration = expiration_seconds
        self._fraction = renew_fraction
        self._approval = approval_seconds
        self._self_approve = self_approve
        self._on_renewed = on_renewed
        self._now = now
        # One given before (already loaded by the caller), renewed when its time comes.
        self.certificate: NodeCertificate | None = certificate

    async def _request(self) -> NodeCertificate:
        return await request_serving_certificate(
            self._kube,
            node_name=self._node,
            addresses=self._addresses,
            directory=self._directory,
            expiration_seconds=self._expiration,
            approval_seconds=self._approval,
            self_approve=self._self_approve,
            now=self._now,
        )

    async def obtain(self) -> NodeCertificate:
        """The first certificate, asked for until signed; loaded by ``on_renewed``."""
        pause = _RETRY_SECONDS
        while True:
            try:
                self.certificate = await self._request()
            except (ApiError, NodeIdentityError) as exc:
                # Not fatal: the node runs its pods meanwhile, only the kubelet API waits.
                log.warning(
                    "kubelet API: no serving certificate yet (asking again in %.0f s): %s",
                    pause,
                    exc,
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_SECONDS)  # a denial is not retried in a loop
                continue
            self._on_renewed(self.certificate)
            return self.certificate

    async def run(self) -> None:
        """Obtain the certificate unless one was given, then renew it for ever (a root)."""
        if self.certificate is None:
            await self.obtain()
        await self.renew_forever()

    def _seconds_until(self, moment: datetime) -> float:
        return max(0.0, (moment - self._now()).total_seconds())

    async def renew_forever(self) -> None:
        """Renew before expiry, for ever (a supervised root task)."""
        assert self.certificate is not None, "obtain() first"
        while True:
            current = self.certificate
            await asyncio.sleep(self._seconds_until(current.renew_at(self._fraction)))
            try:
                fresh = await self._request()
            except (ApiError, NodeIdentityError) as exc:
                await retry_or_expire(current, exc, now=self._now, what="kubelet serving")
                continue
            self.certificate = fresh
            self._on_renewed(fresh)
