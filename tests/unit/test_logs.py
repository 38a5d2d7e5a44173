"""The agent's log format: the pod and instance on every line that concerns them, JSON on
request, and the libraries' per-request lines only at debug."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from vk_provider.domain.logfields import about
from vk_provider.runtime.logs import CHATTY, setup_logging


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in CHATTY}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


def test_json_lines_carry_the_pod_instance_and_provider(
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup_logging("info", "json")
    log = logging.getLogger("vk_provider.controllers.placer")
    log.info("placed on %s", "cloud/a100/eu", extra=about(("ml", "infer-0"), "i-1", "cloud"))
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("failed")
    first, second = capsys.readouterr().err.splitlines()
    entry = json.loads(first)
    assert entry["message"] == "placed on cloud/a100/eu"
    assert (entry["pod"], entry["instance"], entry["provider"]) == ("ml/infer-0", "i-1", "cloud")
    assert (entry["level"], entry["logger"]) == ("INFO", "vk_provider.controllers.placer")
    failure = json.loads(second)  # the traceback escaped into the one line
    assert "RuntimeError: boom" in failure["exception"] and "pod" not in failure


def test_text_lines_end_with_the_fields(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info")
    logging.getLogger("x").info("deleted", extra=about(("ml", "p"), "i-9"))
    logging.getLogger("x").info("no pod")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("INFO x: deleted pod=ml/p instance=i-9")
    assert lines[1].endswith("INFO x: no pod")


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_request_logs_of_libraries_show_only_at_debug(
    capsys: pytest.CaptureFixture[str], level: str, shown: bool
) -> None:
    setup_logging(level)
    logging.getLogger("httpx").info("HTTP Request: GET http://prometheus/api/v1/query 200")
    assert ("HTTP Request" in capsys.readouterr().err) is shown


def test_an_unknown_format_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="--log-format"):
        setup_logging("info", "yaml")  # type: ignore[arg-type]
