"""The adapter's own Lambda firewall ruleset: the pods' ports open to the cluster, SSH to the agent.

Managed only when the configuration has ``firewall`` (``config.LambdaFirewall``); without it
the adapter touches no firewall and the account's own rules (or the rulesets of
``firewall_ruleset_ids``) decide who reaches the VMs.

**Why a ruleset of our own, not the account's rules** (API 1.8.3): ``PUT /firewall-rules``
(``firewallRulesSet``) *replaces* the inbound rules of every instance of the account — other
people's and other tools' too — so a read-modify-write of it races whoever else edits them
and a mistake locks everyone out. ``POST /instance-operations/launch`` takes
``firewall_rulesets`` (``FirewallRulesetEntry``: an id; "must exist in the same region as
the instance"), so the adapter keeps one ruleset per region, named ``LambdaFirewall.name_for``
(``vk-provider-<provider name>`` unless configured), and names it in every launch there,
beside the configured ``firewall_ruleset_ids``. It is found by name and region in ``GET
/firewall-rulesets`` (``firewallRulesetsList``: ``FirewallRuleset``), made with ``POST
/firewall-rulesets`` (``createFirewallRuleset``: ``FirewallRulesetCreateRequest``) the first
time a pod launches in that region, and widened with ``PATCH /firewall-rulesets/{id}``
(``updateFirewallRuleset``: ``FirewallRulesetPatchRequest`` with ``rules`` only) when a pod
declares a port it does not let in yet. The global rules are never read nor written.

**The rules** (``FirewallRule``), for the pod being created:

- every declared container port (``vk_provider_adapters.docker_run`` publishes each one on
  the same port of the VM), TCP or UDP as declared, from each of ``source_cidrs`` (the
  cluster's egress: where its clients and kube-proxy's traffic come from). SCTP has no
  ``NetworkProtocol`` (tcp, udp, icmp, all): it cannot be let in, so it is not asked for (and
  ``vmstate`` never lists it as an endpoint);
- ``ssh_port`` over TCP from each of ``ssh_source_cidrs`` (by default ``source_cidrs``: the
  agent runs in the cluster and connects from its egress). The agent reads every VM over SSH
  (``vmwatch``): without this rule a ruleset would lock it out and the VMs would be reported
  lost after ``ssh_unreachable_seconds``.

**Never clobber.** A rule is missing only when no rule of the ruleset covers it (same
protocol or ``all``, a port range holding the port, a source network holding the CIDR); an
update sends every rule the ruleset already has, as it has them (people may add their own),
followed by the missing ones, and nothing is sent when none is missing. Rules are only added:
a port no pod declares any more stays open to the same sources until someone edits the
ruleset (every VM of this provider in the region shares it, and the adapter does not know
which of their pods still declares which port).

**Cost.** One ``GET /firewall-rulesets`` per create (launches are 12 s apart anyway): what
people changed in the ruleset is seen at once, a deleted one is made again. A ``POST`` or
``PATCH`` only when a rule is missing.

**Ordering.** The ruleset is made or widened before the launch, inside ``create``: a firewall
call that fails fails the create before any VM exists, so nothing leaks and the agent's next
``create`` starts over. Its errors are the API's (``envelope.classify_failure``): 401/403 →
``AuthFailed``, ``global/quota-exceeded`` → ``CapacityUnavailable`` (another region with its
ruleset made may still take the pod), ``global/invalid-parameters`` → ``InvalidSpec``, 409
``global/internal-error`` and 5xx → ``Transient``; a ruleset deleted between the list and the
update → ``Transient`` (the next create makes it again). A create of a ruleset that may have
reached Lambda is never repeated (it would make two): the next ``create`` lists again and
finds it; of two rulesets of our name in one region the oldest is used.

**us-south-1.** The spec says "Firewall rules do not apply to the us-south-1 region": there
no ruleset is made or named (a warning, once per process), and the pod launches as without
``firewall``.

Invariants: the builders and parsers are pure; foreign rulesets are judged by name and
region alone, ours must be well formed (``MalformedResponse`` names what is not).
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from vk_provider.sdk import NotFound, Port, Transient
from vk_provider_adapters.payload import array, field, obj, string, text

log = logging.getLogger(__name__)

FirewallOperation = Literal[
    "list firewall rulesets", "create firewall ruleset", "update firewall ruleset"
]
# One call of the ruleset API: the operation, the path under the base URL, the body (or None).
FirewallCall = Callable[[FirewallOperation, str, Mapping[str, object] | None], Awaitable[object]]

RULESETS_PATH: Final = "/firewall-rulesets"
# From the spec: "Firewall rules do not apply to the us-south-1 region".
UNFIREWALLED_REGIONS: Final = frozenset({"us-south-1"})
# From the spec: FirewallRule.description maxLength.
DESCRIPTION_MAX: Final = 128
# Kubernetes' protocol → Lambda's NetworkProtocol; SCTP has none.
_PROTOCOLS: Final = {"TCP": "tcp", "UDP": "udp"}
_RULE_KEYS: Final = ("protocol", "port_range", "source_network", "description")


@dataclass(frozen=True, slots=True)
class Ruleset:
    """One ``FirewallRuleset`` of the account, as far as this module reads it."""

    ruleset_id: str
    name: str
    region: str
    created: str
    rules: tuple[Mapping[str, object], ...]


@dataclass(frozen=True, slots=True)
class Wanted:
    """One rule a pod needs: ``protocol`` (tcp, udp) on ``port`` from ``source`` (a CIDR)."""

    protocol: str
    port: int
    source: str
    description: str

    def body(self) -> dict[str, object]:
        """As a ``FirewallRule``."""
        return {
            "protocol": self.protocol,
            "port_range": [self.port, self.port],
            "source_network": self.source,
            "description": self.description,
        }


def wanted_rules(
    ports: Iterable[Port],
    *,
    ssh_port: int,
    source_cidrs: Sequence[str],
    ssh_source_cidrs: Sequence[str],
    provider: str,
) -> list[Wanted]:
    """The rules the pod needs: SSH for the agent first, then each declared TCP and UDP port
    from each source (each once)."""
    rules: list[Wanted] = []

    def add(protocol: str, port: int, source: str, what: str) -> None:
        if not any((r.protocol, r.port, r.source) == (protocol, port, source) for r in rules):
            rules.append(Wanted(protocol, port, source, f"{provider}: {what}"[:DESCRIPTION_MAX]))

    for source in ssh_source_cidrs:
        add("tcp", ssh_port, source, "SSH of the vk-provider agent")
    for port in ports:
        protocol = _PROTOCOLS.get(port.protocol.upper())
        if protocol is None:
            continue  # SCTP: no NetworkProtocol lets it in
        number = port.container_port
        for source in source_cidrs:
            add(protocol, number, source, f"pods' port {number}/{protocol}")
    return rules


def covers(rule: Mapping[str, object], wanted: Wanted) -> bool:
    """Whether ``rule`` (any rule of the ruleset, people's too) lets in what ``wanted`` asks:
    the same protocol or ``all``, the port inside its range (no range: every port), the
    source inside its source network. A rule this cannot read covers nothing."""
    if rule.get("protocol") not in (wanted.protocol, "all"):
        return False
    port_range = rule.get("port_range")
    if port_range is not None:
        if not (
            isinstance(port_range, list)
            and len(port_range) == 2
            and all(isinstance(p, int) and not isinstance(p, bool) for p in port_range)
        ):
            return False
        low, high = port_range
        if not low <= wanted.port <= high:
            return False
    inside, source = _network(rule.get("source_network")), _network(wanted.source)
    return inside is not None and source is not None and source.subnet_of(inside)


def missing_rules(
    existing: Sequence[Mapping[str, object]], wanted: Sequence[Wanted]
) -> list[Wanted]:
    """The wanted rules no existing rule covers, in the order wanted."""
    return [rule for rule in wanted if not any(covers(have, rule) for have in existing)]


def create_request(name: str, region: str, rules: Sequence[Wanted]) -> dict[str, object]:
    """The body of ``POST /firewall-rulesets`` (``FirewallRulesetCreateRequest``)."""
    return {"name": name, "region": region, "rules": [rule.body() for rule in rules]}


def update_request(
    existing: Sequence[Mapping[str, object]], added: Sequence[Wanted]
) -> dict[str, object]:
    """The body of ``PATCH /firewall-rulesets/{id}`` (``FirewallRulesetPatchRequest``): every
    rule the ruleset has, as it has it (its ``FirewallRule`` fields), then the added ones. The
    name is left out: it is not updated."""
    kept = [{key: rule[key] for key in _RULE_KEYS if key in rule} for rule in existing]
    for rule in kept:
        rule.setdefault("description", "")  # FirewallRule requires one
    return {"rules": [*kept, *(rule.body() for rule in added)]}


def parse_ruleset(raw: object, where: str = "data") -> Ruleset:
    """One ``FirewallRuleset`` (ours: it must be well formed)."""
    item = obj(raw, where)
    region_where = f"{where}.region"
    rules = array(field(item, "rules", where), f"{where}.rules")
    return Ruleset(
        ruleset_id=string(item, "id", where, nonempty=True),
        name=string(item, "name", where),
        region=string(obj(field(item, "region", where), region_where), "name", region_where),
        created=text(item, "created"),
        rules=tuple(obj(rule, f"{where}.rules[{i}]") for i, rule in enumerate(rules)),
    )


def ours_in(data: object, *, name: str, region: str) -> list[Ruleset]:
    """Our rulesets in ``region`` among ``GET /firewall-rulesets``' ``data``, oldest first
    (``created`` is ISO 8601 in one zone: its text sorts by time)."""
    found = []
    for index, raw in enumerate(array(data, "data")):
        item = raw if isinstance(raw, Mapping) else {}
        area = item.get("region")
        if item.get("name") == name and isinstance(area, Mapping) and area.get("name") == region:
            found.append(parse_ruleset(raw, f"data[{index}]"))
    return sorted(found, key=lambda ruleset: ruleset.created)


async def ensure_ruleset(
    call: FirewallCall,
    *,
    name: str,
    region: str,
    wanted: Sequence[Wanted],
    provider: str,
) -> str:
    """The id of our ruleset in ``region``, made or widened so it lets in ``wanted``."""
    rulesets = ours_in(
        await call("list firewall rulesets", RULESETS_PATH, None), name=name, region=region
    )
    if not rulesets:
        made = parse_ruleset(
            await call(
                "create firewall ruleset", RULESETS_PATH, create_request(name, region, wanted)
            )
        )
        log.info(
            "%s: made firewall ruleset %s (%r) in %s with %d rules",
            provider,
            made.ruleset_id,
            name,
            region,
            len(wanted),
        )
        return made.ruleset_id
    if len(rulesets) > 1:
        log.warning(
            "%s: %d firewall rulesets are named %r in %s; using the oldest, %s",
            provider,
            len(rulesets),
            name,
            region,
            rulesets[0].ruleset_id,
        )
    ruleset = rulesets[0]
    added = missing_rules(ruleset.rules, wanted)
    if not added:
        return ruleset.ruleset_id
    path = f"{RULESETS_PATH}/{urllib.parse.quote(ruleset.ruleset_id, safe='')}"
    try:
        await call("update firewall ruleset", path, update_request(ruleset.rules, added))
    except NotFound as exc:
        raise Transient(
            f"firewall ruleset {ruleset.ruleset_id} ({name!r} in {region}) vanished while "
            "the agent widened it; it is made again on the next try",
            provider=provider,
        ) from exc
    log.info(
        "%s: let %d more rules into firewall ruleset %s (%r) in %s: %s",
        provider,
        len(added),
        ruleset.ruleset_id,
        name,
        region,
        ", ".join(f"{rule.protocol}/{rule.port} from {rule.source}" for rule in added),
    )
    return ruleset.ruleset_id


def _network(value: object) -> ipaddress.IPv4Network | None:
    """A ``source_network`` ("1.2.3.4" is /32, as the API assumes); None when unreadable."""
    if not isinstance(value, str):
        return None
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None
    return network if isinstance(network, ipaddress.IPv4Network) else None
