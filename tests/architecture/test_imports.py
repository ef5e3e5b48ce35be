"""The house plan holds: no import cycle among the project's modules
(function-local imports counted), and every function-local import says
why it is local. The layers themselves are `make lint`'s lint-imports
contract (pyproject.toml); this test runs the same contracts too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sessions_app", "approvals_app", "policies_app", "terret_site")


def project_modules() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts]


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm over the module graph: the cycles, as components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(10_000)

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_the_projects_modules() -> None:
    graph = grimp.build_graph(*PACKAGES)  # every import statement, function-local ones included
    assert len(graph.modules) > 100  # the whole project was read
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert strongly_connected(graph) == [["p.a", "p.b", "p.c"]]


def local_imports_without_a_reason(path: Path) -> list[str]:
    """Imports of the project inside a function with no comment on the
    line or in the three lines above (apps.py's ready() included)."""
    source = path.read_text()
    lines = source.splitlines()
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if not any(n.split(".")[0] in PACKAGES or node.__dict__.get("level") for n in names):
                continue
            window = lines[max(0, node.lineno - 4) : node.lineno]
            if not any("#" in line for line in window):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_every_function_local_import_says_why() -> None:
    missing = [where for path in project_modules() for where in local_imports_without_a_reason(path)]
    assert missing == []


def test_the_reason_check_flags_a_silent_local_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    x = 1\n    from sessions_app import log\n    return log\n")
    assert len(local_imports_without_a_reason_at(module)) == 1
    module.write_text("def f():\n    # imported here: the SDK is slow to import\n    from sessions_app import log\n")
    assert local_imports_without_a_reason_at(module) == []


def local_imports_without_a_reason_at(path: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, path.parent
    try:
        return local_imports_without_a_reason(path)
    finally:
        ROOT = saved


def test_the_layers_contract_is_kept() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"SECRET_KEY": "tests-only", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout
