"""Lambda instances: which are ours, the launch request, and what state a payload says.

- **Ours** = tags ``vk-provider:managed=true`` and ``vk-provider:provider=<provider name>``;
  ``vk-provider:pod-uid=<uid>`` and ``vk-provider:request-id=<uid>.<attempt>`` say for which
  pod attempt. The API cannot filter by tag, so lists are filtered here. The instance name
  ``vk-<uid>.<attempt>`` is for people; it is never trusted. Two agents sharing one Lambda
  account must give their Lambda providers different names.
- **States.** booting → PENDING; active → RUNNING; unhealthy → RUNNING with a message (Lambda
  may recover it; giving up on it is the agent's call, not a single poll's). RUNNING here means
  "the VM is up": ``vmwatch`` then refines it with what the VM says over SSH (the pod's
  containers' own states), so the adapter never reports a VM's state as its containers'.
  terminating → TERMINATING; terminated → TERMINATED (the agent knows whether it asked; an
  unasked end is its to call lost); preempted → LOST. A status this code does not know →
  PENDING with a message (never LOST: that would launch a second VM while the first may run).

Invariants: pure; foreign instances are judged by their tags alone, ours must be well formed
or ``MalformedResponse`` names what is not.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Final

from vk_provider.sdk import Instance, InstanceState, InvalidSpec, Offer, WorkloadSpec
from vk_provider_adapters.lambda_cloud.config import LambdaProviderConfig
from vk_provider_adapters.payload import MalformedResponse, array, field, number, obj, string

log = logging.getLogger(__name__)

TAG_MANAGED: Final = "vk-provider:managed"
TAG_PROVIDER: Final = "vk-provider:provider"
TAG_POD_UID: Final = "vk-provider:pod-uid"
TAG_REQUEST_ID: Final = "vk-provider:request-id"
NAME_PREFIX: Final = "vk-"
# From the spec: RequestedTagEntry.value maxLength, InstanceLaunchRequest.name maxLength.
TAG_VALUE_MAX: Final = 128
NAME_MAX: Final = 64

# Pod UIDs are UUIDs; anything in this alphabet fits a tag value and a name unchanged.
_POD_UID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_REQUEST_ID: Final = re.compile(r"(?P<uid>[A-Za-z0-9][A-Za-z0-9_-]{0,99})\.(?P<attempt>\d{1,9})")

# Every status of InstanceStatus in the spec, and what it means here.
STATES: Final[Mapping[str, tuple[InstanceState, str]]] = {
    "booting": (InstanceState.PENDING, "the Lambda VM is booting"),
    "active": (InstanceState.RUNNING, ""),
    "unhealthy": (
        InstanceState.RUNNING,
        "Lambda reports the VM unhealthy; the container may still run",
    ),
    "terminating": (InstanceState.TERMINATING, "the Lambda VM is terminating"),
    "terminated": (InstanceState.TERMINATED, "the Lambda VM is terminated"),
    "preempted": (InstanceState.LOST, "Lambda preempted the VM"),
}


def instance_state(status: str) -> tuple[InstanceState, str]:
    """The state and message of a Lambda status; an unknown one waits (PENDING), see above."""
    known = STATES.get(status)
    if known is not None:
        return known
    return InstanceState.PENDING, f"Lambda reports status {status[:40]!r}, unknown to vk-provider"


def instance_name(spec: WorkloadSpec) -> str:
    """The instance's name, for people reading the Lambda console: ``vk-<uid>.<attempt>``."""
    return f"{NAME_PREFIX}{spec.request_id}"[:NAME_MAX]


def launch_tags(spec: WorkloadSpec, *, provider: str) -> list[dict[str, str]]:
    """The tags that make an instance ours and say for which pod attempt."""
    if not _POD_UID.fullmatch(spec.pod_uid):
        raise InvalidSpec(
            f"pod uid {spec.pod_uid[:120]!r} cannot label a Lambda instance (letters, digits, "
            "'-' and '_', at most 100)",
            provider=provider,
            field="metadata.uid",
        )
    return [
        {"key": TAG_MANAGED, "value": "true"},
        {"key": TAG_PROVIDER, "value": provider},
        {"key": TAG_POD_UID, "value": spec.pod_uid},
        {"key": TAG_REQUEST_ID, "value": spec.request_id},
    ]


