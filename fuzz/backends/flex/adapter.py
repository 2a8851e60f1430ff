"""torch flex_attention, eager ("flex-eager") and compiled ("flex-compiled").

Every mask of the case language is a mask_mod, one pattern per factory (attention-gym style), ANDed together; their
parameters live in tensors, so one compiled graph serves every value of them (off_b = 0 top-left, skv_b - sq_b
bottom-right):
  band_left(left)          query i sees key j iff  j >= i + off_b - left
  band_right(right)        query i sees key j iff  j <= i + off_b + right      (causal: right = 0)
  padding(lens_q, lens_kv) query i sees key j iff  i < sq_b and j < skv_b
  explicit(mask)           query i sees key j iff  mask[b, 0, i, j]
  documents(mod)           thd: one packed sequence (b = 1); packed query i sees packed key j iff both are in the
                           same sequence n and mod sees them at their positions in n (document masking)
Score mods: softcap  s -> c * tanh(s / c);  alibi  s -> s - slope_h * |i + off_b - j|  (per_document for thd).

Spellings, '+'-joined, "" = the first of each:  mask   block_mask (create_block_mask) | score_mask (the same mask_mod
applied in the score_mod as -inf, no block mask);  heads  enable_gqa | repeat_kv  (GQA cases only);  knob  none | one
of flex's kernel options (flex-compiled on CUDA; flex-eager the BACKEND ones: fuzz/backends/flex/knobs.py says
which and where).

LSE: flex's frontend already returns the natural log (it rescales its kernels' log2 statistics by ln 2), so the
adapter passes it through and the grader checks it.

Compiled: torch.compile(fullgraph=True) of one call; dynamo keeps a graph per structural variant (dtype, heads, head
dims, which mods, spelling) with dynamic lengths (a length of 1 apart: dynamo specializes on it), except explicit-mask
and thd variants, compiled with dynamic=False (a graph per shape) because inductor's CPU flex template emits C++ that
does not compile for them once sizes are symbolic (see _pin_static). The recompile limit is raised for the call (hitting
it is Unsupported, never a silent eager fallback), and `ran` says whether the graph really ran compiled and whether it
was new. On CPU flex has no backward (eager or compiled), and compiled flex has no LSE and no float64; inductor lowers
it on CPU only with AVX2 or better (ATEN_CPU_CAPABILITY=default or an older CPU: flex-compiled is not available there).
Its kernels are vectorised C++ for the ISA torch runs (ATEN_CPU_CAPABILITY), so a finding on one ISA may pass on
another: corpus entries record the ISA and are replayed under it (attnfuzz.store.replay.replay_under_isa).
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings

import torch

from attnfuzz.backends import layout
from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.flash.common import cuda_arch
from attnfuzz.backends.flex import knobs
from attnfuzz.backends.flex.mods import chain, document_index, documents, has_mask, masked_scores, mods_of, per_document
from attnfuzz.backends.flex.repro import flex_source
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

RECOMPILE_LIMIT = 4096  # graphs kept per code object while a campaign runs (dynamo's default is 8)


def _flex_call(q, k, v, score_mod, block_mask, scale, enable_gqa, want_lse, kernel_options=None):
    """The call that is compiled; also returns whether it ran inside a compiled graph."""
    from torch.nn.attention.flex_attention import flex_attention
    if want_lse:
        out, lse = _with_lse(flex_attention, q, k, v, score_mod, block_mask, scale, enable_gqa, kernel_options)
    else:
        out, lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                  enable_gqa=enable_gqa, kernel_options=kernel_options), None
    return out, lse, torch.compiler.is_compiling()


def _flex_call_static(*args):
    """_flex_call under a code object of its own, so its graphs (compiled with dynamic=False) are cached apart."""
    return _flex_call(*args)


def _with_lse(flex_attention, q, k, v, score_mod, block_mask, scale, enable_gqa, kernel_options):
    from torch.nn.attention import flex_attention as fa
    if hasattr(fa, "AuxRequest"):
        out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                  enable_gqa=enable_gqa, kernel_options=kernel_options,
                                  return_aux=fa.AuxRequest(lse=True))
        return out, aux.lse
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa,
                          kernel_options=kernel_options, return_lse=True)


class FlexBackend(Backend):
    family = "flex"

    def __init__(self, device: str, compiled: bool, compiler="inductor", arch: int | None = None):
        self.device, self.compiled = str(device), compiled
        self._arch = arch  # the compute capability the knob rules are read at: given, else the device's
        # torch.compile's backend: inductor is what flex-compiled fuzzes; unit tests hand in a compiler of their own
        # to check the adapter's graphs (one per variant, dynamic lengths, values as inputs) apart from its kernels
        self.compiler = compiler
        # each new structural variant compiles for seconds (minutes of C++ on a 2-core CPU)
        self.cost = 10.0 if compiled else 1.0
        self.name = "flex-compiled" if compiled else "flex-eager"
        self.variants: dict[tuple, int] = {}   # structural key -> cases run with it (compiled only)
        self.graphs = 0                        # graphs dynamo compiled for this backend
        self._compiled_calls: dict[bool, object] = {}   # static sizes? -> the torch.compile wrapper

    @property
    def _cpu(self) -> bool:
        return torch.device(self.device).type == "cpu"

    def version(self) -> str:
        return torch.__version__

    def available(self) -> str | None:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as e:
            return f"{self.name}: torch {torch.__version__} has no flex_attention ({e})"
        if not self._cpu and not torch.cuda.is_available():
            return f"{self.name}: device {self.device!r} is not usable here (torch.cuda.is_available() is False)"
        if self.compiled and self._cpu and self.compiler == "inductor":
            return _inductor_cpu_refusal(os.environ.get("ATEN_CPU_CAPABILITY"))
        return None

    def unsupported(self, case: Case) -> str | None:
        cpu_compiled = self.compiled and self._cpu
        return first_reason(
            (self.available() is not None, self.available() or ""),
            (case.softmax != "vanilla", f"softmax={case.softmax!r}: flex_attention's softmax has no sink term"),
            (case.layout == "thd" and sum(case.lens_kv) == 0,
             "thd with no key at all: flex_attention raises IndexError on a key length of 0 (packed KV is empty)"),
            (case.layout == "thd" and sum(case.lens_q) == 0,
             "thd with no query at all: nothing to grade, and flex's vmap over an empty packed query breaks the "
             "document mask's lookups"),
            (cpu_compiled and case.dtype == "float64", "compiled flex_attention on CPU takes float32 / float16 / "
                                                       "bfloat16 only (inductor's CPU template)"),
            (self.compiled and not self._cpu and min(case.d_qk, case.d_v) < 16,
             f"compiled flex_attention on CUDA needs head dims >= 16 (inductor: 'NYI: embedding dimension ... at "
             f"least 16'); got d_qk={case.d_qk}, d_v={case.d_v}"),
            (self._cpu and case.grads, "flex_attention on CPU has no backward, eager or compiled (torch raises "
                                       "NotImplementedError for inputs that require grad)"),
            (case.spelling not in self.spellings(case), self._spelling_refusal(case) or ""),
        )

    def spellings(self, case: Case) -> tuple[str, ...]:
        masks = ("", "score_mask") if has_mask(case) else ("",)
        heads = ("", "repeat_kv") if case.hk < case.h else ("",)
        names = ("", *knobs.KNOBS)
        return tuple("+".join(p for p in combo if p) for combo in itertools.product(masks, heads, names)
                     if not combo[2] or self.knob_refusal(combo[2], case, combo[:2]) is None)

    def knob_refusal(self, name: str, case: Case, parts=()) -> str | None:
        """Why kernel-option knob `name` is no spelling of `case` here (fuzz/backends/flex/knobs.py), or None."""
        if not self.compiled:
            return knobs.eager_refusal(name)
        device_type = torch.device(self.device).type
        arch = self._arch or cuda_arch(self.device) if device_type == "cuda" else None
        return knobs.knob_refusal(name, case, parts, device_type=device_type, arch=arch,
                                  flash_installed=device_type == "cuda" and knobs.flash_installed())

    def _spelling_refusal(self, case: Case) -> str | None:
        """None for a spelling of this case; else the rule of its refused knob, or the list of spellings."""
        if case.spelling in self.spellings(case):
            return None
        parts = case.spelling.split("+")
        refused = [self.knob_refusal(p, case, parts) for p in parts if p in knobs.KNOBS]
        listed = f"{list(self.spellings(case))}"
        return (f"spelling={case.spelling!r}: " + (refused[0] if refused and refused[0] else
                                                     f"not one of {self.name}'s spellings for this case: {listed}"))

    def run(self, case: Case, tensors: Tensors) -> Output:
        parts = set(case.spelling.split("+")) - {""}
        device = tensors.q.device
        packed = case.layout == "thd"
        leaves = [layout.to_layout(case, x, lens).detach().requires_grad_(case.grads)
                  for x, lens in ((tensors.q, case.lens_q), (tensors.k, case.lens_kv), (tensors.v, case.lens_kv))]
        q, k, v = (_bhsd(case, leaf) for leaf in leaves)
        if "repeat_kv" in parts:
            k, v = (x.repeat_interleave(case.h // case.hk, dim=1) for x in (k, v))
        mask_mod, score_mods = mods_of(case, tensors, device)
        if packed:
            docs = (*document_index(case, device), case.sq, case.skv)
            mask_mod, score_mods = documents(mask_mod, *docs), [per_document(m, *docs) for m in score_mods]
        block_mask = None
        if mask_mod is not None and "score_mask" in parts:
            score_mods.append(masked_scores(mask_mod))
        elif mask_mod is not None:
            from torch.nn.attention.flex_attention import create_block_mask
            batched = not packed and (case.padded or case.mask_density is not None)
            block_mask = create_block_mask(mask_mod, case.b if batched else None, None, q.shape[2], k.shape[2],
                                           device=device)
        score_mod = chain(*score_mods) if score_mods else None
        want_lse = not (self.compiled and self._cpu)
        args = (q, k, v, score_mod, block_mask, case.scale, case.hk < case.h and "repeat_kv" not in parts, want_lse,
                knobs.kernel_options(parts))
        with torch.set_grad_enabled(case.grads):
            out, lse, ran = self._call(case, args)
        result = Output(out=_logical(case, out.detach(), case.lens_q, case.sq), ran=ran)
        if lse is not None:
            result.lse = layout.lse_from_packed(lse.detach()[0], case.lens_q, case.sq) if packed else lse.detach()
        if case.grads:
            dout = _bhsd(case, layout.to_layout(case, tensors.dout, case.lens_q))
            grads = torch.autograd.grad(out, leaves, dout)
            result.dq, result.dk, result.dv = (layout.from_layout(case, g, lens, s) for g, lens, s in
                                               zip(grads, (case.lens_q, case.lens_kv, case.lens_kv),
                                                   (case.sq, case.skv, case.skv)))
        return result

    def compile_key(self, case: Case) -> tuple | None:
        """Compiled: the graph dynamo builds for the case (_variant_key), with the sizes where the variant is compiled
        static (explicit masks, thd) and the batch, which _pin_static marks static; elsewhere whether each length is
        1, which dynamo specializes on (a graph traced at sq = 1 is traced again at sq = 64: 14 of 664 cases of a CPU
        campaign, 66 of its 231 case seconds, when the key left it out); eager: None (nothing compiled)."""
        if not self.compiled:
            return None
        static = case.layout == "thd" or case.mask_density is not None
        return _variant_key(case) + ((case.b, case.sq, case.skv, case.lens_q, case.lens_kv) if static
                                     else (case.b, case.sq == 1, case.skv == 1))

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` as run() calls flex, for standalone repro scripts (fuzz/store/repro.py); None
        for a case flex cannot express (a sink, an unknown spelling). A knob spelling is written wherever it was
        found: the writing machine need not have the GPU (or FA4) that offered it."""
        parts = set(case.spelling.split("+")) - {""}
        known = {"score_mask"} if has_mask(case) else set()
        known |= {"repeat_kv"} if case.hk < case.h else set()
        knob_parts = parts & set(knobs.KNOBS if self.compiled else knobs.EAGER_KNOBS)
        expressible = case.softmax == "vanilla" and len(knob_parts) <= 1 and parts <= known | knob_parts
        with_lse = not (self.compiled and self._cpu)  # as run() asks for it
        return flex_source(case, self.compiled, with_lse) if expressible else None

    def _call(self, case: Case, args):
        """(out, lse, what ran). Compiled: raise the recompile limit for the call and tell a cached graph from a new
        one and a compiled run from an eager fallback."""
        if not self.compiled:
            with warnings.catch_warnings():  # eager is this backend's point, not a mistake to warn a user about
                warnings.filterwarnings("ignore", "flex_attention called without torch.compile", UserWarning)
                out, lse, _ = _flex_call(*args)
            return out, lse, "flex_attention eager (dense math path)"
        import torch._dynamo
        static = case.layout == "thd" or case.mask_density is not None
        if static not in self._compiled_calls:
            self._compiled_calls[static] = (
                torch.compile(_flex_call_static, fullgraph=True, dynamic=False, backend=self.compiler) if static
                else torch.compile(_flex_call, fullgraph=True, backend=self.compiler))
        if not static:
            _pin_static(args)
        key = _variant_key(case)
        self.variants[key] = self.variants.get(key, 0) + 1
        limits = {name: value for name, value in (("recompile_limit", RECOMPILE_LIMIT),
                                                  ("accumulated_recompile_limit", RECOMPILE_LIMIT * 4),
                                                  ("fail_on_recompile_limit_hit", True))
                  if hasattr(torch._dynamo.config, name)}
        before = _graph_count()
        try:
            with torch._dynamo.config.patch(**limits):
                out, lse, ran_compiled = self._compiled_calls[static](*args)
        except Exception as e:
            if "recompile" in type(e).__name__.lower() or "recompile_limit" in str(e):
                raise Unsupported(f"compiled flex hit dynamo's recompile limit ({RECOMPILE_LIMIT}): {e}") from None
            raise
        new_graphs = _graph_count() - before
        self.graphs += new_graphs
        state = "compiled" if ran_compiled else "NOT compiled (dynamo ran it eagerly)"
        if ran_compiled and self.compiler != "inductor":
            state += f" by {getattr(self.compiler, '__name__', self.compiler)}"
        return out, lse, (f"flex_attention {state} ({'new' if new_graphs else 'cached'} graph; {self.graphs} graphs "
                          f"for {len(self.variants)} variants)")


