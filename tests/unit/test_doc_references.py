"""Every reference to a document in the repository's files points at something that exists.

Checked in every tracked text file (code, docs, charts, manifests, scripts):

- markdown links to local files, ``[text](path)`` and ``[text](path#anchor)``, resolved
  from the linking file's folder; ``#anchor`` alone points into the same file;
- paths to markdown files in prose and comments (``docs/operator.md``,
  ``docs/operator.md#client-cleanup``, ``thunder-api.md``), resolved from the repository
  root, the file's folder or ``docs/``;
- section citations by number, ``thunder-api.md 2.7``, ``docs/thunder-api.md 5, item 3``,
  ``thunder-api.md section 2``, lists such as ``thunder-api.md 2.7, 2.8``: the cited file
  must have a heading numbered so (``### 2.7 ...``);
- no reference to a document that is not in the repository (the old architecture
  notes, anything under a ``shared`` folder beside the checkout), and no citation of "the
  contract" by number without naming the file.

Anchors are computed from headings the way GitHub renders them. The checker itself is
tested on small trees written here.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TEXT_SUFFIXES = frozenset(
    {".py", ".md", ".txt", ".yaml", ".yml", ".sh", ".tpl", ".toml", ".cfg", ".ini", ".go"}
)
TEXT_NAMES = frozenset({"Makefile", "Dockerfile"})
# Built from parts, so this file does not hold the strings it forbids.
_OLD_NOTES = "architecture" + ".md"
FORBIDDEN: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(re.escape(_OLD_NOTES)), "a document that is not in the repository"),
    (re.compile(r"\(architecture: "), "a citation of a document that is not in the repository"),
    (re.compile(r"\.\./" + "shared" + r"\b"), "a path outside the repository"),
    (re.compile(r"/work/" + "shared" + r"\b"), "a path outside the repository"),
    (
        re.compile(r"\b[Cc]ontract(?:'s)? (?:section \d|\d+\.\d)"),
        'a section number without its file (write "thunder-api.md 2.7")',
    ),
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
_NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?(?:\s|$)")
_MD_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_MD_PATH = re.compile(r"(?<![\w/.@-])((?:\.\.?/)*(?:[\w.-]+/)*[\w-][\w.-]*\.md)(#[\w-]+)?\b")
_NUM = r"\d+(?:\.\d+)*"
_CITATION = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.md),?(?: section)? (" + _NUM + r")(?![\w.]*\w)"
    r"((?:(?:, |,? and |,? or | - |/| to )\d+\.\d+(?![\d.]*\d))*)"
)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = []
    for char in text:
        if char in " -_" or char.isalnum() or unicodedata.category(char).startswith("M"):
            kept.append(char)
    return "".join(kept).replace(" ", "-")


@dataclass
class Doc:
    """What a markdown file offers to references: anchors and numbered sections."""

    anchors: set[str] = field(default_factory=set)
    sections: set[str] = field(default_factory=set)


def _lines_outside_fences(text: str) -> Iterator[tuple[int, str]]:
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def parse_doc(text: str) -> Doc:
    doc = Doc()
    seen: dict[str, int] = {}
    for _, line in _lines_outside_fences(text):
        doc.anchors.update(_HTML_ID.findall(line))
        heading = _HEADING.match(line)
        if heading is None:
            continue
        title = heading.group(2)
        base = github_anchor(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        doc.anchors.add(base if count == 0 else f"{base}-{count}")
        numbered = _NUMBERED.match(title)
        if numbered:
            doc.sections.add(numbered.group(1))
    return doc


class Checker:
    """Finds dangling references in the files ``paths`` (relative to ``root``)."""

    def __init__(self, root: Path, paths: Iterable[str], exempt: Iterable[str] = ()) -> None:
        self.root = root
        self.paths = sorted(paths)
        self.exempt = set(exempt)
        self._docs: dict[Path, Doc] = {}

    def _doc(self, path: Path) -> Doc:
        if path not in self._docs:
            self._docs[path] = parse_doc(path.read_text(encoding="utf-8", errors="replace"))
        return self._docs[path]

    def _resolve(self, source: Path, target: str, *, link: bool) -> Path | None:
        """The existing file ``target`` names, seen from ``source``; None if there is none.

        A link is relative to its file. A path in prose may be relative to the repository,
        the file or ``docs/``; a bare file name may also name any tracked file of that name.
        """
        bases = [source.parent] if link else [self.root, source.parent, self.root / "docs"]
        for base in bases:
            candidate = (base / target).resolve()
            if candidate.exists() and candidate.is_relative_to(self.root):
                return candidate
        if not link and "/" not in target:
            named = [rel for rel in self.paths if Path(rel).name == target]
            if named:
                return self.root / named[0]
        return None

    def _anchor_problem(self, file: Path, anchor: str) -> str | None:
        if file.suffix != ".md" or not anchor:
            return None
        if anchor in self._doc(file).anchors:
            return None
        return f"no heading with anchor #{anchor} in {file.relative_to(self.root)}"

    def problems(self) -> list[str]:
        found: list[str] = []
        for rel in self.paths:
            if rel in self.exempt:
                continue
            path = self.root / rel
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = _lines_outside_fences(text) if path.suffix == ".md" else _numbered(text)
            for number, line in lines:
                for problem in self._line_problems(path, line):
                    found.append(f"{rel}:{number}: {problem}")
        return found

    def _line_problems(self, path: Path, line: str) -> Iterator[str]:
        for pattern, why in FORBIDDEN:
            for match in pattern.finditer(line):
                yield f"{match.group(0)!r}: {why}"
        if path.suffix == ".md":
            for match in _MD_LINK.finditer(line):
                yield from self._link_problems(path, match.group(1))
        prose = _URL.sub(" ", _MD_LINK.sub(" ", line)) if path.suffix == ".md" else line
        prose = _URL.sub(" ", prose)
        for match in _MD_PATH.finditer(prose):
            target, anchor = match.group(1), (match.group(2) or "#")[1:]
            file = self._resolve(path, target, link=False)
            if file is None:
                yield f"{match.group(0)!r}: no such file"
                continue
            problem = self._anchor_problem(file, anchor)
            if problem:
                yield f"{match.group(0)!r}: {problem}"
        for match in _CITATION.finditer(_URL.sub(" ", line)):
            file = self._resolve(path, match.group(1), link=False)
            if file is None:
                continue  # reported above as a missing file
            numbers = [match.group(2), *re.findall(r"\d+\.\d+", match.group(3))]
            sections = self._doc(file).sections
            for section in numbers:
                if section not in sections:
                    name = file.relative_to(self.root)
                    yield f"{match.group(0)!r}: no section {section} in {name}"

    def _link_problems(self, path: Path, target: str) -> Iterator[str]:
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            return  # a URL or mailto:, not a local file
        file_part, _, anchor = target.partition("#")
        if not file_part:
            file: Path | None = path
        else:
            file = self._resolve(path, file_part, link=True)
        if file is None:
            yield f"link {target!r}: no such file"
            return
        problem = self._anchor_problem(file, anchor)
        if problem:
            yield f"link {target!r}: {problem}"


def _numbered(text: str) -> Iterator[tuple[int, str]]:
    yield from enumerate(text.splitlines(), start=1)


def is_text_file(rel: str) -> bool:
    path = Path(rel)
    return path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES or rel.endswith(".md.tmpl")


def tracked_files(root: Path) -> list[str]:
    """The repository's tracked text files (a checkout without git: every file)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
        ).stdout.decode()
        names = [name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache"}
        names = [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(root).parts)
        ]
    return [name for name in names if is_text_file(name) and (root / name).is_file()]


