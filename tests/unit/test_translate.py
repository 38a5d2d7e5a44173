"""Pod → WorkloadSpec translation: kubelet's env semantics, resources, refusals that name fields."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.env import ObjectRefs, references
from vk_provider.domain.models import EnvVar, Port, WorkloadSpec
from vk_provider.domain.podspec import InvalidPodSpec
from vk_provider.domain.quantity import parse_quantity
from vk_provider.domain.workload import to_workload

NODE = "vk-node"
HOST_IP = "10.0.0.5"
C0 = "spec.containers[0]"

SA_VOLUME: dict[str, Any] = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}


def make_pod(
    *,
    container: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod as the API serves it, with one container; the arguments update its parts."""
    main: dict[str, Any] = {"name": "main", "image": "ghcr.io/acme/train:1"}
    main.update(container or {})
    pod_spec: dict[str, Any] = {"containers": [main], "serviceAccountName": "trainer"}
    pod_spec.update(spec or {})
    meta: dict[str, Any] = {
        "name": "train-0",
        "namespace": "ml",
        "uid": "3f1c2b9a-0000-4000-8000-000000000001",
        "labels": {"app": "train", "team": "ml"},
        "annotations": {},
    }
    meta.update(metadata or {})
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
    if status is not None:
        pod["status"] = status
    return pod


def translate(
    pod: dict[str, Any],
    *,
    secrets: dict[str, dict[str, Any]] | None = None,
    config_maps: dict[str, dict[str, Any]] | None = None,
    attempt: int = 0,
) -> WorkloadSpec:
    return to_workload(
        pod,
        secrets=secrets or {},
        config_maps=config_maps or {},
        node_name=NODE,
        host_ip=HOST_IP,
        attempt=attempt,
    )


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(
    name: str, data: dict[str, str], string_data: dict[str, str] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml"},
        "type": "Opaque",
        "data": {key: b64(value) for key, value in data.items()},
    }
    if string_data is not None:
        obj["stringData"] = string_data
    return obj


