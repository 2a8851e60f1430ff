"""The case language and the strategies that draw it."""

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.lengths import lengths
from attnfuzz.strategies.materialize import Tensors, materialize
from attnfuzz.strategies.space import Space, narrow_to

__all__ = ["Case", "Space", "Tensors", "attention_cases", "lengths", "materialize", "narrow_to"]
