"""Shared by the kubelet API tests: a real server on 127.0.0.1 over real TLS, with
certificates from the local-cluster PKI, and fakes for authentication, authorisation and
logs that record their calls. Import the fixtures (``pki``, ``start_server``) into a test
module to use them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from vk_provider.api.authn import RequestAttributes, UserInfo
from vk_provider.api.kubelet import KubeletApiServer, KubeletSources
from vk_provider.api.tls import build_server_ssl_context
from vk_provider.domain.models import LogOptions
from vk_provider_dev.cluster.pki import CertPair, ClusterPKI, ensure_pki, issue_certificate

NODE = "vk-node"
SECRET_TOKEN = "s3cret-token-never-logged"


# --------------------------------------------------------------------------- fakes


@dataclass
class FakeAuthenticator:
    tokens: dict[str, UserInfo] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)

    async def authenticate_token(self, token: str) -> UserInfo | None:
        self.seen.append(token)
        return self.tokens.get(token)


@dataclass
class FakeAuthorizer:
    allow: bool = True
    calls: list[tuple[UserInfo, RequestAttributes]] = field(default_factory=list)

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        self.calls.append((user, attributes))
        return self.allow


@dataclass
class FakeLogSource:
    """Yields ``lines``; before each line after the first it waits for ``gate`` if given."""

    lines: list[bytes] = field(default_factory=lambda: [b"line 1\n", b"line 2\n"])
    gate: asyncio.Event | None = None
    error: Exception | None = None
    calls: list[tuple[str, str, str, LogOptions]] = field(default_factory=list)
    first_sent: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def open_logs(
        self, namespace: str, pod: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        self.calls.append((namespace, pod, container, options))
        if self.error is not None:
            raise self.error
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        try:
            for index, line in enumerate(self.lines):
                if index and self.gate is not None:
                    await self.gate.wait()
                yield line
                self.first_sent.set()
            self.finished.set()
        finally:
            self.closed.set()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def pki(tmp_path: Path) -> ClusterPKI:
    """The cluster CA with its client certificates, and a serving certificate for the node."""
    pki = ClusterPKI(tmp_path / "pki")
    ensure_pki(pki, cluster_name="t", service_ip="10.0.0.1")
    issue_certificate(
        pki.ca,
        CertPair(pki.directory / "node.crt", pki.directory / "node.key"),
        common_name=NODE,
        server=True,
        dns_names=(NODE,),
        ip_addresses=("127.0.0.1",),
    )
    return pki


def client_context(ca: Path, cert: CertPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    return context


@dataclass
class Running:
    server: KubeletApiServer
    authenticator: FakeAuthenticator
    authorizer: FakeAuthorizer
    logs: FakeLogSource
    ca: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    def client(
        self, cert: CertPair | None = None, *, token: str | None = None
    ) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(
            base_url=self.url,
            verify=client_context(self.ca, cert),
            headers=headers,
            timeout=5,
        )


StartServer = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_server(pki: ClusterPKI) -> AsyncIterator[StartServer]:
    servers: list[KubeletApiServer] = []

    async def start(
        *,
        authenticator: FakeAuthenticator | None = None,
        authorizer: FakeAuthorizer | None = None,
        logs: FakeLogSource | None = None,
        sources: KubeletSources | None = None,
    ) -> Running:
        authenticator = authenticator or FakeAuthenticator()
        authorizer = authorizer or FakeAuthorizer()
        logs = logs or FakeLogSource()
        server = KubeletApiServer(
            node_name=NODE,
            host="127.0.0.1",
            port=0,
            ssl_context=build_server_ssl_context(
                pki.directory / "node.crt", pki.directory / "node.key", pki.ca.cert
            ),
            authenticator=authenticator,
            authorizer=authorizer,
            logs=logs,
            sources=sources or KubeletSources(),
        )
        running = Running(server, authenticator, authorizer, logs, ca=pki.ca.cert)
        await running.server.start()
        servers.append(running.server)
        return running

    yield start
    for server in servers:
        await server.stop()