def config_map(
    name: str, data: dict[str, str], binary: dict[str, bytes] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": "ml"}, "data": data}
    if binary is not None:
        obj["binaryData"] = {k: base64.b64encode(v).decode() for k, v in binary.items()}
    return obj


def env_of(workload: WorkloadSpec) -> dict[str, str]:
    return {var.name: var.value for var in workload.main.env}


def with_env(env: list[dict[str, Any]], **container: Any) -> dict[str, Any]:
    return make_pod(container={"env": env, **container})


@contextmanager
def raises_on(field: str, *, retryable: bool = False) -> Iterator[None]:
    """The block raises InvalidPodSpec for ``field``, with that retryability and a reason."""
    with pytest.raises(InvalidPodSpec) as caught:
        yield
    assert caught.value.field == field
    assert caught.value.retryable is retryable
    assert str(caught.value) == f"{field}: {caught.value.reason}"
    assert caught.value.reason


# --------------------------------------------------------------------------- the whole pod


def test_a_full_pod_translates_to_the_workload_spec() -> None:
    pod = make_pod(
        container={
            "command": ["python", "-m", "train"],
            "args": ["--epochs", "3"],
            "workingDir": "/workspace",
            "ports": [
                {"containerPort": 8080, "protocol": "TCP", "name": "http"},
                {"containerPort": 5353, "protocol": "UDP"},
            ],
            "resources": {
                "limits": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"},
                "requests": {"nvidia.com/gpu": "2", "cpu": "7500m", "memory": "60Gi"},
            },
            "env": [{"name": "MODE", "value": "fast"}],
        },
        metadata={
            "labels": {"team": "ml", "app": "train"},
            "annotations": {
                "vk-provider.io/gpu": "H100, A100-80GB",
                "vk-provider.io/min-gpu-memory": "40Gi",
                "vk-provider.io/max-price": "4.5",
            },
        },
    )
    workload = translate(pod, attempt=3)
    assert workload == WorkloadSpec(
        pod_uid="3f1c2b9a-0000-4000-8000-000000000001",
        namespace="ml",
        pod_name="train-0",
        gpu_count=2,
        gpu_models=("H100", "A100-80GB"),
        min_gpu_memory_gib=40.0,
        cpu=7.5,
        memory_bytes=60 * 2**30,
        labels=(("app", "train"), ("team", "ml")),
        attempt=3,
        containers=(
            ContainerSpec(
                name="main",
                image="ghcr.io/acme/train:1",
                command=("python", "-m", "train"),
                args=("--epochs", "3"),
                env=(EnvVar("MODE", "fast"),),
                ports=(Port(8080, "TCP", "http"), Port(5353, "UDP", None)),
                working_dir="/workspace",
                cpu=7.5,
                memory_bytes=60 * 2**30,
                gpu_count=2,
            ),
        ),
    )
    assert workload.request_id == "3f1c2b9a-0000-4000-8000-000000000001.3"


def test_a_minimal_pod_gets_the_defaults() -> None:
    workload = translate(make_pod(metadata={"labels": None, "annotations": None}))
    assert workload.main.command == () and workload.main.args == () and workload.main.env == ()
    assert workload.main.working_dir is None and workload.main.ports == () and workload.labels == ()
    assert (workload.gpu_count, workload.cpu, workload.memory_bytes) == (0, 0.0, 0)
    assert workload.gpu_models == () and workload.min_gpu_memory_gib == 0.0


def test_translation_does_not_change_its_inputs() -> None:
    pod = with_env(
        [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}],
        envFrom=[{"configMapRef": {"name": "c"}}],
    )
    secrets = {"s": secret("s", {"t": "tok"})}
    config_maps = {"c": config_map("c", {"A": "1"})}
    before = copy.deepcopy((pod, secrets, config_maps))
    first = translate(pod, secrets=secrets, config_maps=config_maps)
    assert (pod, secrets, config_maps) == before
    assert translate(pod, secrets=secrets, config_maps=config_maps) == first


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("spec", "container", "field"),
    [
        pytest.param({"containers": []}, {}, "spec.containers", id="no-container"),
        pytest.param(
            {"containers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]},
            {},
            "spec.containers",
            id="two-containers-one-name",
        ),
        pytest.param({"restartPolicy": "Sometimes"}, {}, "spec.restartPolicy", id="restartPolicy"),
        pytest.param(
            {}, {"restartPolicy": "Always"}, f"{C0}.restartPolicy", id="app-restartPolicy"
        ),
        pytest.param({"hostNetwork": True}, {}, "spec.hostNetwork", id="hostNetwork"),
        pytest.param({"hostPID": True}, {}, "spec.hostPID", id="hostPID"),
        pytest.param({"hostIPC": True}, {}, "spec.hostIPC", id="hostIPC"),
        pytest.param(
            {"initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Never"}]},
            {},
            "spec.initContainers[0].restartPolicy",
            id="init-restartPolicy-Never",
        ),
        pytest.param(
            {"initContainers": [{"name": "init"}]},
            {},
            "spec.initContainers[0].image",
            id="init-without-image",
        ),
        pytest.param(
            {"ephemeralContainers": [{"name": "debug", "image": "busybox"}]},
            {},
            "spec.ephemeralContainers",
            id="ephemeralContainers",
        ),
        pytest.param(
            {
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "h", "hostPath": {"path": "/"}},
                ]
            },
            {},
            "spec.volumes[1].hostPath",
            id="hostPath-volume",
        ),
        pytest.param(
            {"volumes": [{"name": "s", "secret": {"secretName": "s"}}]},
            {},
            "spec.volumes[0].secret",
            id="secret-volume",
        ),
        pytest.param(
            {"volumes": [{"name": "c", "configMap": {"name": "c"}}]},
            {},
            "spec.volumes[0].configMap",
            id="configMap-volume",
        ),
        pytest.param(
            {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]},
            {},
            "spec.volumes[0].persistentVolumeClaim",
            id="pvc-volume",
        ),
        pytest.param(
            {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "s"}}]}}]},
            {},
            "spec.volumes[0].projected",
            id="projected-secret-volume",
        ),
        pytest.param(
            {
                "volumes": [
                    {
                        "name": "kube-api-access-abcde",
                        "projected": {"sources": [{"configMap": {"name": "app-config"}}]},
                    }
                ]
            },
            {},
            "spec.volumes[0].projected",
            id="projected-other-configmap",
        ),
        pytest.param(
            {},
            {"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            f"{C0}.volumeMounts[0]",
            id="mount-of-undeclared-volume",
        ),
        pytest.param(
            {},
            {"volumeDevices": [{"name": "blk", "devicePath": "/dev/xvda"}]},
            f"{C0}.volumeDevices",
            id="volumeDevices",
        ),
        pytest.param(
            {},
            {"securityContext": {"privileged": True}},
            f"{C0}.securityContext.privileged",
            id="privileged",
        ),
        pytest.param({}, {"image": None}, f"{C0}.image", id="missing-image"),
        pytest.param({}, {"image": "  "}, f"{C0}.image", id="blank-image"),
        pytest.param(
            {},
            {"ports": [{"containerPort": 0}]},
            f"{C0}.ports[0].containerPort",
            id="port-zero",
        ),
        pytest.param(
            {},
            {"ports": [{"containerPort": 80, "protocol": "HTTP"}]},
            f"{C0}.ports[0].protocol",
            id="port-protocol",
        ),
    ],
)
def test_unsupported_features_are_refused_naming_the_field(
    spec: dict[str, Any], container: dict[str, Any], field: str
) -> None:
    with raises_on(field):
        translate(make_pod(spec=spec, container=container))


def test_invalid_pod_spec_is_a_value_error_whose_message_names_field_and_reason() -> None:
    with pytest.raises(ValueError, match=r"^spec\.hostNetwork: is not supported") as caught:
        translate(make_pod(spec={"hostNetwork": True}))
    assert isinstance(caught.value, InvalidPodSpec)
    assert caught.value.retryable is False


