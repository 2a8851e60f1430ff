"""The installed attnfuzz: one namespace over the card's folders, every package folder shipped, and a wheel that
knows the shipped known bugs and replays the shipped corpus without the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"attnfuzz": "fuzz", "attnfuzz.oracles": "oracles", "attnfuzz.strategies": "strategies",
           "attnfuzz.shipped_corpus": "corpus"}


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == FOLDERS
    on_disk = set()
    for package, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in parts:
                on_disk.add(".".join((package, *parts)))
    assert set(config["packages"]) == on_disk


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory) -> Path:
    """A venv over this interpreter's packages (torch, hypothesis) with attnfuzz installed from a freshly built wheel,
    not from the repository."""
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(where), str(ROOT)], check=True, capture_output=True)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # `venv --system-site-packages` run from inside a virtualenv builds on the base interpreter, whose packages lack
    # the virtualenv's torch: point the new venv at this interpreter's package folders instead. A .pth line only
    # adds a folder to the path, so the repository's editable install (a .pth hook there) stays out.
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    Path(own, "outer-packages.pth").write_text("".join(f"{p}\n" for p in _package_folders()))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    *map(str, where.glob("attnfuzz-*.whl"))], check=True, capture_output=True)
    return python


def _package_folders() -> list[str]:
    """This interpreter's package folders (a virtualenv's, a conda env's, the system's, the user's), in path order."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _in(folder: Path, python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], cwd=folder, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_wheel_is_what_runs(wheel_env, tmp_path):
    where = _in(tmp_path, wheel_env, "-c", "import attnfuzz, attnfuzz.shipped_corpus as c; print(attnfuzz.__file__, "
                                           "c.__file__)").stdout
    assert str(ROOT) not in where and "site-packages/attnfuzz/" in where


@pytest.mark.slow
def test_an_installed_wheel_knows_the_shipped_bugs(wheel_env, tmp_path):
    script = ("from attnfuzz.store import corpus as c\n"
              "entries, errors = c.load_all(c.shipped_dir())\n"
              "known = c.known_bugs(c.shipped_dir(), c.findings_dir())\n"
              "print(len(entries), len(errors), sum(1 for _, e in entries if e.known_bug and "
              "known(e.backend, e.case, e.verdict.__class__(e.verdict.status, e.verdict.diagnosis, "
              "e.known_bug.get('match', ''))) is not None))\n")
    entries, errors, matched = map(int, _in(tmp_path, wheel_env, "-c", script).stdout.split())
    in_repo = len(list((ROOT / "corpus").glob("*.json")))
    assert (entries, errors) == (in_repo, 0) and matched > 20
    run = _in(tmp_path, wheel_env, "-m", "attnfuzz", "run", "--backend", "sdpa-flash", "--seed", "1",
              "--max-examples", "300")
    assert run.returncode == 0, run.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_installed_wheel_replays_the_shipped_corpus(wheel_env, tmp_path):
    collected = _in(tmp_path, wheel_env, "-m", "pytest", "--pyargs", "attnfuzz.shipped_corpus", "--collect-only",
                    "-q", "-p", "no:cacheprovider")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    names = [line for line in collected.stdout.splitlines() if "test_entry[" in line]
    assert len(names) == len(list((ROOT / "corpus").glob("*.json")))


@pytest.mark.slow
def test_the_wheel_claims_no_generic_top_level_name(wheel_env, tmp_path):
    """fuzz, oracles and strategies are the card's folders, not import names: a user's own fuzz/ package wins."""
    (tmp_path / "fuzz").mkdir()
    (tmp_path / "fuzz" / "__init__.py").write_text("MINE = True\n")
    script = ("import importlib.util as u, fuzz\n"
              "print(fuzz.MINE, u.find_spec('oracles'), u.find_spec('strategies'))")
    assert _in(tmp_path, wheel_env, "-c", script).stdout.split() == ["True", "None", "None"]
    top = next(Path(_in(tmp_path, wheel_env, "-c", "import attnfuzz, os; print(os.path.dirname(attnfuzz.__file__))")
                    .stdout.strip()).parent.glob("attnfuzz-*.dist-info"))
    assert (top / "top_level.txt").read_text().split() == ["attnfuzz"]
