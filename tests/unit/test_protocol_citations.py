"""Every section the code and the docs cite exists: a ``PROTOCOL.md §6.4`` in
``tunnel/PROTOCOL.md`` (the normative spec), a ``§N7.2`` in
``tunnel/IMPLEMENTATION.md`` (the implementation notes, numbered N1, N2, ...).

Where a citation is read:

- in ``tunnel/`` (code and both documents) a bare ``§6.4`` means the spec;
- in ``edge/``, ``origin/``, ``geoedge/`` and the repository's docs only an
  explicit ``PROTOCOL.md §6.4`` does, since a bare ``§`` there is as likely an
  RFC's or the PROXY protocol spec's;
- a ``§N7`` means the notes everywhere;
- a ``§`` that continues a list (``PROTOCOL.md §6.5.1, §6.7``, ``§8-§10``)
  belongs to the document the list started with, so ``RFC 9113 §8.2, §8.3``
  is skipped as a whole.

The same pure functions are tried on made-up text first, so that the real
check cannot pass by finding nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = "PROTOCOL.md"
NOTES = "IMPLEMENTATION.md"
PACKAGES = ("tunnel", "edge", "origin", "geoedge")
#: Repository docs outside the packages that cite the protocol.
DOCS = ("README.md", "docs/*.md", "deploy/config/*.toml")

_HEADING = re.compile(r"^#{2,4} (N?\d+(?:\.\d+)*)\.? ", re.MULTILINE)
_SECTION = re.compile(r"§(N?\d+(?:\.\d+)*)")
#: The document named right before a "§": ours, or one whose sections we skip.
_DOC_BEFORE = re.compile(
    r"(PROTOCOL\.md|IMPLEMENTATION\.md|STYLE\.md|DESIGN\.md|RFC\s?\d+|[Ss]pec)`?\s*$"
)
#: What may stand between two citations of one list.
_LIST_JOINER = re.compile(r"\s*(?:,|-|\u2013|/|and|or)?\s*")  # \u2013: en dash


def sections(document: str) -> set[str]:
    """The numbers of a document's headings: "6.5.1" in the spec, "N7.2" in the notes."""
    return set(_HEADING.findall(document))


def citations(text: str, *, bare_means_spec: bool) -> list[tuple[str, str]]:
    """(document, section) of every citation of the spec or the notes in ``text``."""
    found: list[tuple[str, str]] = []
    previous_end = -1
    previous_doc: str | None = None
    for match in _SECTION.finditer(text):
        section = match.group(1)
        named = _DOC_BEFORE.search(text, max(0, match.start() - 20), match.start())
        continues = previous_end >= 0 and _LIST_JOINER.fullmatch(text, previous_end, match.start())
        if named:
            doc: str | None = named.group(1) if named.group(1) in (SPEC, NOTES) else None
        elif section.startswith("N"):
            doc = NOTES
        elif continues:
            doc = previous_doc
        else:
            doc = SPEC if bare_means_spec else None
        if doc is not None:
            found.append((doc, section))
        previous_end, previous_doc = match.end(), doc
    return found


def broken_citations(
    files: dict[str, tuple[str, bool]], spec_sections: set[str], notes_sections: set[str]
) -> dict[str, list[str]]:
    """Citations that name no existing section, by file; ``files`` maps a name
    to its text and whether a bare "§" in it means the spec."""
    known = {SPEC: spec_sections, NOTES: notes_sections}
    broken: dict[str, list[str]] = {}
    for name, (text, bare_means_spec) in sorted(files.items()):
        for doc, section in citations(text, bare_means_spec=bare_means_spec):
            if section not in known[doc]:
                broken.setdefault(name, []).append(f"{doc} §{section}")
    return broken


