"""The findings catalog: a corpus as one markdown table, a row per bug (backend, what, labels, smallest case, link).

`attnfuzz catalog corpus --out docs/findings.md` writes the shipped corpus's page; a test keeps that page equal to
what this module makes of the corpus, so the list of findings never goes stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import paths
from attnfuzz.report.build import _short_link
from attnfuzz.report.table import md_text

HEADER = """# What attnfuzz found

Every row is a bug of a backend, with its entries in the shipped corpus (`corpus/`): each entry is a minimal case
(JSON) and a standalone repro script beside it (`python3 corpus/ENTRY.py` exits 1 while the bug is there). Entries
marked with a link are known bugs: `pytest corpus` expects them to fail, and every run counts their failures as
KNOWN. Made by `attnfuzz catalog corpus --out docs/findings.md` from the entries themselves.

"""
USER_HEADER = """# Findings in {name}

Every row is a bug of a backend, with its entries in `{directory}`: each entry is a minimal case (JSON), with a
standalone repro script beside it where one was saved (`python3 ENTRY.py` exits 1 while the bug is there). Entries
marked with a link are known bugs: runs that read this folder count their failures as KNOWN.
Made by `attnfuzz catalog {directory}` from the entries themselves.

"""


def smallest_case(entry: corpus_io.Entry) -> str:
    c = entry.case
    parts = [f"b={c.b}", f"sq={c.sq}", f"skv={c.skv}", f"h={c.h}/{c.hk}", f"d={c.d_qk}/{c.d_v}", c.dtype]
    if c.seqlens_q is not None:
        parts.append(f"lens q={list(c.seqlens_q)} kv={list(c.seqlens_kv)}")
    if c.causal or c.window != (None, None):
        parts.append(("causal " if c.causal else "") + (f"window={tuple(c.window)} " if c.window != (None, None)
                                                        else "") + c.alignment)
    parts += [f"{name}" for name, on in (("grads", c.grads), (c.layout, c.layout != "bshd"),
                                         (c.memory, c.memory != "contiguous"), (c.softmax, c.softmax != "vanilla"),
                                         ("alibi", c.alibi_slopes is not None), ("softcap", c.softcap is not None),
                                         (f"spelling {c.spelling}", bool(c.spelling))) if on]
    return " ".join(parts)


def rows(directory: Path) -> list[list[str]]:
    """[backend, what, labels, smallest case, link, entries], one row per known bug (its link and note) or, for an
    entry with none, per backend and label."""
    entries, errors = corpus_io.load_all(directory)
    if errors:
        raise corpus_io.CorpusError("; ".join(map(str, errors)))
    groups: dict[tuple, list[tuple[Path, corpus_io.Entry]]] = {}
    for path, e in entries:
        bug = e.known_bug or {}
        key = (e.backend, bug.get("link", ""), bug.get("note", "") or e.verdict.label)
        groups.setdefault(key, []).append((path, e))
    out = []
    for (backend, link, what), items in sorted(groups.items()):
        smallest = min(items, key=lambda pe: (pe[1].case.size, pe[0].name))[1]
        labels = ", ".join(sorted({e.verdict.label for _, e in items}))
        names = ", ".join(f"`{p.stem}`" for p, _ in sorted(items))
        shown = f"[{_short_link(link)}]({link})" if link else "not yet reported"
        out.append([f"`{backend}`", md_text(what), labels, smallest_case(smallest), shown, names])
    return out


def markdown(directory: Path) -> str:
    """The catalog page: the shipped corpus's with its own preamble (docs/findings.md), any other with a neutral one."""
    lines = ["| backend | what | labels | smallest case | link | entries |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(directory)]
    header = HEADER if _is_shipped(directory) else USER_HEADER.format(name=Path(directory).resolve().name,
                                                                      directory=directory)
    return header + "\n".join(lines) + "\n"


def _is_shipped(directory: Path) -> bool:
    """Whether `directory` is the corpus attnfuzz ships (corpus/ in a checkout), whatever $ATTNFUZZ_SHIPPED_CORPUS
    names in its place."""
    from importlib.resources import files
    return Path(directory).resolve() == Path(str(files("attnfuzz.shipped_corpus"))).resolve()


def add_parser(sub) -> None:
    p = sub.add_parser("catalog", help="a corpus as a markdown table of its bugs (docs/findings.md)")
    p.add_argument("corpus", nargs="?", type=Path, help="corpus folder (default: the shipped corpus)")
    p.add_argument("--out", type=Path, help="write here instead of printing")


def cmd_catalog(args) -> int:
    directory = args.corpus or corpus_io.shipped_dir()
    if not directory.is_dir():
        print(f"attnfuzz catalog: {directory} is not a folder; give a corpus folder", file=sys.stderr)
        return 2
    if args.out:
        paths.writable_file(args.out, "--out", "findings.md")
    text = markdown(directory)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
