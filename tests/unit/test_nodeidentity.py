"""The node identity's certificate life: request, approval outcomes, renewal, expiry.

A fake bootstrap client stands for the API server's CSR API and kube-controller-manager's
approver and signer (a CA made here signs the lifetime asked for, backdated when told);
simulated loop time (looptime) runs hours of renewals instantly. The real path, against the
real control plane (request, auto-approval, a renewal, the 403s), is
tests/integration/test_chart.py.
"""

from __future__ import annotations

import asyncio
import base64
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.helpers import wait_for
from vk_provider.kube.client import ApiError
from vk_provider.kube.nodeidentity import (
    SIGNER,
    NodeCertificate,
    NodeIdentity,
    NodeIdentityError,
    request_certificate,
)
from vk_provider.kube.servingcert import (
    SERVING_SIGNER,
    ServingCertificate,
    request_serving_certificate,
)

pytestmark = pytest.mark.looptime
START = datetime(2026, 12, 1, tzinfo=UTC)


def _now() -> datetime:
    return START + timedelta(seconds=asyncio.get_running_loop().time())


class FakeSigner:
    """CSR create/get as the API server answers them; ``outcome`` decides each request's fate."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.ca = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
        self.csrs: dict[str, dict[str, Any]] = {}
        self.outcome = "sign"  # sign | deny | ignore | error | approval (signed once approved)
        self.approvals: list[tuple[str, str]] = []
        self.backdate = timedelta(0)  # kube-controller-manager's signer backdates 5 minutes
        self.connections: list[tuple[Path, Path]] = []

    async def create_csr(self, csr: dict[str, Any]) -> dict[str, Any]:
        if self.outcome == "error":
            raise ApiError(503, "API server unavailable")
        stored = {**csr, "status": {}}
        self.csrs[csr["metadata"]["name"]] = stored
        if self.outcome == "deny":
            stored["status"]["conditions"] = [
                {"type": "Denied", "status": "True", "reason": "Test", "message": "no"}
            ]
        elif self.outcome == "sign":
            stored["status"]["certificate"] = self._sign(csr["spec"])
        return stored

    def _sign(self, spec: dict[str, Any]) -> str:
        request = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(request.subject)
            .issuer_name(self.ca)
            .public_key(request.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - self.backdate)
            .not_valid_after(now + timedelta(seconds=spec["expirationSeconds"]))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(self.key, hashes.SHA256())
        )
        return base64.b64encode(cert.public_bytes(Encoding.PEM)).decode()

    async def get_csr(self, name: str) -> dict[str, Any] | None:
        return self.csrs.get(name)

    async def approve_csr(self, name: str, *, reason: str, message: str) -> dict[str, Any]:
        """The /approval subresource; in ``approval`` outcome the signer then signs."""
        stored = self.csrs[name]
        self.approvals.append((name, reason))
        if self.outcome == "approval":
            stored["status"]["certificate"] = self._sign(stored["spec"])
        return stored

    def with_client_certificate(self, cert_file: Path, key_file: Path) -> FakeConnection:
        self.connections.append((cert_file, key_file))
        return FakeConnection(cert_file.read_bytes())


class FakeConnection:
    def __init__(self, cert: bytes) -> None:
        self.cert = cert
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def signer_connections(client: FakeNodeClient) -> list[FakeConnection]:
    """The connections the client was bound to before its current one, oldest first."""
    return [client.initial, *client.rebinds[:-1]]


class FakeNodeClient:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection
        self.initial = connection
        self.rebinds: list[FakeConnection] = []

    def rebind(self, connection: FakeConnection) -> FakeConnection:
        previous, self.connection = self.connection, connection
        self.rebinds.append(connection)
        return previous

    async def close(self) -> None:
        await self.connection.close()


async def test_a_request_is_a_kubelet_client_csr_and_the_key_stays_private(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    certificate = await request_certificate(
        signer,  # type: ignore[arg-type]
        node_name="vk-gpu",
        directory=tmp_path,
        expiration_seconds=3600,
        approval_seconds=30,
        now=_now,
    )
    (csr,) = signer.csrs.values()
    spec = csr["spec"]
    assert spec["signerName"] == SIGNER == "kubernetes.io/kube-apiserver-client-kubelet"
    assert spec["usages"] == ["digital signature", "client auth"]
    assert spec["expirationSeconds"] == 3600
    request = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
    cn = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    org = request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert (cn, org) == ("system:node:vk-gpu", "system:nodes")
    assert stat.S_IMODE(certificate.key_file.stat().st_mode) == 0o600
    assert certificate.not_after - certificate.not_before == timedelta(hours=1)
    assert certificate.renew_at(0.7) == certificate.not_before + timedelta(minutes=42)


async def test_a_denied_request_fails_naming_the_condition(tmp_path: Path) -> None:
    signer = FakeSigner()
    signer.outcome = "deny"
    with pytest.raises(NodeIdentityError, match="Denied: Test no"):
        await request_certificate(
            signer,  # type: ignore[arg-type]
            node_name="vk-gpu",
            directory=tmp_path,
            expiration_seconds=3600,
            approval_seconds=30,
        )
    assert not (tmp_path / "node-client.key").exists()


async def test_a_request_nobody_approves_fails_after_the_wait_saying_what_is_missing(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    signer.outcome = "ignore"
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(NodeIdentityError, match="certificatesigningrequests:nodeclient"):
        await request_certificate(
            signer,  # type: ignore[arg-type]
            node_name="vk-gpu",
            directory=tmp_path,
            expiration_seconds=3600,
            approval_seconds=45,
        )
    assert 45 <= loop.time() - started <= 47


async def _identity(tmp_path: Path, signer: FakeSigner, *, fraction: float) -> NodeIdentity:
    first = await request_certificate(
        signer,  # type: ignore[arg-type]
        node_name="vk-gpu",
        directory=tmp_path,
        expiration_seconds=1000,
        approval_seconds=30,
        now=_now,
    )
    client = FakeNodeClient(signer.with_client_certificate(first.cert_file, first.key_file))
    return NodeIdentity(
        signer,  # type: ignore[arg-type]
        client,  # type: ignore[arg-type]
        first,
        node_name="vk-gpu",
        directory=tmp_path,
        expiration_seconds=1000,
        renew_fraction=fraction,
        approval_seconds=30,
        now=_now,
    )


async def test_the_certificate_is_renewed_at_its_fraction_and_the_client_rebound(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    identity = await _identity(tmp_path, signer, fraction=0.5)
    first = identity.certificate
    client: Any = identity.client
    renewing = asyncio.create_task(identity.renew_forever())
    await asyncio.sleep(499)
    assert client.rebinds == []  # not before half the lifetime
    await asyncio.sleep(2)
    assert len(client.rebinds) == 1
    assert identity.certificate.not_before >= first.not_before + timedelta(seconds=500)
    assert client.connection.cert == identity.certificate.cert_file.read_bytes()
    await asyncio.sleep(500)
    assert len(client.rebinds) == 2  # and again, at half of the new lifetime
    renewing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await renewing
    assert len(signer.csrs) == 3
    first_connection, second_connection = (c for c in signer_connections(client))
    assert first_connection.closed  # retired 180 s after its replacement
    assert not second_connection.closed  # replaced a moment ago: calls may still be under way
    await identity.close()
    assert second_connection.closed and client.connection.closed  # nothing left open


async def test_a_failed_renewal_is_retried_and_is_fatal_only_once_expired(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    identity = await _identity(tmp_path, signer, fraction=0.5)
    signer.outcome = "error"
    renewing = asyncio.create_task(identity.renew_forever())
    await asyncio.sleep(600)
    assert not renewing.done()  # retrying while the old certificate holds
    signer.outcome = "sign"
    await asyncio.sleep(31)
    assert not renewing.done()
    assert identity.certificate.not_before > START + timedelta(seconds=500)  # renewed
    signer.outcome = "error"
    with pytest.raises(NodeIdentityError, match="expired"):
        await asyncio.wait_for(renewing, timeout=5000)


async def test_a_backdated_short_certificate_is_renewed_at_its_fraction_not_in_a_loop(
    tmp_path: Path,
) -> None:
    """The cluster's signer backdates NotBefore by five minutes: a 600 s certificate renewed at
    a tenth must wait a minute, not renew at once and for ever."""
    signer = FakeSigner()
    signer.backdate = timedelta(minutes=5)
    first = await request_certificate(
        signer,  # type: ignore[arg-type]
        node_name="vk-gpu",
        directory=tmp_path,
        expiration_seconds=600,
        approval_seconds=30,
        now=_now,
    )
    client = FakeNodeClient(signer.with_client_certificate(first.cert_file, first.key_file))
    identity = NodeIdentity(
        signer,  # type: ignore[arg-type]
        client,  # type: ignore[arg-type]
        first,
        node_name="vk-gpu",
        directory=tmp_path,
        expiration_seconds=600,
        renew_fraction=0.1,
        approval_seconds=30,
        now=_now,
    )
    renewing = asyncio.create_task(identity.renew_forever())
    await asyncio.sleep(59)
    assert client.rebinds == []
    await asyncio.sleep(2)
    assert len(client.rebinds) == 1
    await asyncio.sleep(58)
    assert len(client.rebinds) == 1  # the next one a minute later again
    renewing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await renewing


# --------------------------------------------------------------------------- serving


def _serving(
    signer: FakeSigner,
    directory: Path,
    loaded: list[Path],
    *,
    self_approve: bool,
    certificate: NodeCertificate | None = None,
) -> ServingCertificate:
    """A serving certificate of an hour, renewed at half its life, loads noted in ``loaded``."""
    return ServingCertificate(
        signer,  # type: ignore[arg-type]
        node_name="vk-gpu",
        addresses=("10.0.0.1",),
        directory=directory,
        expiration_seconds=3600,
        renew_fraction=0.5,
        approval_seconds=30,
        self_approve=self_approve,
        on_renewed=lambda c: loaded.append(c.cert_file),
        certificate=certificate,
        now=_now,
    )


async def test_a_serving_request_names_the_node_and_its_address_and_is_self_approved(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    signer.outcome = "approval"  # kubelet-serving: nobody approves it by default
    certificate = await request_serving_certificate(
        signer,  # type: ignore[arg-type]
        node_name="vk-gpu",
        addresses=("10.213.4.1",),
        directory=tmp_path,
        expiration_seconds=86400,
        approval_seconds=30,
        self_approve=True,
        now=_now,
    )
    ((name, csr),) = signer.csrs.items()
    assert signer.approvals == [(name, "VkProviderSelfApproval")]
    spec = csr["spec"]
    assert spec["signerName"] == SERVING_SIGNER == "kubernetes.io/kubelet-serving"
    assert spec["usages"] == ["digital signature", "server auth"]
    request = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
    names = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["vk-gpu"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.213.4.1"]
    cn = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "system:node:vk-gpu"
    assert certificate.cert_file.name == "kubelet-serving.crt"
    assert stat.S_IMODE(certificate.key_file.stat().st_mode) == 0o600


async def test_a_serving_request_nobody_approves_says_how_to_approve_it(tmp_path: Path) -> None:
    signer = FakeSigner()
    signer.outcome = "approval"
    with pytest.raises(NodeIdentityError, match="kubectl certificate approve kubelet-serving-"):
        await request_serving_certificate(
            signer,  # type: ignore[arg-type]
            node_name="vk-gpu",
            addresses=("10.0.0.1",),
            directory=tmp_path,
            expiration_seconds=86400,
            approval_seconds=5,
            self_approve=False,
            now=_now,
        )
    assert signer.approvals == []
    assert not (tmp_path / "kubelet-serving.crt").exists()


async def test_the_serving_certificate_is_renewed_and_loaded_each_time(tmp_path: Path) -> None:
    signer = FakeSigner()
    signer.outcome = "approval"
    loaded: list[Path] = []
    serving = _serving(signer, tmp_path, loaded, self_approve=True)
    first = await serving.obtain()
    renewals = asyncio.create_task(serving.renew_forever())
    await asyncio.sleep(3 * 1800 + 60)  # three half-lives of simulated time
    renewals.cancel()
    with pytest.raises(asyncio.CancelledError):
        await renewals
    assert len(loaded) == 4 and len(signer.csrs) == 4
    assert serving.certificate is not None and serving.certificate.not_after > first.not_after


async def test_a_serving_request_nobody_approves_is_asked_again_until_one_is_approved(
    tmp_path: Path,
) -> None:
    """Not fatal: the agent keeps asking (the node runs meanwhile), and loads the first
    request an operator approves."""
    signer = FakeSigner()
    signer.outcome = "approval"  # signed once approved; nobody does
    loaded: list[Path] = []
    serving = _serving(signer, tmp_path, loaded, self_approve=False)
    running = asyncio.create_task(serving.run())

    async def asked(times: int) -> bool:
        return len(signer.csrs) >= times

    await wait_for(lambda: asked(3), timeout=600, interval=1, what="three requests")
    assert loaded == [] and not running.done()
    pending = list(signer.csrs)[-1]
    await signer.approve_csr(pending, reason="KubectlApprove", message="an operator")

    async def served() -> bool:
        return bool(loaded)

    await wait_for(served, timeout=60, interval=1, what="the approved certificate loaded")
    assert serving.certificate is not None
    assert len(signer.csrs) == 3  # the approved one was the last asked for
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_a_certificate_given_before_is_renewed_when_its_time_comes_not_asked_again(
    tmp_path: Path,
) -> None:
    signer = FakeSigner()
    signer.outcome = "approval"
    first = await request_serving_certificate(
        signer,  # type: ignore[arg-type]
        node_name="vk-gpu",
        addresses=("10.0.0.1",),
        directory=tmp_path,
        expiration_seconds=3600,
        approval_seconds=30,
        self_approve=True,
        now=_now,
    )
    loaded: list[Path] = []
    serving = _serving(signer, tmp_path, loaded, self_approve=True, certificate=first)
    running = asyncio.create_task(serving.run())
    await asyncio.sleep(1700)
    assert len(signer.csrs) == 1 and loaded == []  # the given one serves until half-life
    await asyncio.sleep(200)
    assert len(signer.csrs) == 2 and len(loaded) == 1
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
