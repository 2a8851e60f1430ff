"""The fuzz targets in a user's own project: `pytest --pyargs attnfuzz.test_fuzz --attnfuzz-backend module:fn`, run
from the project's folder (not attnfuzz's checkout), grades the user's kernel and fails on its bug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KERNEL = '''
import torch.nn.functional as F


def attention(q, k, v, *, causal, window, bottom_right, scale):
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale={scale}, enable_gqa=True)
    return out.transpose(1, 2)


attention.supports = lambda case: (case.window == (None, None) and not (case.causal and case.alignment == "bottom_right"
                                   and case.sq != case.skv)) or "no sliding window; is_causal is top-left"
'''


def _project(root: Path, scale: str) -> Path:
    (root / "mykernels").mkdir(parents=True)
    (root / "mykernels" / "__init__.py").write_text("")
    (root / "mykernels" / "attn.py").write_text(KERNEL.format(scale=scale))
    return root


@pytest.mark.parametrize("scale, code, says", [("scale", 0, "1 passed"), ("None", 1, "FAIL:SCALE")],
                         ids=["correct", "ignores-scale"])
def test_the_fuzz_targets_run_a_users_kernel_from_its_own_folder(tmp_path, scale, code, says):
    project = _project(tmp_path / "project", scale)
    ran = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "attnfuzz.test_fuzz", "--attnfuzz-backend",
                          "mykernels.attn:attention", "--attnfuzz-max-examples", "40", "--attnfuzz-seed", "1",
                          "-q", "-p", "no:cacheprovider"], cwd=project, capture_output=True, text=True, timeout=600)
    assert ran.returncode == code, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert says in ran.stdout
