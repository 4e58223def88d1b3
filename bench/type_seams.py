"""Type seams: how much of the tree's public surface is typed `Any`, and how many JSON-ish dicts.

    .venv/bin/python bench/type_seams.py [--rev REV] [--list sigs|dicts] [--package NAME]

Counts two things with the `ast` module (no imports of the counted code, no regexes over text):

- `public_any_signatures`: public function definitions whose annotations mention `Any`.
- `dict_str_any`: occurrences of a `dict[str, Any]`-like type.

Prints a summary, then one JSON object as the last line: the two totals, the per-package breakdown,
the targets and the rules below (`rules`). `--rev REV` counts the tree of a commit (read with
`git show`, the working tree untouched), so a change can be compared with the commit it started
from in one sitting. `--list sigs` / `--list dicts` prints every counted item as `path:line`.

Rules
-----
Which code: every top-level Python package of the repository (a top-level folder with an
`__init__.py`), found anew on each run so that packages added later are counted, except `tests`,
`bench` and `examples`. All `*.py` files under them.

Module-level aliases: an assignment at module level (also inside a module-level `if` / `try`; of an
`if TYPE_CHECKING: ... else: ...`, the branch a type checker reads: the first) of one name to a type
expression (a subscript, an `X | Y` union, a name or an
attribute), an annotated `X: TypeAlias = ...`, a `type X = ...` statement and `X = NewType("X", T)`
are aliases. An alias counts like the type it stands for, through any chain of aliases and of
`from ... import` / `import ... as` (re-exports included): a signature that uses `JsonDict` where
`JsonDict = dict[str, Any]` mentions `Any` and is one `dict[str, Any]` use.

Mentions `Any`: the expression contains the name `Any` (or `typing.Any`, `t.Any`...), or a name that
resolves to an alias whose type mentions `Any`, at any depth (`Callable[..., Any]`, `list[Any]`,
`PSApp[Any, Any]`). String annotations (forward references) are parsed and looked into.

Public signature: a `def` or `async def` whose name does not start with `_` (so dunders such as
`__init__` are not counted), that is not nested in a function (a local function is no one's API), and
whose enclosing classes all have names not starting with `_`. It counts once if any parameter
annotation (positional, `*args`, keyword-only, `**kwargs`) or the return annotation mentions `Any`.

dict[str, Any]-like: a subscript of `dict`, `Dict`, `Mapping` or `MutableMapping` (bare or as an
attribute such as `typing.Mapping` / `collections.abc.Mapping`) whose key is `str` and whose value is
exactly `Any` (or an alias of exactly `Any`). Every occurrence in the code counts: in signatures,
variable and field annotations, alias definitions, and type expressions in calls (`cast(...)`,
`decode(..., type=...)`), nested ones each (`dict[str, dict[str, Any]]` is one, `list[dict[str, Any]]`
is one). A use of an alias counts as many as its definition holds (`JsonDict` in a signature is one
more). Comments and docstrings do not count; string annotations do.
"""
from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED = frozenset({"tests", "bench", "examples"})
DICT_NAMES = frozenset({"dict", "Dict", "Mapping", "MutableMapping"})
# The issue's own figures at the start (its counting, close to but not the same as this one's), and
# its targets.
ISSUE_BASELINE = {"public_any_signatures": 243, "dict_str_any": 342}
TARGETS = {"public_any_signatures": 150, "dict_str_any": 220}
RULES = {
    "packages": "every top-level folder with __init__.py except tests, bench, examples",
    "public_signature": "def / async def not named _*, not nested in a def, in no class named _*; "
                        "counts once if a parameter or return annotation mentions Any",
    "mentions_any": "the name Any or typing.Any, or an alias of a type that mentions Any, at any depth; "
                    "string annotations parsed",
    "alias": "module-level NAME = <type expr>, NAME: TypeAlias = ..., type NAME = ..., NewType (of "
             "if TYPE_CHECKING/else, the TYPE_CHECKING branch); followed through imports and re-exports",
    "dict_str_any": "dict/Dict/Mapping/MutableMapping[str, Any] anywhere in code (annotations, aliases, "
                    "cast/type= expressions), each nested one, plus each alias use times what its "
                    "definition holds",
}


