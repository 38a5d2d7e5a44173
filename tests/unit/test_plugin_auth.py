"""Who may call a plugin, and whom the agent trusts: the server kit refuses to serve without
client authentication (mutual TLS, or a Unix socket whose file and directory only this user
controls) unless told ``insecure``, which it logs as a WARNING; a TCP client without a
certificate is refused by an mTLS server; the agent checks the server's certificate. Real gRPC
on loopback and on Unix sockets; the certificates are made here with ``cryptography``."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vk_provider.domain.errors import Transient
from vk_provider.domain.models import Capabilities, Instance, LogOptions, Offer, WorkloadSpec
from vk_provider_adapters.plugin import rpc
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb
from vk_provider_adapters.plugin.address import PluginAddress
from vk_provider_adapters.plugin.client import GrpcProvider
from vk_provider_adapters.plugin.config import GrpcProviderConfig
from vk_provider_adapters.plugin.server import InsecureServe, ServerTLS, serve

OFFER = Offer("plugin", "cpu", "local", None, 0, 0, 2, 4, 0.5)


class OneOffer:
    """A provider with one offer and nothing else."""

    name = "plugin"
    capabilities = Capabilities()

    async def offers(self) -> list[Offer]:
        return [OFFER]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        raise AssertionError("unused")

    async def get(self, instance_id: str) -> Instance:
        raise AssertionError("unused")

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        raise AssertionError("unused")

    async def list_ours(self) -> list[Instance]:
        return []

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        yield b""

    async def close(self) -> None:
        return None


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True, slots=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Certs:
    ca: Path
    server: Pair  # for 127.0.0.1 and localhost
    client: Pair
    other_ca: Path  # a CA that signed a client certificate the server must refuse
    other_client: Pair
    other_server: Pair  # a server certificate the agent must refuse


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _authority(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], name: str, *, server: bool, at: Path
) -> Pair:
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca[1], hashes.SHA256())
    pair = Pair(at / f"{name}.crt", at / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(_pem_key(key))
    return pair


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    at = tmp_path_factory.mktemp("certs")
    ca, other = _authority("plugin-ca"), _authority("another-ca")
    (at / "ca.crt").write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    (at / "other-ca.crt").write_bytes(other[0].public_bytes(serialization.Encoding.PEM))
    return Certs(
        ca=at / "ca.crt",
        server=_leaf(ca, "server", server=True, at=at),
        client=_leaf(ca, "agent", server=False, at=at),
        other_ca=at / "other-ca.crt",
        other_client=_leaf(other, "intruder", server=False, at=at),
        other_server=_leaf(other, "impostor", server=True, at=at),
    )


# --------------------------------------------------------------------------- serving


@asynccontextmanager
async def _serving(address: str, **options: Any) -> AsyncIterator[PluginAddress]:
    """``serve()`` running until the block ends; what it bound."""
    bound: asyncio.Future[PluginAddress] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(OneOffer(), address, on_listening=bound.set_result, **options))
    try:
        await asyncio.wait({task, bound}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # it failed: raise why
        yield bound.result()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _refused(work: Awaitable[None]) -> InsecureServe:
    """``serve()`` must refuse at once, not serve (a deadline instead of hanging the test)."""
    with pytest.raises(InsecureServe) as raised:
        await asyncio.wait_for(work, 10)
    return raised.value


def _grpc_client(
    address: PluginAddress, *, allow_insecure_loopback: bool = False, **tls: str
) -> GrpcProvider:
    entry: dict[str, Any] = {"type": "grpc", "name": "agent", "address": str(address)}
    entry |= {"timeout_seconds": 5, "allow_insecure_loopback": allow_insecure_loopback}
    return GrpcProvider(GrpcProviderConfig.model_validate(entry | ({"tls": tls} if tls else {})))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The kit's own warnings (grpc's event-loop noise of other tests is not ours)."""
    kit = "vk_provider_adapters.plugin.server"
    return [r for r in caplog.records if r.name == kit and r.levelno >= logging.WARNING]


