"""Names, labels and annotations of what the Kubernetes adapter makes in cluster B.

Every launch is one Pod named ``vk-<pod uid>-<attempt>`` — a hash replaces the uid when that
name would not be a DNS-1123 label of at most 63 characters — and labelled
``vk-provider.io/managed-by=<provider name>``, ``vk-provider.io/pod-uid`` and
``vk-provider.io/attempt``, and ``vk-provider.io/instance=<its name>``, the one label no
other pod has, which the pod's Service selects (``expose: node-port`` and ``load-balancer``);
annotations under ``remote.vk-provider.io/`` repeat the uid and attempt verbatim (labels may
have to hash them) and carry the offer key, the price and the source pod (distinct from the
``vk-provider.io/`` annotations an agent of ours running in B writes onto the same pods). The
name is deterministic, so a second create of the same request meets 409 AlreadyExists.
``list_ours`` selects by the managed-by label, so two agents sharing one namespace of B must
use different provider names. The launch's Secret (secret env
values) has the pod's name; its keys are ``<container>.<variable>`` (``secret_keys``). So has
its Service, which is a DNS-1035 label as a Service name must be (it starts with ``vk-``).

Invariants: pure; every name is a DNS-1123 label and every label value a valid one.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from vk_provider.sdk import WorkloadSpec

LABEL_MANAGED_BY: Final = "vk-provider.io/managed-by"
LABEL_POD_UID: Final = "vk-provider.io/pod-uid"
LABEL_ATTEMPT: Final = "vk-provider.io/attempt"
LABEL_INSTANCE: Final = "vk-provider.io/instance"  # the pod's own name: what its Service selects
# Annotations have a prefix of their own: when B runs an agent of ours too, that agent writes
# ``vk-provider.io/offer`` and ``vk-provider.io/price-per-hour`` onto the same pods.
ANN_POD_UID: Final = "remote.vk-provider.io/pod-uid"
ANN_ATTEMPT: Final = "remote.vk-provider.io/attempt"
ANN_OFFER: Final = "remote.vk-provider.io/offer"
ANN_PRICE: Final = "remote.vk-provider.io/price-per-hour"
ANN_SOURCE: Final = "remote.vk-provider.io/source-pod"

NAME_PREFIX: Final = "vk-"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_SECRET_KEY_MAX = 253


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else a readable prefix and a hash of it."""
    if len(text) <= 63 and _LABEL_VALUE.fullmatch(text):
        return text
    prefix = re.sub(r"[^-A-Za-z0-9_.]", "-", text)[:40].strip("-_.")
    return f"{prefix}-{_digest(text, 16)}" if prefix else _digest(text, 16)


def pod_name(spec: WorkloadSpec) -> str:
    """``vk-<pod uid>-<attempt>``; a hash of the request id stands in for a uid that would not
    make a DNS-1123 label of at most 63 characters."""
    name = f"{NAME_PREFIX}{spec.pod_uid}-{spec.attempt}"
    if len(name) <= 63 and _DNS_LABEL.fullmatch(name):
        return name
    return f"{NAME_PREFIX}{_digest(spec.request_id, 32)}-{spec.attempt}"


def is_pod_name(text: str) -> bool:
    return len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def secret_keys(spec: WorkloadSpec) -> dict[tuple[str, str], str]:
    """The Secret key of each secret env var, by (container, variable): ``<container>.<name>``
    when that is a valid key, else ``<container>.env-<index>`` (made unique with a suffix if a
    variable is literally called that). Container names are DNS labels, without dots, so the
    first dot separates them and keys of different containers never meet."""
    keys: dict[tuple[str, str], str] = {}
    fallbacks: list[tuple[tuple[str, str], str]] = []
    for container in spec.every_container:
        for index, var in enumerate(container.env):
            if not var.secret:
                continue
            literal = f"{container.name}.{var.name}"
            if len(literal) <= _SECRET_KEY_MAX and _SECRET_KEY.fullmatch(literal):
                keys[(container.name, var.name)] = literal
            else:
                fallbacks.append(((container.name, var.name), f"{container.name}.env-{index}"))
    used = set(keys.values())
    for where, candidate in fallbacks:
        key, suffix = candidate, 0
        while key in used:
            suffix += 1
            key = f"{candidate}-{suffix}"
        used.add(key)
        keys[where] = key
    return keys


def owner_labels(spec: WorkloadSpec, *, provider: str) -> dict[str, str]:
    return {
        LABEL_MANAGED_BY: label_value(provider),
        LABEL_POD_UID: label_value(spec.pod_uid),
        LABEL_ATTEMPT: str(spec.attempt),
    }


def instance_selector(name: str, *, provider: str) -> dict[str, str]:
    """The labels that select exactly our pod ``name`` (its Service's selector)."""
    return {LABEL_MANAGED_BY: label_value(provider), LABEL_INSTANCE: name}
