"""Every repository path the README names exists (issue 16: README claims must be checkable).

A path is a `code span`, a link or an image target whose first component is a top-level entry of
the repository (``docs/mini_repro/curves.png``, ``rewards/refine.py``, ``configs/reward/``); a
``path::test_name`` reference must also name a test defined in that file, and ``pkg/module.name`` a
function or class that ``pkg/module.py`` defines.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CANDIDATE = re.compile(r"```.*?```|`[^`]+`|\]\([^)\s]+\)", re.S)


def readme_paths(text: str, top_level: set[str]) -> list[str]:
    """Repository paths named in ``text``: words of code spans, code blocks and link targets whose
    first component is in ``top_level``.

    Worked example: "see `rewards/refine.py` and [curves](docs/x.png), run `bash scripts/a.sh`" with
    top_level {"rewards", "docs", "scripts"} -> ["rewards/refine.py", "docs/x.png", "scripts/a.sh"].
    """
    found = []
    for match in _CANDIDATE.finditer(text):
        for token in match.group(0).strip("`]()").split():
            token = token.strip("`'\"").rstrip(".,;:")
            # "=*<>$" and "...": overrides, globs and placeholders (outputs/.../plan.yaml), not paths.
            if token.startswith(("http://", "https://")) or any(c in token for c in "=*<>$") or "..." in token:
                continue
            first = token.split("::")[0].split("/")[0]
            if first in top_level and ("/" in token or "." in first):
                found.append(token)
    return found


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


def test_readme_paths_worked_example():
    text = "see `rewards/refine.py` and [curves](docs/x.png), run `bash scripts/a.sh` or `python -m mathtask.grade`"
    assert readme_paths(text, {"rewards", "docs", "scripts"}) == ["rewards/refine.py", "docs/x.png", "scripts/a.sh"]
    assert _exists("rewards/refine.py") and _exists("rewards/refine.delta_batched")
    assert _exists("tests/rewards/test_refine.py::test_clip_worked_example")
    assert not _exists("rewards/refine.no_such_function") and not _exists("rewards/no_such_file.py")


def test_every_path_the_readme_names_exists():
    top_level = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} - {"README.md"}
    paths = readme_paths((ROOT / "README.md").read_text(encoding="utf-8"), top_level)
    assert len(paths) > 10  # the README does name files; an empty list would mean the pattern broke
    missing = [ref for ref in paths if not _exists(ref)]
    assert not missing, f"README.md names paths that are not in the repository: {missing}"
