"""The README and the pages under docs/ can be trusted as a map: every repository path they name exists,
every relative link resolves (to a heading, when it names one), and the README stays short.

A path is a `code span`, a word of a code block, or a link or image target. In a code span or block, a word
whose first component is a tracked top-level entry of the repository is a path from the repository root
(``docs/mini_repro/curves.png``, ``rewards/refine.py``, ``configs/reward/``); a ``path::test_name``
reference must also name a test defined in that file, and ``pkg/module.name`` a function or class that
``pkg/module.py`` defines. A link target is relative to the page that holds it, as a reader's browser
resolves it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_README_LINES = 250

_CANDIDATE = re.compile(r"```.*?```|`[^`]+`|\]\([^)\s]+\)", re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def top_level() -> set[str]:
    """The repository's tracked top-level entries (a local outputs/ or multirun/ is not one)."""
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = {line.split("/")[0] for line in tracked.splitlines() if line}
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: what is on disk
        names = {p.name for p in ROOT.iterdir()}
    return {n for n in names if not n.startswith(".")} - {"README.md"}


def readme_paths(text: str, top_level: set[str]) -> list[str]:
    """Repository paths named in ``text``: words of code spans and code blocks whose first component is in
    ``top_level``.

    Worked example: "see `rewards/refine.py`, run `bash scripts/a.sh`" with top_level {"rewards", "scripts"}
    -> ["rewards/refine.py", "scripts/a.sh"].
    """
    found = []
    for match in _CANDIDATE.finditer(text):
        if match.group(0).startswith("]("):
            continue  # a link: relative to its page (links_of)
        for token in match.group(0).strip("`").split():
            token = token.strip("`'\"()").rstrip(".,;:")
            # "=*<>$" and "...": overrides, globs and placeholders (outputs/.../plan.yaml), not paths.
            if token.startswith(("http://", "https://")) or any(c in token for c in "=*<>$") or "..." in token:
                continue
            first = token.split("::")[0].split("/")[0]
            if first in top_level and ("/" in token or "." in first):
                found.append(token)
    return found


def links_of(text: str) -> list[str]:
    """Relative link and image targets (web addresses left out): "[a](b.md#c) [d](https://e)" -> ["b.md#c"]."""
    return [t for t in _LINK.findall(text) if not t.startswith(("http://", "https://", "mailto:"))]


def heading_anchors(text: str) -> set[str]:
    """The anchors a Markdown renderer gives the headings: "## The critic's value loss" -> the-critics-value-loss."""
    anchors = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _defines(path: Path, name: str) -> bool:
    return bool(re.search(rf"^\s*(def|class) {re.escape(name)}\b", path.read_text(encoding="utf-8"), re.M))


def _exists(ref: str) -> bool:
    """``path``, ``path::test_name`` (the file defines it) or ``pkg/module.name`` (pkg/module.py defines it)."""
    path, _, name = ref.partition("::")
    target = ROOT / path
    if target.exists():
        return not name or _defines(target, name)
    module, _, attribute = path.rpartition(".")
    return bool(module) and (ROOT / f"{module}.py").is_file() and _defines(ROOT / f"{module}.py", attribute)


def _resolves(page: Path, link: str) -> bool:
    target, _, anchor = link.partition("#")
    path = (page.parent / target).resolve() if target else page
    if not path.exists():
        return False
    return not anchor or path.suffix != ".md" or anchor in heading_anchors(path.read_text(encoding="utf-8"))


def test_worked_examples():
    text = "see `rewards/refine.py` and [curves](docs/x.png), run `bash scripts/a.sh` or `python -m mathtask.grade`"
    assert readme_paths(text, {"rewards", "docs", "scripts"}) == ["rewards/refine.py", "scripts/a.sh"]
    assert links_of(text) == ["docs/x.png"]
    assert heading_anchors("# Title\n## The critic's value loss\n") == {"title", "the-critics-value-loss"}
    assert _exists("rewards/refine.py") and _exists("rewards/refine.delta_batched")
    assert _exists("tests/rewards/test_refine.py::test_clip_worked_example")
    assert not _exists("rewards/refine.no_such_function") and not _exists("rewards/no_such_file.py")
    assert _resolves(ROOT / "README.md", "docs/rewards.md#the-critics-value-loss")
    assert not _resolves(ROOT / "README.md", "docs/rewards.md#no-such-heading")
    assert "outputs" not in top_level() and "trainer" in top_level()


def test_every_path_the_readme_and_docs_name_exists():
    names = top_level()
    paths = {page.relative_to(ROOT): readme_paths(page.read_text(encoding="utf-8"), names) for page in pages()}
    assert len(paths[Path("README.md")]) > 10  # the README does name files; none would mean the pattern broke
    missing = {str(page): [ref for ref in refs if not _exists(ref)] for page, refs in paths.items()}
    assert not {page: refs for page, refs in missing.items() if refs}, "pages name paths not in the repository"


def test_every_relative_link_resolves():
    broken = {
        str(page.relative_to(ROOT)): [
            link for link in links_of(page.read_text(encoding="utf-8")) if not _resolves(page, link)
        ]
        for page in pages()
    }
    assert not {page: links for page, links in broken.items() if links}, "links that do not resolve"


def test_readme_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= MAX_README_LINES
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in links_of(readme)}
    top_pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert top_pages <= linked, f"docs pages the README does not link: {sorted(p.name for p in top_pages - linked)}"
