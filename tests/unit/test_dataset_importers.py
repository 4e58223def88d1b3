"""Importers from libsvm, triplets and UCI docword text into the dataset format, and the
`elastane data` commands: what the blocks hold, held-out splits, and errors with file and line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elastane_cli.main import main as cli_main
from protocol.dataset_manifest import load_manifest
from psruntime.apps.registry import create_app
from psruntime.apps.text_importers import (ImportOptions, TextFormatError, import_docword, import_libsvm,
                                           import_triplets)

LIBSVM_MLR = """# a comment line
1 3:0.5 1:1.0
0 2:2.0   # trailing comment
2 1:0.25 4:1
1 qid:3 4:3.5

0 2:1 3:1
"""


def text(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text(body)
    return str(p)


def all_rows(app_name: str, out: str, heldout: bool = False) -> list:
    app = create_app(app_name, {"path": out})
    m = load_manifest(out)
    return [app.input_block(b, heldout) for b in range(len(m.heldout if heldout else m.train))]


def test_libsvm_for_mlr_with_a_heldout_fraction(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    m = import_libsvm("mlr", text(tmp_path, "a.svm", LIBSVM_MLR), out,
                      ImportOptions(rows_per_block=2, heldout_fraction=0.4))
    # rows 2 and 4 (where floor((i+1)*0.4) steps up) are held out; features rebased to 0 and sorted
    assert m.spec == {"num_samples": 3, "num_features": 4, "num_classes": 3, "num_heldout": 2,
                      "rows_per_block": 2, "nnz_per_sample": 2}
    train = all_rows("mlr", out)
    assert [b.num_rows for b in train] == [2, 1] and train[1].row_start == 2
    assert train[0].data["indptr"].tolist() == [0, 2, 3]
    assert train[0].data["features"].tolist() == [0, 2, 1]
    assert train[0].data["values"].tolist() == [1.0, 0.5, 2.0]
    assert train[0].data["labels"].tolist() == [1, 0] and train[1].data["labels"].tolist() == [1]
    assert train[1].data["features"].tolist() == [3] and train[1].data["values"].tolist() == [3.5]
    held = all_rows("mlr", out, heldout=True)
    assert held[0].data["labels"].tolist() == [2, 0] and held[0].data["features"].tolist() == [0, 3, 1, 2]


def test_libsvm_for_lasso_with_a_heldout_file(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    m = import_libsvm("lasso", text(tmp_path, "t.svm", "0.5 0:1 5:-2\n-1.25 1:3\n"), out,
                      ImportOptions(rows_per_block=10, heldout_file=text(tmp_path, "h.svm", "2 7:1\n"),
                                    index_base=0), num_features=10)
    assert m.spec["num_features"] == 10 and m.spec["num_samples"] == 2 and m.spec["num_heldout"] == 1
    train = all_rows("lasso", out)[0]
    assert train.data["targets"].tolist() == [0.5, -1.25] and train.data["features"].tolist() == [0, 5, 1]
    assert all_rows("lasso", out, heldout=True)[0].data["features"].tolist() == [7]


@pytest.mark.parametrize("body, line, message", [
    ("1 1:1\nx 2:1\n", 2, "label 'x' is not an integer class"),
    ("1 1:1\n-1 2:1\n", 2, "label -1 is negative"),
    ("1 1:1\n0 2\n", 2, "'2' is not index:value"),
    ("1 1:1\n0 2:abc\n", 2, "value of feature 2 'abc' is not a number"),
    ("1 1:1 1:2\n", 1, "feature index 1 appears twice"),
    ("1 0:1\n", 1, "feature index 0 is out of range"),
    ("1 1:nan\n", 1, "is not a finite float32"),
])
def test_libsvm_errors_name_the_line(tmp_path: Path, body: str, line: int, message: str) -> None:
    path = text(tmp_path, "bad.svm", body)
    with pytest.raises(TextFormatError, match=message) as e:
        import_libsvm("mlr", path, str(tmp_path / "ds"), ImportOptions(heldout_fraction=0.5))
    assert (e.value.path, e.value.line) == (path, line)


def test_libsvm_beyond_the_given_dimensions(tmp_path: Path) -> None:
    path = text(tmp_path, "a.svm", "1 1:1\n3 9:1\n")
    with pytest.raises(TextFormatError, match=r":2: feature index 9 is beyond --num-features 4"):
        import_libsvm("mlr", path, str(tmp_path / "a"), ImportOptions(heldout_fraction=0.5), num_features=4)
    with pytest.raises(TextFormatError, match=r":2: label 3 is not a class 0..2"):
        import_libsvm("mlr", path, str(tmp_path / "b"), ImportOptions(heldout_fraction=0.5), num_classes=3)


def test_triplets_for_nmf(tmp_path: Path) -> None:
    body = "userId,movieId,rating,timestamp\n7,3,4.5,99\n2,1,1.0,98\n7,0,2,97\n2,4,3,96\n9,2,5,95\n"
    out = str(tmp_path / "ds")
    m = import_triplets(text(tmp_path, "r.csv", body), out, ImportOptions(rows_per_block=5, heldout_fraction=0.34,
                                                                              index_base=0))
    # users in id order 2, 7, 9; user index 2 (id 9) is held out; items sorted within a user
    assert m.spec["num_users"] == 2 and m.spec["num_heldout"] == 1 and m.spec["num_items"] == 5
    assert m.spec["observed_fraction"] == pytest.approx(4 / 10)
    b = all_rows("nmf", out)[0]
    assert b.data["indptr"].tolist() == [0, 2, 4]
    assert b.data["items"].tolist() == [1, 4, 0, 3] and b.data["ratings"].tolist() == [1.0, 3.0, 2.0, 4.5]
    assert all_rows("nmf", out, heldout=True)[0].data["items"].tolist() == [2]


def test_triplet_errors_name_the_line(tmp_path: Path) -> None:
    path = text(tmp_path, "r.tsv", "1\t2\t3\n1\t5\t1\n1\t2\t4\n")
    with pytest.raises(TextFormatError, match=r"r.tsv:3: user 1 rated item 2 again \(first on line 1\)"):
        import_triplets(path, str(tmp_path / "a"), ImportOptions(heldout_fraction=0.5, index_base=0))
    path = text(tmp_path, "s.txt", "1 2 3\n1 x 3\n")
    with pytest.raises(TextFormatError, match=r"s.txt:2: user '1' and item 'x' must be integers"):
        import_triplets(path, str(tmp_path / "b"), ImportOptions(heldout_fraction=0.5))
    path = text(tmp_path, "t.txt", "1 2\n")
    with pytest.raises(TextFormatError, match=r"t.txt:1: expected `user item value`"):
        import_triplets(path, str(tmp_path / "c"), ImportOptions(heldout_fraction=0.5))


def test_a_numeric_first_triplet_line_is_a_row_not_a_header(tmp_path: Path) -> None:
    # A first line whose user or item is a number is data: "1.0" as a user id is an error naming
    # line 1, not a header silently dropped (with item 7, the largest, and num_items with it).
    path = text(tmp_path, "r.csv", "1.0,7,5\n1,3,4\n2,2,3\n3,1,1\n")
    with pytest.raises(TextFormatError, match=r"r.csv:1: user '1.0' and item '7' must be integers"):
        import_triplets(path, str(tmp_path / "a"), ImportOptions(heldout_fraction=0.25, index_base=0))
    path = text(tmp_path, "s.csv", "user,7.5,5\n1,3,4\n")
    with pytest.raises(TextFormatError, match=r"s.csv:1: user 'user' and item '7.5' must be integers"):
        import_triplets(path, str(tmp_path / "b"), ImportOptions(heldout_fraction=0.25, index_base=0))
    # a header is a first line whose user and item are both not numbers
    path = text(tmp_path, "t.csv", "# ratings\nuser item rating\n0 7 5\n1 3 4\n2 2 3\n3 1 1\n")
    m = import_triplets(path, str(tmp_path / "c"), ImportOptions(heldout_fraction=0.25, index_base=0))
    assert m.spec["num_users"] + m.spec["num_heldout"] == 4 and m.spec["num_items"] == 8


def test_triplets_accept_spaces_around_double_colons(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    path = text(tmp_path, "ratings.dat", "1 :: 2 :: 5 :: 978300760\n1 ::3:: 4\n2\t::\t2 :: 3\n3::1::1\n")
    m = import_triplets(path, out, ImportOptions(rows_per_block=5, heldout_fraction=0.34, index_base=0))
    assert m.spec["num_users"] == 2 and m.spec["num_heldout"] == 1 and m.spec["num_items"] == 4
    b = all_rows("nmf", out)[0]
    assert b.data["indptr"].tolist() == [0, 2, 3]
    assert b.data["items"].tolist() == [2, 3, 2] and b.data["ratings"].tolist() == [5.0, 4.0, 3.0]
    assert all_rows("nmf", out, heldout=True)[0].data["items"].tolist() == [1]


DOCWORD = "3\n5\n5\n1 2 2\n1 5 1\n2 1 3\n3 3 1\n3 4 1\n"


def test_docword_for_lda(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    m = import_docword(text(tmp_path, "docword.txt", DOCWORD), out, ImportOptions(rows_per_block=2,
                                                                                   heldout_fraction=0.34))
    # doc index 2 (doc id 3) is held out; each word is repeated `count` times, ids rebased to 0
    assert m.spec == {"num_docs": 2, "vocab_size": 5, "num_heldout": 1, "rows_per_block": 2, "doc_length": 3}
    b = all_rows("lda", out)[0]
    assert b.data["indptr"].tolist() == [0, 3, 6] and b.data["words"].tolist() == [1, 1, 4, 0, 0, 0]
    assert all_rows("lda", out, heldout=True)[0].data["words"].tolist() == [2, 3]


@pytest.mark.parametrize("body, line, message", [
    ("3\n5\n", 2, "missing the D, W, NNZ header"),
    ("3\n5\n1\n2 9 1\n", 4, "word 9 is outside the vocabulary of W = 5"),
    ("3\n5\n2\n2 1 1\n1 1 1\n", 5, "doc 1 comes after doc 2"),
    ("3\n5\n1\n1 1 0\n", 4, "count 0 must be at least 1"),
    ("3\n5\n1\n1 1\n", 4, "expected `doc word count`"),
    ("3\n5\n3\n1 1 1\n", 0, "the header says NNZ = 3 but there are 1"),
])
def test_docword_errors_name_the_line(tmp_path: Path, body: str, line: int, message: str) -> None:
    path = text(tmp_path, "docword.bad", body)
    with pytest.raises(TextFormatError, match=message) as e:
        import_docword(path, str(tmp_path / "ds"), ImportOptions(heldout_fraction=0.5))
    assert e.value.line == line


def test_cli_generate_import_and_check(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "gen"
    assert cli_main(["data", "generate", "--app", "nmf", "--set", "num_users=120", "--set", "seed=4",
                     "--out", str(out)]) == 0
    assert "use it with: --set data.path=" in capsys.readouterr().out
    gen = create_app("nmf", {"num_users": 120, "seed": 4})
    assert np.array_equal(create_app("nmf", {"path": str(out)}).input_block(1).data["ratings"],
                          gen.generate_block(1).data["ratings"])
    assert cli_main(["data", "check", str(out)]) == 0
    assert cli_main(["data", "generate", "--app", "nmf", "--out", str(out)]) == 2          # not a new directory
    assert "already holds a dataset" in capsys.readouterr().err
    assert cli_main(["data", "generate", "--app", "nmf", "--set", "rank=0", "--out", str(tmp_path / "x")]) == 2
    assert "rank" in capsys.readouterr().err
    # a bad input file: exit 2 naming file and line, and nothing left behind
    bad = text(tmp_path, "bad.svm", "1 1:1\n0 1:oops\n")
    target = tmp_path / "imported"
    assert cli_main(["data", "import-libsvm", "--app", "mlr", "--input", bad, "--heldout-fraction", "0.5",
                     "--out", str(target)]) == 2
    assert f"{bad}:2: value of feature 1 'oops' is not a number" in capsys.readouterr().err
    assert not target.exists()
    good = text(tmp_path, "docword.txt", DOCWORD)
    assert cli_main(["data", "import-docword", "--input", good, "--heldout-fraction", "0.34",
                     "--out", str(target)]) == 0
    assert load_manifest(str(target)).spec["vocab_size"] == 5
    # check finds a damaged block
    (target / "train" / "block-000000.npz").write_bytes(b"junk")
    capsys.readouterr()
    assert cli_main(["data", "check", str(target)]) == 2
    assert "block-000000.npz: damaged block file" in capsys.readouterr().err
