"""What each context-parallel engine can take, with a reason for every refusal.

torch ring attention (torch 2.13, torch/distributed/tensor/experimental/_context_parallel/_attention.py): the ring
passes q/k/v and is_causal to an SDPA op that returns an LSE, and nothing else.

TransformerEngine 2.20.2 (pytorch/attention/dot_product_attention/context_parallel.py, attn_forward_func_with_cp and
the three autograd functions; utils.py, get_attention_backend, "Filter: Context parallelism"). Each rule below names
where TE states it. "flash" is the FlashAttention TE picks; on the GPU runner that is FA4 4.0.0b36 (no FA2/FA3).

| rule                                               | p2p | all_gather | a2a | a2a+p2p |
|----------------------------------------------------|-----|------------|-----|---------|
| ranks                                              |  2  |     2      |  2  | 4 (2x2) |
| every sequence length a multiple of 2*cp           |  y  |     y      |  y  |    y    |
| h and hk multiples of cp (a2a ranks)               |  -  |     -      |  y  | y (a2a=2)|
| FusedAttention: h and hk even                      |  -  |     -      |  y  |    y    |
| sliding window                                     |  no |    yes     | yes |   no    |
| off-by-one / learnable softmax (FusedAttention)    |  no |     no     | yes |   no    |
| FlashAttention (FA4 on the runner)                 | yes |    yes     | yes |   no    |
Common to all: fp16/bf16; bshd/sbhd take no padding (no_mask / causal only), thd takes padding / padding_causal;
causal only for self-attention (sq == skv); causal_bottom_right refused (the adapter spells bottom-right as causal
when sq == skv, where the two coincide); no ALiBi, no arbitrary mask, no softcap; FlashAttention takes no sbhd.
Padding between thd sequences (lengths not multiples of 2*cp) is taken by FA3 / FA4 through seqused_q / seqused_k
(utils.py, "Filter: QKV layout" disables only FA2 for it; the runner's FlashAttention is FA4). FusedAttention:
off-by-one / learnable softmax with thd needs cuDNN >= 9.18 (utils.py, "Filter: Softmax type"); all_gather over
bshd/sbhd with sq = skv = 2*cp (one query and one key row per chunk): TE 2.20.2 found no FusedAttention for its
per-step configs on the H200 runner (16 of 16; sq = 4 with skv = 8 or 12 ran), reason not yet read from TE's log
(TEEngine(table=False) lets such a case through to read it).

Known defects are not refusals: the cases run (and replay) as they are, and the strategy only avoids drawing the
torch one, which would otherwise end every fp32 ring run at its first example. They are written down here so the
table and the triage say the same thing.
"""

from __future__ import annotations

from attnfuzz.backends.base import first_reason
from attnfuzz.strategies.case import Case

TE_COMM_TYPES = {"p2p": 2, "all_gather": 2, "a2a": 2, "a2a+p2p": 4}  # comm type -> ranks it runs on here
TE_KERNELS = ("fused", "flash")
TE_HEAD_DIMS = (64, 128)
CUDNN_THD_SINKS = 91800  # cuDNN 9.18, as torch.backends.cudnn.version() spells it
LSE_ALIGN = 32           # rows to which CUDA's memory-efficient SDPA op pads its LSE (ceil(s / 32) * 32)

RING_LSE_PADDING = "torch ring merge kept the memory-efficient op's LSE padding"
RING_LSE_PADDING_WHY = (
    "torch's ring merge (_SDPAMerger) takes the op's LSE to hold one entry per query row, but CUDA's memory-"
    "efficient SDPA op (the ring's op for fp32 on CUDA) pads it to a multiple of 32 rows: a shard whose query rows "
    "(half of them when load-balanced) are not a multiple of 32 is broadcast to 32 rows, or raises. torch's public "
    "context_parallel makes the same call (_scaled_dot_product_ring_efficient_attention).")
TE_DEFECTS = {
    "fa4_window_sentinel": "TE 2.20.2 passes FlashAttention 4 window_size (-1, 0) for causal; FA4 >= #2490 reads -1 as "
                           "a bound, so the band is empty: all-zero output (a2a, all_gather, non-CP), or only the "
                           "off-diagonal tiles of p2p's ring (p2p resets those to (-1, -1)).",
    "p2p_empty_kv_step": "TE 2.20.2 p2p + FusedAttention + thd: a step whose KV holds no valid token of a sequence "
                         "(a length-1 sequence under cp=2) returns LSE 0, not -inf, and the merge weighs it in: "
                         "out = out_true * sigmoid(lse_true).",
    "all_gather_swa_alignment": "TE 2.20.2 all_gather + FusedAttention, non-causal sliding window: the per-step window "
                                "is adjusted for bottom-right alignment (get_kv_seq_info_after_all_gather) but "
                                "fused_attn_fwd gets no bottom_right_diagonal and aligns no_mask / padding top-left.",
}


