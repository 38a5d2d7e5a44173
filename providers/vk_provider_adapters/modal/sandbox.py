"""The interface the Modal adapter is built on: ``SandboxClient`` and its value types.

Modal has no public REST API for sandboxes; its Python SDK speaks gRPC. ``ModalProvider``
(``vk_provider_adapters.modal.adapter``) speaks to this small protocol of our own;
``vk_provider_adapters.modal.sdk`` implements it on the ``modal`` SDK and the tests on an in-memory
fake (``tests/unit/fake_modal.py``). Both import this module, which imports neither, so there is no
import cycle and ``modal`` is never needed to read it.

Invariants: the value types are frozen; ``SandboxRequest.secret_env`` never shows in ``repr``;
an implementation raises ``domain.errors`` and ``SandboxNameTaken``, nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol

# How long the SDK's ``Sandbox.create`` waits for capacity (a GPU) before it gives up with
# ``ResourceExhaustedError("Insufficient capacity to create sandbox.")``: modal 1.6,
# ``modal/sandbox/_impl_v1.py`` ``_SANDBOX_SCHEDULING_TIMEOUT = 21 * 60``.
SCHEDULING_WAIT_SECONDS: Final = 21 * 60.0


class SandboxNameTaken(Exception):
    """A running sandbox of the app already has the requested name (Modal's AlreadyExists)."""


@dataclass(frozen=True, slots=True)
class SandboxRequest:
    """One sandbox to create; ``secret_env`` never shows in ``repr``."""

    name: str
    tags: Mapping[str, str]
    image: str
    command: tuple[str, ...]  # replaces the image's ENTRYPOINT when not empty (Kubernetes rule)
    args: tuple[str, ...]
    env: Mapping[str, str]
    secret_env: Mapping[str, str] = field(repr=False)
    gpu: str | None  # Modal's spelling: "H100", "A100-80GB:2"
    cpu: float
    memory_mib: int
    regions: tuple[str, ...]  # empty: anywhere
    timeout_seconds: int
    workdir: str | None = None
    # Container ports Modal tunnels to the internet: TLS-terminated by Modal (the client speaks
    # TLS to the tunnel's host), or raw TCP (to its unencrypted host and port).
    encrypted_ports: tuple[int, ...] = ()
    unencrypted_ports: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SandboxTunnel:
    """One container port's tunnel, as the SDK's ``modal._tunnel.Tunnel`` has it: the TLS
    endpoint ``host``:``port`` (443) and, for an unencrypted port only, the raw TCP endpoint
    ``unencrypted_host``:``unencrypted_port`` (empty and 0 otherwise)."""

    host: str
    port: int
    unencrypted_host: str = ""
    unencrypted_port: int = 0


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """What the client knows of one sandbox; ``exit_code`` is ``poll()``'s answer."""

    sandbox_id: str
    tags: Mapping[str, str]
    exit_code: int | None = None
    name: str | None = None
    started: bool | None = None  # None: the client cannot tell (RUNNING is assumed)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class SandboxClient(Protocol):
    """The few sandbox operations the adapter needs, on one Modal app.

    Implementations raise ``domain.errors`` (mapped in one place) and ``SandboxNameTaken``,
    nothing else.
    """

    async def create_sandbox(self, request: SandboxRequest) -> str:
        """Create and start a sandbox; its id. ``SandboxNameTaken`` if the name is in use.

        May wait up to ``SCHEDULING_WAIT_SECONDS`` for capacity (after building the image),
        then raises ``CapacityUnavailable``."""
        ...

    async def get(self, sandbox_id: str) -> SandboxInfo:
        """Any sandbox of the app, running or finished; ``NotFound`` if there is none."""
        ...

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        """The app's running sandboxes that carry at least ``tags`` (finished ones are not)."""
        ...

    async def from_name(self, name: str) -> SandboxInfo | None:
        """The app's running sandbox of that name, or None."""
        ...

    async def set_tags(self, sandbox_id: str, tags: Mapping[str, str]) -> None:
        """Replace the sandbox's whole tag set."""
        ...

    async def terminate(self, sandbox_id: str) -> None:
        """Terminate the sandbox; a no-op when it has finished."""
        ...

    async def tunnels(
        self, sandbox_id: str, *, wait_seconds: int
    ) -> Mapping[int, SandboxTunnel] | None:
        """The sandbox's tunnels by container port, once Modal has set them up after the start;
        None when they are not there within ``wait_seconds`` (the sandbox is not running yet).
        ``NotFound`` if there is no such sandbox."""
        ...

    def logs(self, sandbox_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        """stdout and stderr from the start, one line per chunk; without ``follow`` the stream
        ends with the output produced so far, with it when the sandbox ends."""
        ...

    async def close(self) -> None: ...
