"""The type-seam ratchet: public signatures with `Any` and `dict[str, Any]`-like types, counted by
bench/type_seams.py over every package (its module doc has the rules), stay at or under the targets
of the issue "One PS-job controller" (150 and 220). The counter's rules are checked on a small
package first, so a count that drops because the counter stopped seeing something fails here too."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_module import load_bench

ROOT = Path(__file__).resolve().parents[2]
ts = load_bench("type_seams")

MAX_PUBLIC_ANY_SIGNATURES = 150
MAX_DICT_STR_ANY = 220

TYPES = '''\
from typing import Any, Mapping
JsonDict = dict[str, Any]
AnyMap = Mapping[str, Any]
Nested = list[JsonDict]
'''

API = '''\
from __future__ import annotations
from typing import TYPE_CHECKING, Any
from .types import JsonDict, Nested
import pkg.types as t


def public(x: JsonDict) -> None: ...
def _private(x: Any) -> None: ...
async def fetch() -> "dict[str, Any]": ...
def plain(x: int, y: dict[str, int]) -> int: ...
def through_module(x: t.AnyMap) -> None: ...
def nested(x: Nested) -> None: ...
def kwargs(**kw: Any) -> None: ...
def outer() -> None:
    def inner(x: Any) -> None: ...
class Public:
    def method(self, x: dict[str, Any]) -> None: ...
    def __init__(self, x: Any) -> None: ...
class _Hidden:
    def method(self, x: Any) -> None: ...
z: dict[str, Any] = {}
"""A docstring that says dict[str, Any] does not count."""
if TYPE_CHECKING:
    Checked = int
else:
    Checked = Any
def checked(x: Checked) -> None: ...
'''


def test_the_counter_follows_its_rules_on_a_small_package() -> None:
    counts = ts.count({"pkg/__init__.py": "", "pkg/types.py": TYPES, "pkg/api.py": API})
    c = counts["pkg"]
    # public (an alias), fetch (a string annotation), through_module (an alias via `import ... as`),
    # nested (an alias of an alias), kwargs (**kw), Public.method; not _private, plain, inner (nested
    # in a def), __init__ (a dunder), _Hidden.method, checked (the TYPE_CHECKING branch is int).
    assert sorted(s.split()[1] for s in c.signatures) == ["fetch", "kwargs", "method", "nested", "public",
                                                        "through_module"]
    # types.py: JsonDict's and AnyMap's definitions, JsonDict inside Nested's; api.py: public, fetch,
    # through_module, nested, Public.method, z.
    assert sorted(d.split(":")[0] for d in c.dicts) == ["pkg/api.py"] * 6 + ["pkg/types.py"] * 3


def test_public_any_signatures_and_dict_str_any_stay_under_the_targets() -> None:
    counts = ts.count(ts.working_tree_sources())
    assert "tests" not in counts and "bench" not in counts and "examples" not in counts
    assert {"protocol", "rm", "appmaster", "psruntime", "elastane_cli"} <= set(counts)
    sigs = [s for c in counts.values() for s in c.signatures]
    dicts = [d for c in counts.values() for d in c.dicts]
    assert len(sigs) <= MAX_PUBLIC_ANY_SIGNATURES, (
        f"{len(sigs)} public signatures with Any (at most {MAX_PUBLIC_ANY_SIGNATURES}); "
        "type the new ones (`bench/type_seams.py --list sigs` lists them all)")
    assert len(dicts) <= MAX_DICT_STR_ANY, (
        f"{len(dicts)} dict[str, Any]-like types (at most {MAX_DICT_STR_ANY}); "
        "`bench/type_seams.py --list dicts` lists them all")


def test_the_bench_prints_its_counts_as_json_on_its_last_line() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "type_seams.py")], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    result = json.loads(out.strip().splitlines()[-1])
    per_package = result["per_package"]
    assert result["public_any_signatures"] == sum(p["public_any_signatures"] for p in per_package.values())
    assert result["dict_str_any"] == sum(p["dict_str_any"] for p in per_package.values())
    assert set(result["rules"]) == {"packages", "public_signature", "mentions_any", "alias", "dict_str_any"}
