"""Forcing TransformerEngine's DotProductAttention onto one backend, and proving afterwards that it ran there.

TE 2.20.2 picks FlashAttention / FusedAttention / UnfusedDotProductAttention in get_attention_backend(), which reads
NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN on every selection; the only place attnfuzz sets them is
forced_backend() below, which restores them on exit. TE caches the last selection by its AttentionParams (which do
not include the environment), so forced_backend() also marks that cache stale: otherwise a te-fused run after a
te-flash run of the same shape would silently reuse FlashAttention.

What ran is established twice, independently: forward hooks on the module's three backend submodules (which one
was actually called), and TE's own record of its selection (`_attention_backends`). Both must name the backend
asked for; anything else raises BackendMismatch, never a pass. When TE finds no eligible backend, its debug log
lines ("Disabling FusedAttention as ...") become the reason of an Unsupported.
"""

from __future__ import annotations

import importlib
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

from attnfuzz.backends.base import Unsupported

DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
UTILS_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.utils"
LOGGER = "DotProductAttention"

FLASH, FUSED, UNFUSED = "FlashAttention", "FusedAttention", "UnfusedDotProductAttention"
SUBMODULE = {FLASH: "flash_attention", FUSED: "fused_attention", UNFUSED: "unfused_attention"}
SELECTION_FLAG = {FLASH: "use_flash_attention", FUSED: "use_fused_attention", UNFUSED: "use_unfused_attention"}
ENV = {  # exactly one backend eligible
    FLASH: {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    FUSED: {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    UNFUSED: {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
}
NO_BACKEND = "No dot product attention backend is available"


class BackendMismatch(RuntimeError):
    """TE ran (or recorded) a backend other than the one forced: the run proves nothing about the one asked for."""


@contextmanager
def switched(env: dict[str, str], backends_state, *, stale_after: bool = False):
    """TE's NVTE_* switches set to `env` for the duration and restored after. TE caches its backend choice by
    attention parameters, which do not include these variables, so its record (`backends_state()`, read once the
    variables are set: importing TE reads them too) is marked stale on the way in, and with `stale_after` on the
    way out too."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    state = None
    try:
        state = backends_state()
        state["backend_selection_requires_update"] = True
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if stale_after and state is not None:
            state["backend_selection_requires_update"] = True


@contextmanager
def forced_backend(wanted: str):
    """Only `wanted` eligible for the duration (switched)."""
    if wanted not in ENV:
        raise ValueError(f"backend={wanted!r} is not a TE backend; one of {sorted(ENV)}")
    with switched(ENV[wanted], lambda: importlib.import_module(DPA_MODULE)._attention_backends):
        yield


@dataclass
class Selection:
    """What one forward did: the submodules entered and completed (in order), TE's recorded selection, and the
    debug lines TE logged while selecting."""

    entered: list[str] = field(default_factory=list)
    called: list[str] = field(default_factory=list)
    recorded: dict = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def reasons(self, wanted: str) -> list[str]:
        """TE's own lines about why `wanted` (or a flash-attn version under it) was switched off."""
        key = "FlashAttention" if wanted == FLASH else wanted
        return [line for line in self.log if "Disabling" in line and key in line]


class _LogCapture(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextmanager
def watched(dpa):
    """Record which backend submodule of `dpa` runs and what TE logs while selecting; TE's console handler is
    quieted to its previous threshold so the debug lines go only to the capture."""
    selection = Selection()
    hooks = []
    for backend, attr in SUBMODULE.items():
        submodule = getattr(dpa, attr)
        hooks.append(submodule.register_forward_pre_hook(lambda *_, b=backend: selection.entered.append(b)))
        hooks.append(submodule.register_forward_hook(lambda *_, b=backend: selection.called.append(b)))
    logger = logging.getLogger(LOGGER)
    capture = _LogCapture(selection.log)
    logger.addHandler(capture)
    utils = importlib.import_module(UTILS_MODULE)
    log_state = getattr(utils, "AttentionLogging", None)
    saved_level = getattr(log_state, "_log_level", None)
    console = getattr(log_state, "_stream_handler", None)
    saved_console = console.level if console is not None else None
    if log_state is not None:
        log_state._log_level = logging.DEBUG   # get_attention_backend() sets the logger's level from this each call
    if console is not None:
        console.setLevel(max(saved_level or logging.WARNING, logging.INFO))
    logger.setLevel(logging.DEBUG)
    try:
        yield selection
    finally:
        for hook in hooks:
            hook.remove()
        logger.removeHandler(capture)
        if log_state is not None:
            log_state._log_level = saved_level
            logger.setLevel(saved_level if saved_level is not None else logging.WARNING)
        if console is not None:
            console.setLevel(saved_console)
        selection.recorded = dict(importlib.import_module(DPA_MODULE)._attention_backends)


def check_ran(wanted: str, selection: Selection) -> str:
    """The `ran` label when exactly `wanted` ran and TE recorded exactly `wanted`; BackendMismatch otherwise."""
    recorded = [b for b, flag in SELECTION_FLAG.items() if selection.recorded.get(flag)]
    if selection.called != [wanted]:
        raise BackendMismatch(f"asked for {wanted} (only it was enabled through NVTE_*), but the submodules called "
                              f"were {selection.called or 'none'}; TE recorded {recorded or 'no selection'}")
    if recorded != [wanted]:
        raise BackendMismatch(f"asked for {wanted}; its submodule ran, but TE recorded the selection {recorded}")
    if wanted == FLASH:
        return f"{FLASH} (flash-attn {selection.recorded.get('flash_attention_backend')})"
    if wanted == FUSED:
        return f"{FUSED} (sub-backend {selection.recorded.get('fused_attention_backend')})"
    return UNFUSED


# TE's get_qkv_layout raises this RuntimeError for q / k / v strides and offsets it has no layout for (a tensor one
# element into its buffer, Case.storage): its own input rule, checked before any backend is entered
LAYOUT_REFUSED = "The provided qkv memory layout is not supported"


def refusal_reason(wanted: str, exc: BaseException, selection: Selection) -> str | None:
    """The Unsupported reason when TE found no eligible backend (or asserted on its own input rules before entering
    a backend), else None: an exception from inside the backend TE selected is a crash, not a refusal."""
    message = str(exc)
    if selection.entered:
        return None
    if NO_BACKEND in message:
        reasons = selection.reasons(wanted) or ["TE logged no reason"]
        return f"TE has no eligible {wanted} for this case: " + "; ".join(dict.fromkeys(reasons))
    if isinstance(exc, (AssertionError, NotImplementedError)) or LAYOUT_REFUSED in message:
        return f"TE refused the case: {message.strip() or type(exc).__name__}"
    return None


def called(wanted: str, selection: Selection, call):
    """call()'s result; an error TE raised before entering a backend (refusal_reason) is Unsupported, any other is
    raised as it is."""
    try:
        return call()
    except Exception as e:
        reason = refusal_reason(wanted, e, selection)
        if reason is None:
            raise
        raise Unsupported(reason) from e


def flash_versions() -> dict[str, str]:
    """The flash-attn versions TE loaded ({"2": ..., "3": ..., "4": ...}, only those installed)."""
    utils = importlib.import_module(UTILS_MODULE)
    fa = utils.FlashAttentionUtils
    found = {}
    for major, flag, version in (("2", "is_installed", "version"), ("3", "v3_is_installed", "fa3_version"),
                                 ("4", "v4_is_installed", "fa4_version")):
        if getattr(fa, flag, False):
            found[major] = str(getattr(fa, version, "?"))
    return found