@functools.lru_cache(maxsize=None)
def _inductor_cpu_refusal(aten_cpu_capability: str | None) -> str | None:
    """Why inductor cannot lower flex_attention on this CPU, or None: its C++ flex template needs AVX2 or better and
    ATEN_CPU_CAPABILITY other than "default" (torch raises NotImplementedError "torch.compile on current platform
    is not supported for CPU" otherwise). torch's own rule, asked once per value of the variable, which it reads."""
    try:
        from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported
    except ImportError:  # a torch without that rule: let a compile say what it says
        return None
    if check_cpu_supported():
        return None
    return (f"flex-compiled: inductor's CPU flex_attention template needs AVX2 or better and ATEN_CPU_CAPABILITY "
            f"other than 'default' (here: ATen capability {torch.backends.cpu.get_cpu_capability()}, "
            f"ATEN_CPU_CAPABILITY={aten_cpu_capability!r}); torch raises NotImplementedError for it")


def _graph_count() -> int:
    """Graphs dynamo has compiled in this process (its own counter; 0 when this torch has none)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except (ImportError, KeyError, TypeError):
        return 0


def _bhsd(case: Case, leaf: torch.Tensor) -> torch.Tensor:
    """A leaf in the case's layout as the [b, h, s, d] view flex takes (thd: one packed sequence, b = 1)."""
    if case.layout == "thd":
        return leaf.permute(1, 0, 2).unsqueeze(0)
    return leaf.permute(1, 2, 0, 3) if case.layout == "sbhd" else leaf.transpose(1, 2)


