"""bench/campaign_ab.py's count: a graded case was run and not refused; a case the known-crash skip answered is not."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("campaign_ab", Path(__file__).resolve().parents[1] / "bench" /
                                              "campaign_ab.py")
campaign_ab = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(campaign_ab)


def test_refused_and_skipped_cases_are_not_graded(tmp_path):
    rows = [{"backend": "b", "label": "PASS", "message": "", "case": {"sq": 4, "skv": 4}},
            {"backend": "b", "label": "KNOWN:AcceleratorError", "message": "AcceleratorError: misaligned",
             "case": {"sq": 2, "skv": 2}},
            {"backend": "b", "label": "KNOWN:AcceleratorError", "message": "not run: known bug x takes this case",
             "case": {"sq": 3, "skv": 3}},
            {"backend": "b", "label": "UNSUPPORTED", "message": "refused", "case": {"sq": 5, "skv": 5}}]
    (tmp_path / "camp" / "cases").mkdir(parents=True)
    (tmp_path / "camp" / "cases" / "lane0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = campaign_ab.measured(tmp_path, seconds=2.0)
    assert m["b"]["rate"] == 1.0 and m["b"]["shapes"] == 2 and m["db_files"] == 0


def test_a_build_s_options_and_cold_caches_reach_its_campaign(tmp_path, monkeypatch):
    seen = {}

    class Popen:
        def __init__(self, command, env, **kwargs):
            seen["command"], seen["env"] = command, env

    monkeypatch.setattr(campaign_ab.subprocess, "Popen", Popen)
    args = campaign_ab.argparse.Namespace(backends="fa4", device="cuda", seconds=36.0, workers=None, cold=True)
    campaign_ab.campaign(tmp_path / "site", tmp_path / "fixed-0", args, ["--compile-time-share", "0"])
    assert seen["command"][-2:] == ["--compile-time-share", "0"] and "--hours" in seen["command"]
    for name in campaign_ab.COMPILE_CACHES:   # each campaign compiles into empty caches of its own
        assert seen["env"][name].startswith(str(tmp_path / "fixed-0" / "cache")), name
    args.cold = False
    campaign_ab.campaign(tmp_path / "site", tmp_path / "fixed-0", args, [])
    assert not any(seen["env"].get(name, "").startswith(str(tmp_path)) for name in campaign_ab.COMPILE_CACHES)
