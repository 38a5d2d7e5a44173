"""The repository stands alone: nothing in it cites a file that is not in it.

Two checks over the files git knows (tracked, plus new ones not ignored):

- no file names a document that lives outside the repository (the specification and notes
  the project was written from) or a path under a ``shared/`` directory beside it; the
  contract is ``docs/reference.md``, the providers' API documents are
  ``tests/fixtures/provider-apis/``;
- every relative link ``](path)`` or ``](path#anchor)`` in README.md and docs/*.md leads to a
  file of the repository and, for a Markdown target, to a heading it has.

The forbidden names are built from pieces, so this file does not name them itself.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

_MD = "." + "md"
OUTSIDE_DOCUMENTS = tuple(
    stem + _MD
    for stem in (
        "PRO" + "DUCT",
        "STY" + "LE",
        "FLIP-" + "COMPONENTS",
        "ARCHITECTURE-" + "REVIEW",
        "LOCAL-" + "CLUSTER",
    )
)
# A path that starts at a directory called shared (not a segment inside a longer path).
OUTSIDE_PATH = re.compile(r"(?<![\w./-])" + "sha" + r"red/")
OUTSIDE = re.compile("|".join(re.escape(n) for n in OUTSIDE_DOCUMENTS) + "|" + OUTSIDE_PATH.pattern)

LINK = re.compile(r"\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _git_files() -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing to list the repository's files with")
    return sorted({p for p in listed.decode().split("\0") if p and (ROOT / p).is_file()})


def _text(path: str) -> str | None:
    data = (ROOT / path).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _outside_lines(path: str, text: str) -> list[str]:
    return [
        f"{path}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if OUTSIDE.search(line)
    ]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found: list[str] = []
    for path in _git_files():
        if path == THIS:
            continue
        text = _text(path)
        if text is not None:
            found += _outside_lines(path, text)
    assert not found, "files cite documents outside the repository:\n" + "\n".join(found)


def test_the_check_catches_each_outside_name() -> None:
    for name in OUTSIDE_DOCUMENTS:
        assert _outside_lines("x", f"see {name} for more"), name
    assert _outside_lines("x", "from ``" + "sha" + "red/provider-apis``")
    assert not _outside_lines("x", "tests/fixtures/provider-apis/README.md, a shared emptyDir")


# --------------------------------------------------------------------------- Markdown links


def _lines_outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line not inside a fenced code block."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()  # a link: its text
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _number, line in _lines_outside_fences(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


def _markdown_pages() -> list[str]:
    return [p for p in _git_files() if p == "README.md" or re.fullmatch(r"docs/[^/]+\.md", p)]


def _broken_links(page: str) -> list[str]:
    source = ROOT / page
    broken = []
    for number, line in _lines_outside_fences(source.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (source.parent / file_part).resolve() if file_part else source
            where = f"{page}:{number}: {target}"
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{where}: no such file in the repository")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{where}: no heading #{anchor} in {resolved.name}")
    return broken


def test_relative_links_in_readme_and_docs_lead_somewhere() -> None:
    pages = _markdown_pages()
    assert "README.md" in pages
    assert "docs/reference.md" in pages
    broken = [b for page in pages for b in _broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slugs_follow_github() -> None:
    assert _slug("Where would a pod go? (`vk-provider place`)") == (
        "where-would-a-pod-go-vk-provider-place"
    )
    assert _slug("Offers by GPU, and `-o json`") == "offers-by-gpu-and--o-json"
    assert _slug("`identity`: who the agent is to the API server") == (
        "identity-who-the-agent-is-to-the-api-server"
    )


def test_reference_has_its_stable_anchors() -> None:
    """Code and docs cite these headings of docs/reference.md: renaming one breaks them."""
    anchors = _anchors(ROOT / "docs" / "reference.md")
    cited = {
        "exit-codes",
        "cli-commands",
        "configuration",
        "the-virtual-node",
        "annotations",
        "written-by-the-agent",
        "written-by-the-user",
        "events",
        "placement",
        "failover",
        "rest-api",
        "kubelet-api",
        "overflow-flip",
        "hand-over",
        "plugin-protocol",
    }
    assert cited <= anchors, sorted(cited - anchors)


def test_cited_doc_anchors_exist() -> None:
    """``docs/PAGE.md#anchor`` written anywhere (code comments included) names a heading."""
    cite = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")
    missing = []
    for path in _git_files():
        text = _text(path) if path != THIS else None
        for page, anchor in cite.findall(text or ""):
            target = ROOT / "docs" / page
            if not target.is_file() or anchor not in _anchors(target):
                missing.append(f"{path}: docs/{page}#{anchor}")
    assert not missing, "citations of missing headings:\n" + "\n".join(missing)