def _logical(case: Case, y: torch.Tensor, lens: tuple[int, ...], s: int) -> torch.Tensor:
    """flex's [b, h, s, d] output back to the logical [b, s, h, d]."""
    if case.layout == "thd":
        return layout.unpack(y[0].transpose(0, 1), lens, s)
    return y.transpose(1, 2)


def _pin_static(args) -> None:
    """Mark static the batch size of q, k, v and every size of every tensor the mods capture. Works around torch
    2.13 inductor bugs in the CPU flex template, whose generated C++ fails to compile ("'cur_kvSplitSize1' was not
    declared") once dynamo makes such a size symbolic: a mask_mod indexing a captured [b] tensor by b after a b=1
    then b=2 call, or a captured [b, sq, skv] mask after a second shape. Explicit-mask and thd variants (whose
    lookups and packed lengths hit the same bugs) are compiled with dynamic=False instead: a graph per shape."""
    import torch._dynamo
    q, k, v, score_mod, block_mask = args[:5]
    mods = [score_mod, getattr(block_mask, "mask_mod", None)]
    captured = [c.cell_contents for fn in _closures(mods) for c in (fn.__closure__ or ())
                if isinstance(c.cell_contents, torch.Tensor)]
    for x in (q, k, v):
        torch._dynamo.mark_static(x, 0)
    for x in captured:
        for dim in range(x.dim()):
            torch._dynamo.mark_static(x, dim)


def _closures(fns):
    """The functions and every function their closures hold (the mods nest: chain -> masked -> all_of -> band)."""
    seen, todo = [], [f for f in fns if callable(f)]
    while todo:
        fn = todo.pop()
        if fn in seen or not hasattr(fn, "__closure__"):
            continue
        seen.append(fn)
        for cell in fn.__closure__ or ():
            inner = cell.cell_contents
            todo.extend(x for x in (inner if isinstance(inner, tuple) else (inner,)) if callable(x))
    return seen


def _variant_key(case: Case) -> tuple:
    """What decides the compiled graph (everything else reaches it as tensor values or dynamic sizes); the spelling
    carries the kernel options, which dynamo guards on and inductor bakes into the kernel."""
    return (case.dtype, case.h, case.hk, case.d_qk, case.d_v, case.left is not None, case.right is not None,
            case.padded, case.mask_density is not None, case.softcap is not None, case.alibi_slopes is not None,
            case.scale, case.grads, case.layout, case.memory, case.spelling, case.storage)


BACKENDS = {"flex-eager": lambda device: FlexBackend(device, compiled=False),
            "flex-compiled": lambda device: FlexBackend(device, compiled=True)}
