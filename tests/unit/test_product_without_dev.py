"""The product's command line loads the dev tooling (vk-provider-dev) only when asked.

Each case runs the real `vk-provider` entry point in a fresh interpreter and reads which
modules it loaded. `run` must load nothing of vk-provider-dev, no adapter and no gRPC; the
dev commands are still found through their entry points, and naming one loads it (so the
probe does see dev modules when they are there).
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from vk_provider.cli.app import main
sys.argv = ["vk-provider", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("MODULES", *sorted(sys.modules))
"""


def loaded(*args: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    head, _, modules = done.stdout.rpartition("MODULES")
    return set(modules.split()), head


def test_run_help_loads_no_dev_module_no_adapter_and_no_grpc() -> None:
    modules, _ = loaded("run", "--help")
    assert "vk_provider.cli.app" in modules
    assert sorted(m for m in modules if m.split(".")[0] == "vk_provider_dev") == []
    assert sorted(m for m in modules if m.endswith(".adapter") or m.endswith(".server")) == []
    assert "grpc" not in modules


def test_the_dev_commands_are_found_through_their_entry_points_and_load_when_named() -> None:
    modules, listing = loaded("--help")
    for command in ("cluster", "demo", "local", "plugin", "run"):
        assert f" {command} " in listing
    modules, usage = loaded("cluster", "--help")
    assert "vk_provider_dev.cluster.cluster" in modules
    assert "flip-components" in usage
