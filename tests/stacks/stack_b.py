"""Stack b: the misbehaving zero-when-causal kernel, in a module that will not load beside the other stack."""

from tests.misbehaving import zero_when_causal
from tests.stacks import claim

claim("b")
kernel = zero_when_causal
