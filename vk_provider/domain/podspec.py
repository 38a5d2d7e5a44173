"""Reading the shape of a pod spec, and refusing what the virtual node can never run.

``InvalidPodSpec`` names the pod field at fault; the typed readers (``string_field``,
``mapping_field``, ...) raise it for an ill-typed field; ``check_pod_level`` and
``check_container`` refuse what no provider can honour (host namespaces, privileged
containers, volumes other than emptyDir and the service-account token, ...).

Invariants: pure; every error names a field by its path in the pod (``spec.containers[0].ports[1]
.containerPort``); no message quotes a value that may be secret.

Deliberately ignored, not errors (the remote runtime cannot or need not honour them):
- probes (liveness, readiness, startup) and ``lifecycle`` hooks (postStart, preStop);
- ``stdin``, ``stdinOnce``, ``tty``, ``imagePullPolicy``, ``terminationMessage*``;
- the service-account token volume (``kube-api-access-*``) and its mounts: a rented machine
  gets no cluster credentials. ``emptyDir`` mounts are read (``volume_mounts``) for providers
  that share them between a pod's containers; the others give each container its own
  writable filesystem;
- service-link variables (``enableServiceLinks``): cluster Services are not reachable from a
  rented machine, so kubelet's ``FOO_SERVICE_HOST`` variables would only mislead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from vk_provider.domain.containers import VolumeMount
from vk_provider.domain.models import Port
from vk_provider.domain.quantity import MAX_QUANTITY, parse_quantity

GPU_RESOURCE: Final = "nvidia.com/gpu"


CONTAINER: Final = "spec.containers[0]"


_PORT_PROTOCOLS: Final = frozenset({"TCP", "UDP", "SCTP"})


_ALLOWED_ROOT_CA: Final = "kube-root-ca.crt"


class InvalidPodSpec(ValueError):
    """The pod asks for something the virtual node cannot run; ``field`` names the pod field.

    ``retryable`` is True when the pod may become runnable without changing (a referenced
    Secret or ConfigMap, or a key in one, does not exist yet); False when it never can.
    """

    def __init__(self, field: str, reason: str, *, retryable: bool = False) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.retryable = retryable


def field_for(parent: str, key: str) -> str:
    """``parent.key`` for plain keys, ``parent['key']`` for keys with dots or slashes."""
    if re.fullmatch(r"[A-Za-z][-A-Za-z0-9]*", key):
        return f"{parent}.{key}"
    return f"{parent}['{key}']"


def quantity_field(raw: object, field: str) -> Decimal:
    """A non-negative, int64-bounded quantity from a pod field, or InvalidPodSpec naming it."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise InvalidPodSpec(field, f"must be a quantity string, not {type(raw).__name__}")
    try:
        value = parse_quantity(str(raw))
    except ValueError as exc:
        raise InvalidPodSpec(field, str(exc)) from exc
    if value < 0:
        raise InvalidPodSpec(field, f"{raw!r} must not be negative")
    if value > MAX_QUANTITY:
        raise InvalidPodSpec(field, f"{raw!r} is too large (at most 2^63-1)")
    return value


