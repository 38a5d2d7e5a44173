"""Secret env values sealed for one VM: the ciphertext rides in user_data, the passphrase over SSH.

A VM's cloud-init ``user_data`` is stored by the cloud and served to the VM by its metadata
service, which any process on the VM (the pod's container included) may read. Secret env values
therefore travel in it sealed, and the passphrase that opens them reaches the VM later, over the
agent's SSH connection to it (whose host key the agent knows in advance). See
``vk_provider_adapters.lambda_cloud.vmwatch`` for the whole threat model.

The format is exactly what ``openssl enc -aes-256-ctr -pbkdf2 -iter 1000 -md sha256`` writes:
``b"Salted__"`` + an 8-byte salt + the AES-256-CTR ciphertext, whose key and IV are
PBKDF2-HMAC-SHA256(passphrase, salt, 1000 iterations, 48 bytes). The boot script opens it with
``OPEN_COMMAND``, reading the passphrase from a root-only file (``-pass file:``), so neither the
key nor the passphrase is ever on a command line.

Invariants:
- Deterministic: the salt is HMAC-SHA256(passphrase, plaintext)[:8], so the same spec gives the
  same user_data, and two different plaintexts sealed with one passphrase get different salts,
  hence different (key, IV) pairs: CTR never reuses a key stream.
- The passphrase is high-entropy (32 random-looking bytes, hex; derived per VM by the caller),
  so one PBKDF2 iteration count is as good as any: no one guesses it.
- Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MAGIC: Final = b"Salted__"
ITERATIONS: Final = 1000
_KEY_BYTES: Final = 32
_IV_BYTES: Final = 16
_SALT_BYTES: Final = 8

# The boot script's inverse of ``seal``: $1 passphrase file, $2 sealed file, $3 output file.
OPEN_COMMAND: Final = (
    f'openssl enc -d -aes-256-ctr -pbkdf2 -iter {ITERATIONS} -md sha256 -pass "file:$1" '
    '-in "$2" -out "$3"'
)


def _key_and_iv(passphrase: str, salt: bytes) -> tuple[bytes, bytes]:
    derived = hashlib.pbkdf2_hmac(
        "sha256", passphrase.encode(), salt, ITERATIONS, _KEY_BYTES + _IV_BYTES
    )
    return derived[:_KEY_BYTES], derived[_KEY_BYTES:]


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    transform = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return transform.update(data) + transform.finalize()


def seal(plaintext: bytes, passphrase: str) -> bytes:
    """``plaintext`` as ``openssl enc -aes-256-ctr -pbkdf2`` would seal it (see above)."""
    if not passphrase:
        raise ValueError("an empty passphrase seals nothing")
    salt = hmac.new(passphrase.encode(), plaintext, hashlib.sha256).digest()[:_SALT_BYTES]
    key, iv = _key_and_iv(passphrase, salt)
    return MAGIC + salt + _ctr(key, iv, plaintext)


def unseal(sealed: bytes, passphrase: str) -> bytes:
    """The inverse of ``seal`` (what ``OPEN_COMMAND`` does on the VM)."""
    if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + _SALT_BYTES:
        raise ValueError("not a sealed document")
    salt = sealed[len(MAGIC) : len(MAGIC) + _SALT_BYTES]
    key, iv = _key_and_iv(passphrase, salt)
    return _ctr(key, iv, sealed[len(MAGIC) + _SALT_BYTES :])