def test_supported_volumes_and_ignored_features_pass() -> None:
    pod = make_pod(
        spec={
            "hostNetwork": False,
            "initContainers": [],
            "volumes": [
                {"name": "scratch", "emptyDir": {"medium": "Memory"}},
                {"name": "bare"},
                SA_VOLUME,
            ],
        },
        container={
            "volumeMounts": [
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "bare", "mountPath": "/bare"},
                {
                    "name": "kube-api-access-x7k2p",
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "readOnly": True,
                },
            ],
            "securityContext": {"privileged": False, "runAsUser": 1000},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
            "readinessProbe": {"exec": {"command": ["true"]}},
            "startupProbe": {"tcpSocket": {"port": 8080}},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
            "stdin": True,
            "tty": True,
        },
    )
    assert translate(pod).main.image == "ghcr.io/acme/train:1"


# --------------------------------------------------------------------------- env: values and $(VAR)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param([{"name": "A", "value": "x"}], {"A": "x"}, id="plain"),
        pytest.param([{"name": "A"}], {"A": ""}, id="no-value-is-empty"),
        pytest.param(
            [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-y"}],
            {"A": "x", "B": "x-y"},
            id="earlier-var",
        ),
        pytest.param(
            [{"name": "B", "value": "$(A)"}, {"name": "A", "value": "x"}],
            {"B": "$(A)", "A": "x"},
            id="later-var-not-expanded",
        ),
        pytest.param([{"name": "A", "value": "$(NOPE)"}], {"A": "$(NOPE)"}, id="undefined-kept"),
        pytest.param(
            [{"name": "A", "value": "x"}, {"name": "B", "value": "$$(A)"}],
            {"A": "x", "B": "$(A)"},
            id="escaped-reference",
        ),
        pytest.param([{"name": "A", "value": "a$$b"}], {"A": "a$b"}, id="double-dollar"),
        pytest.param([{"name": "A", "value": "$$$$"}], {"A": "$$"}, id="four-dollars"),
        pytest.param(
            [{"name": "A", "value": "x"}, {"name": "B", "value": "$$$(A)"}],
            {"A": "x", "B": "$x"},
            id="escape-then-reference",
        ),
        pytest.param([{"name": "A", "value": "$(A"}], {"A": "$(A"}, id="unclosed"),
        pytest.param([{"name": "A", "value": "cost $5"}], {"A": "cost $5"}, id="dollar-other"),
        pytest.param([{"name": "A", "value": "end$"}], {"A": "end$"}, id="trailing-dollar"),
        pytest.param([{"name": "A", "value": "$()"}], {"A": "$()"}, id="empty-name"),
        pytest.param(
            [{"name": "A", "value": "1"}, {"name": "A", "value": "$(A)2"}],
            {"A": "12"},
            id="self-reference-to-earlier-definition",
        ),
        pytest.param(
            [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)$(A)/$(C)"}],
            {"A": "x", "B": "xx/$(C)"},
            id="several-references",
        ),
    ],
)
def test_env_values_expand_like_kubelet(
    env: list[dict[str, Any]], expected: dict[str, str]
) -> None:
    assert env_of(translate(with_env(env))) == expected


def test_env_keeps_one_entry_per_name_last_wins_first_position() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "2"},
        {"name": "A", "value": "3"},
    ]
    workload = translate(with_env(env))
    assert workload.main.env == (EnvVar("A", "3"), EnvVar("B", "2"))


def test_a_non_empty_value_wins_over_value_from_as_in_kubelet() -> None:
    env = [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert env_of(translate(with_env(env))) == {"A": "x"}


def test_env_entry_without_name_is_refused() -> None:
    with raises_on(f"{C0}.env[0].name"):
        translate(with_env([{"value": "x"}]))


def test_value_from_without_a_known_source_is_refused() -> None:
    env = [{"name": "A", "valueFrom": {"fileKeyRef": {"path": "x", "key": "k"}}}]
    with raises_on(f"{C0}.env[0].valueFrom"):
        translate(with_env(env))


# --------------------------------------------------------------------------- env: fieldRef


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "train-0"),
        ("metadata.namespace", "ml"),
        ("metadata.uid", "3f1c2b9a-0000-4000-8000-000000000001"),
        ("metadata.labels['app']", "train"),
        ("metadata.labels['absent']", ""),
        ("metadata.annotations['example.com/owner']", "ada"),
        ("metadata.annotations['odd']key']", "brackets"),
        ("spec.nodeName", NODE),
        ("spec.serviceAccountName", "trainer"),
        ("status.hostIP", HOST_IP),
        ("status.hostIPs", HOST_IP),
        ("status.podIP", "100.64.0.7"),
        ("status.podIPs", "100.64.0.7,fd00::7"),
    ],
)
def test_field_ref_paths(path: str, expected: str) -> None:
    pod = make_pod(
        container={"env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}]},
        metadata={"annotations": {"example.com/owner": "ada", "odd']key": "brackets"}},
        status={"podIP": "100.64.0.7", "podIPs": [{"ip": "100.64.0.7"}, {"ip": "fd00::7"}]},
    )
    var = translate(pod).main.env[0]
    assert var == EnvVar("V", expected, secret=False)


@pytest.mark.parametrize("path", ["status.podIP", "status.podIPs"])
def test_pod_ip_is_empty_before_the_pod_has_one(path: str) -> None:
    env = [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}]
    assert env_of(translate(with_env(env))) == {"V": ""}


