"""Readers of the JSON a provider answers with: one set, shared by every HTTP adapter.

An adapter's parsers read a decoded JSON document through these functions. Each reader names
the path it reads (``where``: ``data[0].instance_type``), so an answer this adapter cannot read
fails as ``MalformedResponse`` saying what was wrong, and ``vk_provider_adapters.http`` turns that
into a ``Transient`` naming the call. Two kinds of readers:

- strict (``obj``, ``array``, ``field``, ``string``, ``number``): the document must have the
  shape, or ``MalformedResponse``;
- lenient (``mapping``, ``text``, ``as_number``, ``timestamp``): an absent or odd value reads as
  empty (``{}``, ``""``, None), for fields whose absence means "not known yet".

Invariants: pure; the only exception raised is ``MalformedResponse``; a message names paths,
keys and JSON kinds, never a value (values may hold secrets the provider echoed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime


class MalformedResponse(ValueError):
    """An answer whose shape the adapter cannot read; ``vk_provider_adapters.http`` makes it
    ``Transient``. The message names what is wrong, never a value."""


def kind(value: object) -> str:
    """The JSON kind of ``value`` as a Python type name (``null`` for None)."""
    return "null" if value is None else type(value).__name__


# --- strict -------------------------------------------------------------------------------


def obj(value: object, where: str) -> Mapping[str, object]:
    """``value`` as a JSON object."""
    if not isinstance(value, Mapping):
        raise MalformedResponse(f"{where} is {kind(value)}, expected an object")
    return value


def array(value: object, where: str) -> Sequence[object]:
    """``value`` as a JSON array."""
    if not isinstance(value, list):
        raise MalformedResponse(f"{where} is {kind(value)}, expected an array")
    return value


def field(value: Mapping[str, object], key: str, where: str) -> object:
    """``value[key]``, which must be present (it may be null)."""
    if key not in value:
        raise MalformedResponse(f"{where} has no {key!r}")
    return value[key]


def string(value: Mapping[str, object], key: str, where: str, *, nonempty: bool = False) -> str:
    """``value[key]`` as a string (``nonempty``: and not ``""``)."""
    got = field(value, key, where)
    if not isinstance(got, str) or (nonempty and not got):
        wanted = "a non-empty string" if nonempty else "a string"
        raise MalformedResponse(f"{where}.{key} is {kind(got)}, expected {wanted}")
    return got


def number(value: Mapping[str, object], key: str, where: str) -> float:
    """``value[key]`` as a finite JSON number."""
    got = field(value, key, where)
    if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(got):
        raise MalformedResponse(f"{where}.{key} is {kind(got)}, expected a number")
    return float(got)


def items(body: object, where: str) -> list[Mapping[str, object]]:
    """The objects of a list answer's ``items`` (Kubernetes lists); other entries skipped."""
    found = body.get("items") if isinstance(body, Mapping) else None
    if not isinstance(found, list):
        raise MalformedResponse(f"{where}: 'items' is missing or not a list")
    return [item for item in found if isinstance(item, Mapping)]


# --- lenient ------------------------------------------------------------------------------


def mapping(value: object, where: str) -> Mapping[str, object]:
    """``value`` as a JSON object; null or absent is ``{}``."""
    return {} if value is None else obj(value, where)


def text(value: Mapping[str, object], key: str) -> str:
    """``value[key]`` when it is a string, else ``""``."""
    got = value.get(key)
    return got if isinstance(got, str) else ""


def as_number(value: object) -> float | None:
    """A finite JSON number, or a numeric string (as RunPod's ``costPerHr`` is documented);
    None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value)
        except ValueError:
            return None
    else:
        return None
    return result if math.isfinite(result) else None


def timestamp(value: object) -> datetime | None:
    """An RFC 3339 timestamp (``Z`` or an offset; none means UTC); None when unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
