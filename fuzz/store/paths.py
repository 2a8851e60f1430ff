"""Folders and files a user names (a findings folder, a campaign folder, a case log), checked before any work starts,
so a run that cannot keep what it finds stops at once instead of after its search. Nothing is made here. PathError's
message is one line naming the option, the path and the fix."""

from __future__ import annotations

import os
from pathlib import Path


class PathError(ValueError):
    """A path that cannot be used as given; the message names the option, the path and the fix."""


def _nearest_existing(path: Path, given: str) -> Path:
    """`path` or its nearest ancestor that exists (a relative path ends at '.')."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return candidate
        except OSError as e:  # a folder on the way that cannot be read (permission denied)
            raise PathError(f"{given}: {candidate} cannot be reached ({e.strerror}); give another path") from None
    return Path(".")


def folder(path: Path, option: str) -> Path:
    """`path` as a folder, there or to be made; PathError when it is a file or lies under one."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PathError(f"{option}={path}: {path} is a file, not a folder; give a folder (made if missing)")
    _check_folder(path, f"{option}={path}", "folder", write=False)
    return path


def writable_folder(path: Path, option: str) -> Path:
    """`path` as a folder this process can write into (made later if missing); PathError when it is a file, lies
    under a file, or the folder that holds it is not writable."""
    folder(path, option)
    _check_folder(Path(path), f"{option}={path}", "folder")
    return Path(path)


def _check_folder(where: Path, given: str, wanted: str, write: bool = True) -> None:
    """`where` can be made as a folder (or is one), and written into where `write`: its nearest existing ancestor
    is a folder, and a writable one."""
    found = _nearest_existing(where, given)
    if not found.is_dir():
        raise PathError(f"{given}: {found} is a file, so nothing can be made under it; give another {wanted}")
    if write and not os.access(found, os.W_OK | os.X_OK):
        raise PathError(f"{given}: {found} is not writable; give a {wanted} you can write to")


def writable_file(path: Path, option: str, example: str = "out.txt") -> Path:
    """`path` as a file this process can write (made later, with its folders, if missing); PathError when it is a
    folder, lies under a file, or cannot be written. `example` names a file for the message's fix."""
    path = Path(path)
    if path.is_dir():
        raise PathError(f"{option}={path}: {path} is a folder; give a file, e.g. {path / example}")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PathError(f"{option}={path}: {path} is not writable; give a file you can write to")
        return path
    _check_folder(path.parent, f"{option}={path}", "file path")
    return path
