"""Importers from common text formats into a dataset directory (docs/dataset_format.md).

- libsvm / svmlight (`label idx:val ...`) for MLR (labels 0..C-1) and Lasso (real targets);
- `user item value` triplets (comma, tab, semicolon, `::` or whitespace separated) for NMF;
- UCI bag-of-words docword (`D`, `W`, `NNZ` header lines, then `doc word count`) for LDA.

Rows are read line by line and written a block at a time (triplets, which may come in any order,
are first gathered as numeric arrays and sorted by user). Held-out rows come from a separate file
or from the training file: with `heldout_fraction` f, row i (in file order) is held out when
floor((i + 1) f) > floor(i f), which spreads exactly about f of the rows evenly and needs no
look-ahead. Bad input raises `TextFormatError` naming the file, the line and the problem.
"""
from __future__ import annotations

import math
import os
import re
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from protocol.dataset_manifest import DatasetManifest
from psruntime.apps.dataset_files import DatasetWriter, mean_entries
from protocol.errors import AppError


class TextFormatError(AppError, ValueError):
    """A problem in an input text file: `path`, 1-based `line` (0: the file as a whole), `problem`."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


@dataclass(frozen=True)
class ImportOptions:
    """Options every importer shares."""

    rows_per_block: int = 1000
    heldout_fraction: float | None = None     # hold out this fraction of the training file's rows ...
    heldout_file: str | None = None           # ... or read held-out rows from this file
    index_base: int = 1                       # ids in the files start at this (libsvm and UCI use 1)

    def __post_init__(self) -> None:
        if self.rows_per_block < 1:
            raise ValueError("rows_per_block must be >= 1")
        if (self.heldout_fraction is None) == (self.heldout_file is None):
            raise ValueError("give exactly one of a held-out fraction and a held-out file")
        if self.heldout_fraction is not None and not 0 < self.heldout_fraction < 1:
            raise ValueError(f"the held-out fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.index_base not in (0, 1):
            raise ValueError(f"the index base must be 0 or 1, got {self.index_base}")


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, content) of the non-blank lines that are not comments (# or %)."""
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise TextFormatError(path, 0, f"cannot open: {e.strerror or e}") from None
    with f:
        try:
            for number, line in enumerate(f, 1):
                text = line.strip()
                if text and text[0] not in "#%":
                    yield number, text
        except UnicodeDecodeError as e:
            raise TextFormatError(path, 0, f"not UTF-8 text: {e}") from None


def _heldout_picker(fraction: float | None) -> Callable[[int], bool]:
    if fraction is None:
        return lambda i: False
    return lambda i: math.floor((i + 1) * fraction) > math.floor(i * fraction)


class _RowBlocks:
    """Rows of one part buffered until a block is full, then written through the DatasetWriter."""

    def __init__(self, writer: DatasetWriter, part: str, entry: dict[str, str], row: dict[str, str]) -> None:
        self.writer, self.part = writer, part
        self.entry_types, self.row_types = entry, row
        self._reset()

    def _reset(self) -> None:
        self.indptr = array("q", [0])
        self.entries = {k: array(t) for k, t in self.entry_types.items()}
        # int or float items, as each field's typecode says
        self.rows: dict[str, array[Any]] = {k: array(t) for k, t in self.row_types.items()}

    def add(self, entries: dict[str, list | array], row: dict[str, float | int]) -> None:
        for k, v in entries.items():
            self.entries[k].extend(v)
        for k, x in row.items():
            self.rows[k].append(x)
        self.indptr.append(len(self.entries[next(iter(self.entries))]))
        if len(self.indptr) - 1 == self.writer.rows_per_block:
            self.flush()

    def flush(self) -> None:
        if len(self.indptr) == 1:
            return
        data = {"indptr": np.frombuffer(self.indptr, np.int64).copy()}
        for k, a in (*self.entries.items(), *self.rows.items()):
            data[k] = np.frombuffer(a, np.dtype(a.typecode)).astype({"i": "<i4", "f": "<f4"}[a.typecode])
        self.writer.add_block(self.part, data)
        self._reset()


def _check_rows(writer: DatasetWriter, opts: ImportOptions, train: str) -> None:
    for part in ("train", "heldout"):
        if writer.rows(part) == 0:
            src = opts.heldout_file if part == "heldout" and opts.heldout_file else train
            hint = " (raise --heldout-fraction or give more rows)" if part == "heldout" and not opts.heldout_file else ""
            raise TextFormatError(src, 0, f"no {part} rows{hint}")


