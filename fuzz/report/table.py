"""A report's tables: built once (Table), rendered to markdown and to HTML with every cell escaped for its format."""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass
class Table:
    """A titled table; a cell is text, a (text, href) link, or a list of those."""

    title: str
    headers: list[str]
    rows: list[list]
    note: str = ""


_MD_SPECIAL = str.maketrans({ch: "\\" + ch for ch in "\\|<>[]`*"} | {"\n": " ", "\r": " "})


def md_text(value: str) -> str:
    """Markdown text that renders as itself: CommonMark backslash-escapes for what could open a tag, link, code or
    emphasis, or end a table cell."""
    return str(value).translate(_MD_SPECIAL)


_URL_SPECIAL = str.maketrans({ch: f"%{ord(ch):02X}" for ch in " <>()"})


def _md_cell(cell) -> str:
    if isinstance(cell, list):
        return "<br>".join(_md_cell(c) for c in cell)
    if isinstance(cell, tuple):
        return f"[{md_text(cell[0])}]({cell[1].translate(_URL_SPECIAL)})"
    return md_text(cell)


def _html_cell(cell) -> str:
    if isinstance(cell, list):
        return "<br>".join(_html_cell(c) for c in cell)
    if isinstance(cell, tuple):
        text, href = cell
        safe = not href.lower().startswith(("javascript:", "data:", "vbscript:"))
        return f'<a href="{html.escape(href)}">{html.escape(text)}</a>' if safe else html.escape(text)
    return html.escape(str(cell))


def table_markdown(t: Table) -> str:
    lines = [f"## {t.title}", ""]
    if t.rows:
        lines += ["| " + " | ".join(md_text(h) for h in t.headers) + " |", "|" + "---|" * len(t.headers)]
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
        lines.append("")
    return "\n".join(lines + ([md_text(t.note), ""] if t.note else []))


def table_html(t: Table) -> str:
    parts = [f"<h2>{html.escape(t.title)}</h2>"]
    if t.rows:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
        body = "".join("<tr>" + "".join(f"<td>{_html_cell(c)}</td>" for c in row) + "</tr>" for row in t.rows)
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    if t.note:
        parts.append(f'<p class="note">{html.escape(t.note)}</p>')
    return "\n".join(parts)