def sources() -> dict[str, tuple[str, bool]]:
    """Every file whose citations are checked, with its reading rule."""
    files: dict[str, tuple[str, bool]] = {}
    for package in PACKAGES:
        paths = [*(ROOT / package).rglob("*.py"), *(ROOT / package).glob("*.md")]
        for path in paths:
            files[str(path.relative_to(ROOT))] = (path.read_text(), package == "tunnel")
    for pattern in DOCS:
        for path in ROOT.glob(pattern):
            files[str(path.relative_to(ROOT))] = (path.read_text(), False)
    return files


def _documents() -> tuple[set[str], set[str]]:
    spec = sections((ROOT / "tunnel" / SPEC).read_text())
    notes = sections((ROOT / "tunnel" / NOTES).read_text())
    return spec, notes


# -- the finder, on made-up text ---------------------------------------------------------


def test_the_finder_reads_citations_as_the_docs_define_them() -> None:
    text = (
        "(PROTOCOL.md §6.5.1, §6.7) and `tunnel/PROTOCOL.md` §8-§10, §7.1\u2013§7.3; "
        "the notes §N7.2 or IMPLEMENTATION.md §N1; RFC 9113 §8.2, §8.3; STYLE.md §11; "
        "spec §2.2; bare §4."
    )
    explicit = [
        (SPEC, "6.5.1"),
        (SPEC, "6.7"),
        (SPEC, "8"),
        (SPEC, "10"),
        (SPEC, "7.1"),
        (SPEC, "7.3"),
        (NOTES, "N7.2"),
        (NOTES, "N1"),
    ]
    assert citations(text, bare_means_spec=False) == explicit
    assert citations(text, bare_means_spec=True) == [*explicit, (SPEC, "4")]


def test_the_headings_give_the_sections() -> None:
    document = "# Title\n## 6. Streams\n### 6.5 Reset\n#### 6.5.1 IDLE\n## N7. Notes\n### N7.2 X\n"
    assert sections(document) == {"6", "6.5", "6.5.1", "N7", "N7.2"}


def test_a_citation_of_a_missing_section_is_reported() -> None:
    files = {
        "tunnel/mux/x.py": ("PROTOCOL.md §6.4 and §99.1; §N7, §N99", True),
        "edge/y.py": ("PROTOCOL.md §N7 (a note cited as the spec); IMPLEMENTATION.md §7", False),
        "origin/z.py": ("RFC 9112 §99; bare §99 outside tunnel/ is not ours", False),
    }
    assert broken_citations(files, {"6", "6.4"}, {"N7"}) == {
        "edge/y.py": ["PROTOCOL.md §N7", "IMPLEMENTATION.md §7"],
        "tunnel/mux/x.py": ["PROTOCOL.md §99.1", "IMPLEMENTATION.md §N99"],
    }


# -- the real documents and code ---------------------------------------------------------


def test_both_documents_have_their_numbered_sections() -> None:
    spec, notes = _documents()
    assert {"1", "2.1", "3.1", "5.12", "6.5.1", "6.6", "7.5", "8.6", "13"} <= spec
    assert {"N1", "N7", "N7.4", "N8.1", "N10"} <= notes
    assert not any(s.startswith("N") for s in spec)
    assert all(s.startswith("N") for s in notes)


def test_every_section_the_code_and_docs_cite_exists() -> None:
    spec, notes = _documents()
    files = sources()
    citing = {
        name.split("/")[0]
        for name, (text, bare) in files.items()
        if citations(text, bare_means_spec=bare)
    }
    assert {"tunnel", "edge", "origin", "docs"} <= citing, "no citations found"
    assert broken_citations(files, spec, notes) == {}


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_within_the_two_documents_resolves() -> None:
    for name in (SPEC, NOTES):
        path = ROOT / "tunnel" / name
        text = path.read_text()
        anchors = {_slug(h) for h in re.findall(r"^#{1,4} (.+)$", text, flags=re.MULTILINE)}
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith("#"):
                assert target[1:] in anchors, f"{name}: no heading for {target}"
            elif "://" not in target:
                assert (path.parent / target).exists(), f"{name}: no file {target}"
