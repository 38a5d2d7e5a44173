"""Names, tags and states of the sandboxes the Modal adapter makes.

Names and tags of a sandbox::

    name  vk-<pod uid>.<attempt>            ``spec.request_id`` behind a prefix, when it fits
                                            Modal's name rules ([A-Za-z0-9._-], <= 64 chars)
          vk-h-<sha256(request id)[:40]>    otherwise (``sandbox_name``)
    tags  vk-provider.managed-by            the provider's name: ``list_ours`` filters on it
          vk-provider.pod-uid / .attempt    whose launch it is
          vk-provider.sku / .region / .price / .gpus    the offer it was launched on
          vk-provider.terminate             "requested", written by ``delete`` before it
                                            terminates the sandbox
          vk-provider.ports                 "<tcp|tls>.<count>" when it opened ports
                                            (``ports.ports_tag``)

States (``sandbox_state``), from ``poll()`` (Modal reports 124 for a sandbox that hit its
timeout and 137 for one that was terminated) and whether we asked for termination:

    | poll()  | we asked | state       | message                                          |
    |---------|----------|-------------|--------------------------------------------------|
    | None    | no       | PENDING     | not scheduled yet (only when the client can tell)|
    | None    | no       | RUNNING     |                                                  |
    | None    | yes      | TERMINATING | termination requested                            |
    | any     | yes      | TERMINATED  | terminated on request                            |
    | 124     | no       | LOST        | sandbox timed out                                |
    | 137     | no       | LOST        | sandbox terminated by Modal                      |
    | other   | no       | EXITED      | ``exit_code`` carries the code                   |

Invariants: pure; a name and every tag value fit Modal's rules (``modal/_utils/name_utils.py``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from vk_provider.sdk import InstanceState
from vk_provider_adapters.modal.sandbox import SandboxInfo

TAG_PREFIX: Final = "vk-provider."
MANAGED_BY_TAG: Final = TAG_PREFIX + "managed-by"
POD_UID_TAG: Final = TAG_PREFIX + "pod-uid"
ATTEMPT_TAG: Final = TAG_PREFIX + "attempt"
SKU_TAG: Final = TAG_PREFIX + "sku"
REGION_TAG: Final = TAG_PREFIX + "region"
PRICE_TAG: Final = TAG_PREFIX + "price"
GPUS_TAG: Final = TAG_PREFIX + "gpus"
TERMINATE_TAG: Final = TAG_PREFIX + "terminate"
TERMINATE_REQUESTED: Final = "requested"
PORTS_TAG: Final = TAG_PREFIX + "ports"

EXIT_TIMED_OUT: Final = 124  # Modal's return code for a sandbox that reached its timeout
EXIT_TERMINATED: Final = 137  # ... and for one that was terminated

# Modal's rules (modal/_utils/name_utils.py): object names and tag keys/values.
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
TAG_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,63}")


def sandbox_name(request_id: str) -> str:
    """The sandbox name (idempotency key) of a launch; see the module docstring."""
    name = f"vk-{request_id}"
    if NAME_PATTERN.fullmatch(name):
        return name
    return "vk-h-" + hashlib.sha256(request_id.encode()).hexdigest()[:40]


def tag_value(value: str) -> str:
    """``value`` when Modal accepts it as a tag value, else a stable digest of it."""
    if TAG_PATTERN.fullmatch(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:32]


def sandbox_state(info: SandboxInfo, *, termination_requested: bool) -> tuple[InstanceState, str]:
    """The state table of the module docstring."""
    code = info.exit_code
    if code is None:
        if termination_requested:
            return InstanceState.TERMINATING, "termination requested"
        if info.started is False:
            return InstanceState.PENDING, "waiting for Modal to schedule the sandbox"
        return InstanceState.RUNNING, ""
    if termination_requested:
        return InstanceState.TERMINATED, "terminated on request"
    if code == EXIT_TIMED_OUT:
        return InstanceState.LOST, "sandbox timed out"
    if code == EXIT_TERMINATED:
        return InstanceState.LOST, "sandbox terminated by Modal"
    return InstanceState.EXITED, ""