def launch_request(
    spec: WorkloadSpec,
    offer: Offer,
    *,
    config: LambdaProviderConfig,
    user_data: str,
    own_ruleset: str | None = None,
) -> dict[str, object]:
    """The body of ``POST /instance-operations/launch`` (``InstanceLaunchRequest``);
    ``own_ruleset`` is the adapter's firewall ruleset in the offer's region
    (``lambda_cloud.firewall``), named first, before the configured ones."""
    body: dict[str, object] = {
        "region_name": offer.region,
        "instance_type_name": offer.sku,
        "ssh_key_names": [config.ssh_key_name],  # the API wants exactly one
        "name": instance_name(spec),
        "user_data": user_data,
        "tags": launch_tags(spec, provider=config.name),
    }
    rulesets = [own_ruleset] if own_ruleset else []
    rulesets += [ruleset for ruleset in config.firewall_ruleset_ids if ruleset not in rulesets]
    if rulesets:
        body["firewall_rulesets"] = [{"id": ruleset} for ruleset in rulesets]
    return body


def parse_launch(data: object) -> str:
    """The instance id of ``InstanceLaunchResponse``; we launch one at a time."""
    ids = array(field(obj(data, "data"), "instance_ids", "data"), "data.instance_ids")
    if not ids or not isinstance(ids[0], str) or not ids[0]:
        raise MalformedResponse(f"data.instance_ids holds no instance id ({len(ids)} entries)")
    if len(ids) > 1:
        log.warning("Lambda launched %d instances for one request: %s", len(ids), ids)
    return ids[0]


def _tags(item: Mapping[str, object]) -> dict[str, str]:
    """Tags as a dict; anything odd in them simply is not a tag (tolerant: foreign data)."""
    raw = item.get("tags")
    tags: dict[str, str] = {}
    if isinstance(raw, list):
        for entry in raw:
            if isinstance(entry, dict):
                key, value = entry.get("key"), entry.get("value")
                if isinstance(key, str) and isinstance(value, str):
                    tags[key] = value
    return tags


def parse_instance(raw: object, *, provider: str, where: str = "data") -> Instance | None:
    """Our ``Instance`` for one Lambda instance payload; None when it is not ours.

    Foreign instances are judged by their tags alone (their shape is not our business);
    ours must be well formed, or ``MalformedResponse`` names what is not.
    """
    item = obj(raw, where)
    tags = _tags(item)
    if tags.get(TAG_MANAGED) != "true" or tags.get(TAG_PROVIDER) != provider:
        return None
    request = _REQUEST_ID.fullmatch(tags.get(TAG_REQUEST_ID, ""))
    if request is None or tags.get(TAG_POD_UID) != request.group("uid"):
        log.warning(
            "%s: instance %r carries our tags but no consistent pod uid and request id; "
            "ignoring it",
            provider,
            item.get("id"),
        )
        return None
    instance_id = string(item, "id", where)
    state, message = instance_state(string(item, "status", where))
    region_where = f"{where}.region"
    region = string(obj(field(item, "region", where), region_where), "name", region_where)
    kind_where = f"{where}.instance_type"
    kind = obj(field(item, "instance_type", where), kind_where)
    sku = string(kind, "name", kind_where)
    price = number(kind, "price_cents_per_hour", kind_where) / 100
    ip = item.get("ip")
    return Instance(
        provider=provider,
        instance_id=instance_id,
        pod_uid=request.group("uid"),
        attempt=int(request.group("attempt")),
        state=state,
        offer_key=f"{provider}/{sku}/{region}",
        message=message,
        ip=ip if isinstance(ip, str) and ip else None,
        price_per_hour=price,
    )


def parse_instances(data: object, *, provider: str) -> list[Instance]:
    """Our instances among ``GET /instances``' ``data``."""
    found = []
    for index, raw in enumerate(array(data, "data")):
        instance = parse_instance(raw, provider=provider, where=f"data[{index}]")
        if instance is not None:
            found.append(instance)
    return found
