"""No function in the package code is longer than 60 lines unless it says why it must stay whole.

Counted: every function and method (nested ones too) in ``trainer/ rewards/ models/ reallocation/
eval/`` and ``train.py``, from its ``def`` line to its last line as ``ruff format`` writes it
(decorators not counted). Entry points beside the packages (``bench/``, ``scripts/``, ``tests/``)
are not counted.

The convention for a function that is right as one piece: a line of its docstring, or a comment
inside it, that starts with ``Kept whole:`` followed by the reason, e.g.::

    def nodes_equal(gold, answer, ops):
        \"\"\"Whether ``answer`` states ``gold`` under the grading policy.

        Kept whole: it is one ordered table of cases over the pair of node kinds ...
        \"\"\"

or ``# Kept whole: the rounds must be posted in this order on every rank``. Give the reason, not a
line count (counts go stale).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.test_layers import layer_order

ROOT = Path(__file__).resolve().parents[1]
# Every package of the README's layer line (tests/test_layers.py reads the same line).
PACKAGES = tuple(layer_order((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")))
SINGLE_FILES = ("train.py",)
MAX_LINES = 60
MARKER = re.compile(r"^\s*(#\s*)?Kept whole:\s*\S")

# Functions another helper is splitting in the same session (issue 14): remove each entry when
# its function is under the limit or carries a `Kept whole:` reason. Nothing else goes here.
PENDING: set[str] = set()


def package_files(root: Path) -> Iterator[Path]:
    for package in PACKAGES:
        yield from (p.relative_to(root) for p in sorted((root / package).rglob("*.py")))
    for name in SINGLE_FILES:
        if (root / name).exists():
            yield Path(name)


def long_functions(root: Path, max_lines: int = MAX_LINES) -> list[tuple[str, int, bool]]:
    """(``path:name``, lines, says why it stays whole) for every function over ``max_lines``."""
    found = []
    for rel in package_files(root):
        source = (root / rel).read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, filename=str(rel))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            assert node.end_lineno is not None  # set by ast.parse
            length = node.end_lineno - node.lineno + 1
            if length > max_lines:
                body = lines[node.lineno - 1 : node.end_lineno]
                found.append((f"{rel}:{node.name}", length, any(MARKER.match(line) for line in body)))
    return found


def test_long_functions_say_why_they_stay_whole():
    unexplained = [
        f"{name} ({length} lines)"
        for name, length, explained in long_functions(ROOT)
        if not explained and name not in PENDING
    ]
    assert unexplained == [], (
        f"functions over {MAX_LINES} lines without a 'Kept whole:' reason: split them along their seams, "
        "or say why they must stay whole"
    )


def test_pending_entries_are_still_needed():
    """An entry for a function that is now short (or explained) must go, so the list only shrinks."""
    unexplained = {name for name, _, explained in long_functions(ROOT) if not explained}
    assert sorted(PENDING - unexplained) == []


def test_checker_counts_lines_and_reads_the_marker(tmp_path):
    def body(indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(60))

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "a.py").write_text(
        "def short():\n    return 1\n\n\n"
        f"def long():\n{body('    ')}\n\n"  # def + 60 lines = 61
        f'def explained():\n    """Doc.\n\n    Kept whole: one table.\n    """\n{body("    ")}\n\n'
        # a marker without a reason does not count
        f"class C:\n    def method(self):\n        # Kept whole:\n{body('        ')}"
    )
    (tmp_path / "train.py").write_text(f"def main():\n{body('    ')}")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text(f"def not_counted():\n{body('    ')}")
    assert long_functions(tmp_path) == [
        ("eval/a.py:long", 61, False),
        ("eval/a.py:explained", 65, True),
        ("eval/a.py:method", 62, False),
        ("train.py:main", 61, False),
    ]
    assert long_functions(tmp_path, max_lines=61) == [
        ("eval/a.py:explained", 65, True),
        ("eval/a.py:method", 62, False),
    ]
