"""A real OpenSSH server for the tests: Debian's ``openssh-server``, extracted, never installed.

``ensure_sshd()`` returns the ``sshd`` binary from a version-keyed cache,
``$XDG_CACHE_HOME/vk-provider/bin/openssh-server-<debian version>/`` (``~/.cache`` by default),
filling it on first use: ``apt-get download`` of ``openssh-server`` and of those of its library
dependencies that are not installed (on Debian 12: ``libwrap0``), ``dpkg -x`` of each into a
temporary directory, ``ldd`` to check every shared library resolves (with the extracted ones on
``LD_LIBRARY_PATH``), then one rename into the cache. Nothing is installed and no daemon is
started. A machine without package lists gets ``apt-get update`` first (as root). The Debian
part is the dev tooling's ``vk_provider_dev.cluster.flip.debian`` (Prometheus comes the same
way). A root
process also needs what Debian's postinst would make for privilege separation: the system user
``sshd`` and ``/run/sshd`` (created when missing; sshd refuses to start as root without them).
``python -m tests.openssh`` does all this ahead of the tests (``scripts/test`` runs it).

``Sshd`` runs one ``sshd -D`` on a loopback address with its own host key, configuration and
authorized_keys in a temporary directory. Every command runs through a ``ForceCommand``
wrapper that puts the test's fake tools first on ``PATH``, whatever the user's shell startup
files do. The process dies with its parent (``PR_SET_PDEATHSIG``) and ``stop`` kills it: no
sshd outlives a test, even one that fails or is interrupted.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.flip import debian

PACKAGE: Final = "openssh-server"
SSHD: Final = "usr/sbin/sshd"
_PR_SET_PDEATHSIG: Final = 1


class SshdUnavailable(RuntimeError):
    """sshd could not be obtained; the message says what to do."""


@dataclass(frozen=True, slots=True)
class SshdBinary:
    path: Path
    library_path: str  # for LD_LIBRARY_PATH ("" when none is needed)

    def environment(self) -> dict[str, str]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        if self.library_path:
            env["LD_LIBRARY_PATH"] = self.library_path
        return env


def _run(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise SshdUnavailable(
            f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-500:]}"
        )
    return result.stdout


def _check_sshd(root: Path, library_path: str) -> None:
    """Refuse an extraction whose sshd needs a library that is neither here nor extracted."""
    env = {**os.environ, "LD_LIBRARY_PATH": library_path}
    result = subprocess.run(
        ["ldd", str(root / SSHD)], capture_output=True, text=True, env=env, check=False
    )
    unresolved = [line.split()[0] for line in result.stdout.splitlines() if "not found" in line]
    if unresolved:
        raise debian.PackageUnavailable(
            f"the extracted sshd needs {', '.join(unresolved)}: apt-get install {PACKAGE} instead"
        )


def _privilege_separation() -> None:
    """What sshd needs to start as root (Debian's postinst makes both)."""
    if os.geteuid() != 0:
        return
    if subprocess.run(["getent", "passwd", "sshd"], capture_output=True, check=False).returncode:
        _run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/run/sshd",
                "--shell",
                "/usr/sbin/nologin",
                "sshd",
            ]
        )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


def ensure_sshd() -> SshdBinary:
    """The cached sshd, extracted first if needed (see the module docstring)."""
    if shutil.which("apt-get") is None:
        installed = Path("/usr/sbin/sshd")
        if installed.exists():
            return SshdBinary(installed, "")
        raise SshdUnavailable("no apt-get and no /usr/sbin/sshd: install OpenSSH's server")
    try:
        extracted = debian.ensure_extracted(PACKAGE, libraries=True, check=_check_sshd)
    except debian.PackageUnavailable as exc:
        raise SshdUnavailable(str(exc)) from exc
    _privilege_separation()
    return SshdBinary(extracted.path(SSHD), extracted.library_path)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Sshd:
    """One ``sshd -D`` on ``address:port`` (see the module docstring)."""

    def __init__(
        self,
        binary: SshdBinary,
        *,
        directory: Path,
        address: str,
        port: int,
        host_key: str,
        authorized_keys: Sequence[str],
        path: Sequence[Path],
        env: dict[str, str],
        workdir: Path | None = None,
    ) -> None:
        """``path`` goes first on PATH, ``env`` into every session's environment; commands
        run in ``workdir`` (default: the user's home)."""
        self.address, self.port = address, port
        self.directory = directory
        self.log = directory / "sshd.log"
        directory.mkdir(parents=True, exist_ok=True)
        key = directory / "host_key"
        key.write_text(host_key if host_key.endswith("\n") else host_key + "\n")
        key.chmod(0o600)
        (directory / "authorized_keys").write_text("".join(k + "\n" for k in authorized_keys))
        exports = "".join(f"export {name}='{value}'\n" for name, value in env.items())
        wrapper = directory / "vm-shell"
        search = ":".join(str(p) for p in path)
        chdir = f"cd '{workdir}' || exit 1\n" if workdir is not None else ""
        wrapper.write_text(
            f'#!/bin/sh\nexport PATH="{search}:/usr/sbin:/usr/bin:/sbin:/bin"\n{exports}{chdir}'
            'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
        )
        wrapper.chmod(0o755)
        config = directory / "sshd_config"
        config.write_text(
            f"ListenAddress {address}:{port}\n"
            f"HostKey {key}\n"
            f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
            f"PidFile {directory / 'sshd.pid'}\n"
            f"ForceCommand {wrapper}\n"
            "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UseDNS no\nPrintMotd no\nMaxSessions 32\nLogLevel VERBOSE\n"
        )
        self._argv = [str(binary.path), "-D", "-e", "-f", str(config)]
        self._env = binary.environment()
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 20.0) -> None:
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                self._argv,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # Its own process group, so that stop() ends the connections' children too.
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise SshdUnavailable(f"sshd exited at start: {self.log.read_text()[-1000:]}")
            if "Server listening" in self.log.read_text(errors="replace"):
                return
            time.sleep(0.02)
        self.stop()
        raise SshdUnavailable(f"sshd did not listen within {timeout}s: {self.log.read_text()}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is not None:
            with contextlib.suppress(ProcessLookupError):  # its connections' children
                os.killpg(process.pid, signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def logins(self) -> int:
        """How many logins sshd accepted so far."""
        return self.log.read_text(errors="replace").count("Accepted publickey")


def main() -> int:
    started = time.monotonic()
    try:
        binary = ensure_sshd()
    except SshdUnavailable as exc:
        print(f"sshd for the tests: {exc}", file=sys.stderr)
        return 1
    print(f"sshd for the tests: {binary.path} ({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
