"""The backend registry: every adapter module lists its backends in `BACKENDS`; names are unique.

Adapter modules import their library lazily (inside methods), so listing backends never needs torch's CUDA build,
flash-attn or TransformerEngine to be installed; `available()` says why one cannot run here.
"""

from __future__ import annotations

import importlib

from fuzz.backends.base import Backend, Unsupported

ADAPTER_MODULES = ("sdpa", "flex", "flash_attn2", "flash_attn3", "flash_attn4", "transformer_engine")


def all_backends() -> list[Backend]:
    """Every registered backend, available here or not, in registry order."""
    found = []
    for module in ADAPTER_MODULES:
        try:
            mod = importlib.import_module(f"fuzz.backends.{module}")
        except ModuleNotFoundError as e:
            if e.name == f"fuzz.backends.{module}":
                continue  # adapter not written yet
            raise
        found.extend(mod.BACKENDS)
    return found


def get(name: str) -> Backend:
    """A backend by registry name, or a bring-your-own kernel given as 'package.module:function'."""
    if ":" in name:
        from fuzz.backends.custom import load_custom
        return load_custom(name)
    backends = {b.name: b for b in all_backends()}
    if name not in backends:
        raise ValueError(f"--backend={name!r} is not a known backend; known: {', '.join(backends)} "
                         f"(or give your own kernel as package.module:function)")
    return backends[name]


__all__ = ["Backend", "Unsupported", "all_backends", "get"]