SELF = str(Path(__file__).resolve().relative_to(REPO))


def test_every_doc_reference_in_the_repository_exists() -> None:
    files = tracked_files(REPO)
    assert "docs/thunder-api.md" in files
    problems = Checker(REPO, files, exempt=[SELF]).problems()
    assert not problems, "dangling doc references:\n" + "\n".join(problems)


def test_the_thunder_api_contract_numbers_the_sections_code_cites() -> None:
    doc = parse_doc((REPO / "docs/thunder-api.md").read_text())
    wanted = {"1", "1.1", "1.2", "1.3", "2", "3", "4", "5", "6", "7"}
    wanted |= {f"2.{n}" for n in range(1, 11)} | {f"3.{n}" for n in range(1, 5)}
    wanted |= {f"6.{n}" for n in range(1, 5)} | {f"7.{n}" for n in range(1, 7)}
    assert wanted <= doc.sections, sorted(wanted - doc.sections)


# The checker on small trees


def _check(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return Checker(tmp_path, files).problems()


DOCS = {
    "docs/api.md": "# API\n\n## 2. Endpoints\n\n### 2.7 Unenroll: `DELETE /x/{id}`\n\n"
    "## Node enrollment (serving nodes)\n\n## Node enrollment (serving nodes)\n\n"
    "```\n## 9.9 inside a fence\n```\n",
    "README.md": "# Top\n",
}


@pytest.mark.parametrize(
    "text",
    [
        "x = 1  # api.md 2.7",
        '"""Unenroll (docs/api.md 2.7)."""',
        "# api.md section 2, and api.md 2.7/2.7",
        "# docs/api.md#27-unenroll-delete-xid",
        "# docs/api.md#node-enrollment-serving-nodes-1",
        "# README.md#top and https://example.com/missing.md#nowhere",
        "# see [the API](docs/api.md#2-endpoints)",
    ],
)
def test_the_checker_accepts_references_that_exist(tmp_path: Path, text: str) -> None:
    assert _check(tmp_path, {**DOCS, "mod.py": text + "\n"}) == []


@pytest.mark.parametrize(
    ("name", "text", "wanted"),
    [
        ("mod.py", "# api.md 2.8", "no section 2.8 in docs/api.md"),
        ("mod.py", "# thunder-api.md 2.7", "'thunder-api.md': no such file"),
        ("mod.py", "# docs/api.md 2.7, 3.1", "no section 3.1 in docs/api.md"),
        ("mod.py", "# docs/api.md 9.9", "no section 9.9 in docs/api.md"),
        ("mod.py", "# docs/api.md#2-endpoint", "no heading with anchor #2-endpoint"),
        ("mod.py", "# docs/nothing.md", "'docs/nothing.md': no such file"),
        ("mod.py", "# as in " + _OLD_NOTES, "a document that is not in the repository"),
        ("mod.py", "# (architecture: reaper)", "a citation of a document that is not"),
        ("mod.py", "# see ../" + "shared/docs/x", "a path outside the repository"),
        ("mod.py", "# see /work/" + "shared/seed", "a path outside the repository"),
        ("mod.py", "# contract 2.7", "a section number without its file"),
        ("docs/more.md", "[api](api.md#nowhere)", "link 'api.md#nowhere': no heading"),
        ("docs/more.md", "[api](../docs/gone.md)", "link '../docs/gone.md': no such file"),
        ("docs/more.md", "[here](#missing)", "link '#missing': no heading"),
    ],
)
def test_the_checker_names_each_dangling_reference(
    tmp_path: Path, name: str, text: str, wanted: str
) -> None:
    problems = _check(tmp_path, {**DOCS, name: text + "\n"})
    assert problems, "nothing reported"
    assert all(problem.startswith(f"{name}:1: ") for problem in problems), problems
    assert any(wanted in problem for problem in problems), problems


def test_github_anchors() -> None:
    assert github_anchor("2.7 Unenroll: `DELETE /api/v1/x/{id}/node` (confirmed)") == (
        "27-unenroll-delete-apiv1xidnode-confirmed"
    )
    assert github_anchor("Admin endpoints (`/_admin/`, unauthenticated)") == (
        "admin-endpoints-_admin-unauthenticated"
    )
    assert github_anchor("CDI environment edits: what the container really gets") == (
        "cdi-environment-edits-what-the-container-really-gets"
    )
