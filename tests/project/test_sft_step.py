"""benchmarks/sft_step.py, the compact LM head's per-step saving: its `--quick` run (tiny random Llama and Gemma 3)
builds both trainers per model, checks their step-1 losses and the head's rows, times paired repeats and writes only
`--out`; a step-1 loss or head that differs stops it before anything is timed."""
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sft_step.py"
RESULTS = ROOT / "benchmarks" / "results"


def _results() -> dict:
    "benchmarks/results/sft_step*.json by name: (modification time, size), what a quick run must leave as it was."
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in RESULTS.glob("sft_step*.json")}


@pytest.fixture(scope="module")
def bench(benchmark_module):
    "benchmarks/sft_step.py as a module."
    with benchmark_module("sft_step") as module: yield module


def test_the_quick_run_checks_times_and_writes_only_out(tmp_path):
    out, before = tmp_path / "quick.json", _results()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--repeats", "2", "--warmup",
                           "1", "--steps", "1", "--threads", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    record = json.loads(out.read_text())
    assert (record["quick"], record["repeats"], record["batch"]) == (True, 2, 4) and record["commit"]
    assert list(record["models"]) == ["smollm2", "gemma"]
    for name, r in record["models"].items():
        first, rows = r["step_1"], r["step_1"]["head_rows"]
        assert abs(first["loss"]["on"] - first["loss"]["off"]) <= 1e-5 * abs(first["loss"]["off"]) + 1e-6, name
        assert 0 < rows["on (labelled positions)"] < rows["off (every position)"], name
        for mode in ("on", "off"):
            runs = r["runs"][mode]
            assert len(runs) == 2 and all(len(x["seconds"]) == len(x["losses"]) == 2 for x in runs), (name, mode)
            assert r["wall"]["per_step"][mode] > 0 and r["cpu"]["per_step"][mode] > 0
        assert len(r["wall"]["paired_ratios"]) == 2 and r["loss_max_rel_diff_all_steps"] < 1e-4, name
        assert f"{name}: " in proc.stdout and "s/step compact" in proc.stdout
    assert _results() == before  # a quick run claims no result


def test_different_step_1_losses_or_heads_stop_it(bench, monkeypatch):
    "Stand-in trainers 'on' and 'off': `run` gives the step-1 loss set here, `head_rows` the rows the head projected."
    def check(loss: dict, rows: dict):
        monkeypatch.setattr(bench, "run", lambda mode, steps: {"losses": [loss[mode]]})
        projected = iter([[rows["on"]], [rows["off"]]])
        @contextlib.contextmanager
        def head_rows():
            calls = []
            yield calls
            calls += next(projected)
        monkeypatch.setattr(bench, "head_rows", head_rows)
        return bench.first_step({"on": ("on",), "off": ("off",)}, "fp32")

    same = {"on": 2.5, "off": 2.5}
    assert check(same, {"on": 10, "off": 200})["head_rows"] == {"on (labelled positions)": 10,
                                                                 "off (every position)": 200}
    with pytest.raises(AssertionError, match="step-1 losses of the compact head and TRL's differ"):
        check({"on": 2.5, "off": 2.51}, {"on": 10, "off": 200})
    with pytest.raises(AssertionError, match="compact head should project one row per label"):
        check(same, {"on": 200, "off": 200})
