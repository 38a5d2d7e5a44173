"""The service's method paths, read from the generated descriptor so they cannot drift.

Server and client wire each method by hand (``grpc.aio`` generic handlers and multi-callables
with the messages' own serializers) instead of through generated ``*_pb2_grpc`` stubs: that
keeps every call typed for ``mypy --strict``. ``METHODS`` is every RPC of the service; a unit
test checks both sides cover all of them.
"""

from __future__ import annotations

from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Provider"]
SERVICE: str = _SERVICE.full_name
METHODS: frozenset[str] = frozenset(method.name for method in _SERVICE.methods)


def path(method: str) -> str:
    """``/vkprovider.v1.Provider/<method>``; refuses a method the proto does not have."""
    if method not in METHODS:
        raise KeyError(f"{method} is not a method of {SERVICE}")
    return f"/{SERVICE}/{method}"
