"""Certificates and keys for the local control plane.

One self-signed CA signs every certificate: the API server's serving certificate, the client
certificates of the admin, controller-manager, scheduler and the API server's kubelet client.
The service-account signing key pair is separate (RSA, as kube-apiserver expects PEM keys).

The aggregation layer has a CA of its own, as kubeadm sets it up: ``front-proxy-ca`` signs the
one client certificate (``front-proxy-client``) the API server presents when it proxies to an
extension API server (metrics-server), which trusts it through ``--requestheader-client-ca-file``
published in ``kube-system/extension-apiserver-authentication``. A separate CA keeps the cluster
CA's client certificates from passing as the front proxy.

Invariants:
- Material is generated once per cluster and reused on every later ``up`` (idempotence: a
  restarted API server must accept tokens and kubeconfigs issued before).
- Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)

# The user name the API server presents to kubelet APIs (kubectl logs/exec/port-forward).
# It is bound to the built-in ClusterRole system:kubelet-api-admin after start-up, exactly as
# kubeadm does, instead of being made a cluster admin.
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
# The name extension API servers accept as the front proxy (--requestheader-allowed-names).
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True, slots=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class ClusterPKI:
    """Where each piece of key material lives inside a cluster's state directory."""

    directory: Path

    @property
    def ca(self) -> CertPair:
        return self._pair("ca")

    @property
    def apiserver(self) -> CertPair:
        return self._pair("apiserver")

    @property
    def admin(self) -> CertPair:
        return self._pair("admin")

    @property
    def controller_manager(self) -> CertPair:
        return self._pair("controller-manager")

    @property
    def scheduler(self) -> CertPair:
        return self._pair("scheduler")

    @property
    def kubelet_client(self) -> CertPair:
        return self._pair("apiserver-kubelet-client")

    @property
    def front_proxy_ca(self) -> CertPair:
        return self._pair("front-proxy-ca")

    @property
    def front_proxy_client(self) -> CertPair:
        return self._pair("front-proxy-client")

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def _pair(self, name: str) -> CertPair:
        return CertPair(cert=self.directory / f"{name}.crt", key=self.directory / f"{name}.key")


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def _create_ca(pair: CertPair, *, common_name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + 10 * _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(pair.key, _pem_key(key))
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_ca(pair: CertPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pair.key} is not an EC private key")
    return cert, key


def issue_certificate(
    ca: CertPair,
    target: CertPair,
    *,
    common_name: str,
    organization: str | None = None,
    server: bool = False,
    client: bool = False,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
) -> None:
    """Issue a certificate signed by ``ca`` and write it (and a fresh key) to ``target``."""
    ca_cert, ca_key = _load_ca(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_private(target.key, _pem_key(key))
    target.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _missing(pair: CertPair) -> bool:
    return not (pair.cert.exists() and pair.key.exists())


def ensure_pki(pki: ClusterPKI, *, cluster_name: str, service_ip: str) -> None:
    """Create whatever key material is missing; never replace what exists."""
    pki.directory.mkdir(parents=True, exist_ok=True)
    if not pki.ca.cert.exists():
        _create_ca(pki.ca, common_name=f"vk-provider-local-ca-{cluster_name}")
    if not pki.front_proxy_ca.cert.exists():
        _create_ca(pki.front_proxy_ca, common_name=f"vk-provider-front-proxy-ca-{cluster_name}")
    if _missing(pki.front_proxy_client):
        issue_certificate(
            pki.front_proxy_ca, pki.front_proxy_client, common_name=FRONT_PROXY_CLIENT, client=True
        )
    if _missing(pki.apiserver):
        issue_certificate(
            pki.ca,
            pki.apiserver,
            common_name="kube-apiserver",
            server=True,
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", service_ip),
        )
    clients = (
        (pki.admin, "vk-admin", "system:masters"),
        (pki.controller_manager, "system:kube-controller-manager", None),
        (pki.scheduler, "system:kube-scheduler", None),
        (pki.kubelet_client, KUBELET_CLIENT_USER, None),
    )
    for pair, user, group in clients:
        if _missing(pair):
            issue_certificate(pki.ca, pair, common_name=user, organization=group, client=True)
    if not pki.service_account_key.exists():
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_private(pki.service_account_key, _pem_key(sa_key))
        pki.service_account_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