# ----------------------------------------------------------------- libsvm (mlr, lasso)

def import_libsvm(app: str, train_file: str, out_dir: str, opts: ImportOptions,
                  num_features: int | None = None, num_classes: int | None = None) -> DatasetManifest:
    """libsvm / svmlight rows for "mlr" (integer labels 0..C-1) or "lasso" (real targets)."""
    if app not in ("mlr", "lasso"):
        raise ValueError(f"libsvm data is for mlr or lasso, not {app}")
    writer = DatasetWriter(out_dir, app, opts.rows_per_block)
    label_field = "labels" if app == "mlr" else "targets"
    parts = {p: _RowBlocks(writer, p, {"features": "i", "values": "f"}, {label_field: "i" if app == "mlr" else "f"})
             for p in ("train", "heldout")}
    max_feature = max_label = -1
    held = _heldout_picker(opts.heldout_fraction)
    sources = [(train_file, None)] + ([(opts.heldout_file, "heldout")] if opts.heldout_file else [])
    for path, fixed_part in sources:
        for i, (number, text) in enumerate(_libsvm_rows(path)):
            label, feats, vals = _parse_libsvm(path, number, text, app, opts.index_base)
            if feats:
                top = feats[-1]
                if num_features is not None and top >= num_features:
                    raise TextFormatError(path, number, f"feature index {top + opts.index_base} is beyond "
                                          f"--num-features {num_features} (index base {opts.index_base})")
                max_feature = max(max_feature, top)
            if app == "mlr":
                if num_classes is not None and label >= num_classes:
                    raise TextFormatError(path, number, f"label {label} is not a class 0..{num_classes - 1}")
                max_label = max(max_label, int(label))
            part = fixed_part or ("heldout" if held(i) else "train")
            parts[part].add({"features": feats, "values": vals}, {label_field: label})
    for p in parts.values():
        p.flush()
    _check_rows(writer, opts, train_file)
    features = num_features if num_features is not None else max_feature + 1
    if features < 1:
        raise TextFormatError(train_file, 0, "no features in any row (give --num-features)")
    spec: dict[str, int | float] = {"num_samples": writer.rows("train"), "num_features": features,
                                    "num_heldout": writer.rows("heldout"), "rows_per_block": opts.rows_per_block,
                                    "nnz_per_sample": min(features, mean_entries(writer.entries("train"),
                                                                                 writer.rows("train")))}
    if app == "mlr":
        classes = num_classes if num_classes is not None else max_label + 1
        if classes < 2:
            raise TextFormatError(train_file, 0, f"MLR needs at least 2 classes, the labels give {classes}")
        spec["num_classes"] = classes
    return writer.finish(spec, {"format": "libsvm", "train": os.path.abspath(train_file),
                                "heldout": os.path.abspath(opts.heldout_file) if opts.heldout_file else None,
                                "heldout_fraction": opts.heldout_fraction, "index_base": opts.index_base})


def _libsvm_rows(path: str) -> Iterator[tuple[int, str]]:
    for number, text in _lines(path):
        text = text.split("#", 1)[0].strip()   # svmlight allows a trailing comment
        if text:
            yield number, text


def _parse_libsvm(path: str, number: int, text: str, app: str, base: int) -> tuple[float | int, list[int], list[float]]:
    tokens = text.split()
    if app == "mlr":
        try:
            label: float | int = int(tokens[0])
        except ValueError:
            raise TextFormatError(path, number, f"label {tokens[0]!r} is not an integer class (MLR needs 0..C-1)") from None
        if label < 0:
            raise TextFormatError(path, number, f"label {label} is negative (MLR needs classes 0..C-1; "
                                  f"remap binary -1/+1 labels to 0/1)")
    else:
        label = _finite(path, number, tokens[0], "target")
    pairs: list[tuple[int, float]] = []
    for tok in tokens[1:]:
        if tok.startswith("qid:"):
            continue
        idx, sep, val = tok.partition(":")
        if not sep:
            raise TextFormatError(path, number, f"{tok!r} is not index:value")
        try:
            feature = int(idx) - base
        except ValueError:
            raise TextFormatError(path, number, f"feature index {idx!r} is not an integer") from None
        if feature < 0 or feature >= 2**31 - 1:
            raise TextFormatError(path, number, f"feature index {idx} is out of range (index base {base})")
        pairs.append((feature, _finite(path, number, val, f"value of feature {idx}")))
    pairs.sort()
    for a, b in zip(pairs, pairs[1:]):
        if a[0] == b[0]:
            raise TextFormatError(path, number, f"feature index {a[0] + base} appears twice")
    return label, [p[0] for p in pairs], [p[1] for p in pairs]


