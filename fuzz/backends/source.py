"""Source text the adapters' repro writers (`repro_source(case)`, read by fuzz/store/repro.py) share: exact tensor
literals, attnfuzz's own self-contained helpers embedded verbatim, keyword arguments rendered as source, and the
`attention(q, k, v)` definition every standalone script calls.

A helper is embedded only if its body needs nothing but torch and the other helpers embedded with it; the script
then runs the very code the adapter ran, and imports no attnfuzz module.
"""

from __future__ import annotations

import inspect
import re
import textwrap

import torch

WIDTH = 110
# a repro script writes a mask up to this size as a literal (about 6 MB of source); a larger one is rebuilt from the
# case's seed through attnfuzz, as the inputs of a large case are
MASK_INLINE = 1 << 20


def guarded_import(statement: str, why: str) -> str:
    """Source of a module-level import for a repro script that exits 2 (not 1, which says the bug is there) where it
    fails: the script's own ImportError answer, which main()'s imports get from its caller."""
    return (f"try:\n    {statement}  # {why}\nexcept ImportError as e:\n"
            "    print(f\"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is\", "
            "file=sys.stderr)\n    sys.exit(2)\n")


def written_mask(mask: torch.Tensor | None, module: str, function: str, args: str) -> tuple[str, str]:
    """A mask as repro-script source and the import that source needs: None, its literal up to MASK_INLINE elements,
    else the call `function(args)` (a function of `module` that rebuilds it from CASE's seed) behind a guarded
    import."""
    if mask is None or mask.numel() <= MASK_INLINE:
        return ("None" if mask is None else literal(mask)), ""
    rebuilt = guarded_import(f"from {module} import {function}", "the mask is too large to write out")
    return f"{function}({args})", rebuilt


def literal(x: torch.Tensor) -> str:
    """A tensor as source: its exact values (float64 holds every fp16 / bf16 / fp32 value), dtype and shape."""
    if x.dtype == torch.bool:
        return f"torch.tensor({x.detach().cpu().flatten().tolist()!r}).reshape({tuple(x.shape)})"
    values = repr(x.detach().cpu().to(torch.float64).flatten().tolist())
    values = re.sub(r"\b(inf|nan)\b", r"float('\1')", values)  # -inf in masks, NaN in a broken output
    return f"torch.tensor({values}, dtype=torch.float64).reshape({tuple(x.shape)}).to({x.dtype})"


def helpers(*functions) -> str:
    """The source of attnfuzz helper functions, verbatim and in the order given (each once), for embedding."""
    unique = list(dict.fromkeys(functions))
    return "\n\n\n".join(textwrap.dedent(inspect.getsource(fn)).rstrip() for fn in unique) + "\n"


def preamble(functions=(), named: dict[str, tuple[object, str]] | None = None) -> str:
    """What precedes `attention`: attnfuzz helpers (verbatim) and module-level constants, each `NAME = value  #
    why`; a tensor value is written as its exact literal, anything else as its repr."""
    text = "\n\n" + helpers(*functions) if functions else ""
    lines = [f"{name} = {literal(x) if isinstance(x, torch.Tensor) else repr(x)}  # {why}"
             for name, (x, why) in (named or {}).items()]
    return text + ("\n\n" + "\n".join(lines) + "\n" if lines else "")


def call(fn: str, args: list[str], kwargs: dict[str, str], indent: int = 4) -> str:
    """`fn(arg, ..., name=value, ...)` from source strings; past WIDTH (the line starting at column `indent`) the
    arguments go on continuation lines 4 spaces deeper than the first, which the caller indents with it."""
    parts = [*args, *(f"{name}={text}" for name, text in kwargs.items())]
    one_line = f"{fn}({', '.join(parts)})"
    if indent + len(one_line) <= WIDTH:
        return one_line
    lines, line = [], ""
    for part in parts:
        if line and indent + 4 + len(line) + len(part) + 1 > WIDTH:
            lines.append(line.rstrip())
            line = ""
        line += part + ", "
    lines.append(line.rstrip(", ") + ")")
    return f"{fn}(\n" + "\n".join(f"    {text}" for text in lines)


def function(signature: str, doc: str, body: list[str]) -> str:
    """`def signature:` with a one-paragraph docstring and the given body lines (4-space indented), preceded by two
    blank lines."""
    text = textwrap.fill(doc, WIDTH - 7, subsequent_indent="    ")
    lines = "".join(f"    {line}\n" if line else "\n" for line in "\n".join(body).split("\n"))
    return f'\n\ndef {signature}:\n    """{text}"""\n{lines}'


def attention(doc: str, body: list[str]) -> str:
    """The `attention(q, k, v)` every repro script calls: logical [b, s, heads, d] tensors in, the output out."""
    return function("attention(q, k, v)", doc, body)
