"""``vk-provider providers | offers | pods`` against a real REST server, and their tables.

The server is a real ``RestServer`` on 127.0.0.1 (a free port) in the test's event loop, with a
static token, over the world of ``test_rest_api``. The CLI runs through typer's ``CliRunner``
in a worker thread, so the loop keeps serving while the (synchronous) command waits for it.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.testing import CliRunner, Result

from tests.unit.test_rest_api import AUTH, OPEN_FLIP, SECRET_TOKEN, RaisingAuth, build_world
from vk_provider.api.rest_server import RestServer
from vk_provider.cli.app import app
from vk_provider.cli.client import (
    ApiFailed,
    ApiUnreachable,
    RestClient,
    TokenRefused,
)
from vk_provider.cli.tables import format_age, format_price, print_table
from vk_provider.cli.tables_catalog import offers_table, providers_table
from vk_provider.cli.tables_node import overflow_table, pods_table

# Nothing from the environment of whoever runs the tests may leak into a command.
CLEAN_ENV: dict[str, str | None] = {"VK_PROVIDER_URL": None, "VK_PROVIDER_TOKEN": None}


async def run_cli(
    *args: str, env: Mapping[str, str | None] | None = None, input: str | None = None
) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, app, list(args), input=input, env={**CLEAN_ENV, **(env or {})}
    )


def line_with(output: str, needle: str) -> str:
    lines = [line for line in output.splitlines() if needle in line]
    assert len(lines) == 1, f"expected one line with {needle!r} in:\n{output}"
    return lines[0]


@pytest.fixture
async def api_url() -> AsyncIterator[str]:
    world = await build_world()
    server = RestServer(app=world.app(), host="127.0.0.1", port=0)
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --------------------------------------------------------------------------- commands


async def test_providers_prints_a_readable_table(api_url: str) -> None:
    result = await run_cli("providers", "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    header = line_with(result.stdout, "BREAKER")
    for column in ("NAME", "TYPE", "HEALTHY", "OFFERS", "GPUS FREE", "PODS", "COST", "FAILURES"):
        assert column in header
    alpha = line_with(result.stdout, "alpha")
    assert alpha.split()[:4] == ["alpha", "runpod", "yes", "closed"]
    assert "$21.3100/h" in alpha
    assert "30m ago" in alpha
    beta = line_with(result.stdout, "beta")
    assert beta.split()[:4] == ["beta", "lambda", "no", "half-open"]
    assert "3 (3 recent)" in beta
    assert "Transient: timed out" in beta
    gamma = line_with(result.stdout, "gamma")
    assert gamma.split()[:4] == ["gamma", "modal", "no", "open"]
    assert "never" in gamma
    assert "$0.0000/h" in gamma
    assert result.stderr == ""


async def test_offers_are_grouped_by_gpu_with_per_gpu_prices(api_url: str) -> None:
    result = await run_cli("offers", "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    header = line_with(result.stdout, "SPOT $/GPU/H")
    assert header.split() == [
        "GPU",
        "QTY",
        "$/GPU/H",
        "SPOT",
        "$/GPU/H",
        "$/H",
        "SPOT",
        "$/H",
        "GPU",
        "MEM",
        "VCPUS",
        "MEMORY",
        "REGION",
        "PROVIDER",
    ]
    # Cheapest per GPU first: the spot A100, then the two H100s (2.49 per GPU each), CPU last.
    order = [
        result.stdout.index(model) for model in ("A100-80GB", "H100-PCIE", "H100-SXM", "CPU only")
    ]
    assert order == sorted(order)
    eight = line_with(result.stdout, "H100-SXM")
    assert eight.split() == [
        "H100-SXM",
        "8",
        "$2.4900/h",  # 19.92 for 8 GPUs: comparable with a 1x offer
        "-",
        "$19.9200/h",
        "-",
        "80",
        "GiB",
        "128",
        "1024",
        "GiB",
        "us-east",
        "alpha",
    ]
    spot = line_with(result.stdout, "A100-80GB")
    assert spot.split()[:6] == ["A100-80GB", "1", "-", "$1.3900/h", "-", "$1.3900/h"]
    assert "4 of 4 offers shown, cheapest per GPU first" in result.stdout
    assert result.stderr == ""


async def test_offers_filter_by_gpu_region_provider_and_spot(api_url: str) -> None:
    common = ("--url", api_url, "--token", SECRET_TOKEN)
    h100 = await run_cli("offers", "--gpu", "H100", *common)
    assert "A100" not in h100.stdout and "H100-PCIE" in h100.stdout and "H100-SXM" in h100.stdout
    assert "2 of 2 offers shown" in h100.stdout
    spot = await run_cli("offers", "--spot", *common)
    assert "A100-80GB" in spot.stdout and "H100" not in spot.stdout
    west = await run_cli("offers", "--region", "us-west", *common)
    assert "A100-80GB" in west.stdout and "H100" not in west.stdout
    beta = await run_cli("offers", "--provider", "beta", *common)
    assert "H100-PCIE" in beta.stdout and "CPU only" in beta.stdout and "alpha" not in beta.stdout


async def test_offers_wide_adds_sku_availability_and_startup(api_url: str) -> None:
    result = await run_cli("offers", "-o", "wide", "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    header = line_with(result.stdout, "PROVIDER")
    assert header.split()[-5:] == ["SKU", "AVAIL", "SPOT", "AVAIL", "STARTUP"]
    pcie = line_with(result.stdout, "H100-PCIE")
    assert pcie.split()[-4:] == ["gpu_1x_h100_pcie", "2", "-", "60s"]


async def test_offers_json_is_the_gpus_answer_and_all_lifts_the_limit(api_url: str) -> None:
    common = ("--url", api_url, "--token", SECRET_TOKEN, "-o", "json")
    limited = json.loads((await run_cli("offers", *common)).stdout)
    every = json.loads((await run_cli("offers", "--all", *common)).stdout)
    async with httpx.AsyncClient(base_url=api_url, headers=AUTH) as http:
        expected = (await http.get("/v1/gpus", params={"limit": 5})).json()
        expected_all = (await http.get("/v1/gpus")).json()
    assert limited == expected and limited["limit"] == 5
    assert every == expected_all and every["limit"] is None
    # The documented shape (docs/operating.md): stable keys, one object per row.
    assert set(every) == {"total", "shown", "limit", "gpus"}
    assert set(every["gpus"][0]) == {"gpu_model", "total", "rows"}
    assert set(every["gpus"][0]["rows"][0]) == {
        "gpu_model",
        "gpu_count",
        "gpu_memory_gib",
        "vcpus",
        "memory_gib",
        "provider",
        "sku",
        "region",
        "offer",
        "price_per_hour",
        "price_per_gpu_hour",
        "spot_price_per_hour",
        "spot_price_per_gpu_hour",
        "available",
        "spot_available",
        "startup_seconds",
    }


async def test_offers_flat_is_the_former_table(api_url: str) -> None:
    result = await run_cli(
        "offers", "--flat", "--gpu", "H100", "--url", api_url, "--token", SECRET_TOKEN
    )
    assert result.exit_code == 0, result.output
    header = line_with(result.stdout, "PRICE")
    assert header.split()[:3] == ["PROVIDER", "SKU", "GPUS"]
    pcie = line_with(result.stdout, "gpu_1x_h100_pcie")
    assert pcie.split()[:4] == ["beta", "gpu_1x_h100_pcie", "1x", "H100-PCIE"]
    assert "2 offers, cheapest first" in result.stdout


async def test_offers_filters_reach_the_api(api_url: str) -> None:
    common = ("--url", api_url, "--token", SECRET_TOKEN, "--output", "json", "--flat")
    spot = await run_cli("offers", "--capacity-type", "spot", *common)
    assert spot.exit_code == 0, spot.output
    assert [o["sku"] for o in json.loads(spot.stdout)] == ["a100-80gb"]
    assert json.loads((await run_cli("offers", "--spot", *common)).stdout) == json.loads(
        spot.stdout
    )
    west = await run_cli("offers", "--region", "us-west", *common)
    assert [o["sku"] for o in json.loads(west.stdout)] == ["a100-80gb"]
    beta = await run_cli("offers", "--provider", "beta", "--capacity-type", "on-demand", *common)
    assert [o["sku"] for o in json.loads(beta.stdout)] == ["cpu-4", "gpu_1x_h100_pcie"]


async def test_no_matching_offers_says_so(api_url: str) -> None:
    result = await run_cli("offers", "--gpu", "B200", "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no offers match" in result.stderr


async def test_pods_prints_a_table(api_url: str) -> None:
    result = await run_cli("pods", "--url", api_url, "--token", SECRET_TOKEN)
    assert result.exit_code == 0, result.output
    header = line_with(result.stdout, "INSTANCE")
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "PHASE",
        "PROVIDER",
        "OFFER",
        "INSTANCE",
        "PRICE",
        "SINCE",
        "ENDPOINTS",
    ]
    trainer = line_with(result.stdout, "trainer-0")
    assert trainer.split()[:4] == ["ml", "trainer-0", "Running", "alpha"]
    assert "$19.9200/h" in trainer and "2025-01-31 09:00Z" in trainer
    pending = line_with(result.stdout, "infer-1")
    assert "Pending" in pending and pending.rstrip().endswith("-")
    assert "3 pods, $23.8000/h in all" in result.stdout


async def test_overflow_prints_the_state_and_the_numbers() -> None:
    world = await build_world()
    world.knobs.overflow = OPEN_FLIP
    server = RestServer(app=world.app(), host="127.0.0.1", port=0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        result = await run_cli("overflow", "--url", url, "--token", SECRET_TOKEN)
        as_json = await run_cli("overflow", "--url", url, "--token", SECRET_TOKEN, "-o", "json")
        world.knobs.overflow = None
    finally:
        await server.stop()
    assert result.exit_code == 0, result.output
    assert line_with(result.stdout, "state").split() == ["state", "open"]
    assert "virtual-kubelet.io/provider=vk-provider:PreferNoSchedule" in result.stdout
    assert line_with(result.stdout, "own GPUs").split()[2:] == [
        "32",
        "of",
        "32",
        "requested,",
        "0",
        "free",
    ]
    assert line_with(result.stdout, "signal").split() == ["signal", "ok"]
    assert json.loads(as_json.stdout)["state"] == "open"


def test_overflow_table_of_a_disabled_flip_and_a_lost_signal() -> None:
    table = overflow_table({"enabled": False})
    assert "overflow.enabled is false" in render(table)
    lost = overflow_table(
        {
            "enabled": True,
            "state": "closed",
            "signal_ok": False,
            "signal_error": "query 'x': ConnectError",
            "needed_free_gpus": 1,
            "transitions": 0,
        }
    )
    assert "UNAVAILABLE: query 'x': ConnectError" in render(lost)


def test_overflow_table_shows_each_hand_over_with_its_step_and_nodes() -> None:
    table = overflow_table(
        {
            "enabled": True,
            "state": "open",
            "signal_ok": True,
            "needed_free_gpus": 1,
            "transitions": 1,
            "held_open_for": "the hand-over of PodGroup ml/train",
            "handovers": [
                {
                    "gang": "PodGroup ml/train",
                    "step": "evict",
                    "reason": "moving 2 pod(s) off the claimed nodes",
                    "nodes": ["gpu-1", "gpu-2"],
                    "displaced": ["ml/a", "ml/b"],
                    "for_seconds": 75,
                }
            ],
        }
    )
    text = " ".join(render(table).split())
    assert "held open for the hand-over of PodGroup ml/train" in text
    assert "hand-over PodGroup ml/train" in text
    assert "evict: moving 2 pod(s)" in text and "gpu-1, gpu-2" in text


@pytest.mark.parametrize("command", ["providers", "pods", "spend", "overflow"])
async def test_json_output_is_the_apis_json(api_url: str, command: str) -> None:
    result = await run_cli(command, "--url", api_url, "--token", SECRET_TOKEN, "-o", "json")
    assert result.exit_code == 0, result.output
    async with httpx.AsyncClient(base_url=api_url, headers=AUTH) as http:
        expected = (await http.get(f"/v1/{command}")).json()
    assert json.loads(result.stdout) == expected


async def test_url_and_token_from_the_environment(api_url: str) -> None:
    env = {"VK_PROVIDER_URL": api_url, "VK_PROVIDER_TOKEN": SECRET_TOKEN}
    result = await run_cli("providers", env=env)
    assert result.exit_code == 0, result.output
    assert "alpha" in result.stdout


async def test_token_from_a_file_wins_over_the_environment(api_url: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET_TOKEN + "\n")
    env = {"VK_PROVIDER_TOKEN": "stale-token"}
    result = await run_cli("pods", "--url", api_url, "--token-file", str(token_file), env=env)
    assert result.exit_code == 0, result.output
    assert "trainer-0" in result.stdout


async def test_a_wrong_token_exits_1_with_one_clear_line(api_url: str) -> None:
    result = await run_cli("providers", "--url", api_url, "--token", "not-the-token")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert (
        result.stderr.strip()
        == f"error: the token was refused by the vk-provider REST API at {api_url}"
    )
    assert "not-the-token" not in result.output


async def test_no_token_exits_1_and_says_how_to_give_one(api_url: str) -> None:
    result = await run_cli("offers", "--url", api_url)
    assert result.exit_code == 1
    assert "needs a token" in result.stderr
    assert "--token-file" in result.stderr


async def test_an_unreachable_agent_exits_1() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = await run_cli("providers", "--url", url, "--token", SECRET_TOKEN)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: cannot reach the vk-provider REST API at {url}: ")


async def test_other_http_errors_exit_1_with_the_apis_message() -> None:
    world = await build_world()
    server = RestServer(app=world.app(auth=RaisingAuth()), host="127.0.0.1", port=0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        result = await run_cli("pods", "--url", url, "--token", SECRET_TOKEN)
    finally:
        await server.stop()
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: the vk-provider REST API at {url} answered 503 for /v1/pods: "
        "the token cannot be checked now; try again later"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["offers", "--capacity-type", "bogus"],
        ["providers", "--output", "yaml"],
        ["pods", "--url", "127.0.0.1:8080"],
        ["pods", "--token-file", "/nonexistent/token"],
        ["pods", "--token", "two words"],
        ["pods", "--token", "t\u00f6ken"],
        ["pods", "--no-such-flag"],
    ],
)
async def test_usage_errors_exit_2(args: list[str]) -> None:
    if "--token" not in args:
        args = [*args, "--token", SECRET_TOKEN]
    result = await run_cli(*args)
    assert result.exit_code == 2, result.output


async def test_an_empty_token_file_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    result = await run_cli("pods", "--token-file", str(empty))
    assert result.exit_code == 2
    # The message sits in a box that wraps the long path; read it without the frame.
    assert "is empty" in re.sub(r"[\s│]+", " ", result.output)
    two_lines = tmp_path / "two-lines"
    two_lines.write_text("first-token\nsecond-token\n")
    result = await run_cli("pods", "--token-file", str(two_lines))
    assert result.exit_code == 2
    assert "first-token" not in result.output


# --------------------------------------------------------------------------- the client


def client_answering(status: int, body: Any = None, *, text: str | None = None) -> RestClient:
    def answer(request: httpx.Request) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)

    return RestClient("http://agent:8080", token="t", transport=httpx.MockTransport(answer))


def test_client_translates_failures_into_one_line_errors() -> None:
    with pytest.raises(TokenRefused, match="the token was refused"):
        client_answering(401, {"error": {"code": "unauthorized", "message": "x"}}).pods()
    error = {"error": {"code": "internal_error", "message": "internal error; see the log"}}
    with pytest.raises(ApiFailed, match="answered 500 for /v1/pods: internal error; see the log"):
        client_answering(500, error).pods()
    with pytest.raises(ApiFailed, match="answered 502 for /v1/pods: Bad Gateway"):
        client_answering(502, text="<html>proxy</html>").pods()
    with pytest.raises(ApiFailed, match="not JSON"):
        client_answering(200, text="<html>").pods()
    with pytest.raises(ApiFailed, match="unexpected JSON"):
        client_answering(200, {"items": []}).pods()


def test_client_sends_the_token_and_the_filters() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[])

    with RestClient(
        "http://agent:8080", token="tok", transport=httpx.MockTransport(answer)
    ) as client:
        assert client.offers(gpu="H100", capacity_type="spot") == []
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert seen[0].url.path == "/v1/offers"
    assert dict(seen[0].url.params) == {"gpu": "H100", "capacity_type": "spot"}


def test_client_reports_timeouts_as_unreachable() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    client = RestClient(
        "http://agent:8080", token="t", timeout=2, transport=httpx.MockTransport(answer)
    )
    with pytest.raises(ApiUnreachable, match="at http://agent:8080: no answer within 2s"):
        client.providers()


# --------------------------------------------------------------------------- pure rendering


def render(table: Table) -> str:
    console = Console(record=True, width=250, color_system=None)
    console.print(table)
    return console.export_text()


def cells(table: Table, header: str) -> list[Text]:
    column = next(c for c in table.columns if c.header == header)
    return [cell for cell in column.cells if isinstance(cell, Text)]


PROVIDER_JSON = {
    "name": "acme[1]",
    "type": "runpod",
    "healthy": False,
    "breaker_state": "open",
    "consecutive_failures": 5,
    "recent_failures": 7,
    "last_error": "Transient: [Errno 111] Connection refused",
    "last_answer_age_seconds": 7300.0,
    "offer_count": 0,
    "gpus_available": 0,
    "running_pods": 1,
    "spend_per_hour": 1.39,
}


def test_providers_table_shows_text_as_is_and_colours_the_breaker() -> None:
    table = providers_table(
        [
            PROVIDER_JSON,
            {**PROVIDER_JSON, "name": "ok", "breaker_state": "closed", "healthy": True},
            {**PROVIDER_JSON, "name": "probing", "breaker_state": "half-open"},
        ]
    )
    text = render(table)
    assert "acme[1]" in text
    assert "Transient: [Errno 111] Connection refused" in text  # not eaten as markup
    assert "5 (7 recent)" in text
    assert "2h ago" in text
    assert "$1.3900/h" in text
    assert [c.style for c in cells(table, "BREAKER")] == ["bold red", "green", "yellow"]
    assert [str(c) for c in cells(table, "HEALTHY")] == ["no", "yes", "no"]


def test_offers_table_renders_cpu_only_and_spot_offers() -> None:
    table = offers_table(
        [
            {
                "provider": "beta",
                "sku": "cpu-4",
                "region": "us-east",
                "gpu_model": None,
                "gpu_count": 0,
                "gpu_memory_gib": 0.0,
                "vcpus": 4.0,
                "memory_gib": 16.0,
                "price_per_hour": 0.12,
                "spot": True,
                "available": 9,
                "startup_seconds": 30.0,
            }
        ]
    )
    row = line_with(render(table), "cpu-4")
    assert row.split() == [
        "beta",
        "cpu-4",
        "none",
        "-",
        "4",
        "16",
        "GiB",
        "us-east",
        "spot",
        "9",
        "30s",
        "$0.1200/h",
    ]


def test_pods_table_says_since_when() -> None:
    now = datetime(2025, 2, 1, 9, 0, tzinfo=UTC)
    pod = {
        "namespace": "web",
        "name": "infer-0",
        "uid": "u",
        "provider": "alpha",
        "instance_id": "i-1",
        "offer": "alpha/a100/us-west",
        "price_per_hour": 1.39,
        "phase": "Running",
        "since": "2025-01-31T09:00:00Z",
    }
    table = pods_table([pod], now=now)
    row = line_with(render(table), "infer-0")
    assert "2025-01-31 09:00Z (24h ago)" in row
    assert [c.style for c in cells(table, "PHASE")] == ["green"]


def test_pods_table_shows_where_each_port_is_reached() -> None:
    pod = {
        "namespace": "web",
        "name": "infer-0",
        "phase": "Running",
        "endpoints": [
            {"container_port": 8000, "protocol": "TCP", "address": "203.0.113.7", "port": 40123},
            {"container_port": 9000, "protocol": "UDP", "address": "203.0.113.7", "port": 9000},
        ],
    }
    bare = {"namespace": "web", "name": "infer-1", "phase": "Running"}
    table = pods_table([pod, bare])
    assert [c.plain for c in cells(table, "ENDPOINTS")] == [
        "8000/TCP 203.0.113.7:40123, 9000/UDP 203.0.113.7:9000",
        "-",
    ]


def test_formatting_helpers() -> None:
    assert format_price(1.39) == "$1.3900/h"
    assert format_price(0) == "$0.0000/h"
    assert format_price(None) == "-"
    assert [format_age(s) for s in (0, 59, 119, 120, 7199, 7200, 172_799, 172_800)] == [
        "0s",
        "59s",
        "119s",
        "2m",
        "119m",
        "2h",
        "47h",
        "2d",
    ]
    assert format_age(None) == "-"
    assert format_age(float("nan")) == "-"


def test_print_table_keeps_rows_whole_and_colours_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=40, force_terminal=True, color_system="standard")
    print_table(console, providers_table([PROVIDER_JSON]))
    output = buffer.getvalue()
    assert "\x1b[" in output  # coloured, because it is a terminal
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    row = line_with(plain, "acme[1]")
    assert "Transient: [Errno 111] Connection refused" in row  # one line, although > 40 wide
