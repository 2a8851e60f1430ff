"""A new user's first hour: bad options exit 2 naming the option, the pytest plugin stays out of other projects'
way, findings never land in the shipped corpus, and the shipped known bugs are known from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.cli import main
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

BAD_OPTIONS = [
    (["run", "--max-examples", "-5"], "--max-examples"),
    (["run", "--max-examples", "0"], "--max-examples"),
    (["run", "--profile", "nope"], "--profile"),
    (["run", "--max-len", "-3"], "--max-len"),
    (["run", "--max-len", "0"], "--max-len"),
    (["run", "--case-timeout", "-1", "--isolate"], "--case-timeout"),
    (["run", "--threads", "0"], "--threads"),
    (["run", "--device", "gpu"], "--device"),
    (["run", "--backend", "does.not:exist"], "does.not:exist"),
    (["replay", "--case-timeout", "0"], "--case-timeout"),
    (["shrink", "x.json", "--max-runs", "0"], "--max-runs"),
    (["campaign", "--hours", "-1"], "--hours"),
    (["campaign", "--round-examples", "0"], "--round-examples"),
    (["campaign", "--climb-every", "-1"], "--climb-every"),
    (["snapshot", "x", "--out", "y", "--max-cases", "0"], "--max-cases"),
]


@pytest.mark.parametrize("argv, named", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_a_bad_option_exits_2_naming_it(argv, named, capsys):
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_the_plugin_rejects_a_bad_value_as_a_usage_error(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = _pytest(tmp_path, "--attnfuzz-max-examples", "0")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "--attnfuzz-max-examples" in done.stderr


def _pytest(folder, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                          capture_output=True, text=True, timeout=300)


def test_the_plugin_coexists_with_a_conftest_that_declares_generic_options(tmp_path):
    """pytest loads the plugin into every session; another project's --device, --backend or --corpus must still
    work there, and the plugin must not import torch into it."""
    (tmp_path / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    for name in ('--device', '--backend', '--corpus', '--isolate', '--threads', '--max-examples'):\n"
        "        parser.addoption(name)\n")
    (tmp_path / "test_theirs.py").write_text(
        "import sys\n"
        "def test_theirs(request):\n"
        "    assert request.config.getoption('--device') == 'tpu'\n"
        "    assert 'torch' not in sys.modules\n")
    theirs = _pytest(tmp_path, "--device", "tpu")
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    # control: the plugin is loaded in that session, so a conftest claiming one of its names does conflict
    (tmp_path / "conftest.py").write_text("def pytest_addoption(parser):\n    parser.addoption('--attnfuzz-device')\n")
    clash = _pytest(tmp_path)
    assert clash.returncode != 0 and "attnfuzz-device" in clash.stdout + clash.stderr


def _entry(**case) -> dict:
    entry = corpus_io.Entry("sdpa-math", Case(**case), V.Verdict(V.FAIL, V.TOLERANCE, "made up"))
    return entry.to_dict()


def test_a_corpus_entry_must_say_true_or_false(tmp_path):
    data = _entry()
    data["case"]["causal"] = "yes"
    (tmp_path / "e.json").write_text(json.dumps(data))
    with pytest.raises(corpus_io.CorpusError, match="causal='yes'"):
        corpus_io.load(tmp_path / "e.json")
    data["case"]["causal"] = True  # control
    (tmp_path / "e.json").write_text(json.dumps(data))
    assert corpus_io.load(tmp_path / "e.json").case.causal is True


def test_an_unreadable_corpus_file_stops_the_run_naming_it(tmp_path, capsys):
    (tmp_path / "good.json").write_text(json.dumps(_entry()))
    argv = ["run", "--backend", "sdpa-math", "--max-examples", "2", "--corpus", str(tmp_path)]
    assert main(argv) == 0  # control: a readable corpus
    (tmp_path / "broken.json").write_text("{not json")
    assert main(argv) == 2
    assert "broken.json" in capsys.readouterr().err


def test_a_corpus_file_that_is_not_utf8_stops_the_run_naming_it(tmp_path, capsys):
    argv = ["run", "--backend", "sdpa-math", "--max-examples", "2", "--corpus", str(tmp_path)]
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "binary.json: not UTF-8 text" in err and "Traceback" not in err, err
    (tmp_path / "binary.json").unlink()
    assert main(argv) == 0  # control


def test_findings_go_to_the_per_user_folder_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNFUZZ_CORPUS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert corpus_io.findings_dir() == tmp_path / "data" / "attnfuzz" / "corpus"
    monkeypatch.setenv("ATTNFUZZ_CORPUS", str(tmp_path / "mine"))
    assert corpus_io.findings_dir() == tmp_path / "mine"
    assert corpus_io.findings_dir(tmp_path / "given") == tmp_path / "given"
    assert corpus_io.findings_dir().resolve() != corpus_io.shipped_dir().resolve()


def test_a_planted_finding_lands_in_the_findings_folder_not_the_shipped_corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped_before = sorted(p.name for p in corpus_io.shipped_dir().iterdir())
    argv = ["run", "--backend", "tests.misbehaving:zero_when_causal", "--max-examples", "60", "--seed", "0"]
    assert main(argv) == 1
    import os
    findings = list((corpus_io.findings_dir()).glob("*.json"))
    assert findings and all(os.environ["ATTNFUZZ_CORPUS"] in str(p) for p in findings)
    assert sorted(p.name for p in corpus_io.shipped_dir().iterdir()) == shipped_before
    assert list(tmp_path.iterdir()) == []  # nothing made in the current folder


def shipped_known_entries() -> list[corpus_io.Entry]:
    entries, errors = corpus_io.load_all(corpus_io.shipped_dir())
    assert not errors, errors
    return [e for _, e in entries if e.known_bug]


def test_every_shipped_known_bug_is_known_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    entries = shipped_known_entries()
    assert len(entries) > 20
    known = corpus_io.known_bugs(corpus_io.shipped_dir(), corpus_io.findings_dir())
    for e in entries:
        verdict = V.Verdict(e.verdict.status, e.verdict.diagnosis, e.known_bug.get("match", "") + " and more")
        if e.verdict.status == V.FLAKY:  # a flaky entry answers to the label it flaked with
            status, _, diagnosis = e.verdict.diagnosis.partition(":")
            verdict = V.Verdict(status, diagnosis or None, verdict.message)
        assert known(e.backend, e.case, verdict) is not None, e.filename


def test_a_run_from_another_folder_reports_no_shipped_bug_as_new(tmp_path, monkeypatch):
    """On torch 2.13's CPU flash kernel this seed draws rows with no visible key, whose LSE is a shipped known bug:
    from another folder it must be KNOWN, not a new finding, and the folder stays as it was."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--backend", "sdpa-flash", "--seed", "1", "--max-examples", "300"]) == 0
    assert list(tmp_path.iterdir()) == []


