"""The Kubernetes adapter's pure stream parts: URLs, v5/v4 channel frames, the error
channel's Status, PodMetrics and the CPU counter made from its rates."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest

from vk_provider.api.portforward_ws import requested_ports
from vk_provider_adapters.kubernetes import channels
from vk_provider_adapters.kubernetes.usage import CpuCounter, advance, parse_pod_metrics
from vk_provider_adapters.payload import MalformedResponse

POD = "/api/v1/namespaces/work/pods/vk-abc"


def _query(url: str) -> list[tuple[str, str]]:
    return parse_qsl(urlsplit(url).query)


def test_exec_url_repeats_command_and_asks_for_each_stream() -> None:
    url = channels.exec_url(
        POD, container="main", command=["sh", "-c", "echo a&b"], stdin=True, tty=False
    )
    assert urlsplit(url).path == f"{POD}/exec"
    assert _query(url) == [
        ("command", "sh"),
        ("command", "-c"),
        ("command", "echo a&b"),
        ("container", "main"),
        ("stdout", "true"),
        ("stderr", "true"),
        ("stdin", "true"),
    ]


def test_a_terminal_has_no_stderr() -> None:
    url = channels.exec_url(POD, container="main", command=["sh"], stdin=True, tty=True)
    query = dict(_query(url))
    assert "stderr" not in query and query["tty"] == "true"
    attach = channels.attach_url(POD, container="side", stdin=False, tty=False)
    assert urlsplit(attach).path == f"{POD}/attach"
    assert dict(_query(attach)) == {"container": "side", "stdout": "true", "stderr": "true"}


def test_port_forward_url_names_one_port() -> None:
    assert channels.port_forward_url(POD, 8080) == f"{POD}/portforward?ports=8080"
    with pytest.raises(ValueError, match="port 0"):
        channels.port_forward_url(POD, 0)


def test_frames() -> None:
    assert channels.frame(channels.STDIN, b"hi") == b"\x00hi"
    assert channels.close_frame(channels.STDIN) == b"\xff\x00"
    channel, data = channels.split_frame(channels.resize_frame(80, 24)) or (None, b"")
    assert channel == channels.RESIZE and json.loads(data) == {"Width": 80, "Height": 24}
    assert channels.split_frame(b"") is None
    assert channels.split_frame(b"\x01") == (1, b"")
    with pytest.raises(ValueError):
        channels.frame(256)


def _status(code: int) -> bytes:
    return json.dumps(
        {
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


def test_status_to_exit_code() -> None:
    assert channels.command_result(b'{"metadata":{},"status":"Success"}').exit_code == 0
    assert channels.command_result(_status(3)).exit_code == 3
    assert channels.command_result(_status(137)).exit_code == 137


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        (b'{"status":"Failure","reason":"InternalError","message":"boom"}', "boom"),
        (b'{"status":"Failure","reason":"NonZeroExitCode","message":"no cause"}', "no cause"),
        (b"not json at all", "not json at all"),
        (b"[1]", "not an object"),
    ],
)
def test_a_failure_without_an_exit_code_is_no_exit_code(status: bytes, failure: str) -> None:
    result = channels.command_result(status)
    assert result.exit_code is None
    assert failure in result.failure


def test_port_frames_take_the_port_prefix_off_each_channel() -> None:
    frames = channels.PortFrames(8080)
    prefix = struct.pack("<H", 8080)
    assert frames.feed(b"\x00" + prefix) is None
    assert frames.feed(b"\x01" + prefix[:1]) is None  # split over messages
    assert frames.feed(b"\x01" + prefix[1:] + b"refused") == (1, b"refused")
    assert frames.feed(b"\x00hello") == (0, b"hello")
    assert frames.feed(b"\x00" + prefix) == (0, prefix)  # later bytes are data


def test_port_frames_refuse_another_port_or_channel() -> None:
    with pytest.raises(ValueError, match="another port"):
        channels.PortFrames(8080).feed(b"\x00" + struct.pack("<H", 9090))
    with pytest.raises(ValueError, match="channel 2"):
        channels.PortFrames(8080).feed(b"\x02xx")


def test_requested_ports_of_the_websocket_port_forward() -> None:
    # The API server sends a kubelet ``port`` (the client's ``ports``, joined by commas).
    assert requested_ports([("port", "80,443"), ("port", "8080")]) == [80, 443, 8080]
    assert requested_ports([("port", "80"), ("ports", "9")]) == [80]
    for bad, message in (([], "required"), ([("port", "")], "empty"), ([("port", "x")], "x")):
        with pytest.raises(ValueError, match=message):
            requested_ports(bad)
    with pytest.raises(ValueError, match="not a port"):
        requested_ports([("port", "70000")])


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_pod_metrics_are_read() -> None:
    sample = parse_pod_metrics(
        {
            "timestamp": "2026-01-01T00:00:00Z",
            "window": "1m0.5s",
            "containers": [{"name": "main", "usage": {"cpu": "250m", "memory": "2Mi"}}],
        }
    )
    assert sample.timestamp == NOW and sample.window_seconds == 60.5
    (main,) = sample.containers
    assert (main.name, main.nanocores, main.memory_bytes) == ("main", 250_000_000, 2 * 2**20)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "PodMetrics"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"timestamp": "2026-01-01T00:00:00Z", "window": "5 s"}, "window"),
        (
            {"timestamp": "2026-01-01T00:00:00Z", "containers": [{"usage": {"cpu": "lots"}}]},
            "containers[0].usage",
        ),
    ],
)
def test_malformed_pod_metrics_name_the_field(body: object, field: str) -> None:
    with pytest.raises(MalformedResponse, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_pod_metrics(body)


def test_the_cpu_counter_integrates_the_rates_and_never_goes_down() -> None:
    first = advance(None, nanocores=500_000_000, at=NOW, window_seconds=10)
    assert first == CpuCounter(NOW, 5_000_000_000)  # the window's CPU time
    later = NOW + timedelta(seconds=15)
    second = advance(first, nanocores=100_000_000, at=later, window_seconds=10)
    assert second == CpuCounter(later, 6_500_000_000)
    assert advance(second, nanocores=10**9, at=later, window_seconds=10) == second  # not newer
    assert advance(second, nanocores=10**9, at=NOW, window_seconds=10) == second  # older
