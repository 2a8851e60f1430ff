"""Known bugs: which failures a corpus entry's known_bug record answers for, and the verdicts it marks KNOWN.

A record, {"link": ..., "note": ..., "match": ..., "when": {...}, "labels": [...]}, is an expected failure until the
bug is fixed: while fuzzing, a failure of the entry's backend and verdict label (or one of `labels`: a bug whose
output is garbage reads 0, NaN or wrong values from run to run; or, for a label naming an alternative reference, a
failure whose output matched it too: `answers`) whose message contains `match` and whose case has the values in
`when` (each optional) counts as this known bug, and the search goes on past it. `when` states the bug's defining
condition; what only the failure shows (which rows failed) is the label's: EMPTY_ROWS is a failure confined to the
rows that see no key. `when` names Case
fields, case features (strategies/features.py: "band": "causal_bottom_right" holds however the band is spelled) or
the TRAITS below, which say what field equality cannot ("some sequence has no query"); a value written
{"any_of": [...]} holds for any of the values listed (one bug seen at head dims 160 and 176). `since`, as
{"torch": "2.13"}, says which release of a package brought the bug: where an older one is installed, an entry that
passes is not affected there (its replay is skipped, saying so) rather than fixed. `unwritten: true` says the bug
is output the kernel never writes: it fails where that memory held garbage and passes where it held zeros, so a replay
that passes without --poison-memory (attnfuzz.engine.poison) is no evidence of a fix.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Callable

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.features import features

def _band_empties_a_row(c: Case) -> bool:
    """Whether a valid query row of some sequence sees no key by the band, the alignment or the lengths alone. The
    band's rows that see keys are contiguous, so only the first and the last row can fall off the key range."""
    for sq_n, skv_n in zip(c.lens_q, c.lens_kv):
        if sq_n == 0:
            continue
        off = 0 if c.alignment == "top_left" else skv_n - sq_n
        if (skv_n == 0 or (c.right is not None and off + c.right < 0)
                or (c.left is not None and sq_n - 1 + off - c.left > skv_n - 1)):
            return True
    return False


def _float32_mask(c: Case) -> bool:
    """SDPA gets a float32 additive mask on a half-precision query: the float32_mask spelling, or
    nn.MultiheadAttention called with is_causal and a key_padding_mask, which merges the float32 mask of
    Transformer.generate_square_subsequent_mask (float32 whatever the inputs) with the padding into a float32 mask."""
    parts = c.spelling.split("+")
    through_module = "is_causal" in parts and "key_padding_mask" in parts and any(p.startswith("mha") for p in parts)
    return "float32_mask" in parts or (through_module and c.dtype in ("float16", "bfloat16"))


def _right_bound_past_keys(c: Case) -> bool:
    if c.right is None:   # flash-attn 2 puts seqlen_k in for an unbounded right side beside a finite left one
        right = c.skv if c.left is not None else None
    else:                 # measured from the bottom-right diagonal: row i sees j <= i + skv - sq + right
        right = c.right + (c.sq - c.skv if c.alignment == "top_left" else 0)
    return right is not None and c.skv <= right < c.sq - 1


def _flex_first_tile_unseen(c: Case) -> bool:
    if "rows_safe" not in c.spelling.split("+"):
        return False
    from attnfuzz.backends.flex.first_tile import first_tile_unseen   # here: the store needs no backend elsewhere
    return first_tile_unseen(c)


def _call_kv_len(c: Case) -> int:
    """The key length one kernel call runs over: thd's packed total, else skv."""
    return sum(c.lens_kv) if c.layout == "thd" else c.skv


