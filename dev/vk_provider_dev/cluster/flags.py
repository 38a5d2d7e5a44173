"""Feature gates and runtime-config for the local control plane, as values and pure functions.

A ``ClusterFlags`` says which feature gates each Kubernetes component gets and which API
groups/versions the API server serves beyond its defaults (``--runtime-config``). It is
parsed from the command line (``parse_feature_gates``, ``parse_runtime_config``), stored in
the cluster's state (``to_json`` / ``from_json``) so ``up`` again and ``restart`` keep it,
and turned into flags appended to each component's command line (``apply``).

Invariants:
- Only the three Kubernetes components take feature gates; etcd takes none. Runtime-config
  is the API server's alone.
- Rendering is canonical (gates and runtime-config keys sorted), so the same flags always
  give the same command lines and compare equal after a round trip through the state file.
- ``GANG_SCHEDULING`` is the set measured to enable Kubernetes 1.37's native gang scheduling
  (``GenericWorkload``, beta and off by default): the API server also needs
  ``WorkloadWithJob`` or its bootstrap RBAC lacks the Job controller's Workload rights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from vk_provider_dev.cluster.errors import ClusterError

APISERVER: Final = "kube-apiserver"
CONTROLLER_MANAGER: Final = "kube-controller-manager"
SCHEDULER: Final = "kube-scheduler"
KUBE_COMPONENTS: Final = (APISERVER, CONTROLLER_MANAGER, SCHEDULER)

Gates = Mapping[str, bool]


def _frozen(gates: Mapping[str, Gates]) -> dict[str, dict[str, bool]]:
    return {c: dict(sorted(g.items())) for c, g in sorted(gates.items()) if g}


@dataclass(frozen=True, slots=True)
class ClusterFlags:
    """Feature gates per component and the API server's runtime-config (module docstring)."""

    feature_gates: Mapping[str, Gates] = field(default_factory=dict)
    runtime_config: Mapping[str, str] = field(default_factory=dict)
    # The API server verifies kubelets' serving certificates against the cluster CA
    # (--kubelet-certificate-authority), as a production cluster should.
    verify_kubelets: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.feature_gates) - set(KUBE_COMPONENTS))
        if unknown:
            raise ClusterError(
                f"feature gates for unknown component {', '.join(unknown)}; "
                f"use one of {', '.join(KUBE_COMPONENTS)}"
            )
        object.__setattr__(self, "feature_gates", _frozen(self.feature_gates))
        object.__setattr__(self, "runtime_config", dict(sorted(self.runtime_config.items())))

    @property
    def empty(self) -> bool:
        return not self.feature_gates and not self.runtime_config and not self.verify_kubelets

    def merged(self, other: ClusterFlags) -> ClusterFlags:
        """These flags with ``other``'s on top (a gate set in both takes ``other``'s value)."""
        gates = {c: dict(g) for c, g in self.feature_gates.items()}
        for component, extra in other.feature_gates.items():
            gates.setdefault(component, {}).update(extra)
        return ClusterFlags(
            gates,
            {**self.runtime_config, **other.runtime_config},
            verify_kubelets=self.verify_kubelets or other.verify_kubelets,
        )

    def arguments(self, component: str) -> list[str]:
        """The flags ``component`` is started with on top of its usual command line."""
        args = []
        gates = self.feature_gates.get(component)
        if gates:
            rendered = ",".join(f"{name}={str(on).lower()}" for name, on in gates.items())
            args.append(f"--feature-gates={rendered}")
        if component == APISERVER and self.runtime_config:
            rendered = ",".join(f"{key}={value}" for key, value in self.runtime_config.items())
            args.append(f"--runtime-config={rendered}")
        return args

    def apply(self, commands: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """Every command line with this component's extra flags appended (later flags win);
        ``verify_kubelets`` makes the API server trust its own client CA for kubelets."""
        applied = {name: [*argv, *self.arguments(name)] for name, argv in commands.items()}
        if self.verify_kubelets and APISERVER in applied:
            argv = applied[APISERVER]
            ca = [a.split("=", 1)[1] for a in argv if a.startswith("--client-ca-file=")]
            argv.extend(f"--kubelet-certificate-authority={path}" for path in ca[:1])
        return applied

    def to_json(self) -> dict[str, object]:
        return {
            "feature_gates": {c: dict(g) for c, g in self.feature_gates.items()},
            "runtime_config": dict(self.runtime_config),
            "verify_kubelets": self.verify_kubelets,
        }

    @classmethod
    def from_json(cls, data: object) -> ClusterFlags:
        """Flags saved by ``to_json``; a state file from before flags existed has none."""
        if not isinstance(data, Mapping):
            return cls()
        gates = data.get("feature_gates") or {}
        runtime = data.get("runtime_config") or {}
        if not isinstance(gates, Mapping) or not isinstance(runtime, Mapping):
            raise ClusterError("the cluster's saved flags are corrupt; run `down` first")
        return cls(
            {str(c): {str(k): bool(v) for k, v in g.items()} for c, g in gates.items()},
            {str(k): str(v) for k, v in runtime.items()},
            verify_kubelets=bool(data.get("verify_kubelets")),
        )

    def describe(self) -> list[str]:
        """One line per component with extra flags, for people."""
        lines = [
            f"{c}: {' '.join(self.arguments(c))}" for c in KUBE_COMPONENTS if self.arguments(c)
        ]
        if self.verify_kubelets:
            lines.append(f"{APISERVER}: --kubelet-certificate-authority (the cluster CA)")
        return lines


GANG_SCHEDULING: Final = ClusterFlags(
    feature_gates={
        APISERVER: {"GenericWorkload": True, "WorkloadWithJob": True},
        CONTROLLER_MANAGER: {"GenericWorkload": True, "WorkloadWithJob": True},
        SCHEDULER: {"GenericWorkload": True},
    },
    runtime_config={"scheduling.k8s.io/v1beta1": "true"},
)


def choose_flags(
    *, saved: ClusterFlags, requested: ClusterFlags | None, running: bool, cluster: str
) -> ClusterFlags:
    """The flags ``up`` starts with: the saved ones unless others are asked for, which a
    cluster with running processes refuses (they would not take effect)."""
    if requested is None or requested == saved:
        return saved
    if running:
        raise ClusterError(
            f"cluster {cluster!r} runs with other feature gates or runtime-config "
            f"({'; '.join(saved.describe()) or 'none'}); run "
            f"`vk-provider cluster down --name {cluster}` first to change them"
        )
    return requested


def _pairs(text: str, *, what: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ClusterError(f"{what} {item!r} is not KEY=VALUE")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _boolean(value: str, *, gate: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ClusterError(f"feature gate {gate}={value}: the value must be true or false")
    return lowered == "true"


def parse_feature_gates(values: Iterable[str]) -> ClusterFlags:
    """``[COMPONENT:]Gate=true|false[,Gate=...]`` per value; no component means all three.

    >>> parse_feature_gates(["kube-scheduler:GenericWorkload=true"]).arguments("kube-scheduler")
    ['--feature-gates=GenericWorkload=true']
    """
    flags = ClusterFlags()
    for value in values:
        head, sep, rest = value.partition(":")
        components = (head.strip(),) if sep else KUBE_COMPONENTS
        text = rest if sep else value
        gates = {k: _boolean(v, gate=k) for k, v in _pairs(text, what="feature gate")}
        flags = flags.merged(ClusterFlags({c: gates for c in components}))
    return flags


def parse_runtime_config(values: Iterable[str]) -> ClusterFlags:
    """``group/version=true|false[,...]`` per value, for the API server's ``--runtime-config``."""
    config: dict[str, str] = {}
    for value in values:
        config.update(_pairs(value, what="runtime-config"))
    return ClusterFlags(runtime_config=config)


def requested_flags(
    feature_gates: Sequence[str], runtime_config: Sequence[str], *, gang_scheduling: bool
) -> ClusterFlags | None:
    """What ``cluster up``'s options ask for; None when they ask nothing (keep the saved)."""
    if not feature_gates and not runtime_config and not gang_scheduling:
        return None
    flags = GANG_SCHEDULING if gang_scheduling else ClusterFlags()
    return flags.merged(parse_feature_gates(feature_gates)).merged(
        parse_runtime_config(runtime_config)
    )
