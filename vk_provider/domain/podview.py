"""Reading pods as the API serves them (JSON dicts), and the annotations the agent owns.

Pure accessors, so that every module reads a pod the same way and a missing field is an
empty value, never a ``KeyError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

JSON = dict[str, Any]
PodKey = tuple[str, str]  # (namespace, name)

# Annotations the agent writes (PRODUCT.md §6); together they make a pod restart-safe.
ANN_PROVIDER = "vk-provider.io/provider"
ANN_INSTANCE = "vk-provider.io/instance-id"
ANN_OFFER = "vk-provider.io/offer"
ANN_PRICE = "vk-provider.io/price-per-hour"

TERMINAL_PHASES = ("Succeeded", "Failed")


def meta(pod: Mapping[str, Any]) -> JSON:
    return dict(pod.get("metadata") or {})


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(meta(pod).get("annotations") or {})


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    metadata = meta(pod)
    return (str(metadata.get("namespace")), str(metadata.get("name")))


def uid(pod: Mapping[str, Any]) -> str:
    return str(meta(pod).get("uid", ""))


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return phase(pod) in TERMINAL_PHASES


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def container_spec(pod: Mapping[str, Any]) -> JSON:
    """The pod's (single) container, or an empty dict."""
    return dict(((pod.get("spec") or {}).get("containers") or [{}])[0])


def container_status(pod: Mapping[str, Any]) -> JSON:
    """The status of the pod's (single) container, or an empty dict."""
    return dict(((pod.get("status") or {}).get("containerStatuses") or [{}])[0])


def restart_count(pod: Mapping[str, Any]) -> int:
    return int(container_status(pod).get("restartCount") or 0)


def restart_policy(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("restartPolicy") or "Always")


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where a placed, live pod runs and what it costs (REST ``/v1/pods``, metrics)."""

    namespace: str
    name: str
    uid: str
    provider: str
    instance_id: str
    offer: str
    price_per_hour: float
    phase: str
    since: datetime | None