async def _offers(client: GrpcProvider) -> list[str]:
    try:
        return [o.sku for o in await client.offers()]
    finally:
        await client.close()


# --------------------------------------------------------------------------- the server


async def test_plain_tcp_even_on_loopback_is_refused_without_insecure() -> None:
    refused = await _refused(serve(OneOffer(), "127.0.0.1:0"))
    assert "authenticates no caller" in str(refused) and "insecure=True" in str(refused)


async def test_tls_without_a_client_ca_is_refused_without_insecure(certs: Certs) -> None:
    tls = ServerTLS(cert_file=certs.server.cert, key_file=certs.server.key)
    for address in ("127.0.0.1:0", "0.0.0.0:0"):
        refused = await _refused(serve(OneOffer(), address, tls=tls))
        assert "client_ca_file" in str(refused)


async def test_plain_tcp_to_other_hosts_is_refused_even_when_insecure() -> None:
    with pytest.raises(ValueError, match="reachable from other hosts"):
        await asyncio.wait_for(serve(OneOffer(), "0.0.0.0:0", insecure=True), 10)


async def test_an_mtls_server_refuses_a_client_without_a_certificate_or_from_another_ca(
    certs: Certs,
) -> None:
    tls = ServerTLS(certs.server.cert, certs.server.key, client_ca_file=certs.ca)
    async with _serving("127.0.0.1:0", tls=tls) as bound:
        assert bound.port != 0
        ca = str(certs.ca)
        with pytest.raises(Transient, match="UNAVAILABLE"):
            await _offers(_grpc_client(bound, ca_file=ca))
        other = {"cert_file": str(certs.other_client.cert), "key_file": str(certs.other_client.key)}
        with pytest.raises(Transient, match="UNAVAILABLE"):
            await _offers(_grpc_client(bound, ca_file=ca, **other))
        # A raw channel without a certificate gets no answer either (not only our client).
        async with grpc.aio.secure_channel(
            bound.target, grpc.ssl_channel_credentials(certs.ca.read_bytes())
        ) as channel:
            call = channel.unary_unary(
                rpc.path("Offers"),
                request_serializer=pb.OffersRequest.SerializeToString,
                response_deserializer=pb.OffersResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call(pb.OffersRequest(), timeout=5)
            assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        mine = {"cert_file": str(certs.client.cert), "key_file": str(certs.client.key)}
        assert await _offers(_grpc_client(bound, ca_file=ca, **mine)) == ["cpu"]


async def test_insecure_serves_anyone_and_says_so_in_a_warning(
    certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="vk_provider_adapters.plugin.server")
    async with _serving("127.0.0.1:0", insecure=True) as bound:
        plain = _grpc_client(bound, allow_insecure_loopback=True)
        assert await _offers(plain) == ["cpu"]  # no credentials at all, and it is served
    (warning,) = _warnings(caplog)
    assert "WITHOUT CLIENT AUTHENTICATION" in warning.getMessage()
    assert str(bound) in warning.getMessage() and "billed" in warning.getMessage()
    caplog.clear()
    tls = ServerTLS(certs.server.cert, certs.server.key)
    async with _serving("127.0.0.1:0", tls=tls, insecure=True) as bound:
        # No client certificate, and it is served: that is what --insecure means.
        assert await _offers(_grpc_client(bound, ca_file=str(certs.ca))) == ["cpu"]
    (warning,) = _warnings(caplog)
    assert "TLS without a client CA" in warning.getMessage()


async def test_mtls_and_a_private_socket_serve_without_a_warning(
    certs: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="vk_provider_adapters.plugin.server")
    tls = ServerTLS(certs.server.cert, certs.server.key, client_ca_file=certs.ca)
    async with _serving("127.0.0.1:0", tls=tls):
        pass
    async with _serving(f"unix://{tmp_path / 'p.sock'}") as bound:
        assert await _offers(_grpc_client(bound)) == ["cpu"]
    assert not _warnings(caplog)


# --------------------------------------------------------------------------- Unix sockets


async def test_the_socket_is_0600_from_its_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mode right after grpc creates the file, before any chmod: no window with a wider
    # one, whatever the process's umask (0 here: the widest).
    at_bind: list[int] = []
    server_class: Any = getattr(grpc.aio, "_server").Server  # noqa: B009 (private on purpose)
    real = server_class.add_insecure_port

    def spy(self: Any, address: str) -> int:
        port: int = real(self, address)
        at_bind.append(stat.S_IMODE(Path(address.removeprefix("unix://")).lstat().st_mode))
        return port

    monkeypatch.setattr(server_class, "add_insecure_port", spy)
    socket = tmp_path / "p.sock"
    old = os.umask(0)
    try:
        async with _serving(f"unix://{socket}") as bound:
            assert bound.unix_path == socket
            info = socket.lstat()
            assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
            assert info.st_uid == os.geteuid()
    finally:
        assert os.umask(old) == 0, "serve() restores the process's umask"
    assert at_bind == [0o600]


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        pytest.param(0o770, "writable by its group (0o770)", id="0770"),
        pytest.param(0o757, "writable by others (0o757)", id="0757"),
        pytest.param(0o1777, "writable by its group and others (0o1777)", id="1777-like-tmp"),
    ],
)
async def test_a_socket_directory_others_may_write_is_refused(
    tmp_path: Path, mode: int, problem: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    refused = await _refused(serve(OneOffer(), f"unix://{shared / 'p.sock'}"))
    assert str(shared) in str(refused) and problem in str(refused)
    assert not (shared / "p.sock").exists(), "nothing was bound"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
async def test_a_socket_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    refused = await _refused(serve(OneOffer(), f"unix://{theirs / 'p.sock'}"))
    assert "owned by uid 65534" in str(refused)


async def test_insecure_serves_in_a_shared_directory_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="vk_provider_adapters.plugin.server")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    async with _serving(f"unix://{shared / 'p.sock'}", insecure=True) as bound:
        assert await _offers(_grpc_client(bound)) == ["cpu"]
        assert stat.S_IMODE((shared / "p.sock").lstat().st_mode) == 0o600
    (warning,) = _warnings(caplog)
    assert "WITHOUT CLIENT AUTHENTICATION" in warning.getMessage()
    assert "writable by" in warning.getMessage()


