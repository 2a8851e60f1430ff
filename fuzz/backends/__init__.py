"""The backend registry. Every adapter module defines `BACKENDS: dict[str, Callable[[str], Backend]]`, a factory
per backend name taking the device ("cpu", "cuda", "cuda:1"); names are unique across modules.

Adapter modules import their library lazily (inside methods), so listing backends never needs torch's CUDA build,
flash-attn or TransformerEngine to be installed; `available()` says why one cannot run here.
"""

from __future__ import annotations

import importlib
from typing import Callable

from attnfuzz.backends.base import Backend, Unsupported

# one folder per family: sdpa/, flex/, flash/ (FA2, FA3, FA4), te/ (TransformerEngine; te.fp8 its FP8 attention),
# cp/ (context parallelism), flashinfer/ (serving kernels)
ADAPTER_MODULES = ("sdpa.adapter", "sdpa.cudnn", "flex.adapter", "flash.fa2", "flash.kvcache", "flash.fa3",
                   "flash.fa3_fp8", "flash.fa4", "flex.paged", "te.adapter", "te.fp8", "cp.adapter",
                   "flashinfer.adapter")


def factories() -> dict[str, Callable[[str], Backend]]:
    """Backend name -> factory(device), in registry order."""
    found: dict[str, Callable[[str], Backend]] = {}
    for module in ADAPTER_MODULES:
        try:
            mod = importlib.import_module(f"attnfuzz.backends.{module}")
        except ModuleNotFoundError as e:
            if e.name == f"attnfuzz.backends.{module}":
                continue  # adapter not written yet
            raise
        for name, factory in mod.BACKENDS.items():
            if name in found:
                raise RuntimeError(f"backend name {name!r} is registered twice (fuzz/backends/{module.replace('.', '/')}.py)")
            found[name] = factory
    return found


def all_backends(device: str = "cpu") -> list[Backend]:
    """Every registered backend for `device`, available here or not."""
    return [factory(device) for factory in factories().values()]


def get(name: str, device: str = "cpu") -> Backend:
    """A backend by registry name, or a bring-your-own kernel given as 'package.module:function'."""
    if ":" in name:
        from attnfuzz.backends.custom import load_custom
        return load_custom(name, device)
    known = factories()
    if name not in known:
        raise ValueError(f"--backend={name!r} is not a known backend; known: {', '.join(known)} "
                         f"(or give your own kernel as package.module:function)")
    return known[name](device)


__all__ = ["Backend", "Unsupported", "all_backends", "factories", "get"]
