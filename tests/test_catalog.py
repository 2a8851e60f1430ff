"""The findings catalog: one row per bug, and docs/findings.md kept equal to what the shipped corpus makes."""

from __future__ import annotations

from pathlib import Path

from attnfuzz.report import catalog
from attnfuzz.store import corpus as corpus_io
from attnfuzz.cli import main
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

ROOT = Path(__file__).resolve().parents[1]


def test_docs_findings_is_the_catalog_of_the_shipped_corpus():
    assert (ROOT / "docs" / "findings.md").read_text() == catalog.markdown(corpus_io.shipped_dir()), \
        "regenerate it: attnfuzz catalog corpus --out docs/findings.md"


def test_one_row_per_known_bug_and_per_unknown_label(tmp_path):
    bug = {"link": "https://github.com/o/r/issues/7", "note": "zeros when causal", "match": "", "when": {}}
    for sq, label in ((3, V.ALL_ZERO), (1, V.MASK_ALIGNMENT)):  # two faces of one known bug: one row
        corpus_io.save(tmp_path, corpus_io.Entry("k", Case(sq=sq, causal=True), V.Verdict(V.FAIL, label),
                                                 known_bug=bug), repro=False)
    corpus_io.save(tmp_path, corpus_io.Entry("k", Case(), V.Verdict(V.FAIL, V.SCALE)), repro=False)
    rows = catalog.rows(tmp_path)
    assert len(rows) == 2
    known = next(r for r in rows if "o/r#7" in r[4])
    assert known[2] == "FAIL:ALL_ZERO, FAIL:MASK_ALIGNMENT" and "sq=1 " in known[3] and known[5].count("`k-") == 2
    assert next(r for r in rows if r is not known)[4] == "not yet reported"


def test_catalog_of_a_missing_folder_exits_2(tmp_path, capsys):
    assert main(["catalog", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_a_users_catalog_gets_a_preamble_of_its_own(tmp_path, capsys):
    mine = tmp_path / "mine"
    corpus_io.save(mine, corpus_io.Entry("k", Case(), V.Verdict(V.FAIL, V.SCALE)), repro=False)
    assert main(["catalog", str(mine)]) == 0
    page = capsys.readouterr().out
    assert page.startswith("# Findings in mine\n") and f"`attnfuzz catalog {mine}`" in page, page[:400]
    assert "shipped" not in page and "docs/findings.md" not in page and "| `k` |" in page
    assert catalog.markdown(corpus_io.shipped_dir()).startswith(catalog.HEADER)  # control: the shipped corpus's own
