"""Fault tolerance under churn: nothing leaked, nothing duplicated, nothing stuck.

Two hundred pods are created, scaled and deleted over a couple of minutes while the `local`
provider fails 30% of its calls (429, 503, timeouts, creates whose answer is lost) until the
very end, the test makes instances vanish, starts duplicates of running attempts and orphans
the agent never asked for, and a busy process per core competes for the CPU. One run also
restarts the kube-apiserver mid-churn; the other SIGKILLs the agent five times at random
moments. Both must end with every surviving pod Running, no listed instance without a live
pod (TERMINATING ones count: a termination is done only when the provider confirms it), no
pod with two instances, every injected duplicate and orphan terminated by reconciliation,
and no pod Terminating longer than its grace period + 10 s + the outages within that span
(the agent down, the API server down: nobody could finish a deletion then). The API server
is restarted while at least 20 deletions are under way, and every deletion that fell due
while it was away must finish within 5 s of its return ("API back -> pod gone"). The counts,
the deletions that used most of their budget and the slowest returns are printed.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tests.helpers import wait_for
from tests.integration.agent_harness import TOLERATION, AgentHarness, AgentProcess, local_providers
from tests.integration.deletions import (
    Deletion,
    DeletionClock,
    Outage,
    Overdue,
    after_return,
    overdue,
)
from vk_provider.domain.models import InstanceState
from vk_provider.kube.client import KubeClient
from vk_provider_adapters.local.faults import inject_instance, inject_loss, set_faults
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

GRACE = 2
# How long past its grace period a deleted pod may stay, outages aside: the agent deletes it
# at the latest deletion_slack_seconds (5 s) after its grace period whatever its instance
# does, and 5 s more covers the injected provider faults' retries on a loaded machine.
DELETION_MARGIN_SECONDS = 10.0
# A deletion that was due while the API server was down finishes this soon after it is back.
API_BACK_BOUND_SECONDS = 5.0
FLAKY = {
    "name": "flaky",
    "offers": [
        {"sku": "cpu", "price_per_hour": 0.01, "capacity": 400, "vcpus": 2, "memory_gib": 4}
    ],
}


@dataclass
class ChurnReport:
    # When no deletion could finish: the agent SIGKILLed (until its next start registered the
    # node), the API server restarting (from its stop until the test's own watch lists
    # again). A pod's time past its grace period within these is not held against the agent.
    outages: list[Outage] = field(default_factory=list)
    losses_injected: int = 0
    duplicates_injected: dict[str, str] = field(default_factory=dict)  # duplicate -> original
    orphans_injected: set[str] = field(default_factory=set)
    agent_kills: int = 0
    reconcile_seconds: list[float] = field(default_factory=list)


def _deployment(name: str, node: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [TOLERATION],
                    "terminationGracePeriodSeconds": GRACE,
                    "containers": [
                        {"name": "c", "image": "example.com/c:1", "command": ["sleep", "3600"]}
                    ],
                },
            },
        },
    }


async def _inject_faults(
    agent: AgentProcess, report: ChurnReport, stop: asyncio.Event, rng: random.Random
) -> None:
    """Every 2 s one of: lose a running instance, start a second instance of a running
    attempt (a create that went through twice), or start an instance for no pod at all."""
    (provider,) = local_providers(agent)
    state_dir = agent.local_dir("flaky")
    round_ = 0
    while not stop.is_set():
        await asyncio.sleep(2)
        round_ += 1
        running = [
            i
            for i in await _list(provider)
            if i.state is InstanceState.RUNNING and "-dup" not in i.instance_id
        ]
        try:
            if round_ % 3 == 1 and running:
                inject_loss(state_dir, rng.choice(running).instance_id)
                report.losses_injected += 1
            elif round_ % 3 == 2 and running:
                original = rng.choice(running).instance_id
                made = inject_instance(state_dir, like=original, suffix=f"dup{round_}")
                report.duplicates_injected[made] = original
            elif round_ % 3 == 0:
                made = inject_instance(
                    state_dir, pod_uid=f"no-such-pod-{round_}", suffix=f"orphan{round_}"
                )
                report.orphans_injected.add(made)
        except FileNotFoundError:
            pass  # the chosen instance went meanwhile


async def _list(provider: Any) -> list[Any]:
    """The provider's listing, through its injected faults (retried; never a silent [])."""
    for _ in range(50):
        try:
            return list(await provider.list_ours())
        except Exception:
            await asyncio.sleep(0.05)
    raise AssertionError("the provider's list failed 50 times in a row")