def test_the_shipped_corpus_can_be_replaced_by_another_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNFUZZ_SHIPPED_CORPUS", raising=False)
    shipped = corpus_io.shipped_dir()
    path, entry = next((p, e) for p, e in corpus_io.load_all(shipped)[0] if e.known_bug)
    assert corpus_io.known_bugs(corpus_io.shipped_dir())(entry.backend, entry.case, entry.verdict)
    (tmp_path / "curated").mkdir()
    monkeypatch.setenv("ATTNFUZZ_SHIPPED_CORPUS", str(tmp_path / "curated"))
    assert corpus_io.shipped_dir() == tmp_path / "curated"
    assert corpus_io.known_bugs(corpus_io.shipped_dir())(entry.backend, entry.case, entry.verdict) is None, path.name


def test_output_closed_by_its_reader_ends_quietly_with_141(tmp_path):
    """`attnfuzz backends --json | head -1`: the reader is gone before the output is written; the command ends
    with 128 + SIGPIPE and no traceback (1 would read as a finding)."""
    command = [sys.executable, "-m", "attnfuzz", "backends", "--json"]
    read = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert read.returncode == 0 and json.loads(read.stdout), read.stderr  # control: a reader that reads it all
    closed = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    closed.stdout.close()  # before the command has written anything: every write meets a closed pipe
    stderr = closed.stderr.read()
    assert closed.wait(timeout=300) == 141, stderr
    assert "Traceback" not in stderr and stderr == "", stderr


