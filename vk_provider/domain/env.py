"""The container's environment, resolved with kubelet's semantics.

Invariants:
- Pure: the Secrets and ConfigMaps a pod reads (``references`` says which) are fetched by the
  caller and passed in.
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

A small deviation from kubelet: ``configMapKeyRef`` and ``envFrom.configMapRef`` also read
``binaryData`` (when it is UTF-8 text); kubelet reads only ``data``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from vk_provider.domain.models import EnvVar
from vk_provider.domain.podspec import (
    CONTAINER,
    GPU_RESOURCE,
    InvalidPodSpec,
    flag,
    item_field,
    list_field,
    loose_list,
    loose_mapping,
    mapping_field,
    quantity_field,
    resource_field,
    string_field,
    strings_field,
)
from vk_provider.domain.quantity import ceil_int, scaled_ceil
from vk_provider.domain.references import InvalidNames, MissingReference, Skipped

# kubelet's utilvalidation.IsEnvVarName, used to skip envFrom keys that cannot be variables.
_ENV_VAR_NAME: Final = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


_SUBSCRIPTED_FIELD: Final = re.compile(r"(metadata\.(?:labels|annotations))\['(.*)'\]", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ObjectRefs:
    """Names of the Secrets and ConfigMaps (in the pod's namespace) a pod's container reads."""

    secrets: frozenset[str] = frozenset()
    config_maps: frozenset[str] = frozenset()


def references(pod: Mapping[str, Any]) -> ObjectRefs:
    """Every Secret and ConfigMap name the pod's containers read through ``env`` and ``envFrom``.

    Optional references are included (the caller fetches them; a missing one is then skipped).
    Never raises: a malformed pod yields what can be read, and ``to_workload`` reports the fault.
    """
    secrets: set[str] = set()
    config_maps: set[str] = set()

    def add(target: set[str], ref: object) -> None:
        name = loose_mapping(ref).get("name")
        if isinstance(name, str) and name:
            target.add(name)

    spec = loose_mapping(pod.get("spec"))
    every = [*loose_list(spec.get("initContainers")), *loose_list(spec.get("containers"))]
    for raw_container in every:
        container = loose_mapping(raw_container)
        for env in loose_list(container.get("env")):
            source = loose_mapping(loose_mapping(env).get("valueFrom"))
            add(secrets, source.get("secretKeyRef"))
            add(config_maps, source.get("configMapKeyRef"))
        for raw_env_from in loose_list(container.get("envFrom")):
            env_from = loose_mapping(raw_env_from)
            add(secrets, env_from.get("secretRef"))
            add(config_maps, env_from.get("configMapRef"))
    return ObjectRefs(secrets=frozenset(secrets), config_maps=frozenset(config_maps))


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
    text = loose_mapping(obj.get(source.text))
    if key in text:
        value = text[key]
        if not isinstance(value, str):
            raise InvalidPodSpec(field, f"key {key!r} of {source.kind} {name!r} is not a string")
        return value
    encoded = loose_mapping(obj.get(source.encoded))
    if key not in encoded:
        return None
    return _decode(encoded[key], key=key, kind=source.kind, name=name, field=field)


def _object_items(
    obj: Mapping[str, Any], source: _Source, *, name: str, field: str
) -> dict[str, str]:
    keys = [*loose_mapping(obj.get(source.encoded)), *loose_mapping(obj.get(source.text))]
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


@dataclass(frozen=True, slots=True)
class EnvContext:
    """What env resolution reads besides the container: the pod and what the caller fetched."""

    pod: Mapping[str, Any]
    container: Mapping[str, Any]
    secrets: Mapping[str, Mapping[str, Any]]
    config_maps: Mapping[str, Mapping[str, Any]]
    node_name: str
    host_ip: str
    path: str = CONTAINER  # the container's field path in the pod, for error messages
    # What was skipped: optional references not found, envFrom keys that are no names.
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return str(loose_mapping(self.pod.get("metadata")).get("namespace") or "default")


def environment(context: EnvContext) -> dict[str, EnvVar]:
    """The container's environment by name, in first-appearance order (envFrom, then env)."""
    env: dict[str, EnvVar] = {}
    container = context.container
    path = context.path
    for index, raw in enumerate(list_field(container, "envFrom", f"{path}.envFrom")):
        field = f"{path}.envFrom[{index}]"
        for from_var in _env_from(context, item_field(raw, field), field):
            env[from_var.name] = from_var
    for index, raw in enumerate(list_field(container, "env", f"{path}.env")):
        field = f"{path}.env[{index}]"
        var = _env_var(context, item_field(raw, field), field, env)
        if var is not None:
            env[var.name] = var
    return env


def _env_from(context: EnvContext, entry: Mapping[str, Any], field: str) -> list[EnvVar]:
    prefix = string_field(entry, "prefix", f"{field}.prefix")
    if entry.get("configMapRef") is not None:
        key, source, objects, secret = "configMapRef", _CONFIG_MAP, context.config_maps, False
    elif entry.get("secretRef") is not None:
        key, source, objects, secret = "secretRef", _SECRET, context.secrets, True
    else:
        raise InvalidPodSpec(field, "must set configMapRef or secretRef")
    ref_field = f"{field}.{key}"
    ref = mapping_field(entry, key, ref_field)
    name = _ref_name(ref, ref_field, source.kind)
    found = objects.get(name)
    if found is None:
        _missing(
            ref,
            ref_field,
            f"{source.kind} {name!r} not found in {context.namespace!r}",
            MissingReference(source.kind, name, optional=flag(ref, "optional")),
            context.skipped,
        )
        return []
    items = _object_items(found, source, name=name, field=ref_field)
    result: list[EnvVar] = []
    invalid: list[str] = []
    for key, value in items.items():
        var_name = prefix + key
        # kubelet skips keys that are not variable names (and emits an event); so do we.
        if _ENV_VAR_NAME.fullmatch(var_name):
            result.append(EnvVar(name=var_name, value=value, secret=secret))
        else:
            invalid.append(var_name)
    if invalid:
        context.skipped.append(InvalidNames(source.kind, context.namespace, name, tuple(invalid)))
    return result


def _env_var(
    context: EnvContext, entry: Mapping[str, Any], field: str, earlier: Mapping[str, EnvVar]
) -> EnvVar | None:
    """One ``env`` entry resolved, or None when an optional reference is missing."""
    name = string_field(entry, "name", f"{field}.name")
    if not name:
        raise InvalidPodSpec(f"{field}.name", "is missing")
    value = string_field(entry, "value", f"{field}.value")
    # As in kubelet: a non-empty value wins; valueFrom is read only without one.
    if value or entry.get("valueFrom") is None:
        expanded, secret = _expand(value, earlier)
        return EnvVar(name=name, value=expanded, secret=secret)
    source_field = f"{field}.valueFrom"
    source = mapping_field(entry, "valueFrom", source_field)
    if source.get("secretKeyRef") is not None:
        field = f"{source_field}.secretKeyRef"
        return _key_ref(
            context.secrets,
            _SECRET,
            mapping_field(source, "secretKeyRef", field),
            namespace=context.namespace,
            field=field,
            var_name=name,
            skipped=context.skipped,
        )
    if source.get("configMapKeyRef") is not None:
        field = f"{source_field}.configMapKeyRef"
        return _key_ref(
            context.config_maps,
            _CONFIG_MAP,
            mapping_field(source, "configMapKeyRef", field),
            namespace=context.namespace,
            field=field,
            var_name=name,
            skipped=context.skipped,
        )
    if source.get("fieldRef") is not None:
        ref_field = f"{source_field}.fieldRef"
        ref = mapping_field(source, "fieldRef", ref_field)
        return EnvVar(name=name, value=_field_ref(context, ref, ref_field))
    if source.get("resourceFieldRef") is not None:
        ref_field = f"{source_field}.resourceFieldRef"
        ref = mapping_field(source, "resourceFieldRef", ref_field)
        return EnvVar(name=name, value=_resource_field_ref(context, ref, ref_field))
    kinds = ", ".join(sorted(key for key, item in source.items() if item is not None))
    raise InvalidPodSpec(
        source_field,
        f"sets {kinds or 'nothing'}; supported are secretKeyRef, configMapKeyRef, "
        "fieldRef and resourceFieldRef",
    )


def _ref_name(ref: Mapping[str, Any], field: str, kind: str) -> str:
    name = string_field(ref, "name", f"{field}.name")
    if not name:
        raise InvalidPodSpec(f"{field}.name", f"must name a {kind}")
    return name


class MissingReferenceError(InvalidPodSpec):
    """A mandatory Secret, ConfigMap or key does not exist (yet): retryable."""

    def __init__(self, field: str, reason: str, missing: MissingReference) -> None:
        super().__init__(field, reason, retryable=True)
        self.missing = missing


def _missing(
    ref: Mapping[str, Any],
    field: str,
    reason: str,
    missing: MissingReference,
    skipped: list[Skipped],
) -> None:
    """Skip a missing optional reference (noted in ``skipped``); refuse a required one
    (retryable: it may appear)."""
    if not flag(ref, "optional"):
        raise MissingReferenceError(field, reason, missing)
    skipped.append(missing)


def _key_ref(
    objects: Mapping[str, Mapping[str, Any]],
    source: _Source,
    ref: Mapping[str, Any],
    *,
    namespace: str,
    field: str,
    var_name: str,
    skipped: list[Skipped],
) -> EnvVar | None:
    """``secretKeyRef`` / ``configMapKeyRef``: one key of a referenced object, or None when
    an optional reference is missing. Values from Secrets are marked secret."""
    name = _ref_name(ref, field, source.kind)
    key = string_field(ref, "key", f"{field}.key")
    optional = flag(ref, "optional")
    obj = objects.get(name)
    if obj is None:
        missing = MissingReference(source.kind, name, optional=optional, variable=var_name)
        _missing(ref, field, f"{source.kind} {name!r} not found in {namespace!r}", missing, skipped)
        return None
    value = _object_value(obj, key, source, name=name, field=field)
    if value is None:
        missing = MissingReference(source.kind, name, optional, key=key, variable=var_name)
        _missing(ref, field, f"key {key!r} not found in {source.kind} {name!r}", missing, skipped)
        return None
    return EnvVar(name=var_name, value=value, secret=source is _SECRET)


def _field_ref(context: EnvContext, ref: Mapping[str, Any], field: str) -> str:
    """The downward-API value of ``fieldRef.fieldPath``, for the paths kubelet supports."""
    path = string_field(ref, "fieldPath", f"{field}.fieldPath")
    pod = context.pod
    metadata = loose_mapping(pod.get("metadata"))
    spec = loose_mapping(pod.get("spec"))
    status = loose_mapping(pod.get("status"))
    subscripted = _SUBSCRIPTED_FIELD.fullmatch(path)
    if subscripted is not None:
        kind = subscripted[1].removeprefix("metadata.")
        value = loose_mapping(metadata.get(kind)).get(subscripted[2], "")
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
            for entry in loose_list(status.get("podIPs"))
            if (ip := loose_mapping(entry).get("ip"))
        ]
        return ",".join(ips) if ips else str(status.get("podIP") or "")
    raise InvalidPodSpec(
        f"{field}.fieldPath",
        f"{path!r} is not supported; use metadata.name, metadata.namespace, metadata.uid, "
        "metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, "
        "spec.serviceAccountName, status.hostIP(s) or status.podIP(s)",
    )