def _query_tiles(c: Case) -> int:
    """The 128-row query tiles of a kernel call, over every head: packed sequences (thd) tile each on its own."""
    rows = [-(-n // 128) for n in c.lens_q] if c.layout == "thd" else [c.b * -(-c.sq // 128)]
    return c.h * sum(rows)


# Derived facts about a case that a known bug's `when` may name beside the Case fields.
TRAITS = {
    "empty_q_sequence": lambda c: 0 in c.lens_q,        # a sequence of the batch has no query token
    "empty_kv_sequence": lambda c: 0 in c.lens_kv,      # ... no key token
    "split_head_dims": lambda c: c.d_qk != c.d_v,
    "gqa": lambda c: c.h != c.hk,
    "sq_longer": lambda c: c.sq > c.skv,
    # some sequence has more or fewer queries than keys: where top-left and bottom-right alignment differ
    "lengths_differ": lambda c: any(n_q != n_kv for n_q, n_kv in zip(c.lens_q, c.lens_kv)),
    # the band's right bound is 0, spelled causal=True or as window (left, 0): one mask either way
    "causal_band": lambda c: c.right == 0,
    # ... with no left bound, either alignment: the plain causal mask (flash-attn's is_causal, not its local window)
    "full_causal": lambda c: c.right == 0 and c.left is None,
    # a valid query row sees no key by band, alignment or lengths, or may by an explicit random mask (the drawn mask
    # alone tells): a known bug of such rows needs it; its failure confined to them is the label FAIL:EMPTY_ROWS
    "empty_rows": lambda c: _band_empties_a_row(c) or (c.mask_density is not None and c.mask_density < 1),
    "no_query_tokens": lambda c: sum(c.lens_q) == 0,   # every sequence of the batch has no query token
    "d_v_narrower": lambda c: c.d_v < c.d_qk,          # the value head dim below the query / key one
    "head_dim_under_16": lambda c: min(c.d_qk, c.d_v) < 16,   # a query / key or value head dim below 16
    "sq_over_64": lambda c: c.sq > 64,                  # a query row past the first 64-row tile (FA's sm90 tiles)
    "skv_over_64": lambda c: c.skv > 64,                # ... a key past the first 64-key tile
    # an unbounded window side spelled as the legacy -1 sentinel, whatever else the spelling says ("seqused+neg")
    "negative_bound": lambda c: "neg" in c.spelling.split("+"),
    # more than one sequence passed as varlen: packed (thd), with lengths, or as TE's padding mask type
    "padded_batch": lambda c: c.b > 1 and (c.layout == "thd" or c.padded or c.spelling == "padding"),
    # the key length a kernel call runs over (thd: the packed total) modulo 16: where a loop over 8- or 16-wide
    # vectors (AVX2, AVX-512) leaves a tail
    "kv_len_mod_16": lambda c: _call_kv_len(c) % 16,
    # ... modulo 128: where the last 128-key tile of a kernel is part padding (64: half of it)
    "kv_len_mod_128": lambda c: _call_kv_len(c) % 128,
    # ... past 1024 keys: more than 16 of the 64-key tiles an online softmax rescales its running sum between
    "kv_len_over_1024": lambda c: _call_kv_len(c) > 1024,
    # a value family that puts whole rows' logits far below 0 (strategies/materialize.py: shifts down to -1024, or
    # every key anti-aligned at -16384): LSEs below -88.7, where exp(-lse) overflows fp32
    "very_negative_rows": lambda c: c.values in ("far_negative", "anti_aligned"),
    # more 128-row query tiles (times heads) than the 132 SMs of an H100 SXM or H200: a kernel that gives each tile a
    # thread block runs them in more than one wave
    "query_tiles_over_132": lambda c: _query_tiles(c) > 132,
    "d_qk_at_most_16": lambda c: c.d_qk <= 16,          # the small query / key head dims (1, 3, 8, 16)
    "head_dim_over_128": lambda c: max(c.d_qk, c.d_v) > 128,   # past the 128 columns most kernels tile a head in
    # a head dim off the 32-column grain FA's sm90 backward allocates its accumulators in (its tiles pad to 16)
    "head_dim_off_32": lambda c: c.d_qk % 32 != 0 or c.d_v % 32 != 0,
    "paged": lambda c: c.page_size is not None,         # the keys held in a paged KV cache, any page size
    # q, k or v one element into its buffer (Case.storage): a pointer off the 16-byte alignment vector loads assume
    "offset_storage": lambda c: "offset" in c.storage,
    # q, k or v whose strides are not the packed strides of its layout, its last dim still of stride 1: head-major
    # (transposed), stride-0 heads (expanded K/V), or rows with a gap after each (padded_rows)
    "unpacked_strides": lambda c: c.memory != "contiguous" or "padded_rows" in c.storage,
    "alibi": lambda c: c.alibi_slopes is not None,
    # a right bound that, measured from the bottom-right diagonal, reaches skv yet still hides keys from the first rows
    # (sq > skv + 1): flash-attn 2 reads a right bound >= seqlen_k as unbounded, and puts seqlen_k in for an unbounded
    # right side beside a finite left one (Dao-AILab/flash-attention#895)
    "right_bound_past_keys": _right_bound_past_keys,
    "softmax_sink": lambda c: c.softmax != "vanilla",  # off_by_one or learnable: a sink term in the denominator
    # flex_attention's kernel option BACKEND="FLASH" in the spelling (fuzz/backends/flex/knobs.py)
    "flex_flash_backend": lambda c: "flash" in c.spelling.split("+"),
    # FA4's varlen max_seqlen_q / max_seqlen_k handed as tensors (fuzz/backends/flash/fa4_forms.py)
    "max_seqlen_tensor": lambda c: "max_seqlen_tensor" in c.spelling.split("+"),
    # flex_attention's kernel option PRESCALE_QK in the spelling (fuzz/backends/flex/knobs.py)
    "flex_prescale": lambda c: "prescale" in c.spelling.split("+"),
    # flex's ROWS_GUARANTEED_SAFE spelling on a case where a row sees no key at the start of the first key block the
    # compiled kernel runs for it (backends/flex/first_tile.py): what the option really asks of a mask
    "flex_rows_safe_first_tile_unseen": _flex_first_tile_unseen,
    # SDPA given its additive mask in float32 on a half-precision query (fuzz/backends/sdpa/spelling.py), spelled so
    # or reached through nn.MultiheadAttention (fuzz/backends/sdpa/modules.py)
    "float32_mask": lambda c: _float32_mask(c),
    # the last query tile of torch's memory-efficient kernel holds one row: its tiles are 64 queries where both head
    # dims are at most 64, else 32 (the fmha_64x128x64 / fmha_32x128x* kernels of mem_eff_attention)
    "last_query_tile_one_row": lambda c: c.sq % (64 if max(c.d_qk, c.d_v) <= 64 else 32) == 1,
    # q, k or v one element into its buffer where its head dim is a multiple of 8: torch's flash and memory-efficient
    # SDPA copy a tensor whose head dim is not one to pad it (an aligned copy), and read the others in place
    "offset_storage_dim_8": lambda c: any(kind == "offset" and d % 8 == 0
                                          for kind, d in zip(c.storage, (c.d_qk, c.d_qk, c.d_v))),
    # d_v more than twice d_qk; with d_v under 256, where FA4's sm90 forward reads out of bounds (FA4 4.0.0b36 on an
    # H100, d_qk 8 / 16 / 32 against d_v 64 / 72 / 128); at d_v 256 its build fails first
    "d_v_over_twice_d_qk": lambda c: 2 * c.d_qk < c.d_v,
    "d_v_under_256": lambda c: c.d_v < 256,
    # q, k or v with a head dim of 1 laid out by a storage kind other than plain: the size-1 last dim then has a
    # stride other than 1 (Case.storage puts a size-1 dim outermost in its buffer)
    "head_dim_1_strided": lambda c: any(kind != "plain" and d == 1
                                        for kind, d in zip(c.storage, (c.d_qk, c.d_qk, c.d_v))),
}


def when_fields(case: Case) -> dict:
    """What a known bug's `when` is matched against: the case's fields, its features (strategies/features.py: the
    classes the strategies and the coverage report use, e.g. "band": "causal_bottom_right", "len_kv": "long_edge")
    and its TRAITS."""
    return {**case.to_dict(), **features(case), **{name: trait(case) for name, trait in TRAITS.items()}}


def meets(when: dict, fields: dict) -> bool:
    """Whether a case whose when_fields are `fields` meets a record's `when`: every named field equal to its value,
    or to one of the values of an {"any_of": [...]}."""
    return all(fields.get(k) in v["any_of"] if _alternatives(v) else fields.get(k) == v for k, v in when.items())


def _alternatives(value) -> bool:
    """Whether a `when` value lists alternatives, {"any_of": [...]}, rather than one value."""
    return isinstance(value, dict) and set(value) == {"any_of"} and isinstance(value["any_of"], list)


def record_problem(record, case: Case) -> str | None:
    """What makes an entry's known_bug record unreadable, naming the field; None for a sound record, or null."""
    if record is None:
        return None
    if not (isinstance(record, dict) and record.get("link")):
        return "field 'known_bug' must be null or an object with a 'link'"
    if not isinstance(record.get("when", {}), dict):
        return "field 'known_bug.when' must be an object of case fields and values"
    labels = record.get("labels", [])
    if not (isinstance(labels, list) and all(isinstance(label, str) for label in labels)):
        return "field 'known_bug.labels' must be a list of verdict labels"
    since = record.get("since", {})
    if not (isinstance(since, dict) and all(isinstance(v, str) and _release(v) for v in since.values())):
        return "field 'known_bug.since' must be an object of package names and versions, as {\"torch\": \"2.13\"}"
    if not isinstance(record.get("unwritten", False), bool):
        return "field 'known_bug.unwritten' must be true or false"
    loose = sorted(k for k, v in record.get("when", {}).items() if isinstance(v, dict) and not _alternatives(v))
    if loose:
        return f"field 'known_bug.when' gives {loose} an object other than {{\"any_of\": [values]}}"
    unknown = sorted(set(record.get("when", {})) - set(when_fields(case)))
    if unknown:
        return f"field 'known_bug.when' names {unknown}, which are neither Case fields nor traits ({', '.join(TRAITS)})"
    return None


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version: '2.11.0+cu130' -> (2, 11, 0)."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(x) for x in found.group(0).split(".")) if found else ()


def predates(record: dict) -> str | None:
    """Where an installed package is older than the release its known bug came with (`since`): which, and its
    version; else None (also when the package is not installed: nothing says the bug is absent)."""
    for package, first in record.get("since", {}).items():
        try:
            here = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
        if _release(here) < _release(first):
            return f"{package} {here} predates this known bug (since {package} {first})"
    return None


def _labels(saved: V.Verdict, bug: dict | None = None) -> tuple[str, ...]:
    """The labels a saved verdict's known bug answers to: its own, for a FLAKY entry the label it flaked with (a case
    fails as CRASH:EXIT_1, say; FLAKY is only what re-running the finding concluded), and the bug's other `labels`."""
    own = (saved.label, saved.diagnosis) if saved.status == V.FLAKY else (saved.label,)
    return own + tuple((bug or {}).get("labels", ()))


def answers(labels: tuple[str, ...], verdict: V.Verdict) -> bool:
    """Whether a failure is of one of a known bug's labels: its own label, or, for a bug named by an alternative
    reference (MASK_IGNORED, say), a FAIL whose output matched that reference too (its `also`), as a run attaches
    it to the same root cause (attnfuzz.engine.rootcause): a dropped causal mask is MASK_ALIGNMENT on sq = 1,
    skv = 2 and WINDOW_OFF_BY_ONE on sq = skv = 2, and matches no mask at all on both."""
    return verdict.label in labels or (verdict.status == V.FAIL and any(
        f"{V.FAIL}:{d}" in labels for d in verdict.also if d in V.ALTERNATIVE))


def known_bugs_of(entries: list[tuple]):
    """The harness's `known` predicate (attnfuzz.engine.harness.KnownBugs) over (path, corpus Entry) pairs: the
    known_bug record that a (backend, case, verdict) failure matches, with the file name of its entry under "entry"
    and its id (the file's stem) under "id"; entries without a known_bug take nothing."""
    entries = [(p, e) for p, e in entries if e.known_bug]
    last = [None, {}]   # the case whose fields were computed last (frozen), and those fields: asked once per face

    def fields_of(case: Case) -> dict:
        if last[0] is not case:
            last[:] = [case, when_fields(case)]
        return last[1]

    def matches(e, backend: str, case: Case, verdict: V.Verdict) -> bool:
        bug = e.known_bug
        return (e.backend == backend and answers(_labels(e.verdict, bug), verdict)
                and bug.get("match", "") in verdict.message
                and meets(bug.get("when", {}), fields_of(case)))

    def known(backend: str, case: Case, verdict: V.Verdict) -> dict | None:
        for path, e in entries:
            if matches(e, backend, case, verdict):
                return {**e.known_bug, "entry": path.name, "id": path.stem}
        return None

    def takes(entry_id: str, backend: str, case: Case, verdict: V.Verdict) -> bool:
        """Whether the record of entry `entry_id` takes the failure, whichever record `known` would name first."""
        return any(path.stem == entry_id and matches(e, backend, case, verdict) for path, e in entries)

    known.takes = takes

    # what engine/skip_known.py answers unrun cases with (entries that failed every run and crash or hang at times)
    known.crash_faces = [(e.backend, path.stem, face) for path, e in entries for face in _skip_faces(e)]
    return known


def _skip_faces(e) -> list[V.Verdict]:
    """The verdicts a case of this entry's bug is answered with unrun: each crash or hang label of a crashing or
    hanging entry; the entry's own failure where it mostly reads wrong and crashes at times (a FAIL with a crash
    label), as most of its cases would show; none for a FLAKY entry or one that never crashes."""
    crashes = [(status, diagnosis) for status, _, diagnosis in
               (label.partition(":") for label in _labels(e.verdict, e.known_bug)) if status in (V.CRASH, V.HANG)]
    if not crashes or e.verdict.status == V.FLAKY:
        return []
    if e.verdict.status == V.FAIL:
        return [e.verdict]
    return [V.Verdict(status, diagnosis or None, e.verdict.message) for status, diagnosis in crashes]


def mark_known(known: Callable[[str, Case, V.Verdict], dict | None] | None, backend: str, case: Case,
               verdict: V.Verdict) -> V.Verdict:
    """The verdict as KNOWN, with the known bug's link among its checks and its entry's id (where the record has one),
    when it is a failure that `known` recognises; else unchanged. (attnfuzz.engine.harness.fuzz_property marks KNOWN
    inline, without them, and attnfuzz.engine.tally.CountedKnown adds them after: Hypothesis derives a derandomized
    run's seed from that function's source, and the ci streams the negative controls were shrunk on would change
    with it.)"""
    hit = known(backend, case, verdict) if verdict.failed and known is not None else None
    return V.as_known(verdict, hit["link"], hit.get("id")) if hit is not None else verdict
