"""Every import in the project (function-level ones too) against the README's layer order, and no circles.

The order is read from the README's `Layers, top to bottom:` line, so the rule people read is the
rule that is checked. A package imports only packages below it; entry points (train.py, bench/,
scripts/, tests/, a package's __main__.py) may import any package and nothing imports them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".cache", ".git", "data", "docs", "outputs", "multirun", "configs", "realm.egg-info"}
ENTRY_DIRS = {"bench", "scripts", "tests"}


def layer_order(readme: str) -> list[str]:
    """``Layers, top to bottom: `a` > `b` > `c``` -> ["a", "b", "c"]."""
    match = re.search(r"^Layers, top to bottom: (.+)$", readme, re.MULTILINE)
    if match is None:
        raise ValueError("README.md has no line 'Layers, top to bottom: `pkg` > `pkg` > ...'")
    return re.findall(r"`([a-z_]+)`", match.group(1))


def python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not SKIP_DIRS.intersection(rel.parts[:-1]) and not rel.parts[0].startswith("."):
            yield rel


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(rel: Path, source: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import statement anywhere in the file.

    ``from pkg import name`` yields ``pkg.name`` too, since ``name`` may be a submodule; a name that is
    not a module is dropped by the caller (it is not in the project's module set).
    """
    package = module_name(rel).split(".")
    if rel.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(source, filename=str(rel))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def import_graph(root: Path) -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    """Project modules (name -> path) and, per module, the project modules it imports (-> a line)."""
    files = {module_name(rel): rel for rel in python_files(root)}
    graph: dict[str, dict[str, int]] = {}
    for name, rel in files.items():
        edges: dict[str, int] = {}
        for line, target in imported_modules(rel, (root / rel).read_text(encoding="utf-8")):
            if target in files and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return files, graph


def is_entry_point(rel: Path) -> bool:
    return len(rel.parts) == 1 or rel.parts[0] in ENTRY_DIRS or rel.name == "__main__.py"


def layer_violations(root: Path, order: list[str]) -> list[str]:
    files, graph = import_graph(root)
    rank = {package: i for i, package in enumerate(order)}
    out = []
    for name, edges in graph.items():
        rel = files[name]
        source = rel.parts[0]
        for target, line in edges.items():
            target_rel = files[target]
            if is_entry_point(target_rel) and not is_entry_point(rel):
                out.append(f"{rel}:{line}: imports entry point {target}")
            if is_entry_point(rel) or target_rel.parts[0] == source:
                continue
            if source not in rank or target_rel.parts[0] not in rank:
                unknown = source if source not in rank else target_rel.parts[0]
                out.append(f"{rel}:{line}: package {unknown!r} is not in the README's layer order")
            elif rank[target_rel.parts[0]] <= rank[source]:
                out.append(f"{rel}:{line}: {source} imports {target}, which is not below it")
    return out


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_readme_names_every_package_once():
    order = layer_order((ROOT / "README.md").read_text(encoding="utf-8"))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - ENTRY_DIRS
    assert sorted(order) == sorted(packages) and len(set(order)) == len(order), order


def test_every_import_follows_the_layer_order():
    order = layer_order((ROOT / "README.md").read_text(encoding="utf-8"))
    assert layer_violations(ROOT, order) == []


def test_no_modules_import_each_other_in_a_circle():
    _, graph = import_graph(ROOT)
    assert circles(graph) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_checker_finds_an_upward_function_level_import_and_a_circle(tmp_path):
    root = _tree(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/a.py": "def f():\n    from high.b import g\n",  # upward, hidden in a function
            "low/c.py": "from . import d\n",  # relative: low.c -> low.d -> low.c
            "low/d.py": "from low import c\n",
            "high/__init__.py": "",
            "high/b.py": "from low.a import f\ng = 1\n",
            "high/__main__.py": "import high.b\n",
            "tests/test_x.py": "import high.b\nimport low.a\n",
        },
    )
    assert layer_violations(root, ["high", "low"]) == ["low/a.py:2: low imports high.b, which is not below it"]
    assert circles(import_graph(root)[1]) == [["high.b", "low.a"], ["low.c", "low.d"]]
    assert layer_violations(root, ["low"]) == [
        "high/b.py:1: package 'high' is not in the README's layer order",
        "low/a.py:2: package 'high' is not in the README's layer order",
    ]


def test_layer_line_must_be_in_the_readme():
    assert layer_order("Layers, top to bottom: `trainer` > `eval`\n") == ["trainer", "eval"]
    with pytest.raises(ValueError, match="Layers, top to bottom"):
        layer_order("no such line")


def _third_party_importers(root: Path, top: str) -> set[str]:
    """Project modules with any import (function-level too) of the third-party package ``top``."""
    files, _ = import_graph(root)
    return {
        name
        for name, rel in files.items()
        if not is_entry_point(rel)
        and any(t == top or t.startswith(top + ".") for _, t in imported_modules(rel, (root / rel).read_text()))
    }


def test_vllm_and_ray_each_have_one_home():
    assert _third_party_importers(ROOT, "vllm") == {"models.vllm_engine"}
    assert _third_party_importers(ROOT, "ray") == {"runtime.placement"}


def test_the_runtime_is_split_by_where_code_runs():
    """Topology is pure (no process group, no Ray, no device code); the device process never reaches
    back into the driver or the placement that hosts it."""
    files, graph = import_graph(ROOT)
    pure = {"runtime.topology", "runtime.meshes"}
    for name in pure:
        assert not [t for t in graph[name] if t.startswith("runtime.") and t not in pure], name
        assert not _imports_any(files[name], ("torch.distributed", "ray")), name
    for name in (n for n in files if n.startswith("runtime.device")):
        assert not [t for t in graph[name] if t in ("runtime.driver", "runtime.placement")], name


def _imports_any(rel: Path, tops: tuple[str, ...]) -> list[str]:
    return [
        t
        for _, t in imported_modules(rel, (ROOT / rel).read_text())
        if any(t == p or t.startswith(p + ".") for p in tops)
    ]
