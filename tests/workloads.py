"""Workload specs for tests: one app container described in a few keyword arguments.

``WorkloadSpec`` has one shape, the whole pod (``containers``, ``init_containers``); most
adapter tests need a pod of one container, so ``workload`` takes that container's fields
(``container_name``, ``image``, ``command``, ``args``, ``env``, ``ports``, ``working_dir``)
beside the spec's own and builds ``containers`` from them. ``with_main`` changes the first
app container of a spec the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.models import WorkloadSpec

# The keyword this helper takes → the field of ContainerSpec it sets.
CONTAINER_FIELDS: Final = {
    "container_name": "name",
    "image": "image",
    "command": "command",
    "args": "args",
    "env": "env",
    "ports": "ports",
    "working_dir": "working_dir",
}


def workload(**fields: Any) -> WorkloadSpec:
    """A ``WorkloadSpec`` whose one app container is made of the container keywords (name
    ``main`` and image ``img`` unless given) and holds the pod's resources, as a pod of one
    container does. With ``containers=`` given, those are the pod's containers and the
    container keywords (a test helper's defaults for the one-container pod) are not used."""
    container = {CONTAINER_FIELDS[k]: fields.pop(k) for k in list(fields) if k in CONTAINER_FIELDS}
    if "containers" not in fields:
        container.setdefault("name", "main")
        container.setdefault("image", "img")
        for resource in ("gpu_count", "cpu", "memory_bytes"):
            container.setdefault(resource, fields.get(resource, 0))
        fields["containers"] = (ContainerSpec(**container),)
    return WorkloadSpec(**fields)


def with_main(spec: WorkloadSpec, **changes: Any) -> WorkloadSpec:
    """``spec`` with its first app container changed (the container keywords of ``workload``)
    and any of the spec's own fields."""
    container = {
        CONTAINER_FIELDS[k]: changes.pop(k) for k in list(changes) if k in CONTAINER_FIELDS
    }
    main = dataclasses.replace(spec.main, **container)
    return dataclasses.replace(spec, containers=(main, *spec.containers[1:]), **changes)