def test_pod_ips_fall_back_to_pod_ip() -> None:
    pod = make_pod(
        container={
            "env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}}]
        },
        status={"podIP": "100.64.0.9"},
    )
    assert env_of(translate(pod)) == {"V": "100.64.0.9"}


@pytest.mark.parametrize(
    "path",
    [
        "status.phase",
        "metadata.labels",
        "metadata.annotations",
        "spec.schedulerName",
        "metadata.generateName",
        "",
    ],
)
def test_unsupported_field_ref_paths_are_refused(path: str) -> None:
    env: list[dict[str, Any]] = [
        {"name": "A", "value": "ok"},
        {"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}},
    ]
    with raises_on(f"{C0}.env[1].valueFrom.fieldRef.fieldPath"):
        translate(with_env(env))


def test_field_ref_values_are_not_expanded() -> None:
    pod = make_pod(
        container={
            "env": [
                {"name": "A", "value": "x"},
                {"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tpl']"}}},
            ]
        },
        metadata={"labels": {"tpl": "$(A)"}},
    )
    assert env_of(translate(pod))["V"] == "$(A)"


# --------------------------------------------------------------------------- env: resourceFieldRef


@pytest.mark.parametrize(
    ("resources", "ref", "expected"),
    [
        pytest.param(
            {"limits": {"cpu": "500m"}}, {"resource": "limits.cpu"}, "1", id="cpu-rounds-up"
        ),
        pytest.param(
            {"limits": {"cpu": "500m"}},
            {"resource": "limits.cpu", "divisor": "1m"},
            "500",
            id="cpu-milli",
        ),
        pytest.param(
            {"limits": {"cpu": "2"}},
            {"resource": "limits.cpu", "divisor": "1"},
            "2",
            id="cpu-cores",
        ),
        pytest.param(
            {"limits": {"cpu": "1.5"}}, {"resource": "limits.cpu"}, "2", id="cpu-1.5-ceil"
        ),
        pytest.param(
            {"requests": {"cpu": "250m"}},
            {"resource": "requests.cpu", "divisor": "1m"},
            "250",
            id="requests-cpu",
        ),
        pytest.param(
            {"requests": {"cpu": "1500m"}},
            {"resource": "limits.cpu"},
            "2",
            id="unset-limit-uses-request",
        ),
        pytest.param({}, {"resource": "limits.cpu"}, "0", id="cpu-unset-is-zero"),
        pytest.param(
            {"limits": {"memory": "1Gi"}},
            {"resource": "limits.memory", "divisor": "1Mi"},
            "1024",
            id="memory-mi",
        ),
        pytest.param(
            {"limits": {"memory": "1500Mi"}},
            {"resource": "limits.memory", "divisor": "1Gi"},
            "2",
            id="memory-ceil",
        ),
        pytest.param(
            {"requests": {"memory": "64Mi"}},
            {"resource": "requests.memory"},
            "67108864",
            id="memory-bytes",
        ),
        pytest.param(
            {"requests": {"memory": "1G"}},
            {"resource": "limits.memory", "divisor": "1M"},
            "1000",
            id="memory-fallback",
        ),
        pytest.param(
            {"limits": {"memory": "1k"}},
            {"resource": "limits.memory", "divisor": "0"},
            "1000",
            id="zero-divisor-is-one",
        ),
        pytest.param(
            {"limits": {"nvidia.com/gpu": "2"}},
            {"resource": "limits.nvidia.com/gpu"},
            "2",
            id="gpu-limit",
        ),
        pytest.param(
            {"requests": {"ephemeral-storage": "10Gi"}},
            {"resource": "requests.ephemeral-storage", "divisor": "1Gi"},
            "10",
            id="ephemeral-storage",
        ),
        pytest.param(
            {"limits": {"hugepages-2Mi": "4Mi"}},
            {"resource": "limits.hugepages-2Mi", "divisor": "1Mi"},
            "4",
            id="hugepages",
        ),
        pytest.param(
            {"limits": {"cpu": "1"}},
            {"resource": "limits.cpu", "containerName": "main"},
            "1",
            id="own-container",
        ),
    ],
)
def test_resource_field_ref(resources: dict[str, Any], ref: dict[str, Any], expected: str) -> None:
    pod = make_pod(
        container={
            "resources": resources,
            "env": [{"name": "V", "valueFrom": {"resourceFieldRef": ref}}],
        }
    )
    assert env_of(translate(pod)) == {"V": expected}


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        ({"resource": "limits.pods"}, "resource"),
        ({"resource": "cpu"}, "resource"),
        ({"resource": "status.cpu"}, "resource"),
        ({"resource": "limits.cpu", "containerName": "sidecar"}, "containerName"),
        ({"resource": "limits.cpu", "divisor": "lots"}, "divisor"),
        ({"resource": "limits.cpu", "divisor": "-1"}, "divisor"),
    ],
)
def test_bad_resource_field_refs_are_refused(ref: dict[str, Any], field: str) -> None:
    pod = make_pod(container={"env": [{"name": "V", "valueFrom": {"resourceFieldRef": ref}}]})
    with raises_on(f"{C0}.env[0].valueFrom.resourceFieldRef.{field}"):
        translate(pod)


