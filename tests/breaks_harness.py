"""A correct kernel whose import breaks attnfuzz itself in the process that loads it (a worker): drawing a causal
case's inputs raises, as a bug of attnfuzz's own would. What escapes the harness so is attnfuzz's error, never the
backend's crash."""

from attnfuzz.engine import harness
from tests.misbehaving import _plain

_draw = harness.draw


def _broken_draw(case, device):
    if case.causal:
        raise RuntimeError("planted: attnfuzz's own input drawing failed")
    return _draw(case, device)


harness.draw = _broken_draw


def correct(q, k, v, *, causal, window, bottom_right, scale):
    return _plain(q, k, v, scale, causal)
