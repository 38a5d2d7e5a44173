"""The error taxonomy across the wire, both ways, in one place.

A plugin's ``ProviderError`` leaves the server as a gRPC status code plus a
``ProviderErrorDetail`` packed into a ``google.rpc.Status`` in the standard
``grpc-status-details-bin`` trailer (the rich error model that grpcio-status, Go's
``status.Details()`` and every other gRPC library read). The client reads it back into the
same class with the same ``retry_after`` and ``field``.

| domain error | gRPC code | detail kind |
|---|---|---|
| ``NotFound`` | NOT_FOUND | NOT_FOUND |
| ``CapacityUnavailable`` | RESOURCE_EXHAUSTED | CAPACITY_UNAVAILABLE |
| ``RateLimited`` | RESOURCE_EXHAUSTED | RATE_LIMITED |
| ``Transient`` | UNAVAILABLE | TRANSIENT |
| ``InvalidSpec`` | INVALID_ARGUMENT | INVALID_SPEC |
| ``AuthFailed`` | PERMISSION_DENIED | AUTH_FAILED |

Invariants: the client never raises anything but a ``ProviderError``. A failure without the
detail (the plugin died, is unreachable, timed out, or a proxy answered) is ``Transient``, so
the agent's breaker and its pods treat a dead plugin exactly as a provider outage. A detail
that is there but garbled (not a ``google.rpc.Status``, no ``ProviderErrorDetail`` in it, an
unknown kind) is ``Transient`` too, with a message naming what is wrong, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status

from vk_provider.sdk import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb

DETAILS_TRAILER = "grpc-status-details-bin"

Kind = pb.ProviderErrorDetail.Kind
_DETAIL_TYPE = pb.ProviderErrorDetail.DESCRIPTOR.full_name
_KINDS: tuple[tuple[type[ProviderError], Kind, grpc.StatusCode], ...] = (
    (NotFound, pb.ProviderErrorDetail.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
    (
        CapacityUnavailable,
        pb.ProviderErrorDetail.CAPACITY_UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    (RateLimited, pb.ProviderErrorDetail.RATE_LIMITED, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Transient, pb.ProviderErrorDetail.TRANSIENT, grpc.StatusCode.UNAVAILABLE),
    (InvalidSpec, pb.ProviderErrorDetail.INVALID_SPEC, grpc.StatusCode.INVALID_ARGUMENT),
    (AuthFailed, pb.ProviderErrorDetail.AUTH_FAILED, grpc.StatusCode.PERMISSION_DENIED),
)


def _kind_of(error: ProviderError) -> tuple[Kind, grpc.StatusCode]:
    for cls, kind, code in _KINDS:
        if isinstance(error, cls):
            return kind, code
    # A ProviderError of no known subclass: the caller can only retry.
    return pb.ProviderErrorDetail.TRANSIENT, grpc.StatusCode.UNAVAILABLE


# --------------------------------------------------------------------------- server side


def to_status(error: ProviderError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes]]]:
    """``(code, message, trailing metadata)`` to abort a call with, for ``error``."""
    kind, code = _kind_of(error)
    detail = pb.ProviderErrorDetail(kind=kind, message=str(error))
    if isinstance(error, RateLimited) and error.retry_after is not None:
        detail.retry_after_seconds = error.retry_after
    if isinstance(error, InvalidSpec):
        detail.field = error.field
    packed = any_pb2.Any()
    packed.Pack(detail)
    status = Status(code=code.value[0], message=str(error), details=[packed])
    return code, str(error), ((DETAILS_TRAILER, status.SerializeToString()),)


# --------------------------------------------------------------------------- client side


def _detail(
    trailers: Iterable[tuple[str, str | bytes]] | None,
) -> tuple[pb.ProviderErrorDetail | None, str]:
    """The detail in ``trailers``, or None and why not ("" when there is no trailer)."""
    raw: str | bytes | None = None
    for key, value in trailers or ():
        if key == DETAILS_TRAILER:
            raw = value
    if raw is None:
        return None, ""
    if not isinstance(raw, bytes):
        return None, f"{DETAILS_TRAILER}: not binary"
    status = Status()
    try:
        status.ParseFromString(raw)
    except DecodeError:
        return None, f"{DETAILS_TRAILER}: not a google.rpc.Status"
    for packed in status.details:
        if packed.TypeName() == _DETAIL_TYPE:
            detail = pb.ProviderErrorDetail()
            try:
                detail.ParseFromString(packed.value)
            except DecodeError:
                return None, f"{DETAILS_TRAILER}: {_DETAIL_TYPE} does not decode"
            return detail, ""
    return None, f"{DETAILS_TRAILER}: no {_DETAIL_TYPE} in it"


def from_detail(detail: pb.ProviderErrorDetail, *, provider: str) -> ProviderError:
    """The domain error a well-formed detail stands for."""
    message = detail.message
    kind = detail.kind
    if kind == pb.ProviderErrorDetail.NOT_FOUND:
        return NotFound(message, provider=provider)
    if kind == pb.ProviderErrorDetail.CAPACITY_UNAVAILABLE:
        return CapacityUnavailable(message, provider=provider)
    if kind == pb.ProviderErrorDetail.RATE_LIMITED:
        retry_after = detail.retry_after_seconds if detail.HasField("retry_after_seconds") else None
        if retry_after is not None and not 0 <= retry_after < 86400:
            retry_after = None  # nonsense from the other side: back off by our own rules
        return RateLimited(message, provider=provider, retry_after=retry_after)
    if kind == pb.ProviderErrorDetail.TRANSIENT:
        return Transient(message, provider=provider)
    if kind == pb.ProviderErrorDetail.INVALID_SPEC:
        return InvalidSpec(message, provider=provider, field=detail.field)
    if kind == pb.ProviderErrorDetail.AUTH_FAILED:
        return AuthFailed(message, provider=provider)
    return Transient(
        f"plugin error with ProviderErrorDetail.kind {kind} (unknown to this agent): {message}",
        provider=provider,
    )


def from_rpc_error(error: grpc.aio.AioRpcError, *, provider: str, address: str) -> ProviderError:
    """The domain error for a failed call to the plugin at ``address``."""
    detail, garbled = _detail(error.trailing_metadata())
    if detail is not None:
        return from_detail(detail, provider=provider)
    code = error.code()
    name = code.name if isinstance(code, grpc.StatusCode) else str(code)
    what = f"plugin at {address}: {name}: {error.details() or 'no message'}"
    if garbled:
        what += f" (error detail ignored: {garbled})"
    return Transient(what, provider=provider)
