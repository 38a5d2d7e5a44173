"""The local provider's pod runner: runs every container of one pod as a kubelet would.

Forked by the provider's spawner (``spawner.py``) as a detached process (a session of its
own), or, when the spawner cannot, started directly as::

    python -m vk_provider_adapters.local.runner --instance DIR [--start-delay SECONDS]

It reads the pod's plan (``DIR/pod.json``, ``layout.py``), waits ``--start-delay`` seconds
(simulated launch latency), then:

1. runs the init containers in order: a plain one to completion (a failure is retried with
   back-off, or under restartPolicy Never ends the pod failed); a native sidecar
   (``restartPolicy: Always``) is started and kept running beside everything after it;
2. starts every app container; an app container that exits is restarted as the pod's
   restartPolicy says (Always; OnFailure if it failed; Never not), after kubelet's crash-loop
   back-off (the plan's ``backoff_seconds``, doubled per restart up to five minutes, reset
   after ten minutes of running); a sidecar is always restarted;
3. when no app container runs or will restart, stops the sidecars (SIGTERM, in reverse order)
   and writes the pod's exit code to ``DIR/exit`` (0 when every app container succeeded).

Each container's program leads a process group of its own; its output goes to its
``container.log`` in the CRI log format (``<RFC3339Nano UTC> <stdout|stderr> F <line>``), the
previous run's to ``previous.log``; ``status.json`` says what it is doing. A
``restart.json`` request (a failed liveness probe) stops the container (SIGTERM, SIGKILL
after the grace it names), and the restart policy decides what follows.

Invariants:
- Only the standard library (and ``vk_provider_adapters.local.container``/``layout``/``processes``,
  which use only it) is imported, so the runner starts fast and never depends on the agent's state.
- One thread: output is read with a selector, so ``preexec_fn`` runs in a process that has no
  other thread (PR_SET_PDEATHSIG: a program dies with the runner).
- ``DIR/started`` exists once the first container was started (its mtime is the time);
  ``DIR/exit`` appears atomically, after every output line the runner could read was written.
- SIGTERM stops the pod: app and init containers get SIGTERM, then the sidecars once the
  apps are gone; nothing restarts any more. Like a pod sandbox, nothing a program leaves
  behind outlives the runner: it kills every container's process group, then its own.
- A program killed by signal N exits ``128 + N`` (137 for SIGKILL); one that cannot be started
  127 (not found) or 126 (not executable), with the reason in its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vk_provider_adapters.local.container import (
    IDLE_SECONDS,
    SIDECAR_STOP_GRACE_SECONDS,
    Container,
    write_atomically,
)
from vk_provider_adapters.local.layout import (
    POD_PLAN,
    container_dir,
)


class PodRunner:
    """The pod's life: init containers, sidecars, app containers, restarts, the end."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        plan = json.loads((directory / POD_PLAN).read_text())
        self.policy: str = plan.get("restart_policy", "Always")
        backoff = float(plan.get("backoff_seconds", 10.0))
        pod = str(plan.get("pod", ""))

        def container(name: str) -> Container:
            return Container(container_dir(directory, name), name, pod=pod, backoff=backoff)

        self.inits = [container(str(n)) for n in plan.get("init", [])]
        self.apps = [container(str(n)) for n in plan.get("apps", [])]
        self.selector = selectors.DefaultSelector()
        self.next_init = 0
        self.stopping = False
        self.failed_init: Container | None = None
        self._term = False
        self._requested = True  # look at restart requests once at the start, then on SIGUSR1
        self._started_marked = False

    def on_sigterm(self, signum: int, frame: object) -> None:
        self._term = True

    def on_sigusr1(self, signum: int, frame: object) -> None:
        self._requested = True

    @property
    def sidecars(self) -> list[Container]:
        return [c for c in self.inits if c.sidecar]

    def _start(self, container: Container, now: float) -> None:
        if not self._started_marked:
            write_atomically(self.dir / "started", b"")
            self._started_marked = True
        if not container.start(self.selector):
            self._ended(container, now)  # could not run: as a run that failed at once

    def _ended(self, container: Container, now: float) -> None:
        """A run of ``container`` ended: restart it, or not, as the policy says."""
        if self.stopping:
            return
        if self._wants_restart(container):
            container.schedule_restart(now)
        elif container.init and not container.sidecar and not container.succeeded:
            self.failed_init = container  # restartPolicy Never: the pod has failed

    def _wants_restart(self, container: Container) -> bool:
        code = container.status.exit_code
        if container.sidecar:
            return True
        if container.init:  # a plain init container: until it succeeds, unless Never
            return code != 0 and self.policy != "Never"
        return self.policy == "Always" or (self.policy == "OnFailure" and code != 0)

    def _step_init(self, now: float) -> None:
        """Advance the init sequence: one plain init container at a time, sidecars kept."""
        while self.next_init < len(self.inits):
            current = self.inits[self.next_init]
            if current.sidecar:
                if not current.running and current.restart_at is None and not current.ended:
                    self._start(current, now)
                if not current.running:
                    return  # not started (yet): what follows waits
                self.next_init += 1
                continue
            if current.succeeded:
                self.next_init += 1
                continue
            if not current.running and current.restart_at is None and not current.ended:
                self._start(current, now)
            return
        if self.next_init == len(self.inits):
            self.next_init += 1  # initialized: every app container starts now
            for app in self.apps:
                self._start(app, now)

    def _collect(self, now: float) -> None:
        for container in (*self.inits, *self.apps):
            if container.poll(self.selector, now):
                self._ended(container, now)
        for container in (*self.inits, *self.apps):
            if (
                not self.stopping
                and container.restart_at is not None
                and now >= container.restart_at
                and (not container.init or container.sidecar or self._is_current(container))
            ):
                self._start(container, now)

    def _is_current(self, container: Container) -> bool:
        return self.next_init < len(self.inits) and self.inits[self.next_init] is container

    def _requests(self) -> None:
        for container in (*self.inits, *self.apps):
            grace = container.restart_requested()
            if grace is not None and container.running:
                container.stop(grace)

    def _apps_done(self) -> bool:
        """No app container runs or will restart (and they had their chance to start)."""
        if self.failed_init is not None:
            return True
        if self.next_init <= len(self.inits):
            return False
        return all(not a.running and a.restart_at is None for a in self.apps)

    def _stop_all(self) -> None:
        """SIGTERM app and init containers now; sidecars once the others are gone."""
        for container in (*self.apps, *(c for c in self.inits if not c.sidecar)):
            container.stop()
        for container in (*self.inits, *self.apps):
            if container.restart_at is not None:
                container.restart_at = None

    def _stop_sidecars(self) -> None:
        others_running = any(c.running for c in (*self.apps, *self.inits) if not c.sidecar)
        if others_running:
            return
        for sidecar in reversed(self.sidecars):
            if sidecar.running and sidecar.kill_at is None:
                sidecar.stop(SIDECAR_STOP_GRACE_SECONDS)

    def exit_code(self) -> int:
        if self.failed_init is not None:
            return self.failed_init.status.exit_code or 1
        for app in self.apps:
            code = app.status.exit_code
            if app.status.state != "terminated" or code is None:
                return 1 if not self._term else 143
            if code != 0:
                return code
        return 0

    def _timeout(self, now: float) -> float:
        """Sleep until a signal (SIGCHLD, SIGTERM, SIGUSR1) or the next timer, at most 1 s."""
        times = [t for c in (*self.inits, *self.apps) if (t := c.next_deadline()) is not None]
        return max(0.0, min([now + IDLE_SECONDS, *times]) - now)

    def run(self, start_delay: float) -> int:
        if start_delay > 0:
            # SIGTERM keeps its default action here: it ends the runner before anything runs.
            time.sleep(start_delay)
        # Signals wake the loop: a program ended (SIGCHLD), stop the pod (SIGTERM), look at
        # the restart requests (SIGUSR1, sent by the provider after writing one).
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGUSR1, self.on_sigusr1)
        self.selector.register(wake_read, selectors.EVENT_READ, None)
        while True:
            now = time.time()
            if self._term and not self.stopping:
                self.stopping = True
                self._stop_all()
            if not self.stopping:
                if self._requested:
                    self._requested = False
                    self._requests()
                self._step_init(now)
            self._collect(now)
            if not self.stopping and self._apps_done():
                self.stopping = True
                self._stop_all()
            if self.stopping:
                self._stop_sidecars()
                if not any(c.running for c in (*self.inits, *self.apps)):
                    break
            for key, _ in self.selector.select(timeout=self._timeout(time.time())):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                    continue
                owner, stream = key.data
                owner.read(self.selector, key.fileobj, stream)
        code = self.exit_code()
        write_atomically(self.dir / "exit", f"{code}\n".encode())
        return code

    def kill_everything(self) -> None:
        for container in (*self.inits, *self.apps):
            container.kill()


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m vk_provider_adapters.local.runner")
    parser.add_argument("--instance", type=Path, required=True, help="The instance directory.")
    parser.add_argument("--start-delay", type=float, default=0.0, help="Seconds to wait first.")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse(sys.argv[1:] if argv is None else argv)
    runner = PodRunner(options.instance)
    try:
        code = runner.run(options.start_delay)
    finally:
        runner.kill_everything()
    if os.getpgrp() == os.getpid():
        # We lead the process group (started in a session of our own): whatever is left ends
        # with it, as in a pod sandbox. This also ends the runner itself.
        sys.stdout.flush()
        os.killpg(os.getpid(), signal.SIGKILL)
    return code


if __name__ == "__main__":
    sys.exit(main())
