"""A small parser of Prometheus text exposition (0.0.4) for tests: families with HELP/TYPE and
samples with labels; it refuses what a scraper would refuse (a sample before its TYPE, a family
declared twice, a malformed line)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


@dataclass
class Family:
    name: str
    help: str = ""
    type: str = ""
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def value(self, **labels: str) -> float:
        """The value of the one sample whose labels include `labels`."""
        found = [v for ls, v in self.samples if all(ls.get(k) == x for k, x in labels.items())]
        assert len(found) == 1, f"{self.name}{labels}: {len(found)} samples in {self.samples}"
        return found[0]


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        assert m, f"bad labels {text!r} at {pos}"
        assert m.group(1) not in out, f"label {m.group(1)} twice in {text!r}"
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def parse(text: str) -> dict[str, Family]:
    assert text.endswith("\n"), "the exposition must end with a newline"
    families: dict[str, Family] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, name, rest = line[2:6], *line[7:].split(" ", 1)
            f = families.setdefault(name, Family(name))
            if kind == "HELP":
                assert not f.help, f"HELP of {name} twice"
                f.help = rest
            else:
                assert not f.type and not f.samples, f"TYPE of {name} twice or after its samples"
                assert rest in ("gauge", "counter", "histogram", "summary", "untyped"), line
                f.type = rest
            continue
        assert not line.startswith("#"), line
        m = _SAMPLE.match(line)
        assert m, f"malformed sample line {line!r}"
        name = m.group(1)
        assert name in families and families[name].type, f"sample of {name} before its TYPE"
        families[name].samples.append((_labels(m.group(3) or ""), float(m.group(4))))
    for f in families.values():
        assert f.help and f.type, f"{f.name} lacks HELP or TYPE"
    return families
