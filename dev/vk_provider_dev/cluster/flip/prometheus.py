"""Prometheus scraping kube-state-metrics and evaluating the flip's recording rules.

``prometheus_config`` writes the configuration (pure); ``start_prometheus`` runs Debian's
binary on a free 127.0.0.1 port with its storage in a directory of the caller's; and
``instant_query`` / ``instant_query_async`` ask the HTTP API (``/api/v1/query``) and return
``Sample``s, decoded in one place (``parse_query_response``).

Invariants:
- Scraped labels are kept (``honor_labels: true``): KSM's ``namespace``/``pod``/``node``
  labels must not be renamed to ``exported_*``, the rules join on them.
- Scrape and rule-evaluation intervals are the same and short (2 s by default), so a change in
  the cluster reaches a recording rule within two intervals.
- A query that Prometheus answers with an error, or an answer that is not an instant vector
  or scalar, raises ``PrometheusQueryError``; an empty vector is an empty list (no data), which
  callers must tell apart from 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip.child import ChildProcess, RunningComponent, http_ok
from vk_provider_dev.cluster.ports import free_ports

DEFAULT_INTERVAL: Final = "2s"
KSM_JOB: Final = "kube-state-metrics"


class PrometheusQueryError(ClusterError):
    """Prometheus refused a query or answered something that is not a sample list."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector (or a scalar, with no labels)."""

    labels: Mapping[str, str]
    value: float


def prometheus_config(
    *,
    targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    interval: str = DEFAULT_INTERVAL,
    job: str = KSM_JOB,
) -> str:
    """The configuration: one job scraping ``targets`` (``host:port``) and the rule files."""
    document: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": True,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


def prometheus_command(
    binary: Path, *, config: Path, storage: Path, port: int, retention: str = "2h"
) -> list[str]:
    return [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={storage}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=info",
    ]


def _number(text: object) -> float:
    try:
        return float(str(text))  # Prometheus writes "NaN", "+Inf", "-Inf" as strings
    except ValueError as exc:
        raise PrometheusQueryError(f"sample value {text!r} is not a number") from exc


def parse_query_response(body: Mapping[str, Any]) -> list[Sample]:
    """Decode an ``/api/v1/query`` answer (module docstring)."""
    if body.get("status") != "success":
        raise PrometheusQueryError(
            f"Prometheus: {body.get('errorType', 'error')}: {body.get('error', body)}"
        )
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list):
        return [Sample(labels={}, value=_number(result[1]))]
    if kind != "vector" or not isinstance(result, list):
        raise PrometheusQueryError(f"expected an instant vector, got {kind}")
    return [
        Sample(labels=dict(item.get("metric") or {}), value=_number(item["value"][1]))
        for item in result
    ]


def single_value(samples: Sequence[Sample]) -> float | None:
    """The value of a one-sample answer; None when there is no data (or NaN)."""
    if not samples:
        return None
    if len(samples) > 1:
        raise PrometheusQueryError(f"expected one sample, got {len(samples)}")
    value = samples[0].value
    return None if math.isnan(value) else value


def _decode(response: httpx.Response) -> list[Sample]:
    try:
        body = response.json()
    except ValueError as exc:
        raise PrometheusQueryError(
            f"Prometheus answered HTTP {response.status_code} that is not JSON"
        ) from exc
    return parse_query_response(body)


def instant_query(url: str, promql: str, *, http_timeout: float = 5.0) -> list[Sample]:
    """Evaluate ``promql`` now at the Prometheus at ``url`` (``http://127.0.0.1:PORT``)."""
    try:
        response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=http_timeout)
    except httpx.HTTPError as exc:
        raise PrometheusQueryError(f"Prometheus at {url} cannot be reached: {exc}") from exc
    return _decode(response)


async def instant_query_async(url: str, promql: str, *, http_timeout: float = 5.0) -> list[Sample]:
    """``instant_query`` for async code (tests of the flip run in an event loop)."""
    try:
        async with httpx.AsyncClient(timeout=http_timeout) as client:
            response = await client.get(f"{url}/api/v1/query", params={"query": promql})
    except httpx.HTTPError as exc:
        raise PrometheusQueryError(f"Prometheus at {url} cannot be reached: {exc}") from exc
    return _decode(response)


@dataclass(slots=True)
class Prometheus(RunningComponent):
    """A running Prometheus (``start_prometheus``)."""

    child: ChildProcess
    port: int
    config: Path
    storage: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, promql: str) -> list[Sample]:
        return instant_query(self.url, promql)

    def value(self, promql: str) -> float | None:
        """The single value of ``promql`` now, or None when there is no data."""
        return single_value(self.query(promql))

    def wait_for_value(
        self,
        promql: str,
        accept: Callable[[float | None], bool],
        *,
        timeout: float = 60.0,
        what: str = "",
    ) -> float | None:
        """Poll ``promql`` until ``accept(value)``; return that value or raise on timeout."""
        deadline = time.monotonic() + timeout
        value: float | None = None
        while True:
            value = self.value(promql)
            if accept(value):
                return value
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{what or promql} not reached after {timeout:.0f}s (last value {value})"
                )
            time.sleep(0.5)

    def targets_up(self) -> bool:
        """Whether every scrape target answered its last scrape."""
        samples = self.query("up")
        return bool(samples) and all(s.value == 1 for s in samples)


def start_prometheus(
    binary: Path,
    *,
    targets: Sequence[str],
    directory: Path,
    rule_files: Sequence[Path] = (),
    interval: str = DEFAULT_INTERVAL,
    timeout: float = 60.0,
    port: int | None = None,
) -> Prometheus:
    """Write the configuration into ``directory`` and start Prometheus (storage in
    ``directory/data``, log ``directory/prometheus.log``); return once it is ready.
    ``port`` (default a free one) lets a restart keep its address.

    Rule files are referred to by absolute path; ``promtool check rules`` them first, a bad
    file makes Prometheus exit at start (the error is in the raised message).
    """
    directory.mkdir(parents=True, exist_ok=True)
    if port is None:
        (port,) = free_ports(1)
    config = directory / "prometheus.yml"
    config.write_text(
        prometheus_config(
            targets=targets,
            rule_files=[p.resolve() for p in rule_files],
            interval=interval,
        )
    )
    storage = directory / "data"
    child = ChildProcess.start(
        "prometheus",
        prometheus_command(binary, config=config, storage=storage, port=port),
        log_file=directory / "prometheus.log",
        health=http_ok(f"http://127.0.0.1:{port}/-/ready"),
        cwd=directory,
        timeout=timeout,
    )
    return Prometheus(child=child, port=port, config=config, storage=storage)
