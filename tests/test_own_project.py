"""A user's own project: the fuzz targets (`pytest --pyargs attnfuzz.test_fuzz --attnfuzz-backend module:fn`) run from
the project's folder, not attnfuzz's checkout, grade the user's kernel and fail on its bug; a finding of it replays
from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

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


ZEROS_KERNEL = """import torch


def attention(q, k, v, *, causal, window, bottom_right, scale):
    return torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
"""


def test_a_custom_kernels_entry_replays_from_any_folder(tmp_path, monkeypatch):
    """The entry records the folder its kernel's module was imported from, and replay imports it from there where
    it does not import otherwise (as the repro script does): the bug is still there, exit 1, not a skip and exit 0.
    An entry that records no folder exits 2 saying how to fix it."""
    from attnfuzz.store import corpus as corpus_io
    kernels, elsewhere = tmp_path / "kernels", tmp_path / "elsewhere"
    kernels.mkdir()
    elsewhere.mkdir()
    (kernels / "replayed_kernel.py").write_text(ZEROS_KERNEL)
    monkeypatch.syspath_prepend(str(kernels))
    entry = corpus_io.Entry("replayed_kernel:attention", Case(sq=4, skv=4, d_qk=8, d_v=8),
                            V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0"))
    path = corpus_io.save(tmp_path / "corpus", entry, repro=False)
    assert json.loads(path.read_text())["kernel_path"] == str(kernels)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def replay(cwd):
        return subprocess.run([sys.executable, "-m", "attnfuzz", "replay", str(path)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)

    ran = replay(elsewhere)
    assert ran.returncode == 1 and "FAIL:ALL_ZERO" in ran.stdout, ran.stdout + ran.stderr
    data = json.loads(path.read_text())
    data.pop("kernel_path")
    path.write_text(json.dumps(data))  # as an entry saved before entries recorded it
    ran = replay(elsewhere)
    assert ran.returncode == 2 and "replay from the folder that holds the module" in ran.stdout, ran.stdout
    assert replay(kernels).returncode == 1  # control: from the folder that holds it, it imports as it is
