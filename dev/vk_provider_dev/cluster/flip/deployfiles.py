"""Where the flip's shipped files are: the recording rules and the descheduler policy.

They live in the repository's ``deploy/`` (operators apply them to real clusters); the local
runs of the demo and the tests use the same files from the source tree. Invariant: a path
returned exists, else ``ClusterError`` says the source tree is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.errors import ClusterError

REPOSITORY: Final = Path(__file__).resolve().parents[4]  # dev/vk_provider_dev/cluster/flip
FLIP_RULES: Final = "deploy/prometheus/flip-rules.yaml"
FLIP_RULES_TEST: Final = "deploy/prometheus/flip-rules.test.yaml"
DESCHEDULER_POLICY: Final = "deploy/descheduler/policy.yaml"


def deploy_file(relative: str) -> Path:
    path = REPOSITORY / relative
    if not path.is_file():
        raise ClusterError(
            f"{relative} is not at {path}: the flip components run from a source checkout "
            "of vk-provider (pip install -e . -e dev)"
        )
    return path


def flip_rules() -> Path:
    return deploy_file(FLIP_RULES)


def descheduler_policy_file() -> Path:
    return deploy_file(DESCHEDULER_POLICY)