# ---------------------------------------------------------------- env: Secrets and ConfigMaps


def _secret_env(optional: bool | None = None, key: str = "token") -> list[dict[str, Any]]:
    ref: dict[str, Any] = {"name": "creds", "key": key}
    if optional is not None:
        ref["optional"] = optional
    return [{"name": "TOKEN", "valueFrom": {"secretKeyRef": ref}}]


def _config_env(optional: bool | None = None, key: str = "level") -> list[dict[str, Any]]:
    ref: dict[str, Any] = {"name": "settings", "key": key}
    if optional is not None:
        ref["optional"] = optional
    return [{"name": "LEVEL", "valueFrom": {"configMapKeyRef": ref}}]


def test_secret_key_ref_is_decoded_and_marked_secret() -> None:
    workload = translate(
        with_env(_secret_env()), secrets={"creds": secret("creds", {"token": "s3cr3t"})}
    )
    assert workload.main.env == (EnvVar("TOKEN", "s3cr3t", secret=True),)


def test_secret_string_data_is_honoured_over_data() -> None:
    creds = secret("creds", {"token": "old"}, string_data={"token": "new"})
    assert env_of(translate(with_env(_secret_env()), secrets={"creds": creds})) == {"TOKEN": "new"}


def test_config_map_key_ref_reads_data_then_binary_data() -> None:
    settings = config_map("settings", {"level": "debug"}, binary={"blob": b"bin-text"})
    blob = {"name": "BLOB", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "blob"}}}
    env = [*_config_env(), blob]
    workload = translate(with_env(env), config_maps={"settings": settings})
    assert workload.main.env == (EnvVar("LEVEL", "debug"), EnvVar("BLOB", "bin-text"))


@pytest.mark.parametrize(
    ("env", "secrets", "config_maps", "field"),
    [
        pytest.param(_secret_env(), {}, {}, "secretKeyRef", id="secret-missing"),
        pytest.param(
            _secret_env(False), {}, {}, "secretKeyRef", id="secret-missing-optional-false"
        ),
        pytest.param(
            _secret_env(key="other"),
            {"creds": secret("creds", {"token": "t"})},
            {},
            "secretKeyRef",
            id="secret-key-missing",
        ),
        pytest.param(_config_env(), {}, {}, "configMapKeyRef", id="configmap-missing"),
        pytest.param(
            _config_env(key="other"),
            {},
            {"settings": config_map("settings", {"level": "x"})},
            "configMapKeyRef",
            id="configmap-key-missing",
        ),
    ],
)
def test_missing_referenced_objects_are_retryable_refusals(
    env: list[dict[str, Any]], secrets: dict[str, Any], config_maps: dict[str, Any], field: str
) -> None:
    with raises_on(f"{C0}.env[0].valueFrom.{field}", retryable=True):
        translate(with_env(env), secrets=secrets, config_maps=config_maps)


@pytest.mark.parametrize(
    ("env", "secrets", "config_maps"),
    [
        pytest.param(_secret_env(True), {}, {}, id="secret-missing"),
        pytest.param(
            _secret_env(True, key="other"),
            {"creds": secret("creds", {"token": "t"})},
            {},
            id="secret-key",
        ),
        pytest.param(_config_env(True), {}, {}, id="configmap-missing"),
        pytest.param(
            _config_env(True, key="other"),
            {},
            {"settings": config_map("settings", {"level": "x"})},
            id="configmap-key",
        ),
    ],
)
def test_optional_missing_references_are_skipped(
    env: list[dict[str, Any]], secrets: dict[str, Any], config_maps: dict[str, Any]
) -> None:
    pod = with_env([{"name": "A", "value": "1"}, *env, {"name": "B", "value": "$(TOKEN)$(LEVEL)"}])
    workload = translate(pod, secrets=secrets, config_maps=config_maps)
    assert env_of(workload) == {"A": "1", "B": "$(TOKEN)$(LEVEL)"}


def test_a_secret_that_is_not_utf8_is_refused_without_quoting_it() -> None:
    creds = {
        "metadata": {"name": "creds"},
        "data": {"token": base64.b64encode(b"\xff\xfe").decode()},
    }
    with raises_on(f"{C0}.env[0].valueFrom.secretKeyRef", retryable=True):
        translate(with_env(_secret_env()), secrets={"creds": creds})