async def _kill_agent(agent: AgentProcess, report: ChurnReport, rng: random.Random) -> None:
    for _ in range(5):
        await asyncio.sleep(rng.uniform(6, 14))
        assert agent.process is not None
        starts = agent.log_text().count(" registered; kubelet API")
        killed = datetime.now(UTC)
        agent.process.send_signal(signal.SIGKILL)
        agent.process.wait()
        report.agent_kills += 1
        agent.start()

        async def registered(before: int = starts) -> bool:
            return agent.log_text().count(" registered; kubelet API") > before

        await wait_for(registered, timeout=120, what="the restarted agent to register its node")
        report.outages.append(Outage(killed, datetime.now(UTC), "agent SIGKILL"))


async def _restart_apiserver(control_plane: LocalCluster, clock: DeletionClock) -> Outage:
    """Restart the API server while deletions are under way (in a thread: the clock's watch
    goes on meanwhile). The outage lasts from the stop until the clock lists again."""
    binaries = ensure_binaries()

    async def deletions_under_way() -> bool:
        return clock.pending() >= 20

    await wait_for(deletions_under_way, timeout=60, interval=0.1, what="20 pending deletions")
    start = datetime.now(UTC)
    await asyncio.to_thread(control_plane.restart, "kube-apiserver", binaries)

    async def listed_again() -> datetime | None:
        return clock.back_after(start)

    back = await wait_for(listed_again, timeout=60, what="the clock to list pods again")
    return Outage(start, back, "API server restart")


def _deletion_report(report: ChurnReport, clock: DeletionClock) -> list[Overdue]:
    """Print what the deletions used of their budget; return those over it."""
    now = datetime.now(UTC)
    used = sorted(
        (overdue(d, report.outages, now=now) for d in clock.deletions.values()),
        key=lambda o: o.charged,
        reverse=True,
    )
    outages = ", ".join(
        f"{o.what} {o.start.time().isoformat('milliseconds')} to "
        f"{o.end.time().isoformat('milliseconds')}"
        for o in report.outages
    )
    print(
        f"deletions: {len(used)}; budget past the grace period {DELETION_MARGIN_SECONDS:.0f} s "
        f"+ outages ({outages or 'none'}); the most charged:"
    )
    for o in used[:8]:
        print(
            f"  {o.name}: {o.used:.1f} s past grace, {o.excused:.1f} s of it in outages, "
            f"{o.charged:.1f} s charged ({_times(clock.deletions[o.name])})"
        )
    return [o for o in used if o.charged > DELETION_MARGIN_SECONDS]


def _times(deletion: Deletion) -> str:
    gone = deletion.gone.time().isoformat("milliseconds") if deletion.gone else "not yet"
    return (
        f"due {deletion.due.time().isoformat('milliseconds')}, "
        f"seen {deletion.seen.time().isoformat('milliseconds')}, gone {gone}"
    )


def _after_return_report(report: ChurnReport, clock: DeletionClock) -> dict[str, float]:
    """Print, per deletion due while the API server was down, how long it took once back."""
    (outage,) = [o for o in report.outages if o.what == "API server restart"]
    taken = after_return(clock.deletions.values(), outage)
    slowest = sorted(taken.items(), key=lambda kv: kv[1], reverse=True)
    print(
        f"API server unreachable {(outage.end - outage.start).total_seconds():.1f} s "
        f"({outage.start.time().isoformat('milliseconds')} to "
        f"{outage.end.time().isoformat('milliseconds')}); "
        f"{len(taken)} deletions were due meanwhile; longest API back -> pod gone "
        f"{slowest[0][1] if slowest else 0.0:.2f} s (bound {API_BACK_BOUND_SECONDS:.0f} s): "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in slowest[:5])
    )
    return taken


