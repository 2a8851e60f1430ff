"""SDPA repro scripts spell every SDPA spelling and layout out: no attnfuzz import, right call passes, broken fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.backends.sdpa.spelling import all_spellings
from attnfuzz.store.repro import script
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.strategies.case import Case

CASES = [Case(sq=3, skv=5, h=2, hk=1, d_qk=8, d_v=8, causal=True, alignment="bottom_right", layout="sbhd", grads=True),
         Case(sq=4, skv=4, h=2, hk=2, d_qk=8, d_v=8, alibi_slopes=(0.5, 0.25), dtype="float32"),
         Case(sq=4, skv=4, h=2, hk=2, d_qk=8, d_v=8, causal=True)]
SPELLED = [(c.replace(spelling=s.name)) for c in CASES for s in all_spellings(c)]


@pytest.mark.parametrize("case", SPELLED, ids=[f"{c.spelling or 'plain'}-{c.layout}" for c in SPELLED])
def test_every_sdpa_spelling_is_written_out(case):
    backend = get("sdpa-math")
    if backend.unsupported(case):
        pytest.skip(backend.unsupported(case))
    source = script(corpus_io.Entry("sdpa-math", case, Verdict("FAIL", "TOLERANCE")))
    assert "fuzz." not in source and "strategies" not in source and "oracles" not in source
    ok = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = source.replace("return out.transpose(1, 2)", "return 0.5 * out.transpose(1, 2)")
    bad = subprocess.run([sys.executable, "-I", "-c", broken], capture_output=True, text=True)
    assert bad.returncode == 1 and "> bound" in bad.stdout, bad.stdout + bad.stderr