def a2a_ranks(comm_type: str, cp: int) -> int:
    """How many ranks scatter the heads: all of cp for a2a, the a2a sub-group (2) for a2a+p2p, none otherwise."""
    return {"a2a": cp, "a2a+p2p": 2}.get(comm_type, 0)


def _same_lengths(case: Case) -> bool:
    return case.sq == case.skv and case.lens_q == case.lens_kv


def common_refusal(case: Case) -> str | None:
    """Features no CP engine here models: an explicit mask, ALiBi, softcap."""
    return first_reason(
        (case.mask_density is not None, "context parallelism takes no arbitrary (explicit boolean) mask"),
        (case.alibi_slopes is not None, "context parallelism takes no ALiBi (torch: no bias in the ring; TE: "
                                        "core_attention_bias_type must be no_bias or post_scale_bias)"),
        (case.softcap is not None, "softcap is not taken under context parallelism (torch SDPA has none; TE 2.20.2 "
                                   "disables FusedAttention for softcap and does not pass it to FlashAttention 4)"),
    )


def ring_refusal(case: Case, world: int, device: str = "cpu") -> str | None:
    """Why torch's ring attention over `world` ranks cannot take the case (None: it can)."""
    lb = case.spelling == "head_tail" or (case.spelling == "" and case.causal)
    unit = 2 * world if lb else world
    return first_reason(
        (case.spelling not in ("", "head_tail", "contiguous"),
         f"spelling={case.spelling!r}: ring attention spells load balancing as '', 'head_tail' or 'contiguous'"),
        (common_refusal(case) is not None, common_refusal(case) or ""),
        (case.layout == "thd", "ring attention shards one padded sequence axis; packed thd has no SDPA op with an "
                               "LSE"),
        (case.padded, "ring attention passes no mask to SDPA, so padded sequences (seqlens_q/seqlens_kv) cannot "
                      "be masked"),
        (case.window != (None, None), "SDPA under the ring takes no sliding window (only is_causal)"),
        (case.softmax != "vanilla", "SDPA takes no attention sink (softmax must be vanilla)"),
        (case.causal and case.sq != case.skv, "torch: is_causal requires the same query and context sequence "
                                              "lengths under ring attention"),
        (lb and not case.causal, "torch refuses load balancing for non-causal attention ('Load balancing requires "
                                 "`is_causal=True`'); use spelling 'contiguous'"),
        (case.sq % unit != 0 or case.skv % unit != 0,
         f"sq={case.sq} and skv={case.skv} must be multiples of {unit} "
         f"({'2*world: head-tail chunks' if lb else 'world: one contiguous shard per rank'})"),
        (case.d_qk != case.d_v, "torch's SDPA flash ops need the same head size for q, k and v"),
        (device == "cuda" and case.dtype == "float64", "no CUDA SDPA op with an LSE takes float64"),
    )


def ring_lse_align(device: str, dtype: str) -> int:
    """Rows to which the LSE of the ring's SDPA op is padded: 32 for CUDA's memory-efficient op (fp32), else 1."""
    return LSE_ALIGN if device == "cuda" and dtype == "float32" else 1


def ring_lse_padding_defect(case: Case, world: int, align: int) -> bool:
    """Whether torch's ring runs the case into RING_LSE_PADDING_WHY with an op whose LSE is padded to `align` rows:
    per-rank query rows not a multiple of `align` (of 2 * align when load-balanced, whose partial steps take half
    the rows)."""
    if align <= 1:
        return False
    lb = case.spelling == "head_tail" or (case.spelling == "" and case.causal)
    return (case.sq // world) % (2 * align if lb else align) != 0


FA4_NO_A2A_P2P = ("TE disables FlashAttention 4 for cp_comm_type a2a+p2p (utils.py: fa4_cp_supported), the only "
                  "FlashAttention on the runner")


def te_refuses_all(comm_type: str, kernel: str) -> str | None:
    """The reason when a comm type / kernel pair takes no case at all on the runner (None: it takes some)."""
    return FA4_NO_A2A_P2P if (comm_type, kernel) == ("a2a+p2p", "flash") else None


def _cudnn_text(cudnn: int | None) -> str:
    return "unknown" if cudnn is None else f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}"


