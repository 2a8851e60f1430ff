"""bench/grad_order.py tells which order a fused backward rounds dS in from the kernel's bits: the two orders written
out (tests/fused_kernels.py) are each recognised as themselves, and a case it cannot write out is refused (exit 2)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fused_kernels import flash_algorithm_backward
from tests.test_fused_families import TIED

SPEC = importlib.util.spec_from_file_location("grad_order", Path(__file__).resolve().parents[1] / "bench" /
                                              "grad_order.py")
grad_order = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(grad_order)


@pytest.mark.parametrize("scaled, order", [(False, "flash"), (True, "scaled")])
def test_each_order_written_out_is_recognised_as_itself(scaled, order):
    t = materialize(TIED)
    _, dq, dk, _ = flash_algorithm_backward(TIED, t, scaled_ds=scaled)
    shares = grad_order.bit_shares(TIED, t, {"dq": dq.to(t.q.dtype), "dk": dk.to(t.q.dtype)})
    assert shares[order] == {"dq": 1.0, "dk": 1.0}
    other = "scaled" if order == "flash" else "flash"
    assert shares[other]["dq"] < 0.5 and shares[other]["dk"] < 0.5   # the subnormal dS of this case tells them apart
    assert grad_order.closer_order(shares) == order


def test_a_backend_is_run_and_graded_under_its_family():
    case = Case(sq=5, skv=7, h=2, d_qk=16, d_v=16, dtype="float16", grads=True, seed=3)
    row = grad_order.examine(case, "sdpa-math", "cpu")
    assert row["family"] == "sdpa" and row["label"] == "PASS" and set(row["shares"]) == {"flash", "scaled"}
    assert "refused" in grad_order.examine(case, "te-fused", "cpu")   # cannot run here: a row, not an error


def test_a_case_the_orders_cannot_take_is_refused(tmp_path, monkeypatch, capsys):
    entry = tmp_path / "e.json"
    entry.write_text(json.dumps({"case": Case(sq=2, skv=2, dtype="float16").to_dict()}))   # no gradients
    monkeypatch.setattr(sys, "argv", ["grad_order.py", str(entry), "--backends", "sdpa-math"])
    assert grad_order.main() == 2
    assert "needs gradients" in capsys.readouterr().err
