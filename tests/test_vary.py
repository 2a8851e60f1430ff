"""`attnfuzz vary`: a saved case over a grid of field changes, each variant's verdict, a fault costing one variant."""

from __future__ import annotations

import json

import pytest

from attnfuzz.cli import main
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case
from attnfuzz.tools.vary import parse_set, split_values, variants

CAUSAL = Case(b=1, sq=5, skv=5, h=2, hk=2, d_qk=8, d_v=8, dtype="float32", causal=True)


def _entry(tmp_path, spec: str, case: Case = CAUSAL, label: str = "FAIL:ALL_ZERO"):
    status, diagnosis = label.split(":")
    return corpus_io.save(tmp_path, corpus_io.Entry(spec, case, V.Verdict(status, diagnosis)), repro=False)


def _rows(out: str) -> dict[str, str]:
    """The table's rows: the changes column -> the rest of the line."""
    lines = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    return {line.split("  ")[0]: line for line in lines}


def test_values_split_outside_brackets_and_parse_as_json_or_words():
    assert split_values('8,[4, 4],null, "a,b"') == ["8", "[4, 4]", "null", '"a,b"']
    assert parse_set("window=[4,4],null") == ("window", [[4, 4], None])
    assert parse_set("dtype=bfloat16,float16") == ("dtype", ["bfloat16", "float16"])
    assert parse_set("grads=true") == ("grads", [True])


@pytest.mark.parametrize("text, says", [("d_qk", "FIELD=V1,V2"), ("dqk=8", "not a Case field"), ("d_qk=", "FIELD=")])
def test_a_bad_set_names_itself_and_the_fix(text, says):
    with pytest.raises(ValueError, match=says):
        parse_set(text)


def test_the_base_runs_first_then_the_product_and_a_broken_rule_is_listed_not_run():
    grid = variants(CAUSAL, [("d_qk", [8, 32]), ("hk", [2, 3])])
    assert [changes for changes, _ in grid] == [{}, {"d_qk": 8, "hk": 2}, {"d_qk": 8, "hk": 3},
                                               {"d_qk": 32, "hk": 2}, {"d_qk": 32, "hk": 3}]
    assert grid[0][1] == CAUSAL and grid[3][1] == CAUSAL.replace(d_qk=32)
    invalid = [case for changes, case in grid if changes.get("hk") == 3]
    assert all(isinstance(c, str) and "hk" in c for c in invalid), invalid   # 2 heads do not group in 3
    assert [c for c, _ in variants(CAUSAL, [("d_qk", [8, 32]), ("hk", [1])], each=True)] == [
        {}, {"d_qk": 8}, {"d_qk": 32}, {"hk": 1}]
    assert variants(CAUSAL, [("sq", [1]), ("sq", [2])])[1:] == [({"sq": 1}, CAUSAL.replace(sq=1)),
                                                               ({"sq": 2}, CAUSAL.replace(sq=2))]


def test_the_variants_that_keep_the_failure_are_told_from_those_that_lose_it(tmp_path, capsys):
    """A kernel that zeroes causal outputs: causal variants fail, the one without causal passes (the control: the
    table shows each variant's own verdict, not the entry's)."""
    path = _entry(tmp_path, "tests.misbehaving:zero_when_causal")
    assert main(["vary", str(path), "--set", "causal=true,false", "--set", "dtype=float16", "--no-isolate"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert "FAIL:ALL_ZERO" in rows["(as saved)"]
    assert "FAIL:ALL_ZERO" in rows['causal=true dtype="float16"']
    assert "PASS" in rows['causal=false dtype="float16"'] and "FAIL" not in rows['causal=false dtype="float16"']


def test_a_fault_costs_one_variant_in_an_isolated_worker(tmp_path, capsys):
    path = _entry(tmp_path, "tests.misbehaving:segfault_when_causal", label="CRASH:SIGSEGV")
    assert main(["vary", str(path), "--set", "causal=true,false", "--case-timeout", "30", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    labels = [[v["label"] for v in row["verdicts"]] for row in report["variants"]]
    assert labels[0][0].startswith("CRASH") and labels[1][0].startswith("CRASH"), labels
    assert labels[2] == ["PASS"], "the variant after the faults ran in a fresh worker"


def test_runs_repeat_each_variant(tmp_path, capsys):
    path = _entry(tmp_path, "tests.misbehaving:zero_when_causal")
    assert main(["vary", str(path), "--runs", "2", "--no-isolate", "--json"]) == 0
    out = capsys.readouterr().out
    [row] = json.loads(out[out.index("{"):])["variants"]
    assert [v["label"] for v in row["verdicts"]] == ["FAIL:ALL_ZERO"] * 2


def test_a_bare_case_file_runs_with_a_backend_named(tmp_path, capsys):
    bare = tmp_path / "case.json"
    bare.write_text(json.dumps({"case": CAUSAL.to_dict()}))
    assert main(["vary", str(bare), "--no-isolate"]) == 2
    assert "--backend" in capsys.readouterr().err
    assert main(["vary", str(bare), "--backend", "tests.misbehaving:zero_when_causal", "--no-isolate"]) == 0
    assert "FAIL:ALL_ZERO" in _rows(capsys.readouterr().out)["(as saved)"]


def test_bad_input_exits_2_naming_it(tmp_path, capsys):
    path = _entry(tmp_path, "tests.misbehaving:zero_when_causal")
    assert main(["vary", str(path), "--set", "dqk=8", "--no-isolate"]) == 2
    assert "'dqk' is not a Case field" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("not json")
    assert main(["vary", str(tmp_path / "junk.json"), "--no-isolate"]) == 2
    assert "junk.json" in capsys.readouterr().err


def test_a_refused_variant_says_why(tmp_path, capsys):
    path = _entry(tmp_path, "tests.misbehaving:segfault_when_causal", CAUSAL.replace(causal=False), "CRASH:SIGSEGV")
    assert main(["vary", str(path), "--set", "window=[2,2]", "--no-isolate"]) == 0
    assert "a plain kernel: no windows" in _rows(capsys.readouterr().out)["window=[2, 2]"]
