"""Hypothesis's example database for `attnfuzz run` and `pytest fuzz`: in the per-user data folder
($XDG_DATA_HOME/attnfuzz/examples, ~/.local/share/attnfuzz/examples), never the working folder. A failure a search
found is replayed first by the next search of the same backend (the same kernel's module, for a bring-your-own
kernel) saving to the same findings folder, and by no other: the key names all three. The ci profile keeps no
database; a seeded run does not read one (Hypothesis). A campaign keeps its own (its db/)."""

from __future__ import annotations

import os
from pathlib import Path

import hypothesis
from hypothesis.database import DirectoryBasedExampleDatabase


def examples_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "attnfuzz" / "examples"


def kept_here(settings: hypothesis.settings) -> hypothesis.settings:
    """`settings` with its example database in examples_dir(); a profile that keeps none keeps none."""
    if settings.database is None:
        return settings
    return hypothesis.settings(settings, database=DirectoryBasedExampleDatabase(str(examples_dir())))


def key(backend, findings: Path) -> str:
    """The name a backend's failures are kept under: its name, its kernel's import folder (bring-your-own kernels)
    and the findings folder the run saves to."""
    return " ".join((backend.name, getattr(backend, "import_path", None) or "", str(Path(findings).resolve())))
