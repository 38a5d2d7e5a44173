"""Reading the API server's audit log as calls, and RBAC roles as grants, to compare them.

``calls_of`` lists each request of one user once (a watch logs two stages); ``grants_of``
expands Roles and ClusterRoles into one ``Grant`` per (group, resource, verb); ``unused``
names the grants no call used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Call:
    group: str
    resource: str  # "pods" or "pods/status"
    verb: str
    namespace: str | None
    name: str | None
    code: int
    # RBAC's decision (the audit annotation authorization.k8s.io/decision): a 403 may also
    # come from admission, e.g. an Event written into a namespace being deleted.
    forbidden: bool = False
    received: str = ""  # requestReceivedTimestamp: RFC 3339 with microseconds, sorts in order


@dataclass(frozen=True)
class Grant:
    group: str
    resource: str
    verb: str
    namespace: str | None  # None: a ClusterRole's, any namespace and cluster-scoped objects
    names: tuple[str, ...] | None  # None: any name

    def allows(self, call: Call) -> bool:
        return (
            (self.group, self.resource, self.verb) == (call.group, call.resource, call.verb)
            and (self.namespace is None or self.namespace == call.namespace)
            and (self.names is None or call.name in self.names)
        )


def calls_of(audit_log: Path, user: str | None = None, *, prefix: str = "") -> list[Call]:
    """Every request of ``user`` (or of every user whose name starts with ``prefix``) in the
    audit log, once each (a watch logs two stages)."""
    seen: dict[str, Call] = {}
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        name = entry.get("user", {}).get("username") or ""
        wanted = name == user if user is not None else name.startswith(prefix)
        if not wanted or "objectRef" not in entry:
            continue
        ref = entry["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        seen[entry["auditID"]] = Call(
            group=ref.get("apiGroup", ""),
            resource=resource,
            verb=entry["verb"],
            namespace=ref.get("namespace"),
            name=ref.get("name"),
            code=int(entry.get("responseStatus", {}).get("code") or 0),
            forbidden=(entry.get("annotations") or {}).get("authorization.k8s.io/decision")
            == "forbid",
            received=entry.get("requestReceivedTimestamp") or "",
        )
    return list(seen.values())


def grants_of(documents: list[dict[str, Any]]) -> list[Grant]:
    grants = []
    for d in documents:
        if d["kind"] not in ("Role", "ClusterRole"):
            continue
        namespace = d["metadata"]["namespace"] if d["kind"] == "Role" else None
        for rule in d["rules"]:
            names = tuple(rule["resourceNames"]) if "resourceNames" in rule else None
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.append(Grant(group, resource, verb, namespace, names))
    return grants


def unused(grants: list[Grant], calls: list[Call]) -> set[tuple[str, str, str]]:
    return {(g.group, g.resource, g.verb) for g in grants if not any(g.allows(c) for c in calls)}
