"""sdpa-cudnn: torch SDPA forced to cuDNN, with the key of the execution graph cuDNN builds for a case.

torch builds one cuDNN execution graph per set of MHAParams (aten/src/ATen/native/cudnn/MHA.cpp): the dtype, every
dim and stride of q, k and v, b, h, the lengths and head dims, whether a bias (the attention mask) is present and its
dims and strides, is_causal, and whether the softmax statistics (the LSE, which the backward needs) are returned.
The graph is cached in the process; a new one takes from tens of milliseconds to seconds to build. The values,
the softmax scale and what the mask holds are inputs of a built graph. So `compile_key` groups cases by those
fields and no others, and the compile-aware search (strategies/compiled.py) draws most cases inside graphs already
built, varying values, scale and band, as it does for FA4's compiled kernels. The graph cache lives in the process
only: there is nothing on disk for a warm-up to leave behind (Backend.compiles_to_disk).
"""

from __future__ import annotations

from attnfuzz.backends.sdpa.adapter import SdpaBackend
from attnfuzz.strategies.case import Case


def graph_key(case: Case) -> tuple:
    """The fields of a case that decide its cuDNN graph: shapes, strides (layout, memory, storage, the spelling's
    tensor and mask forms), dtype, gradients, and which mask is present. What the mask holds (window sizes, the
    alignment's offset, a random mask's density, per-sequence lengths under padding) is not in it: it fills a bias
    of the same shape."""
    left, right = case.window
    return (case.dtype, case.b, case.h, case.hk, case.sq, case.skv, case.d_qk, case.d_v, case.layout, case.memory,
            case.storage, case.spelling, case.grads, case.causal, case.alignment != "top_left", left is None,
            right is None, case.mask_density is None, case.seqlens_q is None, case.seqlens_kv is None,
            case.alibi_slopes is None, case.scale is None)


class CudnnSdpaBackend(SdpaBackend):
    compiles_to_disk = False

    def compile_key(self, case: Case) -> tuple | None:
        return graph_key(case)


BACKENDS = {"sdpa-cudnn": lambda device: CudnnSdpaBackend("sdpa-cudnn", device)}
