"""The probe actions the agent runs: httpGet, tcpSocket, grpc (health v1) and exec.

Each returns ``Outcome(ok, message)``; a timeout or an error is a failed probe, never an
exception. Semantics follow kubelet: an HTTP status 200-399 succeeds (redirects are not
followed; HTTPS is not verified); a TCP probe succeeds when a connection opens; a gRPC probe
calls ``grpc.health.v1.Health/Check`` and succeeds on SERVING; an exec probe succeeds on exit
code 0 (it runs in the container through the provider's ``SupportsExec``).

Invariants: every action finishes within the probe's ``timeout_seconds`` (plus closing); the
message never holds more than the first 200 bytes of what the container said.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import httpx

from vk_provider.domain.containers import Probe
from vk_provider.domain.contract import Provider, SupportsExec
from vk_provider.domain.errors import ProviderError

_MESSAGE_BYTES = 200
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING = 1


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    message: str = ""


def _health_request(service: str) -> bytes:
    """``HealthCheckRequest{service}`` in protobuf's wire format (field 1, a string)."""
    data = service.encode()
    if not data:
        return b""
    length = len(data)
    varint = bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"\x0a" + bytes(varint) + data


def _health_status(response: bytes) -> int:
    """``HealthCheckResponse.status`` (field 1, an enum); 0 (UNKNOWN) when absent."""
    if len(response) >= 2 and response[0] == 0x08:
        return response[1] & 0x7F
    return 0


async def http_probe(probe: Probe, host: str, client: httpx.AsyncClient) -> Outcome:
    url = f"{probe.scheme.lower()}://{host}:{probe.port}{probe.path}"
    headers = {"User-Agent": "kube-probe/vk-provider", **dict(probe.headers)}
    try:
        response = await client.get(url, headers=headers, timeout=probe.timeout_seconds)
    except httpx.HTTPError as exc:
        return Outcome(False, f"Get {url!r}: {type(exc).__name__}: {exc}"[:_MESSAGE_BYTES])
    if 200 <= response.status_code < 400:
        return Outcome(True)
    body = response.content[:_MESSAGE_BYTES].decode(errors="replace")
    return Outcome(False, f"HTTP probe failed with statuscode: {response.status_code} {body}")


async def tcp_probe(probe: Probe, host: str) -> Outcome:
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, probe.port), probe.timeout_seconds
        )
    except (OSError, TimeoutError) as exc:
        return Outcome(False, f"dial tcp {host}:{probe.port}: {exc or type(exc).__name__}")
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Outcome(True)


async def grpc_probe(probe: Probe, host: str) -> Outcome:
    import grpc  # about 7 MiB resident: loaded by the first gRPC probe, not by every agent

    target = f"{host}:{probe.port}"
    async with grpc.aio.insecure_channel(target) as channel:
        check: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_HEALTH_CHECK)
        try:
            response = await check(
                _health_request(probe.grpc_service), timeout=probe.timeout_seconds
            )
        except grpc.aio.AioRpcError as exc:
            return Outcome(False, f"gRPC health check to {target}: {exc.code().name}")
    status = _health_status(response)
    if status == _SERVING:
        return Outcome(True)
    return Outcome(False, f"service unhealthy (responded with status {status})")


async def exec_probe(probe: Probe, provider: Provider, instance_id: str, container: str) -> Outcome:
    if not isinstance(provider, SupportsExec) or not provider.capabilities.exec:
        return Outcome(False, f"provider {provider.name} cannot exec into containers")
    try:
        session = await provider.exec(instance_id, container, list(probe.command), tty=False)
    except ProviderError as exc:
        return Outcome(False, f"exec failed: {exc}")
    output = bytearray()

    async def run() -> int:
        await session.close_stdin()
        async for _, chunk in session.output():
            if len(output) < _MESSAGE_BYTES:
                output.extend(chunk[: _MESSAGE_BYTES - len(output)])
        return await session.wait()

    try:
        code = await asyncio.wait_for(run(), probe.timeout_seconds)
    except TimeoutError:
        return Outcome(False, f"command timed out after {probe.timeout_seconds}s")
    except ProviderError as exc:
        return Outcome(False, f"exec failed: {exc}")
    finally:
        await session.close()
    if code == 0:
        return Outcome(True)
    text = output.decode(errors="replace").strip()
    return Outcome(False, f"command {list(probe.command)} exited with {code}: {text}".strip())
