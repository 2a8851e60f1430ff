"""Fake attention libraries for CPU tests: the documented semantics of flash-attn 2 / 3 / 4 and TransformerEngine's
DotProductAttention in a few lines of plain torch, written apart from oracles/ so that a shared mistake cannot
cancel out. Each fake records the arguments it was called with; `install(monkeypatch)` puts it in sys.modules."""