def test_reference_without_name_is_refused() -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"key": "token"}}}]
    with raises_on(f"{C0}.env[0].valueFrom.secretKeyRef.name"):
        translate(with_env(env))


# --------------------------------------------------------------------------- env: envFrom


def test_env_from_with_prefix_skips_invalid_names_and_marks_secrets() -> None:
    pod = make_pod(
        container={
            "envFrom": [
                {"configMapRef": {"name": "settings"}, "prefix": "CFG_"},
                {"secretRef": {"name": "creds"}},
            ]
        }
    )
    workload = translate(
        pod,
        config_maps={
            "settings": config_map("settings", {"level": "info", "bad key": "x", "a.b-c": "y"})
        },
        secrets={
            "creds": secret("creds", {"PASSWORD": "pw", "1BAD": "z"}, string_data={"USER": "u"})
        },
    )
    assert workload.main.env == (
        EnvVar("CFG_level", "info"),
        EnvVar("CFG_a.b-c", "y"),
        EnvVar("PASSWORD", "pw", secret=True),
        EnvVar("USER", "u", secret=True),
    )


def test_env_from_key_made_valid_by_prefix_is_kept() -> None:
    pod = make_pod(container={"envFrom": [{"configMapRef": {"name": "c"}, "prefix": "P_"}]})
    workload = translate(pod, config_maps={"c": config_map("c", {"1ST": "x"})})
    assert env_of(workload) == {"P_1ST": "x"}


def test_env_overrides_env_from_and_later_env_from_overrides_earlier() -> None:
    pod = make_pod(
        container={
            "envFrom": [
                {"configMapRef": {"name": "first"}},
                {"configMapRef": {"name": "second"}},
            ],
            "env": [
                {"name": "NEW", "value": "n"},
                {"name": "SHARED", "value": "from-env:$(ONLY_FIRST)"},
            ],
        }
    )
    workload = translate(
        pod,
        config_maps={
            "first": config_map("first", {"SHARED": "1", "ONLY_FIRST": "f", "BOTH": "1"}),
            "second": config_map("second", {"BOTH": "2"}),
        },
    )
    assert workload.main.env == (
        EnvVar("SHARED", "from-env:f"),
        EnvVar("ONLY_FIRST", "f"),
        EnvVar("BOTH", "2"),
        EnvVar("NEW", "n"),
    )


def test_env_from_missing_objects() -> None:
    required = make_pod(
        container={"envFrom": [{"configMapRef": {"name": "a"}}, {"secretRef": {"name": "s"}}]}
    )
    with raises_on(f"{C0}.envFrom[0].configMapRef", retryable=True):
        translate(required)
    with raises_on(f"{C0}.envFrom[1].secretRef", retryable=True):
        translate(required, config_maps={"a": config_map("a", {})})
    optional = make_pod(
        container={
            "envFrom": [
                {"configMapRef": {"name": "a", "optional": True}},
                {"secretRef": {"name": "s", "optional": True}},
            ]
        }
    )
    assert translate(optional).main.env == ()


def test_env_from_without_source_is_refused() -> None:
    with raises_on(f"{C0}.envFrom[0]"):
        translate(make_pod(container={"envFrom": [{"prefix": "X_"}]}))


# --------------------------------------------------------------------------- secrets stay secret


def test_secret_values_never_show_in_repr_and_taint_what_expands_them() -> None:
    pod = make_pod(
        container={
            "envFrom": [{"secretRef": {"name": "bulk"}}],
            "env": [
                *_secret_env(),
                {"name": "URL", "value": "https://user:$(TOKEN)@example.com"},
                {"name": "ESCAPED", "value": "$$(TOKEN)"},
                {"name": "PLAIN", "value": "visible"},
            ],
        }
    )
    workload = translate(
        pod,
        secrets={
            "creds": secret("creds", {"token": "hunter2-token"}),
            "bulk": secret("bulk", {"DB_PASSWORD": "bulk-password-9"}),
        },
    )
    by_name = {var.name: var for var in workload.main.env}
    assert by_name["TOKEN"].secret and by_name["DB_PASSWORD"].secret
    assert by_name["URL"] == EnvVar("URL", "https://user:hunter2-token@example.com", secret=True)
    assert by_name["ESCAPED"] == EnvVar("ESCAPED", "$(TOKEN)", secret=False)
    text = repr(workload) + str(workload)
    assert "hunter2-token" not in text and "bulk-password-9" not in text
    assert "visible" in text


def test_command_and_args_expand_the_final_environment() -> None:
    pod = with_env(
        [{"name": "PORT", "value": "8080"}, {"name": "HOST", "value": "127.0.0.1"}],
        command=["serve", "--port=$(PORT)"],
        args=["--bind=$(HOST):$(PORT)", "$$(PORT)", "$(UNSET)"],
    )
    workload = translate(pod)
    assert workload.main.command == ("serve", "--port=8080")
    assert workload.main.args == ("--bind=127.0.0.1:8080", "$(PORT)", "$(UNSET)")