def _finite(path: str, number: int, token: str, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise TextFormatError(path, number, f"{what} {token!r} is not a number") from None
    if not math.isfinite(value) or abs(value) > 3.4e38:
        raise TextFormatError(path, number, f"{what} {token!r} is not a finite float32")
    return value


# ----------------------------------------------------------------- triplets (nmf)

_SEPARATORS = re.compile(r"\s*::\s*|[,;\s]+")     # `1 :: 2 :: 5` is three fields, as `1::2::5` is


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _read_triplets(path: str, base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, ratings, line numbers) of a triplet file, items rebased to 0."""
    cols: tuple[array[int], array[int], array[float], array[int]] = (array("q"), array("q"), array("d"), array("q"))
    first = True
    for number, text in _lines(path):
        fields = _SEPARATORS.split(text)
        if len(fields) < 3:
            raise TextFormatError(path, number, f"expected `user item value`, got {len(fields)} field(s)")
        try:
            user, item = int(fields[0]), int(fields[1])
        except ValueError:
            # A header such as "userId,movieId,rating,timestamp": the first line, and only when
            # neither its user nor its item is a number ("1.0,7,5" is a row with a bad user id).
            if first and not _is_number(fields[0]) and not _is_number(fields[1]):
                first = False
                continue
            raise TextFormatError(path, number, f"user {fields[0]!r} and item {fields[1]!r} must be integers") from None
        first = False
        if item - base < 0 or item - base >= 2**31 - 1:
            raise TextFormatError(path, number, f"item {item} is out of range (index base {base})")
        cols[0].append(user)
        cols[1].append(item - base)
        cols[2].append(_finite(path, number, fields[2], "value"))
        cols[3].append(number)
    users, items, ratings, lines = (np.frombuffer(c, np.int64 if c.typecode == "q" else np.float64) for c in cols)
    order = np.lexsort((items, users))
    users, items, ratings, lines = users[order], items[order], ratings[order], lines[order]
    dup = np.flatnonzero((users[1:] == users[:-1]) & (items[1:] == items[:-1]))
    if len(dup):
        a, b = sorted((int(lines[dup[0]]), int(lines[dup[0] + 1])))
        raise TextFormatError(path, b, f"user {users[dup[0]]} rated item {items[dup[0]] + base} again (first on line {a})")
    return users, items, ratings, lines


def import_triplets(train_file: str, out_dir: str, opts: ImportOptions,
                    num_items: int | None = None) -> DatasetManifest:
    """`user item value` triplets for NMF: a row per distinct user (in user-id order), its
    entries sorted by item; item ids (minus the index base) are the model keys."""
    writer = DatasetWriter(out_dir, "nmf", opts.rows_per_block)
    parts = {p: _RowBlocks(writer, p, {"items": "i", "ratings": "f"}, {}) for p in ("train", "heldout")}
    held = _heldout_picker(opts.heldout_fraction)
    max_item = -1
    sources = [(train_file, None)] + ([(opts.heldout_file, "heldout")] if opts.heldout_file else [])
    for path, fixed_part in sources:
        users, items, ratings, lines = _read_triplets(path, opts.index_base)
        if len(items):
            top = int(items.argmax())
            if num_items is not None and items[top] >= num_items:
                raise TextFormatError(path, int(lines[top]), f"item {items[top] + opts.index_base} is beyond "
                                      f"--num-items {num_items}")
            max_item = max(max_item, int(items[top]))
        bounds = np.flatnonzero(np.diff(users)) + 1
        starts, stops = np.r_[0, bounds], np.r_[bounds, len(users)]
        for i, (lo, hi) in enumerate(zip(starts.tolist(), stops.tolist())):
            if lo == hi:
                continue
            part = fixed_part or ("heldout" if held(i) else "train")
            parts[part].add({"items": items[lo:hi].tolist(), "ratings": ratings[lo:hi].tolist()}, {})
        del users, items, ratings, lines
    for p in parts.values():
        p.flush()
    _check_rows(writer, opts, train_file)
    n_items = num_items if num_items is not None else max_item + 1
    train_rows = writer.rows("train")
    spec = {"num_users": train_rows, "num_items": n_items, "num_heldout": writer.rows("heldout"),
            "rows_per_block": opts.rows_per_block,
            "observed_fraction": min(1.0, writer.entries("train") / (train_rows * n_items))}
    return writer.finish(spec, {"format": "triplets", "train": os.path.abspath(train_file),
                                "heldout": os.path.abspath(opts.heldout_file) if opts.heldout_file else None,
                                "heldout_fraction": opts.heldout_fraction, "index_base": opts.index_base})


# ----------------------------------------------------------------- UCI docword (lda)

def _docword_header(path: str, lines: Iterator[tuple[int, str]]) -> tuple[int, int, int, int]:
    """(D, W, NNZ, line of NNZ) from the first three values of a docword file."""
    values: list[int] = []
    number = 0
    while len(values) < 3:
        try:
            number, text = next(lines)
        except StopIteration:
            raise TextFormatError(path, number, "missing the D, W, NNZ header lines") from None
        for tok in text.split():
            try:
                v = int(tok)
            except ValueError:
                raise TextFormatError(path, number, f"header value {tok!r} is not an integer (D, W, NNZ)") from None
            if v < 0:
                raise TextFormatError(path, number, f"header value {v} is negative")
            values.append(v)
        if len(values) > 3:
            raise TextFormatError(path, number, "the header is D, W and NNZ, three integers")
    if values[1] < 1:
        raise TextFormatError(path, number, "W (the vocabulary size) must be at least 1")
    return values[0], values[1], values[2], number


def import_docword(train_file: str, out_dir: str, opts: ImportOptions) -> DatasetManifest:
    """UCI bag-of-words docword files for LDA: a row per document (in file order, which must be
    by non-decreasing doc id), each word repeated `count` times; the vocabulary is W."""
    writer = DatasetWriter(out_dir, "lda", opts.rows_per_block)
    parts = {p: _RowBlocks(writer, p, {"words": "i"}, {}) for p in ("train", "heldout")}
    held = _heldout_picker(opts.heldout_fraction)
    vocab = 0
    sources = [(train_file, None)] + ([(opts.heldout_file, "heldout")] if opts.heldout_file else [])
    for path, fixed_part in sources:
        lines = _lines(path)
        d, w, nnz, number = _docword_header(path, lines)
        vocab = max(vocab, w)
        seen = doc_index = 0
        doc_words: list[int] = []
        last_doc = -1

        def finish_doc() -> None:
            nonlocal doc_index
            if doc_words:
                part = fixed_part or ("heldout" if held(doc_index) else "train")
                parts[part].add({"words": doc_words}, {})
                doc_index += 1

        for number, text in lines:
            fields = text.split()
            try:
                doc, word, count = (int(x) for x in fields)
            except ValueError:
                raise TextFormatError(path, number, f"expected `doc word count` integers, got {text[:60]!r}") from None
            if not 0 <= doc - opts.index_base < d:
                raise TextFormatError(path, number, f"doc {doc} is outside 1..D ({d}) (index base {opts.index_base})")
            if not 0 <= word - opts.index_base < w:
                raise TextFormatError(path, number, f"word {word} is outside the vocabulary of W = {w} words")
            if count < 1:
                raise TextFormatError(path, number, f"count {count} must be at least 1")
            if doc < last_doc:
                raise TextFormatError(path, number, f"doc {doc} comes after doc {last_doc}: docword lines must "
                                      f"be sorted by doc id")
            if doc != last_doc:
                finish_doc()
                doc_words = []
                last_doc = doc
            doc_words.extend([word - opts.index_base] * count)
            seen += 1
        finish_doc()
        if seen != nnz:
            raise TextFormatError(path, 0, f"the header says NNZ = {nnz} but there are {seen} `doc word count` lines")
    for p in parts.values():
        p.flush()
    _check_rows(writer, opts, train_file)
    spec = {"num_docs": writer.rows("train"), "vocab_size": vocab, "num_heldout": writer.rows("heldout"),
            "rows_per_block": opts.rows_per_block,
            "doc_length": mean_entries(writer.entries("train"), writer.rows("train"))}
    return writer.finish(spec, {"format": "uci-docword", "train": os.path.abspath(train_file),
                                "heldout": os.path.abspath(opts.heldout_file) if opts.heldout_file else None,
                                "heldout_fraction": opts.heldout_fraction, "index_base": opts.index_base})


__all__ = ["ImportOptions", "TextFormatError", "import_docword", "import_libsvm", "import_triplets"]
