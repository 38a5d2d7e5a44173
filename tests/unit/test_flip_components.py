"""The flip components' pure parts: flags, command lines, configuration files, decoders.

The programs themselves run in tests/integration/test_flip_components.py; here only what the
project writes for them, and the child-process runner on plain Python children.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from vk_provider_dev.cluster import flags as f
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip import descheduler as d
from vk_provider_dev.cluster.flip import ksm, kwok, tools, workloads
from vk_provider_dev.cluster.flip import prometheus as p
from vk_provider_dev.cluster.flip.child import ChildProcess, http_ok
from vk_provider_dev.cluster.flip.deployfiles import DESCHEDULER_POLICY, REPOSITORY
from vk_provider_dev.cluster.ports import free_ports

# --------------------------------------------------------------------------- cluster flags


def test_gang_scheduling_flags_are_the_measured_set() -> None:
    flags = f.GANG_SCHEDULING
    assert flags.arguments("kube-apiserver") == [
        "--feature-gates=GenericWorkload=true,WorkloadWithJob=true",
        "--runtime-config=scheduling.k8s.io/v1beta1=true",
    ]
    assert flags.arguments("kube-controller-manager") == [
        "--feature-gates=GenericWorkload=true,WorkloadWithJob=true"
    ]
    assert flags.arguments("kube-scheduler") == ["--feature-gates=GenericWorkload=true"]
    assert flags.arguments("etcd") == []


def test_feature_gates_without_a_component_go_to_all_three() -> None:
    flags = f.parse_feature_gates(["B=false,A=true", "kube-scheduler:C=TRUE"])
    assert flags.arguments("kube-apiserver") == ["--feature-gates=A=true,B=false"]
    assert flags.arguments("kube-scheduler") == ["--feature-gates=A=true,B=false,C=true"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("A=yes", "must be true or false"),
        ("A", "is not KEY=VALUE"),
        ("etcd:A=true", "unknown component etcd"),
        ("kube-scheduler:=true", "is not KEY=VALUE"),
    ],
)
def test_bad_feature_gates_say_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        f.parse_feature_gates([value])


def test_flags_are_appended_and_later_ones_win() -> None:
    commands = {"etcd": ["etcd"], "kube-apiserver": ["kas", "--v=1"]}
    applied = f.parse_runtime_config(["x/v1=true"]).apply(commands)
    assert applied == {
        "etcd": ["etcd"],
        "kube-apiserver": ["kas", "--v=1", "--runtime-config=x/v1=true"],
    }
    merged = f.parse_feature_gates(["A=true"]).merged(f.parse_feature_gates(["A=false"]))
    assert merged.arguments("kube-scheduler") == ["--feature-gates=A=false"]


def test_flags_round_trip_through_the_state_file() -> None:
    saved = f.GANG_SCHEDULING.to_json()
    assert f.ClusterFlags.from_json(yaml.safe_load(yaml.safe_dump(saved))) == f.GANG_SCHEDULING
    assert f.ClusterFlags.from_json(None) == f.ClusterFlags()
    assert f.ClusterFlags().empty


def test_up_keeps_the_saved_flags_and_refuses_others_while_running() -> None:
    saved = f.GANG_SCHEDULING
    keep = f.choose_flags(saved=saved, requested=None, running=True, cluster="c")
    assert keep == saved
    other = f.parse_feature_gates(["A=true"])
    with pytest.raises(ClusterError, match="cluster down --name c"):
        f.choose_flags(saved=saved, requested=other, running=True, cluster="c")
    assert f.choose_flags(saved=saved, requested=other, running=False, cluster="c") == other


def test_cluster_up_options_without_any_flag_keep_the_saved_ones() -> None:
    assert f.requested_flags([], [], gang_scheduling=False) is None
    asked = f.requested_flags(["kube-scheduler:X=true"], [], gang_scheduling=True)
    assert asked is not None
    assert asked.arguments("kube-scheduler") == ["--feature-gates=GenericWorkload=true,X=true"]


# --------------------------------------------------------------------------- tools


def test_versions_are_exact_and_each_has_its_own_cache_directory() -> None:
    keys = {program.cache_key for program in tools.GO_PROGRAMS}
    assert keys == {
        "kwok-v0.8.0",
        "descheduler-v0.36.0",
        "kube-state-metrics-v2.20.0",
        "kueue-v0.19.2",
    }
    for program in tools.GO_PROGRAMS:
        assert program.version.startswith("v")
        assert "latest" not in program.version
        assert program.ldflags().startswith("-s -w")
    assert dict(tools.DESCHEDULER.replaces)["k8s.io/kube-openapi"].startswith(
        "k8s.io/kube-openapi@"
    )


def test_nothing_is_found_in_an_empty_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tools.find_flip_tools() is None
    # A KWOK directory without its stages is not a KWOK.
    directory = tools.program_directory(tools.KWOK)
    directory.mkdir(parents=True)
    (directory / "kwok").write_text("#!/bin/sh\n")
    (directory / "kwok").chmod(0o755)
    assert not tools._kwok_complete(tools._kwok_in(directory))


# --------------------------------------------------------------------------- KWOK


def _stage(name: str) -> str:
    return f"apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: {name}\n"


def test_kwok_manages_only_annotated_nodes_with_every_option_set() -> None:
    text = kwok.kwok_config([_stage("node-initialize"), _stage("pod-complete")], node_port=4321)
    config, *stages = list(yaml.safe_load_all(text))
    options = config["options"]
    assert options["manageAllNodes"] is False
    assert options["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"
    assert options["cidr"] == "10.244.0.0/16"
    for key in (
        "nodeLeaseParallelism",
        "podPlayStageParallelism",
        "nodePlayStageParallelism",
        "podsOnNodeSyncParallelism",
    ):
        assert options[key] > 0, key
    assert [s["metadata"]["name"] for s in stages] == ["node-initialize", "pod-complete"]


def test_kwok_can_leave_job_pods_running() -> None:
    text = kwok.kwok_config(
        [_stage("pod-ready"), _stage("pod-complete")], node_port=1, pod_complete=False
    )
    names = [doc["metadata"].get("name") for doc in yaml.safe_load_all(text) if "metadata" in doc]
    assert names == ["pod-ready"]


def test_kwok_command_never_manages_all_nodes() -> None:
    argv = kwok.kwok_command(Path("/k"), kubeconfig=Path("/kc"), config=Path("/c"), port=7)
    assert "--server-address=127.0.0.1:7" in argv
    assert not any("manage-all-nodes" in a for a in argv)


def test_an_own_gpu_node_carries_its_capacity_and_the_pool_label() -> None:
    node = kwok.gpu_node("gpu-node-0", gpus=8)
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["labels"]["gpu.pool"] == "own"
    assert node["metadata"]["labels"]["type"] == "kwok"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["status"]["capacity"] == node["status"]["allocatable"]
    assert kwok.gpu_node_names(2) == ["gpu-node-0", "gpu-node-1"]


def test_node_readiness_reads_the_ready_condition() -> None:
    assert not kwok.node_ready(None)
    assert not kwok.node_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert kwok.node_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})


# --------------------------------------------------------------------------- KSM, Prometheus


def test_ksm_exports_nodes_and_pods_with_the_pool_label_on_loopback() -> None:
    argv = ksm.ksm_command(Path("/ksm"), kubeconfig=Path("/kc"), port=1, telemetry_port=2)
    assert "--resources=nodes,pods" in argv
    assert "--metric-labels-allowlist=nodes=[gpu.pool,type]" in argv
    assert "--host=127.0.0.1" in argv
    assert "--telemetry-host=127.0.0.1" in argv


def test_prometheus_keeps_ksm_labels_and_loads_the_rules() -> None:
    text = p.prometheus_config(targets=["127.0.0.1:9"], rule_files=[Path("/r.yaml")])
    config = yaml.safe_load(text)
    assert config["global"] == {"scrape_interval": "2s", "evaluation_interval": "2s"}
    assert config["rule_files"] == ["/r.yaml"]
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9"]}]
    argv = p.prometheus_command(Path("/p"), config=Path("/c"), storage=Path("/s"), port=5)
    assert "--web.listen-address=127.0.0.1:5" in argv


def test_query_answers_are_decoded_in_one_place() -> None:
    vector = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"__name__": "flip:own_gpus_full"}, "value": [1.0, "1"]}],
        },
    }
    samples = p.parse_query_response(vector)
    assert samples == [p.Sample(labels={"__name__": "flip:own_gpus_full"}, value=1.0)]
    assert p.single_value(samples) == 1.0
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "+Inf"]}}
    assert math.isinf(p.parse_query_response(scalar)[0].value)
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    assert p.single_value(p.parse_query_response(empty)) is None
    nan = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "NaN"]}}
    assert p.single_value(p.parse_query_response(nan)) is None
    error = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    with pytest.raises(p.PrometheusQueryError, match="bad_data: parse error"):
        p.parse_query_response(error)
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    with pytest.raises(p.PrometheusQueryError, match="instant vector"):
        p.parse_query_response(matrix)


def test_an_unreachable_prometheus_is_a_query_error() -> None:
    with pytest.raises(p.PrometheusQueryError, match="cannot be reached"):
        p.instant_query("http://127.0.0.1:9", "up", http_timeout=0.5)


# --------------------------------------------------------------------------- descheduler


def test_the_shipped_policy_is_the_generated_default() -> None:
    shipped = yaml.safe_load((REPOSITORY / DESCHEDULER_POLICY).read_text())
    assert shipped == d.descheduler_policy()
    evictor = shipped["profiles"][0]["pluginConfig"][0]["args"]
    assert evictor["nodeFit"] is True
    assert evictor["podProtections"]["defaultDisabled"] == ["PodsWithLocalStorage"]
    assert shipped["maxNoOfPodsToEvictPerNode"] == 1


def test_a_policy_for_another_taint() -> None:
    policy = d.descheduler_policy(taints=["example.com/overflow"], max_total=None)
    assert "maxNoOfPodsToEvictTotal" not in policy
    plugin = policy["profiles"][0]["pluginConfig"][1]
    assert plugin == {
        "name": "RemovePodsViolatingNodeTaints",
        "args": {"includedTaints": ["example.com/overflow"]},
    }


def test_evictions_are_read_from_the_log() -> None:
    log = (
        'I1201 10:00:01.2 1 evictions.go:5] "Evicted pod" pod="ml/infer-7f-abc" reason="" '
        'strategy="RemovePodsViolatingNodeTaints" node="vk-gpu" profile="flip-back"\n'
        'I1201 10:00:01.3 1 profile.go:9] "Total number of evictions/requests" '
        'extension point="Deschedule" evictedPods=1\n'
        'I1201 10:00:01.4 1 descheduler.go:252] "Number of evictions/requests" totalEvicted=1 '
        "evictionRequests=0\n"
    )
    assert d.parse_evictions(log) == (
        d.Eviction(pod="ml/infer-7f-abc", node="vk-gpu", strategy="RemovePodsViolatingNodeTaints"),
    )
    assert d.parse_evictions("nothing here") == ()
    assert d.parse_cycles(log) == (1,)
    run = d.DeschedulerRun(returncode=0, output=log, evictions=d.parse_evictions(log))
    assert run.ok
    assert not d.DeschedulerRun(returncode=0, output="Skipping", evictions=()).ok


def test_descheduler_command_one_cycle() -> None:
    argv = d.descheduler_command(
        Path("/d"),
        kubeconfig=Path("/kc"),
        policy=Path("/p"),
        interval="0",
        port=3,
        cert_dir=Path("/c"),
    )
    assert "--descheduling-interval=0" in argv
    assert "--bind-address=127.0.0.1" in argv
    assert "--secure-port=3" in argv


# --------------------------------------------------------------------------- gang manifests


def test_a_gang_and_its_members_share_a_priority_class() -> None:
    group = workloads.pod_group(
        "train", namespace="ml", min_count=4, priority_class_name="training"
    )
    assert group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["spec"] == {
        "schedulingPolicy": {"gang": {"minCount": 4}},
        "priorityClassName": "training",
    }
    pods = workloads.gang_pods(
        "train", namespace="ml", count=2, gpus=8, priority_class_name="training"
    )
    assert [pod["metadata"]["name"] for pod in pods] == ["train-0", "train-1"]
    spec = pods[0]["spec"]
    assert spec["schedulingGroup"] == {"podGroupName": "train"}
    assert spec["priorityClassName"] == "training"
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    with pytest.raises(ValueError, match="at least 1"):
        workloads.pod_group("g", namespace="ml", min_count=0)


# --------------------------------------------------------------------------- child processes


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_child_is_started_healthy_and_stopped_with_its_group(tmp_path: Path) -> None:
    script = (
        "import signal, subprocess, sys, http.server\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('grandchild', child.pid, flush=True)\n"
        "http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])),"
        " http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    (port,) = free_ports(1)
    log = tmp_path / "logs" / "child.log"
    with ChildProcess.start(
        "web",
        [sys.executable, "-c", script, str(port)],
        log_file=log,
        health=http_ok(f"http://127.0.0.1:{port}/"),
        cwd=tmp_path,
    ) as child:
        assert child.running
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
        grandchild = int(log.read_text().split("grandchild ")[1].split()[0])
        assert _alive(grandchild)
        started = time.monotonic()
        child.stop(grace=1.0)  # it ignores SIGTERM: SIGKILL after the grace period
        assert time.monotonic() - started < 10
    assert not child.running
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_child_that_exits_at_start_says_why(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"exited during start-up \(code 3\)[\s\S]*boom"):
        ChildProcess.start(
            "bad",
            [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
            log_file=tmp_path / "bad.log",
            health=lambda: False,
        )


def test_a_child_that_never_gets_healthy_is_stopped(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    script = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(ClusterError, match="not healthy after 5s"):
        ChildProcess.start(
            "slow",
            [sys.executable, "-c", script],
            log_file=tmp_path / "slow.log",
            health=lambda: False,
            timeout=5.0,
        )
    assert not _alive(int(marker.read_text()))


def test_an_inference_deployment_asks_gpus_and_has_a_budget() -> None:
    deployment = workloads.gpu_deployment(
        "infer", namespace="ml", replicas=6, gpus=1, priority_class_name="inference"
    )
    assert deployment["spec"]["replicas"] == 6
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"] == {"app": "infer"}
    resources = template["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"nvidia.com/gpu": "1"}
    assert "tolerations" not in template["spec"]  # the descheduler may move it back
    pdb = workloads.pod_disruption_budget("infer", namespace="ml", app="infer")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "infer"}}}
