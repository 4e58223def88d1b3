"""The controller is pure: neither its package nor any project module it imports (followed
transitively) imports asyncio, aiohttp, sockets, threads, subprocesses or the clock. Third-party
and standard-library internals are not followed: only what the project's own code asks for."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "aiohttp", "socket", "ssl", "selectors", "threading", "subprocess", "time", "datetime",
             "uvloop", "concurrent", "multiprocessing", "signal"}
PROJECT = {"appmaster", "protocol", "psruntime", "models", "rm", "nodemanager", "sim", "elastane", "elastane_cli"}


def _module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    for cand in (path.with_suffix(".py"), path / "__init__.py"):
        if cand.exists():
            return cand
    return None


def _imports(file: Path, module: str) -> set[str]:
    tree = ast.parse(file.read_text())
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)      # `from pkg import module`
    return out


def closure(start: str) -> dict[str, set[str]]:
    """Every project module reachable from `start`'s package, with what each imports."""
    seen: dict[str, set[str]] = {}
    todo = [start]
    pkg_dir = ROOT.joinpath(*start.split("."))
    todo += [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in pkg_dir.rglob("*.py")]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        file = _module_file(mod)
        if file is None:
            continue
        seen[mod] = _imports(file, mod)
        todo += [m for m in seen[mod] if m.split(".")[0] in PROJECT]
    return seen


def test_controller_imports_nothing_of_io_or_the_clock() -> None:
    graph = closure("appmaster.ps.controller")
    assert "appmaster.ps.controller.core" in graph and "appmaster.ps.controller.planners.eps" in graph
    offenders = {mod: sorted(i for i in imps if i.split(".")[0] in FORBIDDEN) for mod, imps in graph.items()}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_the_walk_would_notice_an_offender() -> None:
    graph = closure("appmaster.ps.runtime.executor_pool")      # the AM's I/O side: it does import asyncio
    assert any(i.split(".")[0] in FORBIDDEN for imps in graph.values() for i in imps)