@dataclass
class Module:
    """One parsed source file and the names it binds at module level."""

    name: str                      # dotted module name
    path: str                      # relative to the repo root
    package: str                   # its top-level package
    tree: ast.Module
    is_package: bool
    aliases: dict[str, ast.expr] = field(default_factory=dict)          # alias name -> its type expression
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    modules: dict[str, str] = field(default_factory=dict)               # local name -> module (import x as y)


@dataclass(frozen=True)
class AliasInfo:
    """What an alias stands for, as far as these counts care."""

    mentions_any: bool
    dicts: int          # dict[str, Any]-like occurrences in its expansion
    is_any: bool        # it is exactly Any


NOT_ALIAS = AliasInfo(False, 0, False)


# ---------------------------------------------------------------------------------------------- sources

def top_packages(names: list[str]) -> list[str]:
    """Top-level packages among repo-relative file paths: folders holding an `__init__.py`."""
    return sorted({p.split("/")[0] for p in names
                   if p.count("/") == 1 and p.endswith("/__init__.py") and p.split("/")[0] not in EXCLUDED})


def working_tree_sources() -> dict[str, str]:
    paths = [str(p.relative_to(ROOT)) for p in ROOT.glob("*/__init__.py")]
    out: dict[str, str] = {}
    for pkg in top_packages(paths):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            out[str(f.relative_to(ROOT))] = f.read_text(encoding="utf-8")
    return out


def rev_sources(rev: str) -> dict[str, str]:
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev],
                             check=True, capture_output=True, text=True).stdout.split()
    packages = set(top_packages(listing))
    out: dict[str, str] = {}
    for p in listing:
        if p.endswith(".py") and p.split("/")[0] in packages:
            out[p] = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{p}"],
                                    check=True, capture_output=True, text=True).stdout
    return out


# ---------------------------------------------------------------------------------------------- parsing

