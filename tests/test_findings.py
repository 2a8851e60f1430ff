"""What a finding tells the user: where it is saved and how to replay it; one root cause reads as one finding."""

from __future__ import annotations

from attnfuzz import corpus as corpus_io
from attnfuzz.cli import main


def test_run_prints_where_each_finding_is_and_how_to_replay_it(tmp_path, capsys):
    spec = "tests.misbehaving:zero_when_causal"
    assert main(["run", "--backend", spec, "--max-examples", "30", "--seed", "0", "--corpus", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    [path] = corpus_io.entry_paths(tmp_path)
    script = path.with_suffix(".py")
    assert f"[{spec}] FAIL:ALL_ZERO: every graded output element is 0" in err, err
    for line in (f"saved:  {path}", f"repro:  {script}", f"replay: attnfuzz replay {path}   or   python3 {script}"):
        assert line in err, (line, err)
    assert "shrink:" not in err, "Hypothesis shrank it: no shrink command"
    assert main(["replay", str(path)]) == 1, "the printed replay command replays it: the bug is still there"
    assert main(["run", "--backend", spec, "--max-examples", "30", "--seed", "0", "--corpus", str(tmp_path)]) == 1
    assert "seen before" in capsys.readouterr().err, "the same bug again merges into its entry, and says so"
