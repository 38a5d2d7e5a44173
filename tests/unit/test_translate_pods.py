"""Whole pods: several app containers, init containers, native sidecars and probes, as the
translation reads them (``vk_provider.domain.workload`` and ``vk_provider.domain.probes``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_translate import make_pod, raises_on, secret, translate
from vk_provider.domain import explain
from vk_provider.domain.containers import Probe, VolumeMount
from vk_provider.domain.env import MissingReferenceError
from vk_provider.domain.placement import PodShape
from vk_provider.domain.workload import held_resources, to_request


def pod_with(
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    pod = make_pod(spec={"containers": containers, **spec})
    if init is not None:
        pod["spec"]["initContainers"] = init
    return pod


def c(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": f"img/{name}:1", **fields}


def res(cpu: str = "0", memory: str = "0", gpu: str | None = None) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {} if gpu is None else {"nvidia.com/gpu": gpu}
    return {"resources": {"requests": requests, "limits": limits}}


# --------------------------------------------------------------------------- containers


def test_every_container_is_translated_in_order_with_its_own_environment() -> None:
    pod = pod_with(
        [
            c("app", env=[{"name": "ROLE", "value": "app"}]),
            c("proxy", args=["--port", "$(P)"], env=[{"name": "P", "value": "9"}]),
        ],
        init=[c("migrate", command=["migrate"]), c("log-shipper", restartPolicy="Always")],
    )
    workload = translate(pod)
    assert [x.name for x in workload.containers] == ["app", "proxy"]
    assert [x.name for x in workload.init_containers] == ["migrate", "log-shipper"]
    assert [x.sidecar for x in workload.init_containers] == [False, True]
    assert workload.containers[1].args == ("--port", "9")
    assert [(v.name, v.value) for v in workload.containers[0].env] == [("ROLE", "app")]
    assert workload.init_containers[0].command == ("migrate",)
    # The single-container fields describe the first app container.
    assert (workload.main.name, workload.main.image) == ("app", "img/app:1")
    assert workload.restart_policy == "Always"


def test_container_names_must_be_unique_across_init_and_app_containers() -> None:
    with raises_on("spec.containers"):
        translate(pod_with([c("app")], init=[c("app")]))


def test_a_refusal_inside_an_init_container_names_its_path() -> None:
    pod = pod_with([c("app")], init=[c("ok"), c("bad", securityContext={"privileged": True})])
    with raises_on("spec.initContainers[1].securityContext.privileged"):
        translate(pod)


def test_a_second_app_container_is_checked_like_the_first() -> None:
    with raises_on("spec.containers[1].ports[0].containerPort"):
        translate(pod_with([c("app"), c("side", ports=[{"containerPort": 70000}])]))


def test_a_missing_secret_in_a_later_container_is_a_retryable_refusal_naming_it() -> None:
    ref = {"name": "T", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "t"}}}
    with raises_on("spec.containers[1].env[0].valueFrom.secretKeyRef", retryable=True):
        translate(pod_with([c("app"), c("side", env=[ref])]))


def test_init_containers_read_their_own_references() -> None:
    ref = {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}
    workload = translate(
        pod_with([c("app")], init=[c("fetch", env=[ref])]), secrets={"s": secret("s", {"t": "x"})}
    )
    (var,) = workload.init_containers[0].env
    assert var.value == "x" and var.secret


def test_optional_references_that_are_missing_are_reported_as_skipped() -> None:
    optional = {
        "name": "T",
        "valueFrom": {"secretKeyRef": {"name": "gone", "key": "t", "optional": True}},
    }
    pod = pod_with(
        [c("app", env=[optional], envFrom=[{"configMapRef": {"name": "cm", "optional": True}}])]
    )
    translation = to_request(pod, secrets={}, config_maps={}, node_name="n", host_ip="10.0.0.1")
    assert translation.spec.containers[0].env == ()
    assert [(s.reason, s.message) for s in translation.skipped] == [
        ("OptionalConfigMapNotFound", 'configmap "cm" not found'),
        ("OptionalSecretNotFound", 'skipping optional envvar "T": secret "gone" not found'),
    ]


SECRET = {"metadata": {"name": "s"}, "stringData": {"have": "1"}}
CONFIG_MAP = {"metadata": {"name": "m"}, "data": {"have": "1", "9bad": "x", "ok-key": "y"}}


@pytest.mark.parametrize(
    ("env", "reason", "message"),
    [
        (
            {"secretKeyRef": {"name": "nope", "key": "k"}},
            "MandatorySecretNotFound",
            'secret "nope" not found',
        ),
        (
            {"configMapKeyRef": {"name": "nope", "key": "k"}},
            "MandatoryConfigMapNotFound",
            'configmap "nope" not found',
        ),
        (
            {"secretKeyRef": {"name": "s", "key": "k"}},
            "MandatorySecretKeyNotFound",
            'key "k" does not exist in secret "s"',
        ),
        (
            {"configMapKeyRef": {"name": "m", "key": "k"}},
            "MandatoryConfigMapKeyNotFound",
            'key "k" does not exist in configmap "m"',
        ),
        (
            {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
            "OptionalSecretNotFound",
            'skipping optional envvar "V": secret "nope" not found',
        ),
        (
            {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}},
            "OptionalConfigMapNotFound",
            'skipping optional envvar "V": configmap "nope" not found',
        ),
        (
            {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
            "OptionalSecretKeyNotFound",
            'skipping optional envvar "V": key "k" does not exist in secret "s"',
        ),
        (
            {"configMapKeyRef": {"name": "m", "key": "k", "optional": True}},
            "OptionalConfigMapKeyNotFound",
            'skipping optional envvar "V": key "k" does not exist in configmap "m"',
        ),
    ],
)
def test_missing_references_have_virtual_kubelets_reasons(
    env: dict[str, Any], reason: str, message: str
) -> None:
    pod = pod_with([c("app", env=[{"name": "V", "valueFrom": env}])])
    objects: dict[str, Any] = {"secrets": {"s": SECRET}, "config_maps": {"m": CONFIG_MAP}}
    if reason.startswith("Mandatory"):
        with pytest.raises(MissingReferenceError) as raised:
            to_request(pod, **objects, node_name="n", host_ip="10.0.0.1")
        assert raised.value.retryable and raised.value.field.endswith("KeyRef")
        found = explain.config_error(raised.value)
    else:
        translation = to_request(pod, **objects, node_name="n", host_ip="10.0.0.1")
        assert translation.spec.containers[0].env == ()
        (skipped,) = translation.skipped
        found = explain.skipped_reference(skipped)
    assert (found.kind, found.reason, found.message) == ("Warning", reason, message)


def test_env_from_keys_that_are_no_variable_names_are_skipped_with_an_event() -> None:
    pod = pod_with([c("app", envFrom=[{"configMapRef": {"name": "m"}}])])
    translation = to_request(
        pod, secrets={}, config_maps={"m": CONFIG_MAP}, node_name="n", host_ip="10.0.0.1"
    )
    assert [v.name for v in translation.spec.containers[0].env] == ["have", "ok-key"]
    (skipped,) = translation.skipped
    event = explain.skipped_reference(skipped)
    assert event.reason == "InvalidEnvironmentVariableNames"
    assert event.message == (
        "keys [9bad] from configmap ml/m were skipped since they are invalid as environment "
        "variable names"
    )


def test_pod_restart_policy_is_kept() -> None:
    assert translate(pod_with([c("app")], restartPolicy="OnFailure")).restart_policy == "OnFailure"


# --------------------------------------------------------------------------- resources, shape


def test_effective_resources_follow_kubelet() -> None:
    # Apps and the sidecar run together (1 + 2 + 0.5 CPU); the plain init container runs alone
    # and is larger in memory and GPUs, so those come from it.
    pod = pod_with(
        [c("app", **res("1", "1Gi", "1")), c("side", **res("2", "1Gi"))],
        init=[
            c("warm", **res("500m", "8Gi", "2")),
            c("proxy", restartPolicy="Always", **res("500m", "1Gi")),
        ],
    )
    workload = translate(pod)
    assert workload.cpu == 3.5
    assert workload.memory_bytes == 8 * 2**30
    assert workload.gpu_count == 2
    held = held_resources(pod)
    assert (held.gpus, held.cpu, held.memory_gib) == (2.0, 3.5, 8.0)
    assert [x.cpu for x in workload.containers] == [1.0, 2.0]
    assert [x.gpu_count for x in (*workload.containers, *workload.init_containers)] == [1, 0, 2, 0]


@pytest.mark.parametrize(
    ("apps", "init", "shape"),
    [
        ([c("a")], [], PodShape(1, 0, 0, "")),
        ([c("a"), c("b")], [], PodShape(2, 0, 0, "spec.containers[1]")),
        ([c("a")], [c("i")], PodShape(1, 1, 0, "spec.initContainers[0]")),
        (
            [c("a")],
            [c("i"), c("s", restartPolicy="Always")],
            PodShape(1, 1, 1, "spec.initContainers[1]"),
        ),
    ],
)
def test_the_placement_request_carries_the_pod_shape(
    apps: list[dict[str, Any]], init: list[dict[str, Any]], shape: PodShape
) -> None:
    translation = to_request(
        pod_with(apps, init=init), secrets={}, config_maps={}, node_name="n", host_ip="10.0.0.1"
    )
    assert translation.request.shape == shape
    assert translation.request.shape.single == (shape == PodShape())


# --------------------------------------------------------------------------- probes


def test_probes_are_read_with_the_api_defaults() -> None:
    pod = pod_with(
        [
            c(
                "app",
                ports=[{"name": "http", "containerPort": 8080}],
                readinessProbe={"httpGet": {"path": "/ready", "port": "http"}},
                livenessProbe={
                    "tcpSocket": {"port": 8080},
                    "periodSeconds": 3,
                    "failureThreshold": 2,
                },
                startupProbe={"exec": {"command": ["cat", "/tmp/up"]}, "initialDelaySeconds": 5},
            ),
            c(
                "grpc",
                readinessProbe={"grpc": {"port": 9000, "service": "health"}, "successThreshold": 2},
            ),
        ]
    )
    app, grpc = translate(pod).containers
    assert app.readiness_probe == Probe(kind="http", port=8080, path="/ready")
    assert app.liveness_probe == Probe(kind="tcp", port=8080, period_seconds=3, failure_threshold=2)
    assert app.startup_probe == Probe(
        kind="exec", command=("cat", "/tmp/up"), initial_delay_seconds=5
    )
    assert grpc.readiness_probe == Probe(
        kind="grpc", port=9000, grpc_service="health", success_threshold=2
    )


def test_http_probe_headers_and_scheme() -> None:
    probe = {
        "httpGet": {
            "port": 443,
            "scheme": "https",
            "httpHeaders": [{"name": "Host", "value": "example"}],
        }
    }
    (app,) = translate(pod_with([c("app", readinessProbe=probe)])).containers
    assert app.readiness_probe == Probe(
        kind="http", port=443, scheme="HTTPS", headers=(("Host", "example"),)
    )


@pytest.mark.parametrize(
    ("probe", "field"),
    [
        ({}, "readinessProbe"),
        ({"exec": {"command": ["x"]}, "tcpSocket": {"port": 1}}, "readinessProbe"),
        ({"exec": {"command": []}}, "readinessProbe.exec.command"),
        ({"httpGet": {"port": "web"}}, "readinessProbe.httpGet.port"),
        ({"httpGet": {"port": 0}}, "readinessProbe.httpGet.port"),
        ({"httpGet": {"port": 80, "scheme": "FTP"}}, "readinessProbe.httpGet.scheme"),
        ({"tcpSocket": {"port": True}}, "readinessProbe.tcpSocket.port"),
        ({"tcpSocket": {"port": 80}, "periodSeconds": 0}, "readinessProbe.periodSeconds"),
        ({"tcpSocket": {"port": 80}, "timeoutSeconds": "1"}, "readinessProbe.timeoutSeconds"),
        (
            {"httpGet": {"port": 80, "httpHeaders": ["Host: x"]}},
            "readinessProbe.httpGet.httpHeaders[0]",
        ),
    ],
)
def test_bad_probes_are_refused_naming_the_field(probe: dict[str, Any], field: str) -> None:
    with raises_on(f"spec.containers[0].{field}"):
        translate(pod_with([c("app", readinessProbe=probe)]))


def test_liveness_and_startup_probes_take_success_threshold_one_only() -> None:
    probe = {"tcpSocket": {"port": 80}, "successThreshold": 2}
    with raises_on("spec.containers[0].livenessProbe.successThreshold"):
        translate(pod_with([c("app", livenessProbe=probe)]))
    with raises_on("spec.containers[0].startupProbe.successThreshold"):
        translate(pod_with([c("app", startupProbe=probe)]))


def test_a_plain_init_container_takes_no_probes_but_a_sidecar_may() -> None:
    probe = {"tcpSocket": {"port": 80}}
    with raises_on("spec.initContainers[0]"):
        translate(pod_with([c("app")], init=[c("i", readinessProbe=probe)]))
    workload = translate(
        pod_with([c("app")], init=[c("s", restartPolicy="Always", readinessProbe=probe)])
    )
    assert workload.init_containers[0].readiness_probe == Probe(kind="tcp", port=80)


# --------------------------------------------------------------------------- emptyDir mounts


def test_emptydir_mounts_are_read_per_container_and_the_token_volume_is_not() -> None:
    token = {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/x", "readOnly": True}
    pod = pod_with(
        [
            c("model", volumeMounts=[{"name": "models", "mountPath": "/m", "readOnly": True}]),
            c("exporter", volumeMounts=[{"name": "models", "mountPath": "/d", "subPath": "x/y"}]),
        ],
        init=[c("fetch", volumeMounts=[{"name": "models", "mountPath": "/m"}, token])],
        volumes=[
            {"name": "models", "emptyDir": {}},
            {
                "name": "kube-api-access-x",
                "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
            },
        ],
    )
    spec = translate(pod)
    (fetch,) = spec.init_containers
    model, exporter = spec.containers
    assert fetch.volume_mounts == (VolumeMount("models", "/m"),)  # no cluster credentials
    assert model.volume_mounts == (VolumeMount("models", "/m", read_only=True),)
    assert exporter.volume_mounts == (VolumeMount("models", "/d", sub_path="x/y"),)


MOUNT = "spec.containers[0].volumeMounts[0]"


@pytest.mark.parametrize(
    ("mount", "field"),
    [
        ({"name": "v", "mountPath": "relative"}, f"{MOUNT}.mountPath"),
        ({"name": "v", "mountPath": "/m", "subPath": "../up"}, f"{MOUNT}.subPath"),
        ({"name": "v", "mountPath": "/m", "subPath": "/abs"}, f"{MOUNT}.subPath"),
    ],
)
def test_bad_mounts_are_refused_naming_the_field(mount: dict[str, Any], field: str) -> None:
    pod = pod_with([c("a", volumeMounts=[mount])], volumes=[{"name": "v", "emptyDir": {}}])
    with raises_on(field):
        translate(pod)
