"""The kubelet API of the virtual node: who gets in, what they may do, how logs stream.

Every test talks to a real server on 127.0.0.1 over real TLS, with certificates from the
local-cluster PKI; authentication, authorisation and logs are fakes that record their calls.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
import stat
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from tests.unit.kubelet_harness import (
    NODE,
    SECRET_TOKEN,
    FakeAuthenticator,
    FakeAuthorizer,
    FakeLogSource,
    StartServer,
    pki,
    start_server,
)
from vk_provider.api.authn import RequestAttributes, UserInfo, request_attributes
from vk_provider.api.kubelet import (
    InvalidLogQuery,
    KubeletApiServer,
    LogsNotFound,
    LogsUnavailable,
    parse_log_options,
)
from vk_provider.api.tls import build_server_ssl_context, ensure_serving_certificate
from vk_provider.domain.models import LogOptions
from vk_provider.runtime.agent_kubelet import saved_serving_certificate
from vk_provider_dev.cluster.pki import ClusterPKI, ensure_pki

__all__ = ["pki", "start_server"]  # fixtures, used by name

# --------------------------------------------------------------------------- authentication


async def test_a_request_without_identity_is_401_and_never_authorised(
    start_server: StartServer,
) -> None:
    api = await start_server()
    async with api.client() as client:
        response = await client.get("/healthz")
    assert response.status_code == 401
    assert response.text == "Unauthorized"
    assert api.authorizer.calls == []


async def test_a_client_certificate_from_the_cluster_ca_is_a_user(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    api = await start_server()
    async with api.client(pki.admin) as client:
        response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.text == "ok"
    [(user, attributes)] = api.authorizer.calls
    assert user == UserInfo("vk-admin", ("system:masters", "system:authenticated"))
    assert attributes == RequestAttributes(
        verb="get", resource="nodes", subresource="proxy", name=NODE, api_group=""
    )


async def test_a_client_certificate_from_another_ca_is_rejected(
    start_server: StartServer, tmp_path: Path
) -> None:
    other = ClusterPKI(tmp_path / "other")
    ensure_pki(other, cluster_name="other", service_ip="10.0.0.1")
    api = await start_server()
    async with api.client(other.admin) as client:
        try:
            response = await client.get("/healthz")
        except httpx.TransportError:
            pass  # the TLS handshake failed, as with a kubelet
        else:
            assert response.status_code == 401
    assert api.authorizer.calls == []


async def test_a_serving_certificate_is_not_a_client_certificate(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    # The API server's serving certificate chains to the same CA but lacks clientAuth.
    api = await start_server()
    async with api.client(pki.apiserver) as client:
        try:
            response = await client.get("/healthz")
        except httpx.TransportError:
            pass
        else:
            assert response.status_code == 401
    assert api.authorizer.calls == []


async def test_a_valid_bearer_token_is_a_user(start_server: StartServer) -> None:
    account = UserInfo("system:serviceaccount:ns:sa", ("system:serviceaccounts",), uid="u-1")
    api = await start_server(authenticator=FakeAuthenticator(tokens={SECRET_TOKEN: account}))
    async with api.client(token=SECRET_TOKEN) as client:
        response = await client.get("/healthz")
    assert response.status_code == 200
    [(user, _)] = api.authorizer.calls
    assert user == UserInfo(
        "system:serviceaccount:ns:sa",
        ("system:serviceaccounts", "system:authenticated"),
        uid="u-1",
    )


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {SECRET_TOKEN}", f"Basic {SECRET_TOKEN}", "bearer " + SECRET_TOKEN, "Bearer"],
)
async def test_an_invalid_or_malformed_token_is_401_and_never_logged(
    start_server: StartServer, caplog: pytest.LogCaptureFixture, authorization: str
) -> None:
    caplog.set_level(logging.DEBUG)
    api = await start_server()
    async with api.client() as client:
        response = await client.get("/healthz", headers={"Authorization": authorization})
    assert response.status_code == 401
    assert api.authorizer.calls == []
    assert api.authenticator.seen == (
        [SECRET_TOKEN] if authorization.lower().startswith("bearer s") else []
    )
    server_side = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert all(SECRET_TOKEN not in r.getMessage() for r in server_side)


# --------------------------------------------------------------------------- authorisation


async def test_a_denied_request_is_403_with_a_kubelet_message(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    api = await start_server(authorizer=FakeAuthorizer(allow=False))
    async with api.client(pki.admin) as client:
        response = await client.get("/containerLogs/ns/pod/main")
    assert response.status_code == 403
    assert response.text == (
        "Forbidden (user=vk-admin, verb=get, resource=nodes, subresource(s)=[proxy])"
    )
    assert api.logs.calls == []


async def test_an_unknown_path_is_404_after_authorisation(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    api = await start_server()
    async with api.client(pki.admin) as client:
        response = await client.post("/exec/ns/pod/main")
    assert response.status_code == 404
    [(_, attributes)] = api.authorizer.calls
    assert (attributes.verb, attributes.subresource) == ("create", "proxy")


@pytest.mark.parametrize(
    ("method", "path", "verb", "subresource"),
    [
        ("GET", "/containerLogs/ns/pod/c", "get", "proxy"),
        ("GET", "/healthz", "get", "proxy"),
        ("HEAD", "/healthz", "get", "proxy"),
        ("POST", "/exec/ns/pod/c", "create", "proxy"),
        ("GET", "/logs", "get", "log"),
        ("GET", "/logs/", "get", "log"),
        ("GET", "/logs/syslog", "get", "log"),
        ("GET", "/logsandmore", "get", "proxy"),
        ("GET", "/stats/summary", "get", "stats"),
        ("GET", "/metrics", "get", "metrics"),
        ("GET", "/metrics/cadvisor", "get", "metrics"),
        ("GET", "/spec/", "get", "spec"),
        ("POST", "/checkpoint/ns/pod/c", "create", "checkpoint"),
        ("PUT", "/pods", "update", "proxy"),
        ("PATCH", "/pods", "patch", "proxy"),
        ("DELETE", "/pods", "delete", "proxy"),
    ],
)
def test_request_attributes_follow_kubelet(
    method: str, path: str, verb: str, subresource: str
) -> None:
    assert request_attributes(method, path, NODE) == RequestAttributes(
        verb=verb, subresource=subresource, name=NODE
    )


# --------------------------------------------------------------------------- logs


async def test_follow_streams_each_line_as_it_comes(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    gate = asyncio.Event()
    api = await start_server(logs=FakeLogSource(gate=gate))
    async with (
        api.client(pki.kubelet_client) as client,
        client.stream("GET", "/containerLogs/ns/pod/main?follow=true") as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        chunks = response.aiter_bytes()
        assert await anext(chunks) == b"line 1\n"
        assert not api.logs.finished.is_set()  # the first line came before the source ended
        gate.set()
        rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"line 2\n"
    [(namespace, pod, container, options)] = api.logs.calls
    assert (namespace, pod, container) == ("ns", "pod", "main")
    assert options == LogOptions(follow=True)
    assert api.logs.closed.is_set()


async def test_log_options_are_passed_through(start_server: StartServer, pki: ClusterPKI) -> None:
    api = await start_server()
    async with api.client(pki.kubelet_client) as client:
        response = await client.get(
            "/containerLogs/ns/pod/main",
            params={
                "tailLines": "10",
                "timestamps": "true",
                "sinceSeconds": "30",
                "limitBytes": "1000",
            },
        )
    assert response.status_code == 200
    assert response.text == "line 1\nline 2\n"
    [(_, _, _, options)] = api.logs.calls
    assert options == LogOptions(
        tail_lines=10, timestamps=True, since_seconds=30, limit_bytes=1000, follow=False
    )


async def test_limit_bytes_cuts_the_stream(start_server: StartServer, pki: ClusterPKI) -> None:
    api = await start_server(logs=FakeLogSource(lines=[b"abcdef"] * 3))
    async with api.client(pki.kubelet_client) as client:
        response = await client.get("/containerLogs/ns/pod/main", params={"limitBytes": "8"})
    assert response.content == b"abcdefab"
    assert api.logs.closed.is_set()


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("tailLines=ten", "tailLines"),
        ("tailLines=-1", "tailLines"),
        ("tailLines=1_0", "tailLines"),
        ("limitBytes=0", "limitBytes"),
        ("sinceSeconds=0", "sinceSeconds"),
        ("sinceTime=yesterday", "sinceTime"),
    ],
)
async def test_a_bad_query_parameter_is_400_naming_it(
    start_server: StartServer, pki: ClusterPKI, query: str, named: str
) -> None:
    api = await start_server()
    async with api.client(pki.kubelet_client) as client:
        response = await client.get(f"/containerLogs/ns/pod/main?{query}")
    assert response.status_code == 400
    assert named in response.text
    assert api.logs.calls == []


async def test_previous_is_passed_to_the_log_source(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    api = await start_server()
    async with api.client(pki.kubelet_client) as client:
        response = await client.get("/containerLogs/ns/pod/main?previous=true")
    assert response.status_code == 200
    [(_, _, container, options)] = api.logs.calls
    assert (container, options) == ("main", LogOptions(previous=True))


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (LogsNotFound('container "main" not found in pod "pod"'), 404),
        (LogsUnavailable('container "main" in pod "pod" is waiting to start'), 400),
    ],
)
async def test_log_source_errors_map_to_kubelet_statuses(
    start_server: StartServer, pki: ClusterPKI, error: Exception, status: int
) -> None:
    api = await start_server(logs=FakeLogSource(error=error))
    async with api.client(pki.kubelet_client) as client:
        response = await client.get("/containerLogs/ns/pod/main")
    assert response.status_code == status
    assert response.text == str(error)


async def test_a_client_leaving_a_follow_closes_the_source_quietly(
    start_server: StartServer, pki: ClusterPKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api = await start_server(logs=FakeLogSource(gate=asyncio.Event()))
    async with (
        api.client(pki.kubelet_client) as client,
        client.stream("GET", "/containerLogs/ns/pod/main?follow=true") as response,
    ):
        assert await anext(response.aiter_bytes()) == b"line 1\n"
    # The source waits for a line that never comes; the disconnect alone must close it.
    await asyncio.wait_for(api.logs.closed.wait(), timeout=5)
    assert not api.logs.finished.is_set()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_stop_ends_open_follow_streams_quickly(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    api = await start_server(logs=FakeLogSource(gate=asyncio.Event()))
    loop = asyncio.get_running_loop()
    async with (
        api.client(pki.kubelet_client) as client,
        client.stream("GET", "/containerLogs/ns/pod/main?follow=true") as response,
    ):
        assert await anext(response.aiter_bytes()) == b"line 1\n"
        started = loop.time()
        await asyncio.wait_for(api.server.stop(), timeout=5)
        assert loop.time() - started < 1.5
    assert api.logs.closed.is_set()
    async with api.client(pki.kubelet_client) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/healthz")


# --------------------------------------------------------------------------- pure parsing

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def test_log_query_defaults_and_booleans_follow_kubernetes() -> None:
    assert parse_log_options({}, now=NOW) == LogOptions()
    for value in ("true", "1", "True", "yes", ""):
        assert parse_log_options({"follow": value}, now=NOW).follow
    for value in ("false", "0", "FALSE"):
        assert not parse_log_options({"follow": value}, now=NOW).follow


def test_since_time_becomes_seconds_before_now() -> None:
    options = parse_log_options({"sinceTime": "2025-01-01T11:58:59.5Z"}, now=NOW)
    assert options.since_seconds == 61
    future = parse_log_options({"sinceTime": "2025-01-01T13:00:00Z"}, now=NOW)
    assert future.since_seconds == 1
    with pytest.raises(InvalidLogQuery, match="at most one"):
        parse_log_options({"sinceTime": "2025-01-01T11:00:00Z", "sinceSeconds": "5"}, now=NOW)


def test_integers_out_of_int64_are_refused() -> None:
    with pytest.raises(InvalidLogQuery, match="tailLines"):
        parse_log_options({"tailLines": str(2**63)}, now=NOW)


# --------------------------------------------------------------------------- serving certificate


def _san(path: Path) -> tuple[set[str], set[str]]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(names.get_values_for_type(x509.DNSName)), {
        str(ip) for ip in names.get_values_for_type(x509.IPAddress)
    }


def test_serving_certificate_is_made_once_and_reused(tmp_path: Path) -> None:
    cert, key = ensure_serving_certificate(
        tmp_path / "tls", node_name=NODE, ip_addresses=("127.0.0.1", "10.1.2.3")
    )
    assert _san(cert) == ({NODE}, {"127.0.0.1", "10.1.2.3"})
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    first = cert.read_bytes()
    again = ensure_serving_certificate(tmp_path / "tls", node_name=NODE, ip_addresses=("10.1.2.3",))
    assert again == (cert, key)
    assert cert.read_bytes() == first
    # An address it does not name makes a new one.
    ensure_serving_certificate(tmp_path / "tls", node_name=NODE, ip_addresses=("10.9.9.9",))
    assert cert.read_bytes() != first
    assert _san(cert) == ({NODE}, {"10.9.9.9"})


def _token_server(context: ssl.SSLContext, authorizer: FakeAuthorizer) -> KubeletApiServer:
    """A kubelet API on a free loopback port that knows one bearer token."""
    return KubeletApiServer(
        node_name=NODE,
        host="127.0.0.1",
        port=0,
        ssl_context=context,
        authenticator=FakeAuthenticator(tokens={SECRET_TOKEN: UserInfo("someone", ())}),
        authorizer=authorizer,
        logs=FakeLogSource(),
    )


def _trusting(server: KubeletApiServer, cert: Path) -> httpx.AsyncClient:
    """An HTTPS client of ``server`` that trusts ``cert`` alone."""
    return httpx.AsyncClient(
        base_url=f"https://127.0.0.1:{server.port}", verify=ssl.create_default_context(cafile=cert)
    )


async def test_a_self_signed_serving_certificate_serves_tls_with_tokens_only(
    tmp_path: Path,
) -> None:
    cert, key = ensure_serving_certificate(
        tmp_path / "tls", node_name=NODE, ip_addresses=("127.0.0.1",)
    )
    authorizer = FakeAuthorizer()
    server = _token_server(build_server_ssl_context(cert, key, None), authorizer)
    await server.start()
    try:
        async with _trusting(server, cert) as client:
            assert (await client.get("/healthz")).status_code == 401
            response = await client.get(
                "/healthz", headers={"Authorization": f"Bearer {SECRET_TOKEN}"}
            )
        assert response.status_code == 200
        assert authorizer.calls[0][0] == UserInfo("someone", ("system:authenticated",))
    finally:
        await server.stop()


async def test_without_a_certificate_yet_every_handshake_fails_until_one_is_loaded(
    tmp_path: Path,
) -> None:
    """A cluster-signed certificate still pending: the server listens but serves nobody,
    then serves the pair loaded into its context, without a restart."""
    cert, key = ensure_serving_certificate(
        tmp_path / "tls", node_name=NODE, ip_addresses=("127.0.0.1",)
    )
    context = build_server_ssl_context(None, None, None)
    server = _token_server(context, FakeAuthorizer())
    await server.start()
    try:
        async with _trusting(server, cert) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get("/healthz")
            context.load_cert_chain(cert, key)
            assert (await client.get("/healthz")).status_code == 401
    finally:
        await server.stop()


def test_a_saved_cluster_signed_certificate_is_reused_only_while_it_fits(tmp_path: Path) -> None:
    """After a container restart the pair in the state directory serves again (no new
    request to approve) when it names the node and its address; else a new one is asked."""
    directory = tmp_path / "kubelet-tls"
    assert saved_serving_certificate(directory, node_name=NODE, address="10.1.2.3") is None
    cert, key = ensure_serving_certificate(directory, node_name=NODE, ip_addresses=("10.1.2.3",))
    cert.rename(directory / "kubelet-serving.crt")
    key.rename(directory / "kubelet-serving.key")
    saved = saved_serving_certificate(directory, node_name=NODE, address="10.1.2.3")
    assert saved is not None and saved.cert_file == directory / "kubelet-serving.crt"
    assert saved.not_after > dt.datetime.now(dt.UTC)
    assert saved_serving_certificate(directory, node_name=NODE, address="10.9.9.9") is None
    assert saved_serving_certificate(directory, node_name="other", address="10.1.2.3") is None
