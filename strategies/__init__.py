"""The case language and the strategies that draw it."""

from strategies.case import Case
from strategies.cases import attention_cases, lengths
from strategies.materialize import Tensors, materialize
from strategies.space import Space, narrow_to

__all__ = ["Case", "Space", "Tensors", "attention_cases", "lengths", "materialize", "narrow_to"]
