"""benchmarks/gpu_check.py, the check prepared for a lent GPU: its dry run (the same code on the CPU, tiny fp32 models)
runs every check in a subprocess and exits 0; without CUDA and without --dry-run it measures and writes nothing."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
RESULT = ROOT / "benchmarks" / "results" / "gpu.json"
CHECKS = ["pissa_trainer", "aligner_trainer", "aligner_dpo", "repnoise_trainer", "translora_sequence",
          "translora_logit", "translora_discriminator", "pissa_init", "qpissa_4bit", "aligner_generate", "merge"]
TRAINERS = CHECKS[:7]


def _result_state():
    "benchmarks/results/gpu.json's modification time and size, or None: what a run must leave as it was."
    return (RESULT.stat().st_mtime_ns, RESULT.stat().st_size) if RESULT.exists() else None


def test_the_dry_run_runs_every_check_on_the_cpu_and_exits_0(tmp_path):
    out, before = tmp_path / "dry.json", _result_state()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    record = json.loads(out.read_text())
    checks = record["checks"]
    assert list(checks) == CHECKS and record["failed"] == []
    assert (record["device"], record["dry_run"], record["setup"]["dtype"]) == ("cpu", True, "float32")
    assert _result_state() == before  # the dry run claims no GPU result
    no_bnb = importlib.util.find_spec("bitsandbytes") is None
    for name, r in checks.items():
        want = "skipped" if name == "qpissa_4bit" and no_bnb else "ok"
        assert r["status"] == want, (name, r)
        assert r["seconds"] >= 0 and r["what"], name
        assert f"{name}: {want}" in proc.stdout
    if no_bnb: assert "bitsandbytes is not importable" in checks["qpissa_4bit"]["reason"]
    for name in TRAINERS:  # each trained its steps on the CPU, without bf16 there
        r = checks[name]
        assert r.get("trained_on", "cpu") == "cpu" and r.get("bf16", False) is False, (name, r)
    assert checks["aligner_dpo"]["pairs"] > 0
    init = checks["pissa_init"]["init"]
    assert init["peft_exact"]["rel_error_vs_exact_max"] == 0 and init["adaptkit"]["rel_error_vs_exact_max"] < 1e-3
    assert checks["aligner_generate"]["prompts"] == 4 and checks["merge"]["shards"] >= 1


def test_without_cuda_it_says_so_measures_nothing_and_exits_0(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what the script sets, put back after the test
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert list(module.CHECKS) == CHECKS
    before = _result_state()
    assert module.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    assert _result_state() == before
