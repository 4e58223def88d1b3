"""The simulator benches' `--seeds` argument: which traces a bench runs (issue 33 part 4).

Every simulator bench runs `DEFAULT_SEEDS` (five traces) unless told otherwise, and reports each
ratio's median and min-max over them (sim.metrics.Spread). `--seeds` names others, so a gain can be
checked on seeds it was not developed on: a list ("6,7,8"), a range ("6-10") or both ("1,4-6").
"""
from __future__ import annotations

DEFAULT_SEEDS = (1, 2, 3, 4, 5)
DEFAULT_TEXT = "1-5"


def parse_seeds(text: str) -> list[int]:
    """The seeds `text` names, in order, without repeats (ValueError naming the bad part)."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"--seeds: {part!r} is not an integer or a range like 6-10") from None
        if first > last:
            raise ValueError(f"--seeds: range {part!r} runs backwards")
        out.extend(s for s in range(first, last + 1) if s not in out)
    if not out:
        raise ValueError(f"--seeds names no seed: {text!r}")
    return out


__all__ = ["DEFAULT_SEEDS", "DEFAULT_TEXT", "parse_seeds"]
