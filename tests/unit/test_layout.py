"""The layout holds: no import circle, imports one way, each folder about one thing.

Read from the source with ``ast`` (nothing is imported), lazy imports inside functions
included: a circle that only closes at run time is still a circle to a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "targets", "worker", "local", "producer")
#: Who may import whom: a package imports only those before it.
ORDER = ("ledger", "targets", "worker", "local", "producer", "bench")
#: producer/'s root: the CLI and the run verbs. Everything else lives in a subpackage.
PRODUCER_ROOT = {"__init__.py", "cli.py", "cli_common.py", "cli_errors.py", "cli_worker.py", "submit.py", "submit_checks.py",
                 "run_config.py", "sampling_profiles.py", "retry.py", "clean.py"}


def _modules(*tops: str) -> dict[str, Path]:
    found = {}
    for top in tops:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` (or their packages) that ``name`` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return out


def _graph(*tops: str) -> dict[str, set[str]]:
    known = _modules(*tops)
    return {name: {d for d in _imports(name, path, known) if d in known and d != name}
            for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_packages_have_no_import_circle():
    graph = _graph(*PACKAGES)
    # A package's __init__ is imported with each of its modules: ignore that edge, keep the rest.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    assert _cycles(graph) == []


def test_imports_go_one_way_ledger_targets_worker_local_producer_bench():
    graph = _graph(*ORDER, "tests")
    wrong = [f"{m} -> {d}" for m, deps in graph.items() for d in deps
             if m.split(".")[0] in ORDER and (d.split(".")[0] == "tests"
                                              or ORDER.index(d.split(".")[0]) > ORDER.index(m.split(".")[0]))]
    assert wrong == []


def test_the_producer_root_holds_only_the_cli_and_the_run_verbs():
    assert {p.name for p in (ROOT / "producer").glob("*.py")} == PRODUCER_ROOT


def test_every_package_has_a_map_and_is_listed_for_setuptools():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for init in sorted(p for top in PACKAGES for p in (ROOT / top).rglob("__init__.py")):
        package = ".".join(init.parent.relative_to(ROOT).parts)
        assert package in listed, f"{package} is missing from pyproject.toml's packages"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} has no map"


def test_the_worker_root_holds_at_most_ten_modules_and_its_rooms():
    """worker/ is grouped into rooms named after what they serve (issue 35), not a flat folder."""
    root_modules = {p.name for p in (ROOT / "worker").glob("*.py")}
    assert len(root_modules) <= 10, sorted(root_modules)
    rooms = {p.name for p in (ROOT / "worker").iterdir() if (p / "__init__.py").exists()}
    assert {"engine", "conversation", "batches", "process", "measure", "tiny"} <= rooms


def test_the_ledger_holds_only_the_ledger():
    """Templates and parsers live in targets/, local servers in local/, process deaths in worker/process/."""
    names = {p.stem for p in (ROOT / "ledger").glob("*.py")}
    strays = {n for n in names if any(w in n for w in ("template", "parser", "local", "orphan"))}
    assert strays == set()


def test_parser_choice_and_parsing_live_in_one_package():
    found = {".".join(p.relative_to(ROOT).with_suffix("").parts)
             for top in PACKAGES for p in (ROOT / top).rglob("*pars*.py")}
    assert found and {name.split(".")[0] for name in found} == {"targets"}, found


def test_no_production_module_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for top in PACKAGES for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}