async def _scale(apps: client.AppsV1Api, name: str, namespace: str, replicas: int) -> None:
    for _ in range(30):
        try:
            await apps.patch_namespaced_deployment_scale(
                name, namespace, {"spec": {"replicas": replicas}}
            )
            return
        except (ApiException, OSError):
            await asyncio.sleep(1)  # API server restarting


@pytest.mark.parametrize("disruption", ["apiserver-restart", "agent-sigkill"])
async def test_churn_under_faults_leaks_nothing(
    disruption: str,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    agents: AgentHarness,
    control_plane: LocalCluster,
    cpu_hog: int,
) -> None:
    rng = random.Random(f"churn-{disruption}")
    agent = agents.start(
        providers=[FLAKY],
        intervals={"orphan_grace_seconds": 3, "retry_backoff_seconds": 0.5},
        placement={"breaker_threshold": 12, "breaker_cooldown_seconds": 3},
        node={"max_pods": 500},
        # One replica and nothing to restart it: with the default 10 s renew deadline an API
        # server restart on a loaded machine makes it exit (its pod would restart it,
        # docs/operating.md). Riding the outage out is what this case tests, so the leader
        # may go a minute without renewing, as an operator may configure.
        leader_election=(
            {"lease_duration_seconds": 90, "renew_deadline_seconds": 60}
            if disruption == "apiserver-restart"
            else None
        ),
    )

    async def ready() -> bool:
        node = await api.get_node(agent.node)
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    await wait_for(ready, timeout=60, what="node Ready")
    set_faults(agent.local_dir("flaky"), call_failure_rate=0.3)

    apps = client.AppsV1Api(kube)
    report = ChurnReport()
    stop = asyncio.Event()
    clock = DeletionClock(api, agent.node, namespace)
    clock_task = asyncio.create_task(clock.run())
    try:
        background = [asyncio.create_task(_inject_faults(agent, report, stop, rng))]
        if disruption == "agent-sigkill":
            background.append(asyncio.create_task(_kill_agent(agent, report, rng)))
        try:
            for i in range(4):  # 200 pods
                await apps.create_namespaced_deployment(
                    namespace, _deployment(f"d{i}", agent.node, 50)
                )
            await asyncio.sleep(15)
            await _scale(apps, "d0", namespace, 10)
            await _scale(apps, "d1", namespace, 0)
            if disruption == "apiserver-restart":
                report.outages.append(await _restart_apiserver(control_plane, clock))
            await asyncio.sleep(10)
            await apps.create_namespaced_deployment(namespace, _deployment("d4", agent.node, 20))
            await _scale(apps, "d2", namespace, 30)
            # d3 goes whole: its 50 pods through the ReplicaSet controller (scaled to 0), then
            # the Deployment. Not through the garbage collector alone: after an API server
            # restart on a loaded machine the controller-manager's garbage collector may stall
            # for minutes re-syncing its monitors ("timed out waiting for dependency graph
            # builder sync"), which is the control plane's business, not the agent's.
            await _scale(apps, "d3", namespace, 0)

            async def d3_going() -> bool:
                pods, _ = await api.list_node_pods(agent.node)
                # Failed pods (an injected loss) stay until the Deployment goes, and count
                # for nothing: only the live ones must be on their way out.
                return not [
                    p
                    for p in pods
                    if p["metadata"]["namespace"] == namespace
                    and p["metadata"]["labels"].get("app") == "d3"
                    and p["status"].get("phase") not in ("Succeeded", "Failed")
                    and not p["metadata"].get("deletionTimestamp")
                ]

            await wait_for(d3_going, timeout=60, what="d3's live pods deleted by its ReplicaSet")
            await apps.delete_namespaced_deployment("d3", namespace)
            await asyncio.sleep(15)
            await _scale(apps, "d1", namespace, 15)
            await _scale(apps, "d4", namespace, 5)
            if disruption == "agent-sigkill":
                await asyncio.wait_for(background[-1], timeout=120)  # all five kills done
            else:
                await asyncio.sleep(20)
        finally:
            stop.set()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

        if disruption == "agent-sigkill":
            # Every start (the first and one per kill) must finish a full reconciliation, and
            # within 30 s; the last restart may still be starting up here.
            async def all_reconciled() -> bool:
                found = re.findall(r"first reconciliation complete", agent.log_text())
                return len(found) == report.agent_kills + 1

            await wait_for(all_reconciled, timeout=30, what="the last restart to reconcile")

        # The faults stay on: convergence must not depend on the provider becoming reliable.
        desired = {"d0": 10, "d1": 15, "d2": 30, "d4": 5}
        (provider,) = local_providers(agent)

        async def counts() -> dict[str, int]:
            pods, _ = await api.list_node_pods(agent.node)
            mine = [p for p in pods if p["metadata"]["namespace"] == namespace]
            alive = [p for p in mine if p["status"].get("phase") not in ("Succeeded", "Failed")]
            running = [
                p
                for p in alive
                if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ]
            by_app: dict[str, int] = {}
            for pod in running:
                app = pod["metadata"]["labels"]["app"]
                by_app[app] = by_app.get(app, 0) + 1
            # Everything the provider lists is not terminated yet: TERMINATING counts too.
            instances = await _list(provider)
            alive_uids = {p["metadata"]["uid"] for p in alive}
            per_uid: dict[str, int] = {}
            for instance in instances:
                per_uid[instance.pod_uid] = per_uid.get(instance.pod_uid, 0) + 1
            listed = {i.instance_id for i in instances}
            return {
                "surviving_pods": len(alive),
                "running_as_desired": int(by_app == desired and len(running) == len(alive)),
                "instances_without_pod": sum(1 for i in instances if i.pod_uid not in alive_uids),
                "duplicate_instances": sum(n - 1 for n in per_uid.values() if n > 1),
                "injected_left": len(
                    (set(report.duplicates_injected) | report.orphans_injected) & listed
                ),
            }

        async def converged() -> dict[str, int] | None:
            found = await counts()
            ok = (
                found["running_as_desired"] == 1
                and found["instances_without_pod"] == 0
                and found["duplicate_instances"] == 0
                and found["injected_left"] == 0
            )
            return found if ok else None

        churn_ended = datetime.now(UTC)
        try:
            final = await wait_for(
                converged, timeout=180, interval=2, what="convergence after churn"
            )
        except pytest.fail.Exception:
            # What was stuck, compactly and last (CI shows the tail of the output), and in
            # the failure's own message: the pods not Running or Terminating, the instances
            # without a live pod or beside another of the same pod.
            pods, _ = await api.list_node_pods(agent.node)
            alive = {
                p["metadata"]["uid"]
                for p in pods
                if p["status"].get("phase") not in ("Succeeded", "Failed")
            }
            stuck = []
            for pod in pods:
                status = pod.get("status") or {}
                if status.get("phase") in ("Succeeded", "Failed"):
                    continue  # an injected loss's leftover: counted for nothing
                if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                    waiting = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get(
                        "waiting"
                    )
                    meta = pod["metadata"]
                    instance_id = (meta.get("annotations") or {}).get("vk-provider.io/instance-id")
                    stuck.append(
                        f"{meta['name']} {status.get('phase')} waiting={waiting} "
                        f"deleting={meta.get('deletionTimestamp')} instance={instance_id}"
                    )
            instances = await _list(provider)
            per_uid: dict[str, int] = {}
            for instance in instances:
                per_uid[instance.pod_uid] = per_uid.get(instance.pod_uid, 0) + 1
            odd = [
                f"{i.instance_id} {i.state.value} {i.message}"
                for i in instances
                if i.pod_uid not in alive or per_uid[i.pod_uid] > 1
            ]
            by_app: dict[str, int] = {}  # as counts() counts: Running, not being deleted
            for pod in pods:
                if (
                    pod["metadata"]["namespace"] == namespace
                    and pod["status"].get("phase") == "Running"
                    and not pod["metadata"].get("deletionTimestamp")
                ):
                    app = pod["metadata"]["labels"].get("app", "?")
                    by_app[app] = by_app.get(app, 0) + 1
            manager_log = control_plane.log_file("kube-controller-manager")
            collector = [
                line
                for line in manager_log.read_text(errors="replace").splitlines()
                if "garbage" in line.lower()
            ]
            found = await counts()
            for line in [*stuck, *odd, *collector[-10:]]:
                print(line)
            print(f"churn ({disruption}) did not converge: {found}")
            pytest.fail(
                f"no convergence 180 s after the churn: {found}; pods by app {by_app} (want "
                f"{desired}); live pods not Running or being deleted: {stuck[:5]}; instances "
                f"without a live pod or duplicated: {odd[:5]}; the garbage collector's last "
                f"word: {collector[-1:]}"
            )
        converged_after = (datetime.now(UTC) - churn_ended).total_seconds()
        if disruption == "agent-sigkill":
            report.reconcile_seconds = [
                float(m)
                for m in re.findall(r"first reconciliation complete ([0-9.]+)s", agent.log_text())
            ]
        print(
            f"churn ({disruption}): surviving pods {final['surviving_pods']} all Running, "
            f"instances without a pod {final['instances_without_pod']}, "
            f"duplicate instances {final['duplicate_instances']}, "
            f"losses injected {report.losses_injected}, duplicates injected "
            f"{len(report.duplicates_injected)}, orphans injected {len(report.orphans_injected)}, "
            f"agent SIGKILLs {report.agent_kills}, CPU hogs {cpu_hog}, "
            f"first reconciliation after each start {report.reconcile_seconds}, converged "
            f"{converged_after:.1f} s after the churn ended (bound 180 s)"
        )
        clock_task.cancel()
        await asyncio.gather(clock_task, return_exceptions=True)
        late = _deletion_report(report, clock)
        assert late == [], (
            f"pods Terminating past grace + {DELETION_MARGIN_SECONDS:.0f} s + outages"
        )
        if disruption == "apiserver-restart":
            taken = _after_return_report(report, clock)
            assert taken, "no deletion was due while the API server was down: nothing measured"
            assert max(taken.values()) <= API_BACK_BOUND_SECONDS, taken
        assert report.losses_injected > 0
        # Reconciliation, not luck, removed what was injected. Of a duplicate and its original,
        # one was terminated by name by reconciliation (either may be the one kept: both are the
        # same attempt, and a pod that lost its annotation adopts by one rule).
        log = agent.log_text()
        terminated = set(re.findall(r"terminating instance (\S+) on flaky ", log))
        for made, original in report.duplicates_injected.items():
            assert {made, original} & terminated, (made, original)
        for made in report.orphans_injected:
            assert re.search(rf"terminating instance {re.escape(made)} on flaky .*: orphan", log)
        assert any(
            re.search(rf"terminating instance {re.escape(made)} on flaky .*: duplicate", log)
            for made in report.duplicates_injected
        ), "no injected duplicate was caught as one while its pod still lived"
        assert report.duplicates_injected and report.orphans_injected
        if disruption == "agent-sigkill":
            assert report.agent_kills == 5
            assert len(report.reconcile_seconds) == 6  # the first start and five restarts
            assert max(report.reconcile_seconds) <= 30
    finally:
        clock_task.cancel()
        await asyncio.gather(clock_task, return_exceptions=True)
