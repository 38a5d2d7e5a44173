"""The agent's SSH identity on Lambda, and the keys it derives for each VM from it.

**The key pair.** From ``ssh_private_key`` (a ``SecretRef``: OpenSSH or PEM, unencrypted;
ed25519, ECDSA or RSA) or else ``<provider state dir>/ssh/id_ed25519``, an ed25519 key generated
there once (mode 0600 in a 0700 directory). Its public half is what the adapter registers with
Lambda's SSH-key API under ``ssh_key_name`` and what launches name, so every VM lets the agent
in (``vk_provider_adapters.lambda_cloud.sshkeys``).

**Per VM**, from the private key with HKDF-SHA256 (info: provider name and request id):

- the VM's **SSH host key** (ed25519). Its private half goes to the VM in cloud-init's
  ``ssh_keys``; its public half is the only host key the agent accepts from that VM. The VM is
  thus authenticated from the first connection on: no trust on first use, no known_hosts file.
- the **passphrase** of the VM's sealed secret environment (``vk_provider_adapters.sealed_env``),
  sent to the VM over that authenticated connection.

Derived, not stored: nothing per VM is kept on the agent's disk, and an agent that restarts
knows every VM's keys again from the request id in its tags. Someone who learns one VM's keys
learns nothing of another's, nor of the agent's key.

Invariants: the private key is never in a message, a log line or a ``repr``; the same private
key, provider and request id always give the same host key and passphrase.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

import asyncssh
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from vk_provider.sdk import ConfigError, SecretRef
from vk_provider_adapters.cloud_init import HostKey

KEY_FILE: Final = Path("ssh") / "id_ed25519"
_SALT: Final = b"vk-provider/lambda: keys of one VM"
_SupportedKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class AgentKey:
    """The agent's private key, and what it derives per VM (see the module docstring)."""

    def __init__(self, private_text: str, *, provider: str, origin: str) -> None:
        """``private_text``: an unencrypted OpenSSH or PEM private key; ``origin`` says where
        it came from in errors (a reference or a path, never the key)."""
        self._provider = provider
        self.origin = origin
        data = private_text.strip().encode() + b"\n"
        try:
            key: object
            if b"OPENSSH PRIVATE KEY" in data:
                key = serialization.load_ssh_private_key(data, password=None)
            else:
                key = serialization.load_pem_private_key(data, password=None)
            self._ssh_key = asyncssh.import_private_key(data)
        except (ValueError, TypeError, asyncssh.KeyImportError) as exc:
            raise ConfigError(
                f"SSH private key {origin}: not an unencrypted OpenSSH or PEM private key "
                f"({type(exc).__name__})"
            ) from None
        if not isinstance(key, _SupportedKey):
            raise ConfigError(f"SSH private key {origin}: use an ed25519, ECDSA or RSA key")
        self._seed = key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self.public = (
            key.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )
        self._host_keys: dict[str, HostKey] = {}

    def __repr__(self) -> str:
        return f"AgentKey({self.fingerprint}, from {self.origin})"

    @classmethod
    def load(
        cls, *, reference: SecretRef | None, state_dir: Path | None, provider: str
    ) -> AgentKey:
        """The configured key, else the one in ``state_dir`` (generated there if absent)."""
        if reference is not None:
            return cls(reference.resolve(), provider=provider, origin=reference.ref)
        if state_dir is None:
            raise ConfigError(
                f"provider {provider}: ssh_private_key is not set and there is no state "
                "directory to keep a generated key in"
            )
        path = state_dir / KEY_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = _generate(path)
        except OSError as exc:
            raise ConfigError(f"SSH private key {path}: cannot read it ({exc.strerror})") from exc
        return cls(text, provider=provider, origin=str(path))

    @property
    def ssh_key(self) -> asyncssh.SSHKey:
        """The private key, as asyncssh logs in with it."""
        return self._ssh_key

    @property
    def fingerprint(self) -> str:
        return self._ssh_key.get_fingerprint("sha256")

    def host_key(self, request_id: str) -> HostKey:
        """The SSH host key of the VM that runs ``request_id``."""
        known = self._host_keys.get(request_id)
        if known is None:
            seed = self._derive("ssh host key", request_id)
            private = ed25519.Ed25519PrivateKey.from_private_bytes(seed)
            known = HostKey(
                private_openssh=private.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.OpenSSH,
                    serialization.NoEncryption(),
                ).decode(),
                public=private.public_key()
                .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
                .decode(),
            )
            # Cached so that two launch bodies for one request are the same bytes (OpenSSH's
            # private key format carries a random check number).
            self._host_keys[request_id] = known
        return known

    def host_public_key(self, request_id: str) -> asyncssh.SSHKey:
        return asyncssh.import_public_key(self.host_key(request_id).public)

    def env_passphrase(self, request_id: str) -> str:
        """The passphrase of the sealed secret environment of ``request_id``'s VM."""
        return self._derive("secret environment", request_id).hex()

    def _derive(self, purpose: str, request_id: str) -> bytes:
        info = f"{purpose}\0{self._provider}\0{request_id}".encode()
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info).derive(self._seed)


def _generate(path: Path) -> str:
    """A new ed25519 key at ``path`` (0600, its directory 0700), written atomically."""
    text = (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        try:
            os.link(partial, path)  # never replaces a key another process wrote meanwhile
        except FileExistsError:
            text = path.read_text()
        finally:
            with contextlib.suppress(OSError):
                partial.unlink()
    except OSError as exc:
        raise ConfigError(
            f"SSH private key {path}: cannot create it ({exc.strerror}); set ssh_private_key"
        ) from exc
    return text
