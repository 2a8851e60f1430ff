"""bench/verify_cp.py on CPU: its defect models reproduce the numbers the first 2x H200 run reported, its runs ask
the capability table what it would refuse, and its corpus copies are the saved cases."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from attnfuzz.backends import factories, get
from attnfuzz.backends.cp.adapter import BACKENDS as CP_BACKENDS
from attnfuzz.oracles.grade import Oracle
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / ".gpu-findings" / "cp" / "corpus"


def _load_verify():
    spec = importlib.util.spec_from_file_location("verify_cp", ROOT / "bench" / "verify_cp.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("verify_cp", module)  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


vc = _load_verify()


@pytest.mark.parametrize("sq, window", [(8, (0, 1)), (16, (3, 3)), (16, (0, 5)), (32, (7, 2)), (16, (20, 20)),
                                        (256, (16, 16)), (12, (5, 4))])
def test_te_all_gather_window_adjustment_is_right_when_aligned_bottom_right(sq, window):
    """The transcription of TE's per-step KV slice and window: aligned bottom-right (what TE's computation assumes)
    it is exactly the case's band, so the defect is the alignment alone."""
    case = Case(sq=sq, skv=sq, window=window)
    i, j = torch.arange(sq)[:, None], torch.arange(sq)[None, :]
    band = (j >= i - window[0]) & (j <= i + window[1])
    assert torch.equal(vc.all_gather_window_mask(case, 2, "bottom_right")[0, 0], band)
    assert not torch.equal(vc.all_gather_window_mask(case, 2, "top_left")[0, 0], band)


def test_top_left_model_predicts_the_first_run_s_worst_element():
    """te-cp-all_gather-fused, window (0, 1), sq=8: the first run got 1.94531 at [0, 4, 0, 7] (expected -1.16538)."""
    case = vc.AG_FUSED
    seen = vc.all_gather_window_mask(case, 2, "top_left")[0, 0]
    assert seen[4].nonzero().flatten().tolist() == [4]        # row 4 sees key 4 only (its band is keys 4 and 5)
    tensors = materialize(case)
    oracle = Oracle.of(case, tensors)
    model = vc.model_output(vc.Run("4", "", "te-cp-all_gather-fused", case, "FAIL", model="topleft"), tensors, oracle)
    assert model[0, 4, 0, 7].item() == pytest.approx(1.94531, abs=1e-5)
    assert oracle.ref.out[0, 4, 0, 7].item() == pytest.approx(-1.16538, abs=1e-5)


def test_empty_step_model_predicts_the_first_run_s_worst_element():
    """te-cp-p2p-fused, thd seqlens (1,): the first run got 0.466797 at [0, 0, 0, 26] where the oracle has 3.39062,
    and a merge with an empty step of LSE 0 gives v0 * sigmoid(lse0)."""
    case = vc.P2P_FUSED
    tensors = materialize(case)
    oracle = Oracle.of(case, tensors)
    model = vc.model_output(vc.Run("3", "", "te-cp-p2p-fused", case, "FAIL", model="empty_step"), tensors, oracle)
    assert oracle.ref.out[0, 0, 0, 26].item() == pytest.approx(3.390625)
    assert model[0, 0, 0, 26].item() == pytest.approx(0.466797, rel=2 ** -8)   # bf16 rounding of the reported value
    longer = case.replace(seqlens_q=(2,), seqlens_kv=(2,))                     # no empty step: the model is the oracle
    o2 = Oracle.of(longer, materialize(longer))
    assert torch.equal(vc.empty_step_output(longer, o2.ref.out, o2.ref.lse, 2), o2.ref.out)


def test_runs_name_real_backends_and_bypass_the_table_only_where_it_refuses():
    names = set(factories())
    for run in vc.runs(cudnn=None):
        assert run.backend in names, run.backend
        if run.backend not in CP_BACKENDS:  # FA4 alone: a spelling its adapter takes (TE's (-1, 0) among them)
            assert get(run.backend, "cuda").unsupported(run.case) is None, run.what
            continue
        refusal = CP_BACKENDS[run.backend]("cpu").engine.unsupported(run.case)
        assert (refusal is not None) == (not run.table), (run.what, refusal)
        assert run.model in (None, "topleft", "empty_step")


def test_thd_sink_probe_expects_what_the_cudnn_version_allows():
    [probe] = [r for r in vc.runs(cudnn=91300) if r.case.softmax == "learnable"]
    assert probe.expect == "UNSUPPORTED"
    [probe] = [r for r in vc.runs(cudnn=91800) if r.case.softmax == "learnable"]
    assert probe.expect == "PASS"


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"{CORPUS} holds the first run's findings; not in this checkout")
def test_built_in_corpus_cases_are_the_saved_ones():
    notes = vc.check_corpus(CORPUS)
    assert len(notes) == len(list(CORPUS.glob("*.json"))) == 7
    assert all("same case as built in" in n for n in notes), notes
    for path in CORPUS.glob("*.json"):
        data = json.loads(path.read_text())
        assert Case.from_dict(data["case"]) == vc.CORPUS[data["backend"]]
