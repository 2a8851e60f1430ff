"""The environment that holds a fresh process's torch to one CPU vector ISA, as on a CPU that has no more.

ATEN_CPU_CAPABILITY picks the ISA of torch's own CPU kernels and of inductor's C++; oneDNN picks its own from the CPU.
On a CPU with AMX, torch's CPU flash attention packs bf16 blocks for AMX (oneDNN's choice, pytorch/pytorch#138783)
and then refuses to, running ATen's AVX2 kernels ("pack_vnni2 is only supported when avx512 is supported"): an
AVX2-only CPU never goes there. So where ATen runs below AVX-512 to stand in for an older CPU, oneDNN is held to the
same ISA (ONEDNN_MAX_CPU_ISA). `.ci/run` does the same in shell.
"""

from __future__ import annotations

ONEDNN_ISA = {"default": "SSE41", "avx2": "AVX2"}   # ATen's spelling -> oneDNN's, below AVX-512


def emulating(isa: str, env: dict[str, str]) -> dict[str, str]:
    """`env` with torch's CPU kernels held to `isa` (ATEN_CPU_CAPABILITY's spelling: avx2, avx512, default) as on a
    CPU that has no more, for a fresh process: ATEN_CPU_CAPABILITY, and ONEDNN_MAX_CPU_ISA unless `env` sets it."""
    held = {**env, "ATEN_CPU_CAPABILITY": isa.lower()}
    if isa.lower() in ONEDNN_ISA:
        held.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA[isa.lower()])
    return held
