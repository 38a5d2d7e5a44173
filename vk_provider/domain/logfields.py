"""The fields a log line carries about what it concerns: the pod and the instance.

``about(pod, instance)`` is passed as a log call's ``extra``; the agent's formatters
(``runtime.logs``) print them as ``pod=ns/name instance=id`` in text and as fields in JSON,
so every line about a pod or an instance can be found by either.

Invariant: pure; only names and ids, never a value of a pod's environment.
"""

from __future__ import annotations

from collections.abc import Sequence

FIELDS = ("pod", "instance", "provider")


def about(
    pod: Sequence[str] | None = None, instance: str | None = None, provider: str | None = None
) -> dict[str, str]:
    """``extra=`` for a log call about ``pod`` (a ``(namespace, name)`` key), ``instance``
    and its ``provider``; what is None is left out."""
    fields: dict[str, str] = {}
    if pod is not None:
        fields["pod"] = "/".join(pod)
    if instance:
        fields["instance"] = instance
    if provider:
        fields["provider"] = provider
    return fields
