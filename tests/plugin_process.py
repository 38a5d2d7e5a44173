"""A provider served out of process for tests: `vk-provider plugin serve` as a real child.

``PluginProcess.start()`` runs the command, waits for its ``listening on ADDRESS`` line (the
port it bound, for ``127.0.0.1:0``) and records the address; ``kill()`` SIGKILLs it (a plugin
that dies), ``start()`` again serves the same state at the same address (a TCP port is kept
after the first start). ``stop()`` ends it with SIGTERM (SIGKILL after a deadline). Every
test that makes one stops it, so no process is left behind. `plugin serve` authenticates its
callers: a Unix socket (in a directory only this user may write), or TCP with TLS and
``require_client_cert``; anything else needs ``insecure`` (``--insecure``).

``tls_material(directory)`` issues a CA, a server certificate for 127.0.0.1 and a client
certificate, with the project's own PKI code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vk_provider_dev.cluster.pki import CertPair, ClusterPKI, ensure_pki, issue_certificate

START_SECONDS = 60.0  # a loaded 2-core machine imports the CLI slowly


@dataclass(frozen=True, slots=True)
class TLSMaterial:
    ca: Path
    server: CertPair
    client: CertPair
    other_ca: Path  # a CA that signed nothing the server trusts


def tls_material(directory: Path) -> TLSMaterial:
    pki = ClusterPKI(directory / "pki")
    ensure_pki(pki, cluster_name="plugin-test", service_ip="10.0.0.1")
    server = CertPair(directory / "server.crt", directory / "server.key")
    client = CertPair(directory / "client.crt", directory / "client.key")
    issue_certificate(
        pki.ca, server, common_name="plugin", server=True, ip_addresses=("127.0.0.1",)
    )
    issue_certificate(pki.ca, client, common_name="agent", client=True)
    return TLSMaterial(
        ca=pki.ca.cert, server=server, client=client, other_ca=pki.front_proxy_ca.cert
    )


def local_entry(name: str, state_dir: Path, offers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "enabled": True, "state_dir": str(state_dir), "offers": offers}


@dataclass
class PluginProcess:
    """`vk-provider plugin serve --type local` with ``entry`` at ``listen``."""

    entry: dict[str, Any]
    root: Path
    listen: str
    tls: TLSMaterial | None = None
    require_client_cert: bool = False
    insecure: bool = False  # --insecure: TCP without a client certificate (logged)
    address: str = ""
    process: subprocess.Popen[bytes] | None = None
    _lines: list[str] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.root / "plugin.log"

    def _command(self) -> list[str]:
        config = self.root / "plugin.yaml"
        config.write_text(yaml.safe_dump(self.entry))
        listen = self.address or self.listen  # the second start keeps the port chosen
        command = [sys.executable, "-m", "vk_provider", "plugin", "serve", "--type", "local"]
        command += ["--config", str(config), "--listen", listen]
        command += ["--state-dir", str(self.root / "state")]
        if self.tls is not None:
            command += ["--tls-cert", str(self.tls.server.cert)]
            command += ["--tls-key", str(self.tls.server.key)]
            if self.require_client_cert:
                command += ["--client-ca", str(self.tls.ca)]
        if self.insecure:
            command.append("--insecure")
        return command

    def start(self) -> str:
        """Start serving; the address it listens on."""
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self._command(), stdout=subprocess.PIPE, stderr=log, start_new_session=True
        )
        log.close()
        line = self._first_line(self.process)
        prefix = "listening on "
        if not line.startswith(prefix):
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"plugin did not start (said {line!r}):\n{tail}")
        self.address = line.removeprefix(prefix).strip()
        return self.address

    def _first_line(self, process: subprocess.Popen[bytes]) -> str:
        # A thread reads the line so a plugin that hangs cannot hang the test past the deadline.
        assert process.stdout is not None
        stdout = process.stdout
        got: list[str] = []
        reader = threading.Thread(
            target=lambda: got.append(stdout.readline().decode()), daemon=True
        )
        reader.start()
        reader.join(START_SECONDS)
        return got[0] if got else ""

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, and its exit code (SIGKILL after 30 s: then negative)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode
