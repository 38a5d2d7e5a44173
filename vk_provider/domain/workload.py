"""Pod → provider-neutral ``WorkloadSpec``: the one place a Kubernetes pod is read for launching.

The input is a pod exactly as the API serves it as JSON (camelCase keys), plus the Secrets and
ConfigMaps it references (fetched by the caller; ``references`` says which). The output is a
``domain.models.WorkloadSpec``; anything the virtual node can never honour is refused with
``InvalidPodSpec`` naming the pod field at fault.

Invariants:
- Pure: no I/O, no clock, no globals; the same arguments always give the same result.
- Environment variables follow kubelet semantics: ``envFrom`` first, then ``env`` in order;
  ``$(VAR)`` expands earlier variables, ``$$`` escapes ``$``, undefined references stay as
  written; an explicit ``env`` entry overrides an ``envFrom`` one of the same name; the result
  keeps one entry per name (last value wins, first position kept).
- Every value that came from a Secret — directly, through ``envFrom`` or by ``$(VAR)``
  expansion of a Secret-derived variable — is an ``EnvVar`` with ``secret=True``, so it never
  shows in ``repr``. No error message here ever quotes a Secret or ConfigMap value.
- ``$(VAR)`` in ``command``/``args`` is expanded like kubelet does, except that a reference to a
  Secret-derived variable is refused: it would put the secret on the command line, which
  providers show in consoles and logs (and which ``WorkloadSpec`` does not redact).
- ``InvalidPodSpec.retryable`` is True only when the pod may work later without changing
  (a referenced Secret, ConfigMap or key that does not exist yet); kubelet keeps such pods in
  ``CreateContainerConfigError`` and retries.

Deliberately ignored, not errors (the remote runtime cannot or need not honour them):
- probes (liveness, readiness, startup) and ``lifecycle`` hooks (postStart, preStop);
- ``stdin``, ``stdinOnce``, ``tty``, ``imagePullPolicy``, ``terminationMessage*``;
- ``emptyDir`` volumes and the service-account token volume (``kube-api-access-*``) with their
  mounts: the container gets its own writable filesystem and no cluster credentials;
- service-link variables (``enableServiceLinks``): cluster Services are not reachable from a
  rented machine, so kubelet's ``FOO_SERVICE_HOST`` variables would only mislead.

Also a small deviation from kubelet: ``configMapKeyRef`` and ``envFrom.configMapRef`` also read
``binaryData`` (when it is UTF-8 text); kubelet reads only ``data``.

Placement annotations other than GPU model and GPU memory (``max-price``, ``regions``,
``providers``, ``capacity-type``) are read by the placement module, not here.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from vk_provider.domain.models import EnvVar, Port, WorkloadSpec
from vk_provider.domain.quantity import GIB, MAX_QUANTITY, ceil_int, parse_quantity, scaled_ceil

GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_MODELS_ANNOTATION: Final = "vk-provider.io/gpu"
MIN_GPU_MEMORY_ANNOTATION: Final = "vk-provider.io/min-gpu-memory"

_CONTAINER: Final = "spec.containers[0]"
# kubelet's utilvalidation.IsEnvVarName, used to skip envFrom keys that cannot be variables.
_ENV_VAR_NAME: Final = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_GPU_MODEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SUBSCRIPTED_FIELD: Final = re.compile(r"(metadata\.(?:labels|annotations))\['(.*)'\]", re.DOTALL)
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


@dataclass(frozen=True, slots=True)
class ObjectRefs:
    """Names of the Secrets and ConfigMaps (in the pod's namespace) a pod's container reads."""

    secrets: frozenset[str] = frozenset()
    config_maps: frozenset[str] = frozenset()


def _field_for(parent: str, key: str) -> str:
    """``parent.key`` for plain keys, ``parent['key']`` for keys with dots or slashes."""
    if re.fullmatch(r"[A-Za-z][-A-Za-z0-9]*", key):
        return f"{parent}.{key}"
    return f"{parent}['{key}']"


def _quantity(raw: object, field: str) -> Decimal:
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


# --------------------------------------------------------------------------- typed access


def _mapping(obj: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPodSpec(field, f"must be an object, not {type(value).__name__}")
    return value


def _list(obj: Mapping[str, Any], key: str, field: str) -> Sequence[Any]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidPodSpec(field, f"must be a list, not {type(value).__name__}")
    return value


def _item(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidPodSpec(field, f"must be an object, not {type(value).__name__}")
    return value


def _str(obj: Mapping[str, Any], key: str, field: str, default: str = "") -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidPodSpec(field, f"must be a string, not {type(value).__name__}")
    return value


def _strings(obj: Mapping[str, Any], key: str, field: str) -> tuple[str, ...]:
    items = _list(obj, key, field)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidPodSpec(f"{field}[{index}]", "must be a string")
    return tuple(items)


def _string_map(obj: Mapping[str, Any], key: str, field: str) -> dict[str, str]:
    raw = _mapping(obj, key, field)
    result: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidPodSpec(_field_for(field, str(name)), "must be a string")
        result[name] = value
    return result


def _flag(obj: Mapping[str, Any], key: str) -> bool:
    return obj.get(key) is True


def _loose_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _loose_list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


# --------------------------------------------------------------------------- references


def references(pod: Mapping[str, Any]) -> ObjectRefs:
    """Every Secret and ConfigMap name the pod's containers read through ``env`` and ``envFrom``.

    Optional references are included (the caller fetches them; a missing one is then skipped).
    Never raises: a malformed pod yields what can be read, and ``to_workload`` reports the fault.
    """
    secrets: set[str] = set()
    config_maps: set[str] = set()

    def add(target: set[str], ref: object) -> None:
        name = _loose_mapping(ref).get("name")
        if isinstance(name, str) and name:
            target.add(name)

    spec = _loose_mapping(pod.get("spec"))
    for raw_container in _loose_list(spec.get("containers")):
        container = _loose_mapping(raw_container)
        for env in _loose_list(container.get("env")):
            source = _loose_mapping(_loose_mapping(env).get("valueFrom"))
            add(secrets, source.get("secretKeyRef"))
            add(config_maps, source.get("configMapKeyRef"))
        for raw_env_from in _loose_list(container.get("envFrom")):
            env_from = _loose_mapping(raw_env_from)
            add(secrets, env_from.get("secretRef"))
            add(config_maps, env_from.get("configMapRef"))
    return ObjectRefs(secrets=frozenset(secrets), config_maps=frozenset(config_maps))


# --------------------------------------------------------------------------- Secret / ConfigMap


@dataclass(frozen=True, slots=True)
class _Source:
    """Where a kind of object keeps its values: plain text first, then base64."""

    kind: str
    text: str
    encoded: str


_SECRET = _Source("Secret", text="stringData", encoded="data")
_CONFIG_MAP = _Source("ConfigMap", text="data", encoded="binaryData")


def _object_value(
    obj: Mapping[str, Any], key: str, source: _Source, *, name: str, field: str
) -> str | None:
    """The text of one key (Secret: ``stringData`` over ``data``; ConfigMap: ``data`` over
    UTF-8 ``binaryData``), None if absent."""
    text = _loose_mapping(obj.get(source.text))
    if key in text:
        value = text[key]
        if not isinstance(value, str):
            raise InvalidPodSpec(field, f"key {key!r} of {source.kind} {name!r} is not a string")
        return value
    encoded = _loose_mapping(obj.get(source.encoded))
    if key not in encoded:
        return None
    return _decode(encoded[key], key=key, kind=source.kind, name=name, field=field)


def _object_items(
    obj: Mapping[str, Any], source: _Source, *, name: str, field: str
) -> dict[str, str]:
    keys = [*_loose_mapping(obj.get(source.encoded)), *_loose_mapping(obj.get(source.text))]
    items: dict[str, str] = {}
    for key in keys:
        value = _object_value(obj, str(key), source, name=name, field=field)
        if value is not None:
            items[str(key)] = value
    return items


def _decode(encoded: object, *, key: str, kind: str, name: str, field: str) -> str:
    # The value itself is never quoted: it may be a secret. Retryable: the object may be fixed.
    try:
        if not isinstance(encoded, str):
            raise TypeError
        return base64.b64decode(encoded, validate=True).decode("utf-8")
    except (TypeError, binascii.Error) as exc:
        raise InvalidPodSpec(
            field, f"key {key!r} of {kind} {name!r} is not valid base64", retryable=True
        ) from exc
    except UnicodeDecodeError as exc:
        raise InvalidPodSpec(
            field, f"key {key!r} of {kind} {name!r} is not UTF-8 text", retryable=True
        ) from exc


# --------------------------------------------------------------------------- $(VAR) expansion


def _expand(text: str, env: Mapping[str, EnvVar]) -> tuple[str, bool]:
    """Kubernetes ``$(VAR)`` expansion; also says whether a Secret-derived value was used.

    Mirrors ``k8s.io/kubernetes/third_party/forked/golang/expansion``: ``$$`` is ``$``,
    ``$(NAME)`` is replaced when NAME is defined and kept as written otherwise, an unclosed
    ``$(`` and any other ``$x`` are copied literally.
    """
    out: list[str] = []
    used_secret = False
    index = 0
    length = len(text)
    while index < length:
        char = text[index]
        if char != "$" or index + 1 == length:
            out.append(char)
            index += 1
            continue
        following = text[index + 1]
        if following == "(":
            close = text.find(")", index + 2)
            if close == -1:
                out.append("$(")
                index += 2
                continue
            name = text[index + 2 : close]
            var = env.get(name)
            if var is None:
                out.append(f"$({name})")
            else:
                out.append(var.value)
                used_secret = used_secret or var.secret
            index = close + 1
        elif following == "$":
            out.append("$")
            index += 2
        else:
            out.append("$" + following)
            index += 2
    return "".join(out), used_secret


# --------------------------------------------------------------------------- the pod


@dataclass(frozen=True, slots=True)
class _Context:
    """What env resolution reads besides the container: the pod and what the caller fetched."""

    pod: Mapping[str, Any]
    container: Mapping[str, Any]
    secrets: Mapping[str, Mapping[str, Any]]
    config_maps: Mapping[str, Mapping[str, Any]]
    node_name: str
    host_ip: str

    @property
    def namespace(self) -> str:
        return str(_loose_mapping(self.pod.get("metadata")).get("namespace") or "default")


def to_workload(
    pod: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    node_name: str,
    host_ip: str,
    attempt: int = 0,
) -> WorkloadSpec:
    """Translate a pod (API JSON) into the ``WorkloadSpec`` a provider launches.

    ``secrets`` and ``config_maps`` map names (in the pod's namespace) to the objects as the API
    serves them; a name absent from them does not exist. ``node_name`` and ``host_ip`` answer
    ``spec.nodeName`` and ``status.hostIP`` field references. Raises ``InvalidPodSpec``.
    """
    metadata = _mapping(pod, "metadata", "metadata")
    spec = _mapping(pod, "spec", "spec")
    uid = _str(metadata, "uid", "metadata.uid")
    if not uid:
        raise InvalidPodSpec("metadata.uid", "is missing; the pod UID keys every launch")
    pod_name = _str(metadata, "name", "metadata.name")
    if not pod_name:
        raise InvalidPodSpec("metadata.name", "is missing")
    namespace = _str(metadata, "namespace", "metadata.namespace") or "default"

    _check_pod_level(spec)
    container = _single_container(spec)
    allowed_volumes = _allowed_volumes(spec)
    _check_container(container, allowed_volumes)

    container_name = _str(container, "name", f"{_CONTAINER}.name")
    if not container_name:
        raise InvalidPodSpec(f"{_CONTAINER}.name", "is missing")
    image = _str(container, "image", f"{_CONTAINER}.image").strip()
    if not image:
        raise InvalidPodSpec(f"{_CONTAINER}.image", "is missing; the container needs an image")

    resources = _mapping(container, "resources", f"{_CONTAINER}.resources")
    context = _Context(
        pod=pod,
        container=container,
        secrets=secrets,
        config_maps=config_maps,
        node_name=node_name,
        host_ip=host_ip,
    )
    env = _environment(context)
    command = _expanded_strings(container, "command", env)
    args = _expanded_strings(container, "args", env)
    annotations = _string_map(metadata, "annotations", "metadata.annotations")
    labels = _string_map(metadata, "labels", "metadata.labels")
    working_dir = _str(container, "workingDir", f"{_CONTAINER}.workingDir") or None

    return WorkloadSpec(
        pod_uid=uid,
        namespace=namespace,
        pod_name=pod_name,
        container_name=container_name,
        image=image,
        command=command,
        args=args,
        env=tuple(env.values()),
        ports=_ports(container),
        working_dir=working_dir,
        gpu_count=_gpu_count(resources),
        gpu_models=_gpu_models(annotations),
        min_gpu_memory_gib=_min_gpu_memory_gib(annotations),
        cpu=_cpu(resources),
        memory_bytes=_memory_bytes(resources),
        labels=tuple(sorted(labels.items())),
        attempt=attempt,
    )


def _check_pod_level(spec: Mapping[str, Any]) -> None:
    for key, why in (
        ("hostNetwork", "the container runs on a rented machine, not on a cluster node"),
        ("hostPID", "there is no cluster host whose processes could be shared"),
        ("hostIPC", "there is no cluster host whose IPC namespace could be shared"),
    ):
        if _flag(spec, key):
            raise InvalidPodSpec(f"spec.{key}", f"is not supported on the virtual node: {why}")
    for key in ("initContainers", "ephemeralContainers"):
        if _list(spec, key, f"spec.{key}"):
            raise InvalidPodSpec(
                f"spec.{key}", "is not supported; the virtual node runs exactly one container"
            )


def _single_container(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = _list(spec, "containers", "spec.containers")
    if len(containers) != 1:
        raise InvalidPodSpec(
            "spec.containers",
            f"must hold exactly one container on the virtual node, found {len(containers)}",
        )
    return _item(containers[0], _CONTAINER)


def _allowed_volumes(spec: Mapping[str, Any]) -> frozenset[str]:
    """Names of the pod's volumes, all of which must be supported kinds (or refused here)."""
    names: set[str] = set()
    for index, raw in enumerate(_list(spec, "volumes", "spec.volumes")):
        field = f"spec.volumes[{index}]"
        volume = _item(raw, field)
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
        names.add(_str(volume, "name", f"{field}.name"))
    return frozenset(names)


def _is_service_account_volume(volume: Mapping[str, Any]) -> bool:
    """True for the projected token volume the ServiceAccount admission plugin adds."""
    projected = _loose_mapping(volume.get("projected"))
    for raw in _loose_list(projected.get("sources")):
        source = _loose_mapping(raw)
        if set(source) == {"serviceAccountToken"}:
            continue
        if set(source) == {"configMap"}:
            if _loose_mapping(source["configMap"]).get("name") == _ALLOWED_ROOT_CA:
                continue
            return False
        if set(source) == {"downwardAPI"}:
            items = _loose_list(_loose_mapping(source["downwardAPI"]).get("items"))
            paths = {
                _loose_mapping(_loose_mapping(item).get("fieldRef")).get("fieldPath")
                for item in items
            }
            if paths <= {"metadata.namespace"}:
                continue
        return False
    return True


def _check_container(container: Mapping[str, Any], volumes: frozenset[str]) -> None:
    security = _mapping(container, "securityContext", f"{_CONTAINER}.securityContext")
    if _flag(security, "privileged"):
        raise InvalidPodSpec(
            f"{_CONTAINER}.securityContext.privileged",
            "privileged containers are not supported on rented machines",
        )
    if _list(container, "volumeDevices", f"{_CONTAINER}.volumeDevices"):
        raise InvalidPodSpec(
            f"{_CONTAINER}.volumeDevices", "block devices are not supported on the virtual node"
        )
    for index, raw in enumerate(_list(container, "volumeMounts", f"{_CONTAINER}.volumeMounts")):
        field = f"{_CONTAINER}.volumeMounts[{index}]"
        name = _str(_item(raw, field), "name", f"{field}.name")
        if name not in volumes:
            raise InvalidPodSpec(
                field, f"mounts volume {name!r}, which is not an emptyDir volume of the pod"
            )


def _ports(container: Mapping[str, Any]) -> tuple[Port, ...]:
    ports: list[Port] = []
    for index, raw in enumerate(_list(container, "ports", f"{_CONTAINER}.ports")):
        field = f"{_CONTAINER}.ports[{index}]"
        entry = _item(raw, field)
        number = entry.get("containerPort")
        if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 65536:
            raise InvalidPodSpec(f"{field}.containerPort", "must be a port number 1-65535")
        protocol = _str(entry, "protocol", f"{field}.protocol", default="TCP")
        if protocol not in _PORT_PROTOCOLS:
            raise InvalidPodSpec(f"{field}.protocol", f"{protocol!r} is not TCP, UDP or SCTP")
        name = _str(entry, "name", f"{field}.name") or None
        ports.append(Port(container_port=number, protocol=protocol, name=name))
    return tuple(ports)


# --------------------------------------------------------------------------- resources


def _resource(resources: Mapping[str, Any], kind: str, name: str) -> tuple[Decimal | None, str]:
    """The quantity of ``resources.<kind>.<name>`` (None if unset) and its field path."""
    parent = f"{_CONTAINER}.resources.{kind}"
    field = _field_for(parent, name)
    raw = _mapping(resources, kind, parent).get(name)
    return (None if raw is None else _quantity(raw, field)), field


def _request_or_limit(resources: Mapping[str, Any], name: str) -> Decimal:
    value, _ = _resource(resources, "requests", name)
    if value is None:
        value, _ = _resource(resources, "limits", name)
    return Decimal(0) if value is None else value


def _cpu(resources: Mapping[str, Any]) -> float:
    return float(_request_or_limit(resources, "cpu"))


def _memory_bytes(resources: Mapping[str, Any]) -> int:
    return ceil_int(_request_or_limit(resources, "memory"))


def _gpu_count(resources: Mapping[str, Any]) -> int:
    value, field = _resource(resources, "limits", GPU_RESOURCE)
    if value is None:
        value, field = _resource(resources, "requests", GPU_RESOURCE)
    if value is None:
        return 0
    if value != value.to_integral_value():
        raise InvalidPodSpec(field, f"must be a whole number of GPUs, not {value}")
    return int(value)


# --------------------------------------------------------------------------- annotations


def _gpu_models(annotations: Mapping[str, str]) -> tuple[str, ...]:
    raw = annotations.get(GPU_MODELS_ANNOTATION)
    if raw is None:
        return ()
    field = f"metadata.annotations['{GPU_MODELS_ANNOTATION}']"
    models: list[str] = []
    for part in raw.split(","):
        model = part.strip()
        if not model:
            continue
        if not _GPU_MODEL.fullmatch(model):
            raise InvalidPodSpec(
                field,
                f"{model!r} is not a GPU model name (letters, digits, '.', '_', '-'; "
                "comma-separated, e.g. H100,A100-80GB)",
            )
        if model not in models:
            models.append(model)
    return tuple(models)


def _min_gpu_memory_gib(annotations: Mapping[str, str]) -> float:
    raw = annotations.get(MIN_GPU_MEMORY_ANNOTATION)
    if raw is None:
        return 0.0
    field = f"metadata.annotations['{MIN_GPU_MEMORY_ANNOTATION}']"
    return float(_quantity(raw.strip(), field) / GIB)


# --------------------------------------------------------------------------- environment


def _environment(context: _Context) -> dict[str, EnvVar]:
    """The container's environment by name, in first-appearance order (envFrom, then env)."""
    env: dict[str, EnvVar] = {}
    container = context.container
    for index, raw in enumerate(_list(container, "envFrom", f"{_CONTAINER}.envFrom")):
        field = f"{_CONTAINER}.envFrom[{index}]"
        for from_var in _env_from(context, _item(raw, field), field):
            env[from_var.name] = from_var
    for index, raw in enumerate(_list(container, "env", f"{_CONTAINER}.env")):
        field = f"{_CONTAINER}.env[{index}]"
        var = _env_var(context, _item(raw, field), field, env)
        if var is not None:
            env[var.name] = var
    return env


def _env_from(context: _Context, entry: Mapping[str, Any], field: str) -> list[EnvVar]:
    prefix = _str(entry, "prefix", f"{field}.prefix")
    if entry.get("configMapRef") is not None:
        ref_field = f"{field}.configMapRef"
        ref = _mapping(entry, "configMapRef", ref_field)
        name = _ref_name(ref, ref_field, "ConfigMap")
        config_map = context.config_maps.get(name)
        if config_map is None:
            _missing(ref, ref_field, f"ConfigMap {name!r} not found in {context.namespace!r}")
            return []
        items = _object_items(config_map, _CONFIG_MAP, name=name, field=ref_field)
        secret = False
    elif entry.get("secretRef") is not None:
        ref_field = f"{field}.secretRef"
        ref = _mapping(entry, "secretRef", ref_field)
        name = _ref_name(ref, ref_field, "Secret")
        found = context.secrets.get(name)
        if found is None:
            _missing(ref, ref_field, f"Secret {name!r} not found in {context.namespace!r}")
            return []
        items = _object_items(found, _SECRET, name=name, field=ref_field)
        secret = True
    else:
        raise InvalidPodSpec(field, "must set configMapRef or secretRef")
    result: list[EnvVar] = []
    for key, value in items.items():
        var_name = prefix + key
        # kubelet skips keys that are not variable names (and emits an event); so do we.
        if _ENV_VAR_NAME.fullmatch(var_name):
            result.append(EnvVar(name=var_name, value=value, secret=secret))
    return result


def _env_var(
    context: _Context, entry: Mapping[str, Any], field: str, earlier: Mapping[str, EnvVar]
) -> EnvVar | None:
    """One ``env`` entry resolved, or None when an optional reference is missing."""
    name = _str(entry, "name", f"{field}.name")
    if not name:
        raise InvalidPodSpec(f"{field}.name", "is missing")
    value = _str(entry, "value", f"{field}.value")
    # As in kubelet: a non-empty value wins; valueFrom is read only without one.
    if value or entry.get("valueFrom") is None:
        expanded, secret = _expand(value, earlier)
        return EnvVar(name=name, value=expanded, secret=secret)
    source_field = f"{field}.valueFrom"
    source = _mapping(entry, "valueFrom", source_field)
    if source.get("secretKeyRef") is not None:
        field = f"{source_field}.secretKeyRef"
        return _key_ref(
            context.secrets,
            _SECRET,
            _mapping(source, "secretKeyRef", field),
            namespace=context.namespace,
            field=field,
            var_name=name,
        )
    if source.get("configMapKeyRef") is not None:
        field = f"{source_field}.configMapKeyRef"
        return _key_ref(
            context.config_maps,
            _CONFIG_MAP,
            _mapping(source, "configMapKeyRef", field),
            namespace=context.namespace,
            field=field,
            var_name=name,
        )
    if source.get("fieldRef") is not None:
        ref_field = f"{source_field}.fieldRef"
        ref = _mapping(source, "fieldRef", ref_field)
        return EnvVar(name=name, value=_field_ref(context, ref, ref_field))
    if source.get("resourceFieldRef") is not None:
        ref_field = f"{source_field}.resourceFieldRef"
        ref = _mapping(source, "resourceFieldRef", ref_field)
        return EnvVar(name=name, value=_resource_field_ref(context, ref, ref_field))
    kinds = ", ".join(sorted(key for key, item in source.items() if item is not None))
    raise InvalidPodSpec(
        source_field,
        f"sets {kinds or 'nothing'}; supported are secretKeyRef, configMapKeyRef, "
        "fieldRef and resourceFieldRef",
    )


def _ref_name(ref: Mapping[str, Any], field: str, kind: str) -> str:
    name = _str(ref, "name", f"{field}.name")
    if not name:
        raise InvalidPodSpec(f"{field}.name", f"must name a {kind}")
    return name


def _missing(ref: Mapping[str, Any], field: str, reason: str) -> None:
    """Skip a missing optional reference; refuse a required one (retryable: it may appear)."""
    if not _flag(ref, "optional"):
        raise InvalidPodSpec(field, reason, retryable=True)


def _key_ref(
    objects: Mapping[str, Mapping[str, Any]],
    source: _Source,
    ref: Mapping[str, Any],
    *,
    namespace: str,
    field: str,
    var_name: str,
) -> EnvVar | None:
    """``secretKeyRef`` / ``configMapKeyRef``: one key of a referenced object, or None when
    an optional reference is missing. Values from Secrets are marked secret."""
    name = _ref_name(ref, field, source.kind)
    key = _str(ref, "key", f"{field}.key")
    obj = objects.get(name)
    if obj is None:
        _missing(ref, field, f"{source.kind} {name!r} not found in {namespace!r}")
        return None
    value = _object_value(obj, key, source, name=name, field=field)
    if value is None:
        _missing(ref, field, f"key {key!r} not found in {source.kind} {name!r}")
        return None
    return EnvVar(name=var_name, value=value, secret=source is _SECRET)


def _field_ref(context: _Context, ref: Mapping[str, Any], field: str) -> str:
    """The downward-API value of ``fieldRef.fieldPath``, for the paths kubelet supports."""
    path = _str(ref, "fieldPath", f"{field}.fieldPath")
    pod = context.pod
    metadata = _loose_mapping(pod.get("metadata"))
    spec = _loose_mapping(pod.get("spec"))
    status = _loose_mapping(pod.get("status"))
    subscripted = _SUBSCRIPTED_FIELD.fullmatch(path)
    if subscripted is not None:
        kind = subscripted[1].removeprefix("metadata.")
        value = _loose_mapping(metadata.get(kind)).get(subscripted[2], "")
        return str(value)
    if path == "metadata.namespace":
        return context.namespace
    if path in ("metadata.name", "metadata.uid"):
        return str(metadata.get(path.removeprefix("metadata.")) or "")
    if path == "spec.nodeName":
        return context.node_name
    if path == "spec.serviceAccountName":
        return str(spec.get("serviceAccountName") or "")
    if path in ("status.hostIP", "status.hostIPs"):
        return context.host_ip
    if path == "status.podIP":
        return str(status.get("podIP") or "")
    if path == "status.podIPs":
        ips = [
            str(ip)
            for entry in _loose_list(status.get("podIPs"))
            if (ip := _loose_mapping(entry).get("ip"))
        ]
        return ",".join(ips) if ips else str(status.get("podIP") or "")
    raise InvalidPodSpec(
        f"{field}.fieldPath",
        f"{path!r} is not supported; use metadata.name, metadata.namespace, metadata.uid, "
        "metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, "
        "spec.serviceAccountName, status.hostIP(s) or status.podIP(s)",
    )


def _resource_field_ref(context: _Context, ref: Mapping[str, Any], field: str) -> str:
    """kubelet's value for ``resourceFieldRef``: the quantity over ``divisor``, rounded up.

    CPU is compared in millicores (``ceil(milli / divisor_milli)``), everything else in whole
    units (``ceil(ceil(value) / ceil(divisor))``). An unset limit falls back to the request
    (kubelet would use node allocatable, which a virtual node does not have), else 0.
    """
    container = context.container
    wanted = _str(ref, "containerName", f"{field}.containerName")
    if wanted and wanted != container.get("name"):
        raise InvalidPodSpec(
            f"{field}.containerName", f"names {wanted!r}, which is not the pod's container"
        )
    resource = _str(ref, "resource", f"{field}.resource")
    kind, _, name = resource.partition(".")
    supported = name in ("cpu", "memory", "ephemeral-storage", GPU_RESOURCE) or (
        name.startswith("hugepages-")
    )
    if kind not in ("limits", "requests") or not supported:
        raise InvalidPodSpec(
            f"{field}.resource",
            f"{resource!r} is not supported; use limits.<r> or requests.<r> with r one of cpu, "
            f"memory, ephemeral-storage, hugepages-<size>, {GPU_RESOURCE}",
        )
    resources = _mapping(container, "resources", f"{_CONTAINER}.resources")
    value, _ = _resource(resources, kind, name)
    if value is None and kind == "limits":
        value, _ = _resource(resources, "requests", name)
    if value is None:
        value = Decimal(0)
    divisor_raw = ref.get("divisor")
    divisor = Decimal(1) if divisor_raw is None else _quantity(divisor_raw, f"{field}.divisor")
    if divisor == 0:  # kubelet treats a zero divisor as unset
        divisor = Decimal(1)
    if name == "cpu":
        result = -(-scaled_ceil(value, 3) // scaled_ceil(divisor, 3))
    else:
        result = -(-ceil_int(value) // ceil_int(divisor))
    return str(result)


def _expanded_strings(
    container: Mapping[str, Any], key: str, env: Mapping[str, EnvVar]
) -> tuple[str, ...]:
    """``command`` or ``args`` with ``$(VAR)`` expanded from the final environment, as kubelet."""
    field = f"{_CONTAINER}.{key}"
    result: list[str] = []
    for index, text in enumerate(_strings(container, key, field)):
        expanded, used_secret = _expand(text, env)
        if used_secret:
            raise InvalidPodSpec(
                f"{field}[{index}]",
                "refers to a variable whose value comes from a Secret; expanding it would put "
                "the secret on the command line, which providers show and log. Read it from "
                "the environment instead (for example sh -c '... \"$VAR\"')",
            )
        result.append(expanded)
    return tuple(result)
