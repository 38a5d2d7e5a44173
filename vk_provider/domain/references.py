"""What a pod's environment could not read, named as virtual-kubelet names it.

virtual-kubelet's ``podutils`` records one Warning Event per reference a pod's environment
could not resolve, with reasons its providers' users and tools know:
``Mandatory|Optional`` + ``Secret|ConfigMap`` + (``Key`` when a key of it is missing) +
``NotFound``, and ``InvalidEnvironmentVariableNames`` for ``envFrom`` keys that cannot be
variable names. ``domain.env`` finds these (``MissingReference``, ``InvalidNames``); the
placer records each as an Event before any create, and a mandatory one keeps the pod waiting
in ``CreateContainerConfigError`` until the object appears, as a kubelet does.

Invariants: pure; messages name objects, keys and variables, never a value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

INVALID_NAMES: Final = "InvalidEnvironmentVariableNames"


@dataclass(frozen=True, slots=True)
class MissingReference:
    """A Secret or ConfigMap (or one key of it) an ``env``/``envFrom`` entry reads that does
    not exist."""

    kind: str  # "Secret" or "ConfigMap"
    name: str
    optional: bool
    key: str | None = None  # the missing key of an existing object; None: the object
    variable: str | None = None  # the variable a keyRef sets; None for envFrom

    @property
    def reason(self) -> str:
        presence = "Optional" if self.optional else "Mandatory"
        part = "Key" if self.key is not None else ""
        return f"{presence}{self.kind}{part}NotFound"

    @property
    def message(self) -> str:
        kind = self.kind.lower()
        if self.key is not None:
            what = f'key "{self.key}" does not exist in {kind} "{self.name}"'
        else:
            what = f'{kind} "{self.name}" not found'
        if self.optional and self.variable is not None:
            return f'skipping optional envvar "{self.variable}": {what}'
        return what


@dataclass(frozen=True, slots=True)
class InvalidNames:
    """``envFrom`` keys skipped because they are not valid variable names."""

    kind: str
    namespace: str
    name: str
    keys: tuple[str, ...]

    @property
    def reason(self) -> str:
        return INVALID_NAMES

    @property
    def message(self) -> str:
        return (
            f"keys [{', '.join(sorted(self.keys))}] from {self.kind.lower()} "
            f"{self.namespace}/{self.name} were skipped since they are invalid as environment "
            "variable names"
        )


Skipped = MissingReference | InvalidNames
