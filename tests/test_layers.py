"""The one rule of the layout: imports only go down the layers, and no modules import each other in a circle.

Layers, top to bottom: front ends (cli, plugin, `python -m attnfuzz`, the fuzz targets) -> campaign -> tools and
report (one layer) -> store -> engine -> backends -> oracles -> strategies. Every import counts, the ones inside
functions too (a lazy import is still a dependency, and the usual way a cycle hides).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"attnfuzz": ROOT / "fuzz", "attnfuzz.oracles": ROOT / "oracles", "attnfuzz.strategies": ROOT / "strategies"}

# (prefix, rank): a module belongs to the longest prefix that names it; higher ranks may import lower ones only.
LAYERS = [("attnfuzz", 7),  # front ends: attnfuzz.cli, attnfuzz.plugin, attnfuzz.__main__, attnfuzz.test_fuzz
          ("attnfuzz.campaign", 6),
          ("attnfuzz.tools", 5), ("attnfuzz.report", 5),
          ("attnfuzz.store", 4),
          ("attnfuzz.engine", 3),
          ("attnfuzz.backends", 2),
          ("attnfuzz.oracles", 1),
          ("attnfuzz.strategies", 0)]


def sources() -> dict[str, str]:
    """Module name -> source, for every module of the installed package's folders (not the shipped corpus)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if name.startswith("attnfuzz.oracles.") and package == "attnfuzz":
                continue
            found[name] = path.read_text()
    return found


def imported(name: str, source: str, modules: set[str]) -> set[str]:
    """The attnfuzz modules `source` imports anywhere in it: `from P import m` is module P.m where that is a module,
    else P; relative imports are resolved against `name`."""
    out = set()
    is_package = any(m.startswith(name + ".") for m in modules)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def graph(found: dict[str, str]) -> dict[str, set[str]]:
    return {name: imported(name, source, set(found)) for name, source in found.items()}


def rank(module: str) -> int:
    return max((len(prefix), r) for prefix, r in LAYERS if module == prefix or module.startswith(prefix + "."))[1]


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} (layer {rank(a)}) imports {b} (layer {rank(b)})"
                  for a, targets in edges.items() for b in targets if rank(b) > rank(a))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(groups)


def test_imports_only_go_down_the_layers():
    assert upward(graph(sources())) == []


def test_no_modules_import_each_other_in_a_circle():
    assert cycles(graph(sources())) == []


def test_the_check_fires_on_a_made_up_upward_import_and_cycle():
    """Negative control: the tree plus an import of the CLI inside an engine function, and two store modules that
    import each other inside functions, are both caught."""
    found = sources()
    found["attnfuzz.engine.harness"] += "\n\ndef _late():\n    from attnfuzz.cli import main\n    return main\n"
    found["attnfuzz.store.made_up_a"] = "def f():\n    from attnfuzz.store import made_up_b\n"
    found["attnfuzz.store.made_up_b"] = "def g():\n    import attnfuzz.store.made_up_a\n"
    edges = graph(found)
    assert "attnfuzz.engine.harness (layer 3) imports attnfuzz.cli (layer 7)" in upward(edges)
    assert ["attnfuzz.store.made_up_a", "attnfuzz.store.made_up_b"] in cycles(edges)