@pytest.mark.parametrize("key", ["command", "args"])
def test_command_line_expansion_of_a_secret_is_refused(key: str) -> None:
    pod = with_env(_secret_env(), **{key: ["run", "--token=$(TOKEN)"]})
    with raises_on(f"{C0}.{key}[1]"):
        translate(pod, secrets={"creds": secret("creds", {"token": "t0k"})})


def test_secret_reasons_do_not_quote_values() -> None:
    creds = {"metadata": {"name": "creds"}, "data": {"token": "not-base64!"}}
    with pytest.raises(InvalidPodSpec) as caught:
        translate(with_env(_secret_env()), secrets={"creds": creds})
    assert "not-base64!" not in str(caught.value)


# --------------------------------------------------------------------------- resources


@pytest.mark.parametrize(
    ("resources", "cpu", "memory"),
    [
        ({"requests": {"cpu": "500m", "memory": "512Mi"}}, 0.5, 512 * 2**20),
        ({"requests": {"cpu": "2", "memory": "1G"}}, 2.0, 10**9),
        ({"limits": {"cpu": "1500m", "memory": "2Gi"}}, 1.5, 2 * 2**30),
        ({"requests": {"cpu": "0.25"}, "limits": {"cpu": "4", "memory": "1e3"}}, 0.25, 1000),
        ({"requests": {"memory": "1.5Ki"}}, 0.0, 1536),
        ({"requests": {"memory": "1500m"}}, 0.0, 2),
        ({"requests": {"cpu": 3, "memory": 1024}}, 3.0, 1024),
    ],
)
def test_cpu_and_memory_come_from_requests_then_limits(
    resources: dict[str, Any], cpu: float, memory: int
) -> None:
    workload = translate(make_pod(container={"resources": resources}))
    assert (workload.cpu, workload.memory_bytes) == (cpu, memory)


@pytest.mark.parametrize(
    ("resources", "count"),
    [
        ({"limits": {"nvidia.com/gpu": "4"}}, 4),
        ({"requests": {"nvidia.com/gpu": "1"}}, 1),
        ({"limits": {"nvidia.com/gpu": "0"}}, 0),
        ({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}, 2),
        ({"limits": {"cpu": "1"}}, 0),
    ],
)
def test_gpu_count(resources: dict[str, Any], count: int) -> None:
    assert translate(make_pod(container={"resources": resources})).gpu_count == count


@pytest.mark.parametrize(
    ("resources", "field", "fragment"),
    [
        ({"requests": {"memory": "lots"}}, "resources.requests.memory", "is not a quantity"),
        ({"requests": {"memory": "1 Gi"}}, "resources.requests.memory", "is not a quantity"),
        ({"limits": {"cpu": "2cores"}}, "resources.limits.cpu", "is not a quantity"),
        ({"requests": {"cpu": "-1"}}, "resources.requests.cpu", "negative"),
        ({"requests": {"memory": "1e30"}}, "resources.requests.memory", "too large"),
        (
            {"limits": {"nvidia.com/gpu": "1.5"}},
            "resources.limits['nvidia.com/gpu']",
            "whole number",
        ),
        (
            {"requests": {"nvidia.com/gpu": "500m"}},
            "resources.requests['nvidia.com/gpu']",
            "whole number",
        ),
        ({"limits": {"nvidia.com/gpu": "-1"}}, "resources.limits['nvidia.com/gpu']", "negative"),
        (
            {"limits": {"nvidia.com/gpu": "one"}},
            "resources.limits['nvidia.com/gpu']",
            "is not a quantity",
        ),
        ({"limits": {"memory": True}}, "resources.limits.memory", "quantity string"),
    ],
)
def test_bad_quantities_name_the_field(
    resources: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(InvalidPodSpec) as caught:
        translate(make_pod(container={"resources": resources}))
    assert caught.value.field == f"{C0}.{field}"
    assert fragment in caught.value.reason
    assert str(caught.value).startswith(f"{C0}.{field}: ")
    assert caught.value.retryable is False


# --------------------------------------------------------------------------- annotations


@pytest.mark.parametrize(
    ("value", "models"),
    [
        ("H100", ("H100",)),
        ("H100,A100-80GB", ("H100", "A100-80GB")),
        (" H100 , ,A100-80GB,, ", ("H100", "A100-80GB")),
        ("L40S,H100,L40S", ("L40S", "H100")),
        ("RTX_4090,gh200.x", ("RTX_4090", "gh200.x")),
        ("", ()),
        (" , ", ()),
    ],
)
def test_gpu_models_annotation(value: str, models: tuple[str, ...]) -> None:
    pod = make_pod(metadata={"annotations": {"vk-provider.io/gpu": value}})
    assert translate(pod).gpu_models == models


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("vk-provider.io/gpu", "H100;A100"),
        ("vk-provider.io/gpu", "H100,A100 80GB"),
        ("vk-provider.io/gpu", "-H100"),
        ("vk-provider.io/min-gpu-memory", "forty"),
        ("vk-provider.io/min-gpu-memory", "-40Gi"),
    ],
)
def test_bad_annotations_are_refused(annotation: str, value: str) -> None:
    pod = make_pod(metadata={"annotations": {annotation: value}})
    with raises_on(f"metadata.annotations['{annotation}']"):
        translate(pod)