def _resource_field_ref(context: EnvContext, ref: Mapping[str, Any], field: str) -> str:
    """kubelet's value for ``resourceFieldRef``: the quantity over ``divisor``, rounded up.

    CPU is compared in millicores (``ceil(milli / divisor_milli)``), everything else in whole
    units (``ceil(ceil(value) / ceil(divisor))``). An unset limit falls back to the request
    (kubelet would use node allocatable, which a virtual node does not have), else 0.
    """
    container = context.container
    wanted = string_field(ref, "containerName", f"{field}.containerName")
    if wanted and wanted != container.get("name"):
        raise InvalidPodSpec(
            f"{field}.containerName", f"names {wanted!r}, which is not this container"
        )
    resource = string_field(ref, "resource", f"{field}.resource")
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
    resources = mapping_field(container, "resources", f"{context.path}.resources")
    value, _ = resource_field(resources, kind, name, path=context.path)
    if value is None and kind == "limits":
        value, _ = resource_field(resources, "requests", name, path=context.path)
    if value is None:
        value = Decimal(0)
    divisor_raw = ref.get("divisor")
    divisor = Decimal(1) if divisor_raw is None else quantity_field(divisor_raw, f"{field}.divisor")
    if divisor == 0:  # kubelet treats a zero divisor as unset
        divisor = Decimal(1)
    if name == "cpu":
        result = -(-scaled_ceil(value, 3) // scaled_ceil(divisor, 3))
    else:
        result = -(-ceil_int(value) // ceil_int(divisor))
    return str(result)


def expanded_strings(
    container: Mapping[str, Any], key: str, env: Mapping[str, EnvVar], *, path: str = CONTAINER
) -> tuple[str, ...]:
    """``command`` or ``args`` with ``$(VAR)`` expanded from the final environment, as kubelet."""
    field = f"{path}.{key}"
    result: list[str] = []
    for index, text in enumerate(strings_field(container, key, field)):
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