async def test_a_missing_socket_directory_is_an_error_not_an_exposure(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist") as raised:
        await asyncio.wait_for(serve(OneOffer(), f"unix://{tmp_path / 'no' / 'p.sock'}"), 10)
    assert not isinstance(raised.value, InsecureServe)


# --------------------------------------------------------------------------- the agent


async def test_the_agent_refuses_a_server_its_ca_did_not_sign_or_of_another_name(
    certs: Certs,
) -> None:
    impostor = ServerTLS(certs.other_server.cert, certs.other_server.key, client_ca_file=certs.ca)
    mine = {"cert_file": str(certs.client.cert), "key_file": str(certs.client.key)}
    async with _serving("127.0.0.1:0", tls=impostor) as bound:
        with pytest.raises(Transient, match="UNAVAILABLE"):
            await _offers(_grpc_client(bound, ca_file=str(certs.ca), **mine))
    genuine = ServerTLS(certs.server.cert, certs.server.key, client_ca_file=certs.ca)
    async with _serving("127.0.0.1:0", tls=genuine) as bound:
        wrong_name = {"server_name": "plugin.example", **mine}
        with pytest.raises(Transient, match="UNAVAILABLE"):
            await _offers(_grpc_client(bound, ca_file=str(certs.ca), **wrong_name))
        assert await _offers(_grpc_client(bound, ca_file=str(certs.ca), **mine)) == ["cpu"]
