"""TLS of the kubelet API: the serving certificate, and the server's SSL context.

Invariants: the serving certificate is made once and reused until it no longer fits (names,
addresses, expiry within 30 days, a key that is not its pair); files are written atomically,
the key with mode 0600; client certificates are verified against the cluster CA only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

logger = logging.getLogger(__name__)


_SERVING_VALIDITY = dt.timedelta(days=365)


# A serving certificate this close to expiry is replaced at start-up rather than reused.
_SERVING_RENEW_BEFORE = dt.timedelta(days=30)


def build_server_ssl_context(
    cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None
) -> ssl.SSLContext:
    """The TLS context of the kubelet API; without ``cert_file`` it has no certificate yet
    (every handshake fails, as a kubelet's does while its serving certificate is pending)
    until one is loaded with ``load_cert_chain``.

    Client certificates are requested but optional (``CERT_OPTIONAL``, Go's
    ``VerifyClientCertIfGiven``): a certificate that does not chain to ``client_ca_file``, or is
    not meant for client authentication, fails the handshake; no certificate at all leaves
    bearer tokens. Deliberately not ``ssl.create_default_context``: that would also trust the
    system CAs for client certificates.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["http/1.1"])
    if client_ca_file is not None:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def ensure_serving_certificate(
    directory: Path, *, node_name: str, ip_addresses: tuple[str, ...]
) -> tuple[Path, Path]:
    """A self-signed serving certificate for the node, made once and reused (``kubelet.crt``).

    It is replaced only when it no longer fits: unreadable, key and certificate not a pair,
    expiring within 30 days, or not naming ``node_name`` and every address in ``ip_addresses``.
    Files are written atomically; the key with mode 0600.
    """
    cert_file = directory / "kubelet.crt"
    key_file = directory / "kubelet.key"
    if serving_certificate_fits(
        cert_file, key_file, node_name=node_name, ip_addresses=ip_addresses
    ):
        return cert_file, key_file
    wanted_dns, wanted_ips = _serving_names(node_name, ip_addresses)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_name)])
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in sorted(wanted_dns)]
    alt_names += [x509.IPAddress(ip) for ip in sorted(wanted_ips, key=str)]
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _SERVING_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    certificate = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Key first: a crash in between leaves a mismatched pair, which the next start replaces.
    _write_atomically(key_file, key_pem, mode=0o600)
    _write_atomically(cert_file, certificate.public_bytes(serialization.Encoding.PEM), mode=0o644)
    logger.info("kubelet API: made a self-signed serving certificate %s", cert_file)
    return cert_file, key_file


_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _serving_names(
    node_name: str, ip_addresses: tuple[str, ...]
) -> tuple[set[str], set[_IPAddress]]:
    dns: set[str] = set()
    ips = {ipaddress.ip_address(ip) for ip in ip_addresses}
    try:
        ips.add(ipaddress.ip_address(node_name))
    except ValueError:
        dns.add(node_name)
    return dns, ips


def serving_certificate_fits(
    cert_file: Path,
    key_file: Path,
    *,
    node_name: str,
    ip_addresses: tuple[str, ...],
    valid_for: dt.timedelta = _SERVING_RENEW_BEFORE,
) -> bool:
    """Whether the pair is readable, a pair, valid for ``valid_for`` still, and names
    ``node_name`` and every address in ``ip_addresses``."""
    dns, ips = _serving_names(node_name, ip_addresses)
    if not (cert_file.exists() and key_file.exists()):
        return False
    try:
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (ValueError, TypeError, OSError):
        return False
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if key.public_key().public_bytes(encoding, public) != certificate.public_key().public_bytes(
        encoding, public
    ):
        return False
    if certificate.not_valid_after_utc - valid_for < dt.datetime.now(dt.UTC):
        return False
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return not dns and not ips
    return dns <= set(san.get_values_for_type(x509.DNSName)) and ips <= set(
        san.get_values_for_type(x509.IPAddress)
    )


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    temporary.replace(path)