def module_name(path: str) -> tuple[str, bool]:
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def resolve_relative(mod: Module, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def is_type_expr(value: ast.expr) -> bool:
    if isinstance(value, ast.Subscript | ast.Name | ast.Attribute):
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from module_level_statements(stmt.body)
            if not _is_type_checking(stmt.test):   # the type checker sees the TYPE_CHECKING branch only
                yield from module_level_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from module_level_statements(stmt.body)
            for h in stmt.handlers:
                yield from module_level_statements(h.body)
            yield from module_level_statements(stmt.orelse)
            yield from module_level_statements(stmt.finalbody)


def is_typealias_annotation(ann: ast.expr) -> bool:
    return (isinstance(ann, ast.Name) and ann.id == "TypeAlias") or \
        (isinstance(ann, ast.Attribute) and ann.attr == "TypeAlias")


def collect_bindings(mod: Module) -> None:
    for stmt in module_level_statements(mod.tree.body):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name, value = stmt.targets[0].id, stmt.value
            if isinstance(value, ast.Call) and _call_name(value) == "NewType" and len(value.args) == 2:
                mod.aliases[name] = value.args[1]
            elif is_type_expr(value):
                mod.aliases[name] = value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None \
                and is_typealias_annotation(stmt.annotation):
            mod.aliases[stmt.target.id] = stmt.value
        elif sys.version_info >= (3, 12) and isinstance(stmt, getattr(ast, "TypeAlias", ())):
            mod.aliases[stmt.name.id] = stmt.value  # type: ignore[attr-defined]
        elif isinstance(stmt, ast.ImportFrom):
            source = resolve_relative(mod, stmt.level, stmt.module)
            for a in stmt.names:
                if a.name != "*":
                    mod.imported[a.asname or a.name] = (source, a.name)
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    mod.modules[a.asname] = a.name
                else:
                    mod.modules[a.name.split(".")[0]] = a.name.split(".")[0]


def _call_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


def parse_string_annotation(s: str) -> ast.expr | None:
    try:
        return ast.parse(s, mode="eval").body
    except SyntaxError:
        return None


# ---------------------------------------------------------------------------------------------- counting

class Resolver:
    """Resolves names in type expressions to aliases across modules, memoised, cycle-safe."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.memo: dict[tuple[str, str], AliasInfo] = {}
        self.active: set[tuple[str, str]] = set()

    def symbol(self, modname: str, name: str, depth: int = 0) -> AliasInfo:
        """What `name` as bound at module level of `modname` stands for."""
        key = (modname, name)
        if key in self.memo:
            return self.memo[key]
        if key in self.active or depth > 50:
            return NOT_ALIAS
        mod = self.modules.get(modname)
        if mod is None:
            return NOT_ALIAS
        self.active.add(key)
        try:
            if name in mod.aliases:
                value = mod.aliases[name]
                info = AliasInfo(self.mentions_any(mod, value), self.count_dicts(mod, value, in_type=True),
                                 self.is_any(mod, value))
            elif name in mod.imported:
                src, orig = mod.imported[name]
                info = self.symbol(src, orig, depth + 1)
            else:
                info = NOT_ALIAS
        finally:
            self.active.discard(key)
        self.memo[key] = info
        return info

    def name_info(self, mod: Module, node: ast.expr) -> AliasInfo:
        """The alias a Name / Attribute in `mod` refers to, if any."""
        if isinstance(node, ast.Name):
            return self.symbol(mod.name, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in mod.modules:
            return self.symbol(mod.modules[node.value.id], node.attr)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in mod.imported:
            # `from pkg import submodule` then `submodule.Alias`
            src, orig = mod.imported[node.value.id]
            return self.symbol(f"{src}.{orig}", node.attr)
        return NOT_ALIAS

    def is_any(self, mod: Module, node: ast.expr) -> bool:
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            inner = parse_string_annotation(node.value)
            return inner is not None and self.is_any(mod, inner)
        if isinstance(node, ast.Name | ast.Attribute):
            return self.name_info(mod, node).is_any
        return False

    def mentions_any(self, mod: Module, node: ast.expr | None) -> bool:
        if node is None:
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                inner = parse_string_annotation(sub.value)
                if inner is not None and self.mentions_any(mod, inner):
                    return True
            elif isinstance(sub, ast.Name | ast.Attribute) and sub.ctx.__class__ is ast.Load:
                if self.is_any(mod, sub) or self.name_info(mod, sub).mentions_any:
                    return True
        return False

    def is_dict_str_any(self, mod: Module, node: ast.Subscript) -> bool:
        base = node.value
        base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        if base_name not in DICT_NAMES:
            return False
        sl = node.slice
        if not (isinstance(sl, ast.Tuple) and len(sl.elts) == 2):
            return False
        key, value = sl.elts
        key_is_str = (isinstance(key, ast.Name) and key.id == "str") or \
            (isinstance(key, ast.Constant) and key.value == "str")
        return key_is_str and self.is_any(mod, value)

    def count_dicts(self, mod: Module, node: ast.AST, in_type: bool) -> int:
        """dict[str, Any]-like occurrences under `node`; `in_type` = string constants are annotations."""
        return sum(1 for _ in self.dict_sites(mod, node, in_type))

    def dict_sites(self, mod: Module, node: ast.AST, in_type: bool) -> Iterator[int]:
        """One line number per dict[str, Any]-like occurrence under `node` (alias uses expanded)."""
        for sub in _walk_typed(node, in_type):
            n, typed = sub
            if isinstance(n, ast.Subscript) and self.is_dict_str_any(mod, n):
                yield n.lineno
            elif isinstance(n, ast.Name | ast.Attribute) and isinstance(n.ctx, ast.Load):
                if isinstance(n, ast.Attribute) and not isinstance(n.value, ast.Name):
                    continue
                k = self.name_info(mod, n).dicts
                for _ in range(k):
                    yield n.lineno
            elif typed and isinstance(n, ast.Constant) and isinstance(n.value, str):
                inner = parse_string_annotation(n.value)
                if inner is not None:
                    for _ in self.dict_sites(mod, inner, True):
                        yield n.lineno


def _walk_typed(node: ast.AST, in_type: bool) -> Iterator[tuple[ast.AST, bool]]:
    """ast.walk, telling for each node whether it sits in a type position (annotation, alias value,
    cast's first argument, a `type=` keyword), where a string is a forward reference to parse."""
    stack: list[tuple[ast.AST, bool]] = [(node, in_type)]
    while stack:
        n, typed = stack.pop()
        yield n, typed
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant):
            continue  # docstrings and bare string statements
        for fname, child in ast.iter_fields(n):
            kids = child if isinstance(child, list) else [child]
            for k in kids:
                if not isinstance(k, ast.AST):
                    continue
                child_typed = typed or fname in ("annotation", "returns")
                if isinstance(n, ast.Call) and fname == "args" and _call_name(n) == "cast" and k is kids[0]:
                    child_typed = True
                if isinstance(n, ast.keyword) and n.arg == "type":
                    child_typed = True
                stack.append((k, child_typed))


@dataclass
class Counts:
    """Per-package tallies and the items behind them."""

    signatures: list[str] = field(default_factory=list)
    dicts: list[str] = field(default_factory=list)
    files: int = 0


def public_defs(body: list[ast.stmt], private_class: bool = False) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Public function definitions: not nested in a def, in no class named _*, not named _*."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            if not private_class and not stmt.name.startswith("_"):
                yield stmt
        elif isinstance(stmt, ast.ClassDef):
            yield from public_defs(stmt.body, private_class or stmt.name.startswith("_"))
        elif isinstance(stmt, ast.If | ast.Try):
            for block in module_level_statements([stmt]):
                if block is not stmt and isinstance(block, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    yield from public_defs([block], private_class)


def signature_mentions_any(res: Resolver, mod: Module, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
    return any(res.mentions_any(mod, p.annotation) for p in params) or res.mentions_any(mod, fn.returns)


def count(sources: dict[str, str]) -> dict[str, Counts]:
    modules: dict[str, Module] = {}
    for path, text in sources.items():
        name, is_pkg = module_name(path)
        mod = Module(name=name, path=path, package=path.split("/")[0],
                     tree=ast.parse(text, filename=path), is_package=is_pkg)
        collect_bindings(mod)
        modules[name] = mod
    res = Resolver(modules)
    out: dict[str, Counts] = {}
    for mod in sorted(modules.values(), key=lambda m: m.path):
        c = out.setdefault(mod.package, Counts())
        c.files += 1
        for fn in public_defs(mod.tree.body):
            if signature_mentions_any(res, mod, fn):
                c.signatures.append(f"{mod.path}:{fn.lineno} {fn.name}")
        for line in res.dict_sites(mod, mod.tree, in_type=False):
            c.dicts.append(f"{mod.path}:{line}")
        # An alias's own definition line is walked like any code; its string constants are types.
        for value in mod.aliases.values():
            for sub in ast.walk(value):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    inner = parse_string_annotation(sub.value)
                    if inner is not None:
                        c.dicts.extend(f"{mod.path}:{line}" for line in res.dict_sites(mod, inner, True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="count the tree of this commit instead of the working tree")
    ap.add_argument("--list", choices=("sigs", "dicts"), help="print every counted item")
    ap.add_argument("--package", help="with --list: only this package")
    args = ap.parse_args()
    sources = rev_sources(args.rev) if args.rev else working_tree_sources()
    counts = count(sources)
    if args.list:
        for pkg, c in counts.items():
            if args.package and pkg != args.package:
                continue
            for item in (c.signatures if args.list == "sigs" else c.dicts):
                print(item)
    total_sigs = sum(len(c.signatures) for c in counts.values())
    total_dicts = sum(len(c.dicts) for c in counts.values())
    for pkg, c in counts.items():
        print(f"{pkg:14s} files {c.files:4d}  public Any signatures {len(c.signatures):4d}  "
              f"dict[str, Any] {len(c.dicts):4d}", file=sys.stderr)
    print(f"{'total':14s}            public Any signatures {total_sigs:4d}  dict[str, Any] {total_dicts:4d}  "
          f"(targets {TARGETS['public_any_signatures']} / {TARGETS['dict_str_any']})", file=sys.stderr)
    print(json.dumps({
        "public_any_signatures": total_sigs,
        "dict_str_any": total_dicts,
        "per_package": {pkg: {"public_any_signatures": len(c.signatures), "dict_str_any": len(c.dicts),
                              "files": c.files} for pkg, c in counts.items()},
        "targets": TARGETS,
        "under_targets": total_sigs <= TARGETS["public_any_signatures"]
        and total_dicts <= TARGETS["dict_str_any"],
        "issue_baseline": ISSUE_BASELINE,
        "rev": args.rev or "working tree",
        "rules": RULES,
    }))


if __name__ == "__main__":
    main()
