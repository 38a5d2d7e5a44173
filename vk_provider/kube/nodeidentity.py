"""The agent as a node: a client certificate for ``system:node:<name>``, as a kubelet gets one.

Kubelet TLS bootstrap, done by the agent with its starting ("bootstrap") credentials:

1. a fresh EC P-256 key and a PKCS#10 request with CN ``system:node:<name>``, O
   ``system:nodes``;
2. a CertificateSigningRequest with signer ``kubernetes.io/kube-apiserver-client-kubelet`` and
   usages ``digital signature`` + ``client auth`` (what kube-controller-manager's csrapproving
   controller recognises as a node client certificate);
3. approval: the csrapproving controller approves it when the requester may create
   ``certificatesigningrequests/nodeclient`` (the built-in ClusterRole
   ``system:certificates.k8s.io:certificatesigningrequests:nodeclient``, bound to the
   bootstrap ServiceAccount by the chart); the agent never approves its own request;
4. the csrsigning controller signs it with the cluster CA; the agent polls until
   ``status.certificate`` is set, a Denied/Failed condition appears, or the time is up;
5. a second API connection that authenticates with that certificate alone.

``NodeIdentity.renew_forever`` renews at ``renew_fraction`` of the time from receiving the
certificate to its expiry (not from its NotBefore: kube-controller-manager's signer backdates
that by five minutes, which would put the renewal of a short certificate in the past and
renew it in a loop; the signer may also shorten the requested lifetime) with the same steps,
and rebinds the node client to the new certificate; a failed renewal is retried with back-off
while the old certificate is still valid, and the loop fails (stopping the agent) only once it
has expired.

Invariants: the private key never leaves the state directory (written 0600, atomically by
rename); the node client carries no token of the bootstrap credentials; connections made with
a replaced certificate are closed only after calls under way on them had time to finish.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio.client.api_client import ApiClient

from vk_provider.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
NODES_GROUP = "system:nodes"
USAGES = ("digital signature", "client auth")
_POLL_SECONDS = 1.0
_RETRY_SECONDS = 30.0
# Calls under way on a replaced connection: the longest is a pod watch (server timeout + 15 s).
_RETIRE_AFTER_SECONDS = 180.0


class NodeIdentityError(RuntimeError):
    """The node certificate could not be obtained (denied, failed, or never signed)."""


def node_user(node_name: str) -> str:
    return f"system:node:{node_name}"


@dataclass(frozen=True, slots=True)
class NodeCertificate:
    """Files of a signed node client certificate, its validity and when it was received."""

    cert_file: Path
    key_file: Path
    not_before: datetime
    not_after: datetime
    received: datetime

    def renew_at(self, fraction: float) -> datetime:
        start = max(self.not_before, self.received)
        return start + (self.not_after - start) * fraction


def key_and_request(node_name: str, names: Sequence[x509.GeneralName] = ()) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a request for ``system:node:<name>`` in ``system:nodes``,
    with ``names`` as its subject alternative names (a serving certificate's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, node_user(node_name)),
        ]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    request = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, request.public_bytes(serialization.Encoding.PEM)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    tmp.replace(path)


def _save(
    directory: Path, key_pem: bytes, cert_pem: bytes, *, stem: str = "node-client"
) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_file, cert_file = directory / f"{stem}.key", directory / f"{stem}.crt"
    _write_private(key_file, key_pem)
    _write_private(cert_file, cert_pem)
    return key_file, cert_file


def _failure(csr: dict[str, object]) -> str | None:
    status = csr.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions or []:
        if condition.get("type") in ("Denied", "Failed") and condition.get("status") == "True":
            return f"{condition.get('type')}: {condition.get('reason')} {condition.get('message')}"
    return None


async def signed_certificate(
    bootstrap: KubeClient,
    *,
    name: str,
    spec: dict[str, object],
    labels: dict[str, str],
    approval_seconds: float,
    not_signed: str,
    approve: bool = False,
) -> bytes:
    """Create the CertificateSigningRequest ``name`` and wait until it is signed; its PEM.

    With ``approve`` the requester approves it itself (the kubelet-serving signer has no
    approver of its own); else kube-controller-manager or an operator must. ``not_signed``
    says what to check when the time is up."""
    await bootstrap.create_csr(
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }
    )
    if approve:
        await bootstrap.approve_csr(
            name,
            reason="VkProviderSelfApproval",
            message="the agent approved the serving certificate of its own node",
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + approval_seconds
    while True:
        csr = await bootstrap.get_csr(name)
        if csr is None:
            raise NodeIdentityError(f"CertificateSigningRequest {name} disappeared")
        failure = _failure(csr)
        if failure:
            raise NodeIdentityError(f"CertificateSigningRequest {name} {failure}")
        certificate = (csr.get("status") or {}).get("certificate")
        if certificate:
            return base64.b64decode(certificate)
        if loop.time() > deadline:
            raise NodeIdentityError(
                f"CertificateSigningRequest {name} was not approved and signed within "
                f"{approval_seconds:.0f} s: {not_signed}"
            )
        await asyncio.sleep(_POLL_SECONDS)


def received(
    directory: Path,
    stem: str,
    key_pem: bytes,
    cert_pem: bytes,
    *,
    now: datetime,
) -> NodeCertificate:
    """Save a signed certificate and its key as ``<stem>.crt``/``<stem>.key``."""
    parsed = x509.load_pem_x509_certificate(cert_pem)
    key_file, cert_file = _save(directory, key_pem, cert_pem, stem=stem)
    return NodeCertificate(
        cert_file=cert_file,
        key_file=key_file,
        not_before=parsed.not_valid_before_utc,
        not_after=parsed.not_valid_after_utc,
        received=now,
    )


async def request_certificate(
    bootstrap: KubeClient,
    *,
    node_name: str,
    directory: Path,
    expiration_seconds: int,
    approval_seconds: float,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> NodeCertificate:
    """Steps 1-4 of the module docstring; the files are replaced only once a certificate is
    signed, so a failed request leaves the previous certificate in use."""
    key_pem, request_pem = key_and_request(node_name)
    name = f"node-csr-{node_name}-{uuid.uuid4().hex[:8]}"[:253]
    cert_pem = await signed_certificate(
        bootstrap,
        name=name,
        spec={
            "request": base64.b64encode(request_pem).decode(),
            "signerName": SIGNER,
            "usages": list(USAGES),
            "expirationSeconds": expiration_seconds,
        },
        labels={"vk-provider.io/node": node_name},
        approval_seconds=approval_seconds,
        not_signed=(
            "the bootstrap credentials need the ClusterRole "
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient (the chart's "
            "identity: node binds it), and kube-controller-manager its csrapproving and "
            "csrsigning controllers"
        ),
    )
    certificate = received(directory, "node-client", key_pem, cert_pem, now=now())
    log.info(
        "node identity %s: certificate from %s valid until %s",
        node_user(node_name),
        name,
        certificate.not_after.isoformat(),
    )
    return certificate


async def retry_or_expire(
    certificate: NodeCertificate, error: Exception, *, now: Callable[[], datetime], what: str
) -> None:
    """A renewal failed: wait a while (the caller retries) as long as ``certificate`` is still
    valid; once it has expired, fail (a supervised task: the agent stops)."""
    left = max(0.0, (certificate.not_after - now()).total_seconds())
    if left <= 0:
        raise NodeIdentityError(
            f"the {what} certificate expired and renewing it failed: {error}"
        ) from error
    log.warning("renewing the %s certificate failed (retrying): %s", what, error)
    await asyncio.sleep(min(_RETRY_SECONDS, left / 2))


class NodeIdentity:
    """The node client (``client``) and the loop that keeps its certificate fresh."""

    def __init__(
        self,
        bootstrap: KubeClient,
        client: KubeClient,
        certificate: NodeCertificate,
        *,
        node_name: str,
        directory: Path,
        expiration_seconds: int,
        renew_fraction: float,
        approval_seconds: float,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._bootstrap = bootstrap
        self.client = client
        self.certificate = certificate
        self._node_name = node_name
        self._directory = directory
        self._expiration = expiration_seconds
        self._fraction = renew_fraction
        self._approval_seconds = approval_seconds
        self._now = now
        # Connections of replaced certificates, closed once calls under way on them ended.
        self._retired: set[ApiClient] = set()

    @classmethod
    async def obtain(
        cls,
        bootstrap: KubeClient,
        *,
        node_name: str,
        directory: Path,
        expiration_seconds: int,
        renew_fraction: float,
        approval_seconds: float,
    ) -> NodeIdentity:
        certificate = await request_certificate(
            bootstrap,
            node_name=node_name,
            directory=directory,
            expiration_seconds=expiration_seconds,
            approval_seconds=approval_seconds,
        )
        api = bootstrap.with_client_certificate(certificate.cert_file, certificate.key_file)
        return cls(
            bootstrap,
            KubeClient(api),
            certificate,
            node_name=node_name,
            directory=directory,
            expiration_seconds=expiration_seconds,
            renew_fraction=renew_fraction,
            approval_seconds=approval_seconds,
        )

    def _seconds_until(self, moment: datetime) -> float:
        return max(0.0, (moment - self._now()).total_seconds())

    async def renew_forever(self) -> None:
        """Renew before expiry, for ever (a supervised root task)."""
        closing: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(self._seconds_until(self.certificate.renew_at(self._fraction)))
                try:
                    fresh = await request_certificate(
                        self._bootstrap,
                        node_name=self._node_name,
                        directory=self._directory,
                        expiration_seconds=self._expiration,
                        approval_seconds=self._approval_seconds,
                        now=self._now,
                    )
                except (ApiError, NodeIdentityError) as exc:
                    await retry_or_expire(self.certificate, exc, now=self._now, what="node")
                    continue
                api = self._bootstrap.with_client_certificate(fresh.cert_file, fresh.key_file)
                previous = self.client.rebind(api)
                self.certificate = fresh
                self._retired.add(previous)
                task = asyncio.create_task(self._close_later(previous))
                closing.add(task)
                task.add_done_callback(closing.discard)
        finally:
            for task in closing:
                task.cancel()

    async def _close_later(self, api: ApiClient) -> None:
        await asyncio.sleep(_RETIRE_AFTER_SECONDS)
        self._retired.discard(api)
        await api.close()

    async def close(self) -> None:
        """Close the node client and every replaced connection not closed yet."""
        for api in list(self._retired):
            self._retired.discard(api)
            await api.close()
        await self.client.close()
