"""Key material of the local cluster: a working chain, private keys private, never replaced."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vk_provider_dev.cluster.pki import (
    FRONT_PROXY_CLIENT,
    KUBELET_CLIENT_USER,
    ClusterPKI,
    ensure_pki,
)


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certificates_chain_to_the_ca_with_the_right_identities(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path / "pki")
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    ca = _load(pki.ca.cert)
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    for pair in (
        pki.apiserver,
        pki.admin,
        pki.controller_manager,
        pki.scheduler,
        pki.kubelet_client,
    ):
        cert = _load(pair.cert)
        cert.verify_directly_issued_by(ca)
    server = _load(pki.apiserver.cert)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in names.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.0.0.1",
    }
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    admin = _load(pki.admin.cert)
    assert (
        admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    )
    kubelet_client = _load(pki.kubelet_client.cert)
    assert kubelet_client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        KUBELET_CLIENT_USER
    )
    # The kubelet client is deliberately not a cluster admin.
    assert not kubelet_client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)


def test_private_keys_are_private(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path / "pki")
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    for key in [*pki.directory.glob("*.key")]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_existing_material_is_kept(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path / "pki")
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    before = {p.name: p.read_bytes() for p in pki.directory.iterdir()}
    pki.scheduler.cert.unlink()
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    after = {p.name: p.read_bytes() for p in pki.directory.iterdir()}
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"scheduler.crt", "scheduler.key"}


def test_the_front_proxy_has_a_ca_of_its_own(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path / "pki")
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    front_ca, cluster_ca = _load(pki.front_proxy_ca.cert), _load(pki.ca.cert)
    client = _load(pki.front_proxy_client.cert)
    client.verify_directly_issued_by(front_ca)
    assert client.issuer != cluster_ca.subject  # the cluster CA's clients are not the proxy
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        FRONT_PROXY_CLIENT
    )
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_an_older_cluster_gets_front_proxy_material_on_its_next_up(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path / "pki")
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    for pair in (pki.front_proxy_ca, pki.front_proxy_client):
        pair.cert.unlink()
        pair.key.unlink()
    ca_before = pki.ca.cert.read_bytes()
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    assert pki.front_proxy_client.cert.exists() and pki.ca.cert.read_bytes() == ca_before
