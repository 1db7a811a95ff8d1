"""``spectool tune spectool:demo-target-mtp --method mtp`` on its own (the demo profile's
comparison does not include mtp yet): the embedded engine measures the target's own MTP module
and the tune folder is a build that serves it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from spectool.cli.app import main
from spectool.deploy.decision import parse_decision
from spectool.deploy.manifest import read_manifest


def test_tune_measures_the_demo_targets_mtp_module(tune_workload: Path, tmp_path: Path) -> None:
    out = tmp_path / "tune-mtp"
    args = ["tune", "spectool:demo-target-mtp", "--method", "mtp", "--engine", "torch"]
    args += ["--max-draft-len", "2", "--concurrency", "1", "--workload", str(tune_workload)]
    args += ["--num-prompts", "4", "--max-tokens", "8", "--device", "cpu", "--threads", "1"]
    # greedy decoding of the same prompts: the acceptance asserted below is the same at 8 pairs
    # a cell (--budget 1) as at 24 (--budget 5), tokens_per_step 1.4, alphas (0.5, 0.0)
    args += ["--budget", "1", "--out", str(out), "--json"]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(args)
    assert code == 0, buffer.getvalue()
    data = json.loads((out / "decision.json").read_text())
    parse_decision(data, out / "decision.json")  # what build and serve read
    assert (data["engine"], data["method"]) == ("torch", "mtp")
    assert {c["k"] for c in data["cells"]} >= {2}
    tune = json.loads((out / "tune.json").read_text())
    (measured,) = [c["stats"] for c in tune["cells"] if c["k"] == 2]
    # the trained module's drafts are accepted (2 drafts: between 1 and 3 tokens per step)
    assert 1.3 < measured["tokens_per_step"] <= 3.0 and len(measured["alphas"]) == 2
    manifest = read_manifest(out)
    assert (manifest.method, manifest.drafter) == ("mtp", None)
    config = json.loads((out / "speculative.json").read_text())
    assert config["method"] == "mtp"