def _stops_at_once(capsys, argv, named: str) -> str:
    """main(argv) exits 2 with one line naming `named`, before any example ran."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1 and "examples" not in err, err
    return err


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_findings_folder_that_cannot_be_one_stops_the_run_before_it_starts(tmp_path, capsys, where):
    afile = tmp_path / "afile"
    afile.write_text("x")
    corpus = afile if where == "a file" else afile / "sub"
    argv = ["run", "--backend", "sdpa-math", "--max-examples", "2", "--corpus"]
    err = _stops_at_once(capsys, argv + [str(corpus)], f"--corpus={corpus}")
    assert f"{afile} is a file" in err
    assert main(argv + [str(tmp_path / "folder")]) == 0  # control: a folder that can be made


def test_an_unwritable_findings_folder_stops_the_run_before_it_starts(tmp_path, capsys, monkeypatch):
    """Root writes anywhere, so the folder is made unwritable to the check itself (os.access)."""
    import os
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked and access(path, mode, **kw))
    argv = ["run", "--backend", "sdpa-math", "--max-examples", "2", "--corpus"]
    err = _stops_at_once(capsys, argv + [str(locked / "findings")], "--corpus=")
    assert f"{locked} is not writable" in err
    monkeypatch.setenv("ATTNFUZZ_CORPUS", str(locked))
    _stops_at_once(capsys, argv[:-1], f"$ATTNFUZZ_CORPUS={locked}")
    assert main(argv + [str(tmp_path / "open")]) == 0  # control: a folder it can write


def test_a_folder_given_for_a_file_and_a_file_for_a_folder_exit_2(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    entry = corpus_io.save(tmp_path / "corpus", corpus_io.Entry("sdpa-math", Case(), V.Verdict(V.FAIL, V.TOLERANCE)),
                           repro=False)
    log = tmp_path / "run.jsonl"
    log.write_text("")
    run = ["run", "--backend", "sdpa-math", "--max-examples", "2"]
    _stops_at_once(capsys, run + ["--log", str(tmp_path)], f"--log={tmp_path}")
    _stops_at_once(capsys, ["campaign", "--dir", str(afile), "--backends", "sdpa-math"], f"--dir={afile}")
    _stops_at_once(capsys, ["report", str(log), "--out", str(afile)], f"--out={afile}")
    _stops_at_once(capsys, ["catalog", str(tmp_path / "corpus"), "--out", str(tmp_path)], f"--out={tmp_path}")
    _stops_at_once(capsys, ["snapshot", str(tmp_path / "corpus"), "--out", str(tmp_path)], f"--out={tmp_path}")
    _stops_at_once(capsys, ["report-bug", str(entry), "--out", str(tmp_path)], f"--out={tmp_path}")
    assert main(run + ["--log", str(tmp_path / "logs" / "run.jsonl")]) == 0  # control: a file path
    assert (tmp_path / "logs" / "run.jsonl").read_text().count("\n") >= 2


def test_the_plugin_refuses_a_file_for_its_corpus_folder(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    (tmp_path / "afile").write_text("x")
    done = _pytest(tmp_path, "--attnfuzz-corpus", str(tmp_path / "afile"))
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "--attnfuzz-corpus" in done.stderr, done.stderr
    assert _pytest(tmp_path, "--attnfuzz-corpus", str(tmp_path / "folder")).returncode == 0  # control


def test_a_named_backend_that_cannot_run_here_exits_2_unless_skipped(capsys):
    """sdpa-cudnn has no CPU implementation: named for a CPU run it is bad usage, so a CI job that asked for it does
    not pass having fuzzed nothing; --skip-unavailable skips it, saying why, and a run left with nothing stops."""
    argv = ["run", "--backend", "sdpa-cudnn", "--backend", "sdpa-math", "--max-examples", "2"]
    err = _stops_at_once(capsys, argv, "--backend=sdpa-cudnn cannot run here")
    assert "--skip-unavailable" in err
    assert main(argv + ["--skip-unavailable"]) == 0
    err = capsys.readouterr().err
    assert "[sdpa-cudnn] skipped: sdpa-cudnn needs CUDA" in err and "[sdpa-math] 2 examples" in err, err
    _stops_at_once(capsys, argv[:3] + ["--skip-unavailable"], "no backend can run here")
    assert main(["run", "--max-examples", "2"]) == 0  # control: the default run, the CPU backends


def test_a_campaign_named_backend_that_cannot_run_here_exits_2_unless_skipped(tmp_path, capsys):
    argv = ["campaign", "--dir", str(tmp_path / "c"), "--backends", "sdpa-cudnn,sdpa-math", "--hours", "0.0001"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "sdpa-cudnn cannot run here" in err and "--skip-unavailable" in err and not (tmp_path / "c").exists(), err
    assert main(argv + ["--skip-unavailable", "--max-len", "16"]) == 0
    config = json.loads((tmp_path / "c" / "campaign.json").read_text())
    assert config["backends"] == ["sdpa-math"] and "sdpa-cudnn" in config["skipped"]


def test_version_prints_the_installed_version(capsys):
    from importlib import metadata
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"attnfuzz {metadata.version('attnfuzz')}"


def test_backends_columns_line_up_past_long_names(capsys, monkeypatch):
    from attnfuzz import cli
    from attnfuzz.backends import factories
    registry = dict(factories())
    monkeypatch.setattr(cli, "factories", lambda: {**registry, "a-backend-name-of-thirty-chars": registry["sdpa-math"]})
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = {len(line) - len(line.split("  ", 1)[1].lstrip()) for line in lines}  # where yes / no starts
    assert len(lines) == len(registry) + 1 and len(starts) == 1, lines
    assert any(line.startswith("sdpa-math ") for line in lines)


def test_the_progress_line_says_what_the_examples_past_the_budget_did(tmp_path, capsys):
    """Hypothesis draws at most max_examples new cases, and stops drawing soon after failures stop coming; shrinking
    runs more. The final line says how many of each, and they add up."""
    import re
    argv = ["run", "--backend", "tests.misbehaving:zero_when_causal", "--max-examples", "60", "--seed", "1",
            "--corpus", str(tmp_path)]
    assert main(argv) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if "/s  " in line]
    final = re.search(r"\] (\d+) examples \((\d+) new of 60, (\d+) shrinking\), .*/s  (.*)", lines[-1])
    assert final, lines
    examples, new, shrinking = map(int, final.groups()[:3])
    assert examples == new + shrinking == sum(int(n) for n in final.group(4).split()[1::2]), lines[-1]
    assert new <= 60 and shrinking > 0, lines[-1]
    control = ["run", "--backend", "sdpa-math", "--max-examples", "20", "--seed", "0", "--corpus", str(tmp_path)]
    assert main(control) == 0
    assert "[sdpa-math] 20/20 examples, " in capsys.readouterr().err  # control: no failure, nothing but new draws


def test_a_run_keeps_its_example_database_out_of_the_working_folder(tmp_path):
    """Unseeded, a run reads and writes Hypothesis's example database: in the per-user data folder, not the working
    folder, and keyed by the findings folder, so a failure replays first where it was found and nowhere else. (Run
    outside a CI environment: there Hypothesis's own ci profile, the base of attnfuzz's, keeps no database.)"""
    from attnfuzz.store.examples import examples_dir
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])  # tests.misbehaving from the working folder

    def run(findings: str) -> str:
        ran = subprocess.run([sys.executable, "-m", "attnfuzz", "run", "--backend", "tests.misbehaving:zero_when_causal",
                              "--max-examples", "60", "--corpus", str(tmp_path / findings)], cwd=work, env=env,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 1, ran.stderr[-3000:]
        return ran.stderr

    run("a")
    assert list(work.iterdir()) == [] and any(examples_dir().rglob("*")), list(work.iterdir())
    assert "from the example database" not in run("b")  # another findings folder: nothing replayed
    assert "from the example database" in run("a")  # control: the same folder replays its failure