def te_refusal(case: Case, comm_type: str, kernel: str, world: int, cudnn: int | None = None) -> str | None:
    """Why TE 2.20.2's DotProductAttention with `cp_comm_type=comm_type`, forced to `kernel` ("fused" or "flash"),
    over `world` ranks cannot take the case (None: it can). `cudnn` is the cuDNN version TE runs with
    (torch.backends.cudnn.version() spelling; None: unknown, taken as older than 9.18)."""
    if comm_type not in TE_COMM_TYPES:
        return f"cp_comm_type={comm_type!r} is not one of {tuple(TE_COMM_TYPES)}"
    if kernel not in TE_KERNELS:
        return f"kernel={kernel!r} is not one of {TE_KERNELS}"
    cp = world
    a2a = a2a_ranks(comm_type, cp)
    band = case.window != (None, None) and not (case.left is None and case.right == 0)
    return first_reason(
        (world != TE_COMM_TYPES[comm_type], f"{comm_type} runs on {TE_COMM_TYPES[comm_type]} ranks here "
                                            f"(a2a+p2p as a 2x2 grid), not {world}"),
        (case.spelling != "", f"spelling={case.spelling!r}: the TE CP adapter has only the default spelling"),
        (common_refusal(case) is not None, common_refusal(case) or ""),
        (case.dtype not in ("float16", "bfloat16"), "FusedAttention and FlashAttention run fp16/bf16 only"),
        (case.d_qk not in TE_HEAD_DIMS or case.d_v not in TE_HEAD_DIMS,
         f"attnfuzz draws TE CP head dims from {TE_HEAD_DIMS} only (kernel head-dim limits are not modelled)"),
        (case.layout != "thd" and case.padded, "bshd/sbhd under CP take no padding mask (TE: no_mask or causal "
                                               "only; use thd for padded sequences)"),
        (case.layout == "thd" and not _same_lengths(case), "thd under CP is modelled for self-attention only "
                                                           "(seqlens_q == seqlens_kv, sq == skv)"),
        (case.right == 0 and case.sq != case.skv, "TE refuses causal masking for cross-attention under CP "
                                                  "(utils.py: 'causal masking for cross-attention')"),
        (band and not _same_lengths(case), "sliding windows are drawn for self-attention (sq == skv) only"),
        (band and case.right != 0 and (case.left is None or case.right is None),
         "TE spells a non-causal window as (>=0, >=0) or (-1, -1) (check_set_window_size); a half-open band has "
         "no spelling"),
        (band and comm_type in ("p2p", "a2a+p2p"), f"TE refuses sliding window attention with "
                                                   f"cp_comm_type={comm_type} (attn_forward_func_with_cp)"),
        (case.softmax != "vanilla" and (comm_type != "a2a" or kernel != "fused"),
         f"softmax={case.softmax!r} under CP needs cp_comm_type='a2a' and FusedAttention (TE: 'Context "
         f"parallelism only supports softmax_type with cp_comm_type = a2a' / FusedAttention)"),
        (te_refuses_all(comm_type, kernel) is not None, te_refuses_all(comm_type, kernel) or ""),
        (kernel == "fused" and case.layout == "thd" and case.softmax != "vanilla"
         and (cudnn is None or cudnn < CUDNN_THD_SINKS),
         f"softmax={case.softmax!r} with thd: TE disables FusedAttention for softmax_type != vanilla with thd on "
         f"cuDNN < 9.18 (utils.py); cuDNN here is {_cudnn_text(cudnn)}"),
        (comm_type == "all_gather" and kernel == "fused" and case.layout != "thd" and case.sq == case.skv == 2 * cp,
         f"all_gather with FusedAttention over {case.layout}: sq=skv={case.sq} leaves one query and one key row per "
         f"chunk, and TE 2.20.2 found no FusedAttention for that per-step config on the H200 runner (16 of 16)"),
        (kernel == "flash" and case.layout == "sbhd", "TE: 'Context parallelism does not support FlashAttention "
                                                      "backend with qkv_format = sbhd'"),
        (case.layout != "thd" and (case.sq % (2 * cp) or case.skv % (2 * cp)),
         f"sq={case.sq} and skv={case.skv} must be multiples of 2*cp={2 * cp} (TE splits each sequence in 2*cp "
         f"chunks)"),
        (a2a and (case.h % a2a or case.hk % a2a), f"cp_comm_type={comm_type} scatters heads over {a2a} ranks: h="
                                                  f"{case.h} and hk={case.hk} must be multiples of {a2a}"),
        (a2a and kernel == "fused" and (case.h % 2 or case.hk % 2),
         f"FusedAttention with cp_comm_type={comm_type} needs h and hk even (utils.py)"),
    )
