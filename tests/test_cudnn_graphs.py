"""sdpa-cudnn's graph key (fuzz/backends/sdpa/cudnn.py): cases that share a cuDNN execution graph share a key, and
the compile-aware search then draws most cases inside graphs already built. On the CPU the kernel is SDPA's math
one under the same key: what is tested is the search, which does not need cuDNN."""

from __future__ import annotations

from attnfuzz.backends import get
from attnfuzz.backends.sdpa.cudnn import CudnnSdpaBackend, graph_key
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space

BASE = Case(b=2, sq=40, skv=40, h=4, hk=2, d_qk=64, d_v=64, dtype="bfloat16", window=(8, None))


def test_the_values_scale_and_mask_contents_share_a_graph():
    key = graph_key(BASE)
    same = [BASE.replace(seed=5), BASE.replace(values="probe"), BASE.replace(std=(4.0, 1.0, 1.0)),
            BASE.replace(window=(30, None)), BASE.replace(mean=(1.0, 0.0, 0.0))]
    assert all(graph_key(c) == key for c in same)
    dense = BASE.replace(window=(None, None), mask_density=0.3)
    assert graph_key(dense.replace(mask_density=0.8)) == graph_key(dense)
    scaled = BASE.replace(scale=0.5)
    assert graph_key(scaled.replace(scale=0.125)) == graph_key(scaled)


def test_shapes_strides_dtype_gradients_and_mask_presence_do_not():
    key = graph_key(BASE)
    other = [BASE.replace(sq=41), BASE.replace(skv=39), BASE.replace(b=1), BASE.replace(h=8, hk=4),
             BASE.replace(h=4, hk=4), BASE.replace(d_qk=128, d_v=128), BASE.replace(dtype="float16"),
             BASE.replace(grads=True), BASE.replace(window=(None, None)), BASE.replace(window=(8, 0)),
             BASE.replace(layout="sbhd"), BASE.replace(memory="transposed"), BASE.replace(scale=0.5),
             BASE.replace(window=(None, None), causal=True)]
    assert all(graph_key(c) != key for c in other)


def test_the_registry_gives_sdpa_cudnn_its_graph_key_and_the_others_none():
    assert isinstance(get("sdpa-cudnn", "cuda"), CudnnSdpaBackend)
    assert get("sdpa-cudnn", "cuda").compile_key(BASE) == graph_key(BASE)
    assert all(get(name, "cpu").compile_key(BASE) is None for name in ("sdpa-math", "sdpa-flash", "sdpa-efficient"))


class _MathUnderGraphKeys(CudnnSdpaBackend):
    """SDPA's math kernel on the CPU, searched with cuDNN's graph key."""

    def __init__(self):
        super().__init__("sdpa-math", "cpu")


def _graph_reuse(share: float, seed: int = 0) -> tuple[int, int]:
    backend = _MathUnderGraphKeys()
    keys: list[tuple] = []
    fuzz(backend, space=Space(max_len=64, compiled_share=share), seed=seed, reruns=0,
         on_case=lambda case, verdict, tally: keys.append(graph_key(case)) if verdict.status != V.UNSUPPORTED else None,
         settings=profile("quick", max_examples=120, database=None))
    return len(keys), len(set(keys))


def test_the_search_draws_most_cases_inside_graphs_built_already():
    graded, graphs = _graph_reuse(0.8)
    plain_graded, plain_graphs = _graph_reuse(0.0)
    assert graded >= 60 and plain_graded >= 60
    # measured: 11-20 graphs in 120 cases against 84-104 for the plain search (seeds 0-2)
    assert graphs / graded < 0.3, (graphs, graded)             # most cases reuse a graph
    assert plain_graphs / plain_graded > 0.6, (plain_graphs, plain_graded)   # the plain search builds one nearly each


def test_a_campaign_does_not_warm_up_graphs_that_live_in_one_process(capsys):
    from attnfuzz.campaign.supervisor import warm_jit_backends
    warm_jit_backends({"backends": ["sdpa-cudnn", "fa4"], "device": "cpu"})
    err = capsys.readouterr().err
    assert "sdpa-cudnn" not in err and "warm: fa4" in err
