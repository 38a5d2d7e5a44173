"""`vk-provider demo` tells the overflow story on a fresh machine and leaves nothing behind.

The real command in a child process, with a short training, a fast descheduler and clouds
that take 10 s to start a pod, so the whole story fits in a few minutes; its printed
timeline (Ready inference never below the PDB minimum through the hand-over), final state,
picture and cleanup are checked.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.test_demo import _alive, _descendants

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

PHASES = [
    "inference serves at home",
    "training arrives, held for the hand-over",
    "hand-over: inference moves to rented GPUs",
    "inference on rented GPUs",
    "training ends",
    "overflow closes",
    "inference moves home",
    "done",
]


def _pod_networks() -> set[str]:
    """The local provider's pod network namespaces on this machine."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.startswith("vkp-")}


async def test_the_demo_tells_the_story_and_cleans_up(tmp_path: Path) -> None:
    before = _pod_networks()
    state = tmp_path / "state"
    name = f"vkt-story-{os.getpid()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vk_provider",
            "demo",
            "--name",
            name,
            "--training-seconds",
            "5",
            "--descheduling-interval",
            "3s",
            "--start-delay",
            "10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "VK_PROVIDER_STATE_DIR": str(state), "COLUMNS": "200"},
    )
    seen: list[str] = []
    started: list[int] = []
    try:
        assert proc.stdout is not None
        while True:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=900)
            assert line, "the demo ended early:\n" + "".join(seen[-60:])
            seen.append(line)
            if "Press Ctrl-C" in line:
                break
        started = _descendants(proc.pid)
        text = "".join(seen)
        marks = [ln.strip().removeprefix("── ") for ln in seen if ln.startswith("── ")]
        assert marks == PHASES, marks
        assert "0 cloud instance(s) left" in text
        rows = [ln.split() for ln in seen if re.match(r"^\s*\d+s\s", ln)]
        assert rows, text
        # Columns from the right: $/h, overflow, own GPUs, held, training, ready, waiting,
        # virtual, home. The last row: everything home, overflow closed, $0/h.
        last = rows[-1]
        assert last[-2:] == ["closed", "0.00"] and last[-8] == "0", last
        # Make before break: Ready inference never below the PDB minimum (5 of 6), the
        # training held until the hand-over was done, and the summary says so.
        first = next(i for i, r in enumerate(rows) if r[1:3] == ["training", "arrives,"])
        assert min(int(r[-6]) for r in rows[first:]) >= 5, [r[-6] for r in rows[first:]]
        assert any(int(r[-4]) == 4 for r in rows), "the training was never seen held"
        assert "inference Ready never below 5 of 6" in text
        # Inference was on the virtual node at the two cheapest clouds while training ran.
        during = [r for r in rows if r[1:4] == ["inference", "on", "rented"]]
        assert during and all(r[-1] == "8.04" for r in during), during
        # Traffic followed: the Service's slices as kubectl shows them, and every rented
        # replica answering at the endpoint the agent published for it (its own address).
        assert "$ kubectl get endpointslices -n ml -l kubernetes.io/service-name=infer" in text
        answers = re.findall(r"GET http://(10\.215\.[\d.]+):8000/ -> (\S+)", text)
        assert len(answers) == 6 and len({a for a, _ in answers}) == 6, answers
        assert all(name.startswith("infer-") for _, name in answers), answers
        picture = Path(re.search(r"picture of the run: (\S+)", text).group(1))  # type: ignore[union-attr]
        svg = ET.fromstring(picture.read_text())  # noqa: S314 - our own output
        classes = {e.get("class") for e in svg.iter()}
        assert {
            "home",
            "virtual",
            "waiting",
            "own-gpus",
            "overflow-open",
            "ready",
            "minimum",
            "training-held",
        } <= classes
        proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 120) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert [pid for pid in started if _alive(pid)] == []
    leftovers = subprocess.run(["pgrep", "-af", name], capture_output=True, text=True, check=False)
    assert name not in leftovers.stdout.replace("pgrep -af " + name, "")
    assert _pod_networks() <= before  # every rented replica's network went with it
