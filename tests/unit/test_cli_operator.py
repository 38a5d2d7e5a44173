"""``vk-provider spend`` and ``vk-provider place`` against a real REST server, and the reading
of manifests for ``place``.

The server is a real ``RestServer`` on 127.0.0.1 over the world of ``test_rest_api`` (three
providers in the three breaker states, three pods, half an hour of spend), as in
``test_cli_rest``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.unit.test_cli_rest import line_with, run_cli
from tests.unit.test_rest_api import AUTH, PLANTED_CREDENTIAL, SECRET_TOKEN, build_world
from vk_provider.api.rest_server import RestServer
from vk_provider.cli.manifests import (
    ManifestError,
    default_kubeconfig,
    parse_reference,
    pod_from_manifest,
)
from vk_provider.domain.budget import BudgetCaps

CAPS = BudgetCaps(global_per_hour=30.0, per_namespace={"web": 5.0, "idle": 1.0})


async def serve(caps: BudgetCaps | None) -> AsyncIterator[str]:
    world = await build_world(caps)
    server = RestServer(app=world.app(), host="127.0.0.1", port=0)
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


@pytest.fixture
async def api_url() -> AsyncIterator[str]:
    async for url in serve(None):
        yield url


@pytest.fixture
async def capped_url() -> AsyncIterator[str]:
    async for url in serve(CAPS):
        yield url


def deployment(**annotations: str) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "template": {
                "metadata": {
                    "labels": {"app": "llama"},
                    "annotations": {f"vk-provider.io/{k}": v for k, v in annotations.items()},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:latest",
                            "env": [{"name": "HF_TOKEN", "value": PLANTED_CREDENTIAL}],
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1"},
                                "requests": {"cpu": "4", "memory": "16Gi"},
                            },
                        }
                    ]
                },
            }
        },
    }


# --------------------------------------------------------------------------- spend


async def test_spend_shows_now_spent_and_each_cap(capped_url: str) -> None:
    result = await run_cli("spend", "--url", capped_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    header = line_with(result.stdout, "SCOPE")
    assert header.split() == ["SCOPE", "NAME", "NOW", "SPENT", "CAP", "HELD", "ROOM", "USE"]
    assert line_with(result.stdout, "total").split() == [
        "total",
        "-",
        "$23.8000/h",
        "$11.90",
        "$30.0000/h",
        "$23.8000/h",
        "$6.2000/h",
        "79%",
    ]
    assert line_with(result.stdout, " web ").split()[2:] == [
        "$3.8800/h",
        "$1.94",
        "$5.0000/h",
        "$3.8800/h",
        "$1.1200/h",
        "78%",
    ]
    assert line_with(result.stdout, " idle ").split()[4] == "$1.0000/h"  # capped, idle
    assert line_with(result.stdout, " ml ").split()[4] == "none"
    assert line_with(result.stdout, "alpha").split()[:3] == ["provider", "alpha", "$21.3100/h"]
    assert "ROOM: what one more pod may cost" in result.stdout


# --------------------------------------------------------------------------- place


async def test_place_a_manifest_shows_the_choice_the_candidates_and_the_refusals(
    api_url: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "llama.yaml"
    manifest.write_text(yaml.safe_dump(deployment(gpu="H100")))
    result = await run_cli("place", "-f", str(manifest), "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "pod ml/llama-template would be placed on alpha/h100-sxm-8x/us-east at $19.9200/h"
    )
    assert lines[1] == "  asks for: 1 GPU (H100), 4 vCPU, 16 GiB, on-demand, 1 app container(s)"
    assert line_with(result.stdout, "why:").strip() == (
        "why: the only offer that fits (score 21.1152)"
    )
    candidate = line_with(result.stdout, "alpha/h100-sxm-8x/us-east  ")
    assert candidate.split()[:6] == [
        "1",
        "alpha/h100-sxm-8x/us-east",
        "8x",
        "H100-SXM",
        "us-east",
        "on-demand",
    ]
    assert "+5% last instance, +1% slow start-up" in candidate
    assert "a launch tries at most 5 of these, in this order" in result.stdout
    refused = line_with(result.stdout, "alpha/a100-80gb/us-west")
    assert refused.split()[2] == "gpu-model"
    assert refused.rstrip().endswith("A100-80GB is not one of vk-provider.io/gpu (H100)")
    assert line_with(result.stdout, "beta/cpu-4/us-east").split()[2] == "gpu-count"
    assert "3 of 4 offers refused: 1 by gpu-count, 1 by gpu-model" in result.stdout
    assert PLANTED_CREDENTIAL not in result.output


async def test_place_a_pod_nothing_fits_names_the_filter_of_each_offer(
    api_url: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "dear.yaml"
    manifest.write_text(yaml.safe_dump(deployment(**{"max-price": "1"})))
    result = await run_cli("place", "-f", str(manifest), "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    assert "fits no offer now (NoCapacity" in result.stdout
    filters = {
        key: line_with(result.stdout, key).split()[2]
        for key in (
            "beta/cpu-4/us-east",
            "alpha/a100-80gb/us-west",
            "beta/gpu_1x_h100_pcie/us-east",
            "alpha/h100-sxm-8x/us-east",
        )
    }
    assert filters == {
        "beta/cpu-4/us-east": "gpu-count",
        "alpha/a100-80gb/us-west": "capacity-type",
        "beta/gpu_1x_h100_pcie/us-east": "price",
        "alpha/h100-sxm-8x/us-east": "price",
    }
    assert "RANK" not in result.stdout


async def test_place_from_stdin_with_json_output_is_the_apis_answer(api_url: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "infer", "annotations": {"vk-provider.io/gpu": "H100"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }
    result = await run_cli(
        *("place", "-f", "-", "--url", api_url, "--token", SECRET_TOKEN, "-o", "json"),
        input=json.dumps(pod),
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    async with httpx.AsyncClient(base_url=api_url, headers=AUTH) as http:
        expected = (await http.post("/v1/placements", json=pod)).json()
    assert answer == expected
    assert answer["chosen"]["key"] == "alpha/h100-sxm-8x/us-east"
    assert answer["pod"] == {"namespace": "default", "name": "infer"}


async def test_place_a_budget_limited_pod_says_which_cap(capped_url: str, tmp_path: Path) -> None:
    manifest = tmp_path / "llama.yaml"
    manifest.write_text(yaml.safe_dump(deployment(gpu="H100")))
    result = await run_cli(
        "place", "-f", str(manifest), "-n", "web", "--url", capped_url, "--token", SECRET_TOKEN
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("pod web/llama-template is held back by a budget cap")
    assert (
        line_with(result.stdout, "alpha/h100-sxm-8x/us-east")
        .rstrip()
        .endswith(
            "$19.9200/h would exceed a budget cap ($1.1200/h left in the namespace; "
            "$6.2000/h left in all)"
        )
    )


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([], 2, "give either NAMESPACE/NAME or -f FILE"),
        (["ns/pod", "-f", "x.yaml"], 2, "give either NAMESPACE/NAME or -f FILE"),
        (["-f", "/nonexistent/pod.yaml"], 2, "/nonexistent/pod.yaml: cannot read (No such file"),
    ],
)
async def test_place_usage_errors(args: list[str], code: int, message: str) -> None:
    result = await run_cli("place", *args, "--token", SECRET_TOKEN)
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.replace("│", " ").split())


async def test_place_an_unreadable_pod_of_the_cluster_exits_1(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("not: a kubeconfig\n")
    result = await run_cli("place", "ns/pod", "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot read pod ns/pod: ")
    assert len(result.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- manifests


def test_a_workloads_template_is_the_pod_placed() -> None:
    pod = pod_from_manifest(yaml.safe_dump(deployment(gpu="H100")), where="x.yaml")
    assert pod["kind"] == "Pod"
    assert pod["metadata"] == {
        "name": "llama-template",
        "namespace": "ml",
        "labels": {"app": "llama"},
        "annotations": {"vk-provider.io/gpu": "H100"},
    }
    assert pod["spec"]["containers"][0]["name"] == "server"
    cron = {
        "kind": "CronJob",
        "metadata": {"name": "nightly"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}}},
    }
    assert pod_from_manifest(json.dumps(cron), where="c.json")["metadata"]["name"] == (
        "nightly-template"
    )


def test_a_manifest_must_hold_exactly_one_pod() -> None:
    service = {"kind": "Service", "metadata": {"name": "s"}}
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    both = yaml.safe_dump_all([service, pod, {**pod, "metadata": {"name": "q"}}])
    with pytest.raises(ManifestError, match=r"holds 2 pods to place \(p, q\); give one"):
        pod_from_manifest(both, where="all.yaml")
    with pytest.raises(ManifestError, match="holds no Pod"):
        pod_from_manifest(yaml.safe_dump(service), where="svc.yaml")
    with pytest.raises(ManifestError, match="is not YAML or JSON"):
        pod_from_manifest("{ nope", where="bad.yaml")
    listed = {"kind": "List", "items": [service, pod]}
    assert pod_from_manifest(json.dumps(listed), where="list.json")["metadata"]["name"] == "p"
    moved = pod_from_manifest(yaml.safe_dump(pod), where="p.yaml", namespace="other")
    assert moved["metadata"]["namespace"] == "other"


def test_pod_references_and_the_kubeconfig_kubectl_would_use(tmp_path: Path) -> None:
    assert parse_reference("ns/name") == ("ns", "name")
    assert parse_reference("name", namespace="ns") == ("ns", "name")
    assert parse_reference("name") == ("default", "name")
    for bad in ("/name", "ns/", "a/b/c", ""):
        with pytest.raises(ManifestError):
            parse_reference(bad)
    first, second = tmp_path / "one", tmp_path / "two"
    second.write_text("")
    assert default_kubeconfig({"KUBECONFIG": f"{first}:{second}", "HOME": str(tmp_path)}) == (
        second
    )
    assert default_kubeconfig({"HOME": str(tmp_path)}) is None
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("")
    assert default_kubeconfig({"HOME": str(tmp_path)}) == tmp_path / ".kube" / "config"
