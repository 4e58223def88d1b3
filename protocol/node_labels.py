"""Node labels: YARN's exclusive node partitions, as far as Elastane uses them (pure).

An NM reports the labels its host carries (nm.toml / nm-<host>.toml `node_labels`); the RM knows
the cluster's labels (rm.toml `node_labels`) and refuses a node that reports any other. Every label
is *exclusive*, as YARN's default partitions are: a labelled node takes only containers that ask
for its label, so ordinary executors never land there. The one ask that names a label is the AM
container's: rm.toml `am_node_label` puts every AM on nodes carrying it (the dissertation's setups
run their masters on an extra instance outside the worker machines, docs/testbed.md). Without
`am_node_label` AMs go where executors go, the unlabelled nodes.

YARN also has non-exclusive labels and per-queue label access; a cluster here has one queue tree
and AMs are the only labelled demand, so neither is modelled.
"""
from __future__ import annotations

import re
from typing import Iterable

from protocol.errors import ConfigurationError

# YARN's rule for a label name: letters, digits, '-' and '_', starting with a letter or digit.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,254}")


class NodeLabelError(ConfigurationError, ValueError):
    """A label that is malformed, or that the cluster does not know; the message names it."""


def check_label(label: str, what: str = "node label") -> str:
    """`label` if it is a well-formed label name; NodeLabelError naming it otherwise."""
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise NodeLabelError(f"{what} {label!r} is not a label name (letters, digits, '-' and '_', "
                             "starting with a letter or digit, at most 255)")
    return label


def check_labels(labels: Iterable[str], what: str = "node_labels") -> frozenset[str]:
    """Well-formed, distinct labels as a set."""
    seen: list[str] = []
    for label in labels:
        check_label(label, f"{what}:")
        if label in seen:
            raise NodeLabelError(f"{what}: {label!r} is listed twice")
        seen.append(label)
    return frozenset(seen)


def check_cluster(cluster_labels: Iterable[str], am_node_label: str) -> frozenset[str]:
    """The RM's labels: well-formed, and `am_node_label` ("" = none) one of them."""
    known = check_labels(cluster_labels, "rm node_labels")
    if am_node_label:
        check_label(am_node_label, "am_node_label")
        if am_node_label not in known:
            raise NodeLabelError(f"am_node_label {am_node_label!r} is not one of the cluster's node_labels "
                                 f"{sorted(known)} (add it to rm.toml node_labels)")
    return known


def unknown(reported: Iterable[str], cluster_labels: Iterable[str]) -> list[str]:
    """The labels a node reports that the cluster does not know (sorted)."""
    return sorted(set(reported) - set(cluster_labels))


def accepts(node_labels: frozenset[str], is_am: bool, am_node_label: str) -> bool:
    """May a container go to a node carrying `node_labels`? An AM container needs the AM label
    where one is set; every other container (and an AM without an AM label) needs an unlabelled
    node: labels are exclusive."""
    if is_am and am_node_label:
        return am_node_label in node_labels
    return not node_labels