@pytest.mark.parametrize(
    ("value", "gib"),
    [
        ("40Gi", 40.0),
        ("80Gi", 80.0),
        ("512Mi", 0.5),
        (" 24Gi ", 24.0),
        ("0", 0.0),
        (str(2**30), 1.0),
    ],
)
def test_min_gpu_memory_annotation_in_gib(value: str, gib: float) -> None:
    pod = make_pod(metadata={"annotations": {"vk-provider.io/min-gpu-memory": value}})
    assert translate(pod).min_gpu_memory_gib == gib


def test_min_gpu_memory_in_decimal_units() -> None:
    pod = make_pod(metadata={"annotations": {"vk-provider.io/min-gpu-memory": "40G"}})
    assert translate(pod).min_gpu_memory_gib == pytest.approx(37.2529, rel=1e-5)


# --------------------------------------------------------------------------- references


def test_references_lists_every_secret_and_config_map_the_container_reads() -> None:
    pod = make_pod(
        container={
            "env": [
                {"name": "A", "value": "x"},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}},
                {
                    "name": "C",
                    "valueFrom": {"configMapKeyRef": {"name": "c1", "key": "k", "optional": True}},
                },
                {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "E", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "other"}}},
            ],
            "envFrom": [
                {"secretRef": {"name": "s2"}},
                {"configMapRef": {"name": "c2"}, "prefix": "P_"},
            ],
        }
    )
    assert references(pod) == ObjectRefs(
        secrets=frozenset({"s1", "s2"}), config_maps=frozenset({"c1", "c2"})
    )


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"spec": None},
        {"spec": {"containers": "nope"}},
        {"spec": {"containers": [None, {"env": [None, {"valueFrom": "x"}], "envFrom": [3]}]}},
        make_pod(),
    ],
)
def test_references_of_pods_without_any_is_empty_and_never_raises(pod: dict[str, Any]) -> None:
    assert references(pod) == ObjectRefs()


# --------------------------------------------------------------------------- parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Decimal(0)),
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("1.", Decimal(1)),
        ("+3", Decimal(3)),
        ("-1k", Decimal(-1000)),
        ("100n", Decimal("1e-7")),
        ("5u", Decimal("5e-6")),
        ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)),
        ("1G", Decimal(10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("1Ki", Decimal(1024)),
        ("1Mi", Decimal(2**20)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1Ti", Decimal(2**40)),
        ("1Pi", Decimal(2**50)),
        ("1Ei", Decimal(2**60)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("1e-3", Decimal("0.001")),
        ("2.5e+2", Decimal(250)),
        (
            "12345678901234567890123456789012345Ei",
            Decimal(12345678901234567890123456789012345 * 2**60),
        ),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "1 Gi",
        "Gi",
        "1K",
        "1ki",
        "1e",
        "1ee3",
        "1.2.3",
        "1GiB",
        "0x10",
        "NaN",
        "inf",
        "1_000",
        "--1",
        "\u0661",  # a digit, but not an ASCII one
    ],
)
def test_parse_quantity_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


def test_parse_quantity_rejects_absurd_exponents() -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_quantity("1e99999999999")


_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@given(
    number=st.integers(min_value=-(10**30), max_value=10**30),
    suffix=st.sampled_from(sorted(_BINARY)),
)
def test_integer_times_binary_suffix_round_trips(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * 2 ** _BINARY[suffix]


@given(number=st.integers(min_value=0, max_value=10**30), suffix=st.sampled_from(sorted(_DECIMAL)))
def test_integer_times_decimal_suffix_round_trips(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == Decimal(f"{number}e{_DECIMAL[suffix]}")


@given(
    value=st.decimals(
        allow_nan=False, allow_infinity=False, places=6, min_value=-(10**12), max_value=10**12
    )
)
def test_plain_decimals_round_trip(value: Decimal) -> None:
    assert parse_quantity(format(value, "f")) == value


@given(
    mantissa=st.integers(min_value=0, max_value=10**12),
    exponent=st.integers(min_value=-40, max_value=40),
)
def test_decimal_exponent_round_trips(mantissa: int, exponent: int) -> None:
    assert parse_quantity(f"{mantissa}e{exponent}") == Decimal(f"{mantissa}e{exponent}")


@given(text=st.text(max_size=20))
def test_parse_quantity_only_ever_raises_value_error(text: str) -> None:
    try:
        result = parse_quantity(text)
    except ValueError:
        return
    assert result.is_finite()
