"""The agent's public key in Lambda's SSH-key API: found by name, added when missing.

``GET /ssh-keys`` lists the account's keys (``SSHKey``: id, name, public_key); ``POST
/ssh-keys`` with a name and a public key adds one (``AddSSHKeyRequest``). A launch names one
key (``ssh_key_names``: the API takes exactly one), which Lambda installs for the VM's
``ubuntu`` user: the agent's, registered under the configured ``ssh_key_name``. People's keys
go to the VM through cloud-init instead (``authorized_keys``).

Registration is idempotent by name: a key of that name with the agent's public key is used as
it is (whatever its comment); a missing one is added; one with another public key is refused
(``AuthFailed``: every launch of this provider would make VMs the agent cannot read), naming
both fingerprints' owner, never a key.

``ensure_registered`` is that flow, around an injected ``call`` (the adapter's one API call).

Invariants: the parsers are pure; foreign keys' shapes are tolerated, ours must be well
formed (``MalformedResponse``); no message carries a key, only its fingerprint.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from vk_provider.sdk import AuthFailed, InvalidSpec
from vk_provider_adapters.lambda_cloud.agentkey import AgentKey
from vk_provider_adapters.payload import array, obj, string

log = logging.getLogger(__name__)

KeyOperation = Literal["list ssh keys", "add ssh key"]
# One call of the SSH-key API: GET /ssh-keys (no body) or POST /ssh-keys (a body).
KeyCall = Callable[[KeyOperation, Mapping[str, object] | None], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class RegisteredKey:
    """One ``SSHKey`` of the account."""

    key_id: str
    name: str
    public_key: str


def parse_ssh_keys(data: object) -> list[RegisteredKey]:
    """The keys of ``GET /ssh-keys``' ``data``; entries without a name are skipped."""
    keys = []
    for index, raw in enumerate(array(data, "data")):
        item = obj(raw, f"data[{index}]")
        name, public_key, key_id = item.get("name"), item.get("public_key"), item.get("id")
        if isinstance(name, str) and isinstance(public_key, str):
            keys.append(RegisteredKey(key_id if isinstance(key_id, str) else "", name, public_key))
    return keys


def parse_added_key(data: object) -> RegisteredKey:
    """The ``SSHKey`` that ``POST /ssh-keys`` answers with."""
    item = obj(data, "data")
    return RegisteredKey(
        string(item, "id", "data"), string(item, "name", "data"), string(item, "public_key", "data")
    )


def named(keys: list[RegisteredKey], name: str) -> RegisteredKey | None:
    return next((key for key in keys if key.name == name), None)


def same_public_key(left: str, right: str) -> bool:
    """Whether two ``authorized_keys`` lines are one key (type and data; comments aside)."""
    return left.split()[:2] == right.split()[:2]


def add_request(name: str, public_key: str) -> dict[str, object]:
    """The body of ``POST /ssh-keys`` (``AddSSHKeyRequest``)."""
    return {"name": name, "public_key": public_key}


async def ensure_registered(call: KeyCall, *, name: str, key: AgentKey, provider: str) -> None:
    """The account holds ``key``'s public half under ``name`` afterwards, or this raises
    ``AuthFailed`` (another public key has the name; Lambda refused ours)."""
    found = named(parse_ssh_keys(await call("list ssh keys", None)), name)
    if found is None:
        try:
            found = parse_added_key(await call("add ssh key", add_request(name, key.public)))
        except InvalidSpec as exc:
            # Refused; if someone added the name meanwhile, judge that key instead.
            found = named(parse_ssh_keys(await call("list ssh keys", None)), name)
            if found is None:
                raise AuthFailed(
                    f"Lambda refused the agent's SSH key as {name!r}: {exc}", provider=provider
                ) from exc
        else:
            log.info("%s: registered the agent's SSH key %s as %r", provider, key.fingerprint, name)
    if not same_public_key(found.public_key, key.public):
        raise AuthFailed(
            f"the Lambda SSH key {name!r} is another public key than the agent's "
            f"({key.fingerprint}, from {key.origin}): VMs launched with it could not be read. "
            "Give its private key as ssh_private_key, or name a new key in ssh_key_name",
            provider=provider,
        )
