"""Reading a YAML configuration file within bounds: what ``load_config`` parses, or why not.

A configuration is a few kilobytes written by a person, so a file that is not UTF-8, larger
than ``MAX_BYTES``, nested deeper than ``MAX_DEPTH`` lists and mappings, or holding more than
``MAX_VALUES`` values is refused before anything walks it.

Aliases: ``yaml.safe_load`` builds each alias as the very object of its anchor, so loading
itself is linear in the file, even for a "billion laughs" (nine aliases a level, nine levels:
9**9 values from 342 bytes). Everything that walks the result afterwards pays the expansion:
validation, error messages, dumping, and recursion through an alias of its own anchor
(``&a [*a]``) never ends. Anchors are useful in a configuration (offers shared by two
providers), so aliases are not refused; they are counted as what they stand for: the values
and the depth limits hold once every alias is expanded, and an alias into itself is deeper
than any limit. ``MAX_VALUES`` bounds time too: the pure-Python parser (``yaml.safe_load``'s)
takes a few seconds to compose 100,000 values, so composing stops there, aliases or not.

``read_yaml`` is meant for every configuration file the command line reads, the agent's
(``load_config``) and a plugin's single provider entry alike; ``parse_yaml`` and
``parse_yaml_all`` for YAML text from elsewhere (a kubeconfig from a Secret, a manifest on
standard input).

Invariants:
- ``read_yaml`` returns what ``yaml.safe_load`` would, or raises ``ConfigError`` whose message
  starts with the file's path and says why (with the byte offset, or the line and column).
- Nothing recurses deeper than ``MAX_DEPTH`` levels, so no file raises ``RecursionError``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import CollectionNode, MappingNode, Node

from vk_provider.settings.secrets import ConfigError

MAX_BYTES = 1024 * 1024
"""Largest configuration file read (1 MiB)."""

MAX_DEPTH = 64
"""Most lists and mappings nested in one another, the top-level mapping included."""

MAX_VALUES = 100_000
"""Most values (scalars, lists, mappings, keys included) once every alias is expanded."""


class _Bounds(yaml.YAMLError):
    """A limit this module sets was passed; the message says which, and where."""


def _where(mark: yaml.Mark | None) -> str:
    return "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that stops composing past ``MAX_DEPTH`` (the composer recurses
    once a level) or ``MAX_VALUES`` (each costs time), and names the line of a value it
    cannot build (``ValueError``)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        opens = self.check_event(yaml.CollectionStartEvent)  # peeks: now current_event
        at: yaml.Mark | None = self.current_event.start_mark
        self._values += 1  # an alias is one here, at least one expanded: stop early
        if self._values > MAX_VALUES:
            raise _Bounds(f"more than {MAX_VALUES} values ({_where(at)})")
        if opens:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Bounds(
                    f"lists and mappings nested deeper than {MAX_DEPTH} levels ({_where(at)})"
                )
        try:
            return super().compose_node(parent, index)
        finally:
            if opens:
                self._depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> object:
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:  # a date that does not exist, an int of 5000 digits
            raise ConstructorError(
                None, None, f"cannot build this value: {exc}", node.start_mark
            ) from exc


def _children(node: CollectionNode) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value)


def _too_deep(node: Node) -> _Bounds:
    return _Bounds(
        f"lists and mappings nested deeper than {MAX_DEPTH} levels once its aliases are "
        f"expanded ({_where(node.start_mark)})"
    )


def _measure(node: Node, level: int, seen: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """``(height, values)`` of ``node`` with its aliases expanded, memoised by node (an alias
    is its anchor's node); raises ``_Bounds`` past ``MAX_DEPTH`` or ``MAX_VALUES``. ``level``
    counts the collections from the top down to ``node``, so recursion stops at the limit,
    and an alias into itself, never memoised while it is measured, stops there too."""
    if not isinstance(node, CollectionNode):
        return 0, 1
    known = seen.get(id(node))
    if known is None:
        if level > MAX_DEPTH:
            raise _too_deep(node)
        height, values = 1, 1
        for child in _children(node):
            child_height, child_values = _measure(child, level + 1, seen)
            height = max(height, child_height + 1)
            values += child_values
            if values > MAX_VALUES:
                raise _Bounds(
                    f"more than {MAX_VALUES} values once its aliases are expanded "
                    f"({_where(node.start_mark)})"
                )
        known = seen[id(node)] = height, values
    elif level + known[0] - 1 > MAX_DEPTH:
        raise _too_deep(node)
    return known


def read_text(path: Path) -> str:
    """The file's text: at most ``MAX_BYTES``, UTF-8 (a byte order mark is allowed)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_BYTES} bytes (1 MiB), the limit for a configuration file"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = raw[exc.start]
        raise ConfigError(
            f"{path}: not UTF-8: byte 0x{byte:02x} at offset {exc.start} ({exc.reason}); "
            "save the file as UTF-8"
        ) from exc


def parse_yaml(text: str, name: str = "<unicode string>") -> object:
    """``yaml.safe_load(text)`` within the bounds; ``yaml.YAMLError`` says why not, and where
    (``name``, line and column)."""
    loader = _BoundedLoader(text)
    loader.name = name
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, 1, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_yaml_all(text: str, name: str = "<unicode string>") -> list[object]:
    """``list(yaml.safe_load_all(text))`` within the bounds, each document on its own (the
    values limit counts all of them: a stream of many small documents costs time too)."""
    loader = _BoundedLoader(text)
    loader.name = name
    documents: list[object] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                _measure(node, 1, {})
                documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def read_yaml(path: Path) -> object:
    """The document in the YAML file at ``path``; ``ConfigError`` names the file and why not."""
    text = read_text(path)
    try:
        return parse_yaml(text, name=str(path))
    except _Bounds as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