def mapping_field(obj: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPodSpec(field, f"must be an object, not {type(value).__name__}")
    return value


def list_field(obj: Mapping[str, Any], key: str, field: str) -> Sequence[Any]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidPodSpec(field, f"must be a list, not {type(value).__name__}")
    return value


def item_field(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidPodSpec(field, f"must be an object, not {type(value).__name__}")
    return value


def string_field(obj: Mapping[str, Any], key: str, field: str, default: str = "") -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidPodSpec(field, f"must be a string, not {type(value).__name__}")
    return value


def strings_field(obj: Mapping[str, Any], key: str, field: str) -> tuple[str, ...]:
    items = list_field(obj, key, field)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidPodSpec(f"{field}[{index}]", "must be a string")
    return tuple(items)


def string_map_field(obj: Mapping[str, Any], key: str, field: str) -> dict[str, str]:
    raw = mapping_field(obj, key, field)
    result: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidPodSpec(field_for(field, str(name)), "must be a string")
        result[name] = value
    return result


def flag(obj: Mapping[str, Any], key: str) -> bool:
    return obj.get(key) is True


def loose_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def loose_list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def check_pod_level(spec: Mapping[str, Any]) -> None:
    for key, why in (
        ("hostNetwork", "the container runs on a rented machine, not on a cluster node"),
        ("hostPID", "there is no cluster host whose processes could be shared"),
        ("hostIPC", "there is no cluster host whose IPC namespace could be shared"),
    ):
        if flag(spec, key):
            raise InvalidPodSpec(f"spec.{key}", f"is not supported on the virtual node: {why}")
    if list_field(spec, "ephemeralContainers", "spec.ephemeralContainers"):
        raise InvalidPodSpec(
            "spec.ephemeralContainers",
            "is not supported: debug containers cannot be added to a rented machine's pod",
        )


Located = tuple[str, Mapping[str, Any]]
"""A container and its field path in the pod (``spec.initContainers[1]``)."""


def pod_containers(spec: Mapping[str, Any]) -> tuple[list[Located], list[Located]]:
    """The app containers and the init containers, each with its field path."""
    apps = [
        (f"spec.containers[{i}]", item_field(raw, f"spec.containers[{i}]"))
        for i, raw in enumerate(list_field(spec, "containers", "spec.containers"))
    ]
    if not apps:
        raise InvalidPodSpec("spec.containers", "must hold at least one container")
    inits = [
        (f"spec.initContainers[{i}]", item_field(raw, f"spec.initContainers[{i}]"))
        for i, raw in enumerate(list_field(spec, "initContainers", "spec.initContainers"))
    ]
    return apps, inits


def single_container(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first app container (what a single-container provider runs)."""
    return pod_containers(spec)[0][0][1]


def allowed_volumes(spec: Mapping[str, Any]) -> frozenset[str]:
    """Names of the pod's volumes, all of which must be supported kinds (or refused here)."""
    names: set[str] = set()
    for index, raw in enumerate(list_field(spec, "volumes", "spec.volumes")):
        field = f"spec.volumes[{index}]"
        volume = item_field(raw, field)
        sources = sorted(key for key in volume if key != "name")
        if sources in ([], ["emptyDir"]):  # the API defaults a volume without source to emptyDir
            pass
        elif sources == ["projected"]:
            if not _is_service_account_volume(volume):
                raise InvalidPodSpec(
                    f"{field}.projected",
                    "projected volumes are not supported; only the service-account token "
                    "volume that admission adds (kube-api-access-*) is accepted",
                )
        else:
            kind = next((key for key in sources if key != "emptyDir"), "")
            raise InvalidPodSpec(
                f"{field}.{kind}" if kind else field,
                f"{kind or 'this'} volumes are not supported on the virtual node; only emptyDir is",
            )
        names.add(string_field(volume, "name", f"{field}.name"))
    return frozenset(names)


def empty_dir_volumes(spec: Mapping[str, Any]) -> frozenset[str]:
    """Names of the pod's emptyDir volumes (``allowed_volumes`` has refused other kinds)."""
    names: set[str] = set()
    for index, raw in enumerate(list_field(spec, "volumes", "spec.volumes")):
        volume = item_field(raw, f"spec.volumes[{index}]")
        if sorted(key for key in volume if key != "name") in ([], ["emptyDir"]):
            names.add(string_field(volume, "name", f"spec.volumes[{index}].name"))
    return frozenset(names)


def volume_mounts(
    container: Mapping[str, Any], empty_dirs: frozenset[str], *, path: str = CONTAINER
) -> tuple[VolumeMount, ...]:
    """The container's mounts of emptyDir volumes (``check_container`` has checked the names)."""
    mounts: list[VolumeMount] = []
    for index, raw in enumerate(list_field(container, "volumeMounts", f"{path}.volumeMounts")):
        field = f"{path}.volumeMounts[{index}]"
        entry = item_field(raw, field)
        name = string_field(entry, "name", f"{field}.name")
        if name not in empty_dirs:
            continue  # the service-account token: deliberately not mounted
        mount_path = string_field(entry, "mountPath", f"{field}.mountPath")
        if not mount_path.startswith("/"):
            raise InvalidPodSpec(f"{field}.mountPath", "must be an absolute path")
        sub_path = string_field(entry, "subPath", f"{field}.subPath")
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            raise InvalidPodSpec(f"{field}.subPath", "must be a relative path without '..'")
        mounts.append(
            VolumeMount(
                volume=name,
                mount_path=mount_path,
                read_only=flag(entry, "readOnly"),
                sub_path=sub_path,
            )
        )
    return tuple(mounts)


def _is_service_account_volume(volume: Mapping[str, Any]) -> bool:
    """True for the projected token volume the ServiceAccount admission plugin adds."""
    projected = loose_mapping(volume.get("projected"))
    for raw in loose_list(projected.get("sources")):
        source = loose_mapping(raw)
        if set(source) == {"serviceAccountToken"}:
            continue
        if set(source) == {"configMap"}:
            if loose_mapping(source["configMap"]).get("name") == _ALLOWED_ROOT_CA:
                continue
            return False
        if set(source) == {"downwardAPI"}:
            items = loose_list(loose_mapping(source["downwardAPI"]).get("items"))
            paths = {
                loose_mapping(loose_mapping(item).get("fieldRef")).get("fieldPath")
                for item in items
            }
            if paths <= {"metadata.namespace"}:
                continue
        return False
    return True


def check_container(
    container: Mapping[str, Any], volumes: frozenset[str], *, path: str = CONTAINER
) -> None:
    security = mapping_field(container, "securityContext", f"{path}.securityContext")
    if flag(security, "privileged"):
        raise InvalidPodSpec(
            f"{path}.securityContext.privileged",
            "privileged containers are not supported on rented machines",
        )
    if list_field(container, "volumeDevices", f"{path}.volumeDevices"):
        raise InvalidPodSpec(
            f"{path}.volumeDevices", "block devices are not supported on the virtual node"
        )
    for index, raw in enumerate(list_field(container, "volumeMounts", f"{path}.volumeMounts")):
        field = f"{path}.volumeMounts[{index}]"
        name = string_field(item_field(raw, field), "name", f"{field}.name")
        if name not in volumes:
            raise InvalidPodSpec(
                field, f"mounts volume {name!r}, which is not an emptyDir volume of the pod"
            )


def ports(container: Mapping[str, Any], *, path: str = CONTAINER) -> tuple[Port, ...]:
    ports: list[Port] = []
    for index, raw in enumerate(list_field(container, "ports", f"{path}.ports")):
        field = f"{path}.ports[{index}]"
        entry = item_field(raw, field)
        number = entry.get("containerPort")
        if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 65536:
            raise InvalidPodSpec(f"{field}.containerPort", "must be a port number 1-65535")
        protocol = string_field(entry, "protocol", f"{field}.protocol", default="TCP")
        if protocol not in _PORT_PROTOCOLS:
            raise InvalidPodSpec(f"{field}.protocol", f"{protocol!r} is not TCP, UDP or SCTP")
        name = string_field(entry, "name", f"{field}.name") or None
        ports.append(Port(container_port=number, protocol=protocol, name=name))
    return tuple(ports)


def resource_field(
    resources: Mapping[str, Any], kind: str, name: str, *, path: str = CONTAINER
) -> tuple[Decimal | None, str]:
    """The quantity of ``resources.<kind>.<name>`` (None if unset) and its field path."""
    parent = f"{path}.resources.{kind}"
    field = field_for(parent, name)
    raw = mapping_field(resources, kind, parent).get(name)
    return (None if raw is None else quantity_field(raw, field)), field
