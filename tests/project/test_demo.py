"""`make demo`'s steps (adaptkit.demo.run_demo) at tiny scale: tiny random models stand in for SmolLM2, Gemma and
MiniLM, every step trains a few steps, and every artifact goes through the embedded LocalHub and back."""
import json
import math
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi

from adaptkit.demo import EMR_TASKS, STAGES, DemoArguments, DemoModels, _cores, run_demo
from adaptkit.localhub.server import LocalHub
from adaptkit.models import tiny_causal_lm, tiny_tokenizer


@pytest.fixture
def tiny_bases(tmp_path):
    "Folders of two tiny chat causal LMs (different widths and seeds) and a tiny BERT encoder, each with the tokenizer."
    from transformers import BertConfig, BertModel
    torch.set_num_threads(2)
    tok, folders = tiny_tokenizer(), {}
    models = {
        "smol": tiny_causal_lm(tok),
        "gemma": tiny_causal_lm(tok, hidden_size=48, seed=1),
        "minilm": BertModel(
            BertConfig(
                vocab_size=len(tok),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=128,
            )
        ),
    }
    for name, model in models.items():
        folders[name] = tmp_path / f"tiny-{name}"
        model.save_pretrained(folders[name])
        tok.save_pretrained(folders[name])
    return DemoModels(**folders, repnoise_layers=(0, 1), repnoise_max_length=512,
                      translora_threshold=0.0)  # a random model's prompts are all fake: keep them all


def assert_two_lanes_shared_the_cores(results: dict, out: str):
    "The default lanes ran, each on one torch thread until the other ended; then the one left took the cores."
    assert results["lanes"] == [["pissa", "translora"], ["aligner", "repnoise", "emr"]]
    assert ("; lanes: pissa translora | aligner repnoise emr (a process each, 1 torch thread until the other lanes "
            "end)") in out.splitlines()[0]
    (first, first_end), (last, last_end) = sorted(results["lane_ends_s"].items(), key=lambda kv: kv[1])
    assert last_end <= results["seconds"] + 1 and set(results["stage_threads"]) == set(results["stage_seconds"])
    assert all(results["stage_threads"][s] == 1 for s in results["lanes"][int(first) - 1])
    if _cores() > 1 and last_end - first_end > 2:  # its last stage was still running when the other lane ended
        assert results["stage_threads"][results["lanes"][int(last) - 1][-1]] == _cores()
        assert f"adaptkit demo: lane {first} ended; lane {last} (" in out


def test_the_demo_runs_every_step_through_the_hub(tiny_bases, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    args = DemoArguments(namespace="tiny", pissa_steps=2, aligner_steps=2, repnoise_steps=2, translora_synthetic=8,
                         translora_steps=2, emr_steps=2, n_test=8, precision="bf16")  # bf16 on any CPU
    start = time.perf_counter()
    assert run_demo(args, tiny_bases) == 0
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "cache" / "demo" / "results.json").read_text())
    rows = results["rows"]
    # SmolLM2, which four stages use, is pushed first; Gemma by Trans-LoRA and MiniLM by EMR, each in its lane
    assert [r["step"] for r in rows] == (["base"] + ["pissa"] * 3 + ["aligner"] * 2 + ["repnoise"] * 4 + ["base"]
                                         + ["translora"] * 4 + ["base"] + ["emr"] * 2 * len(EMR_TASKS))
    assert [r["what"] for r in rows if r["step"] == "base"] == ["SmolLM2-135M-Instruct", "Gemma-3-270M",
                                                                "all-MiniLM-L6-v2"]
    pushed = {r["repo_id"]: r["commit"] for r in rows if r["repo_id"]}
    assert set(pushed) == {
        f"tiny/{n}"
        for n in [
            "SmolLM2-135M-Instruct",
            "gemma-3-270m",
            "all-MiniLM-L6-v2",
            "SmolLM2-135M-arithmetic-pissa",
            "SmolLM2-135M-arithmetic-aligner",
            "SmolLM2-135M-repnoise",
            "SmolLM2-135M-arithmetic-discriminator",
            "gemma-3-270m-arithmetic-translora",
            "all-MiniLM-L6-v2-emr-3tasks",
            *(f"all-MiniLM-L6-v2-{t}" for t in EMR_TASKS),
        ]
    }
    # the demo's hub, reopened: every commit it reported is there
    with LocalHub(tmp_path / "cache" / "localhub") as hub:
        api = HfApi(endpoint=hub.endpoint)
        for repo_id, commit in pushed.items():
            assert api.model_info(repo_id).sha == commit, repo_id
        assert {"adapter_config.json", "adapter_model.safetensors", "adaptkit.json"} <= set(
            api.list_repo_files("tiny/SmolLM2-135M-arithmetic-pissa"))
        card = open(
            api.hf_hub_download(
                "tiny/SmolLM2-135M-Instruct", "README.md", revision=pushed["tiny/SmolLM2-135M-Instruct"]
            )
        )
        assert "SmolLM2-135M-Instruct stand-in: the checkpoint in `tiny-smol`." in card.read()  # not the real summary
    scored = {r["what"]: r["accuracy"] for r in rows if "accuracy" in r}
    assert len(scored) == 3 + 2 + 3 + 2 * len(EMR_TASKS)  # PiSSA: base, LoRA, PiSSA; Trans-LoRA: source, alone, moved
    for what in [w for w in scored if not w.startswith(("task model", "`"))]:  # the arithmetic rows: 8 held-out sums
        assert scored[what] * 8 == round(scored[what] * 8), (what, scored[what])
    # every stage beside its baseline: each interval holds its mean, each verdict is the gain's interval said plainly
    for r in rows:
        for k in [k for k in r if k.endswith("_95ci")]:
            low, high = r[k]
            assert low <= r[k[:-5]] <= high if k != "gain_95ci" else low <= r["gain"] <= high, (r["what"], k)
    compared = {r["step"]: r for r in rows if "gain" in r}
    assert set(compared) == {"pissa", "aligner", "repnoise", "translora"}
    for step, r in compared.items():
        assert r["shows_gain"] == (r["gain_95ci"][0] > 0)
        said = {"pissa": ("better than the LoRA by", "no gain over the LoRA shown: "),
                "aligner": ("better by", "no gain shown: "),
                "repnoise": ("less harmful than the undefended model by", "no reduction shown: "),
                "translora": ("better than Gemma alone by", "no gain over Gemma alone shown: ")}[step]
        assert said[0 if r["shows_gain"] else 1] in r["what"], r["what"]
        assert f"{r['gain']:+.3f} [{r['gain_95ci'][0]:+.3f}, {r['gain_95ci'][1]:+.3f}]" in r["what"]
    harm = [r for r in rows if r["step"] == "repnoise"]
    assert [("undefended" in r["what"], "attack" in r["what"]) for r in harm] == [
        (True, False), (True, False), (True, True), (False, True)]  # the immunised rows name the undefended model
    assert all(0 <= r["harmfulness"] <= 1 and len(r["harmfulness_95ci"]) == 2 for r in harm)
    assert all(math.isfinite(r["benign_loss"]) and r["benign_loss"] > 0 for r in harm[:2])
    pissa, repnoise = compared["pissa"], compared["repnoise"]
    lora = next(r for r in rows if r["what"].startswith("the baseline: LoRA"))
    assert abs(pissa["gain"] - (pissa["accuracy"] - lora["accuracy"])) < 2e-4  # PiSSA - LoRA, paired
    assert abs(repnoise["gain"] - (harm[2]["harmfulness"] - harm[3]["harmfulness"])) < 2e-4  # undefended - immunised
    assert set(results["stage_seconds"]) == {"bases", "pissa", "aligner", "repnoise", "translora", "emr"}
    assert results["stages"] == list(STAGES) and "stages:" not in out.splitlines()[0]
    # two lanes (the default), each a process: every stage's rows merged in the demo's order (above), lines as they came
    assert_two_lanes_shared_the_cores(results, out)
    assert all(s >= 0 for s in results["stage_seconds"].values())
    assert all(sum(results["stage_seconds"][s] for s in lane) <= results["seconds"] + 1 for lane in results["lanes"])
    assert all(rows[0]["elapsed_s"] <= r["elapsed_s"] <= results["seconds"] + 1 for r in rows[1:])  # the demo's clock
    said = [line for line in out.splitlines() if line.startswith("[")]  # each row's line, printed as it happened
    assert len(said) == len(rows) and {line.split("] ")[1].split()[0] for line in said} == {"base", *STAGES}
    assert out.index("] aligner   answers corrected") < out.index("adaptkit demo: done")
    assert results["precision"] == "bf16" and "; bf16" in out.splitlines()[0]
    assert len(results["load_average"]["start"]) == len(results["load_average"]["end"]) == 3
    steal = results["cpu_steal_share"]  # the hypervisor's share of the machine's CPU over the run (None: no /proc/stat)
    assert 0 <= steal <= 1 if Path("/proc/stat").exists() else steal is None
    assert set(results["stage_cpu_steal_share"]) == set(results["stage_seconds"])
    assert ("(the hypervisor took" in out) == (steal is not None and steal > 0.02)  # said on the last line if > 2%
    assert "kept 8 of 8 prompts" in out and "threshold 0.000" in out  # the stand-in threshold was used
    for repo_id, commit in pushed.items(): assert f"{repo_id}@{commit[:8]}" in out  # the final table names every commit
    assert out.rstrip().endswith(f"results: {tmp_path / 'cache' / 'demo' / 'results.json'}")
    print(f"tiny demo: {seconds:.0f} s")


def test_a_lane_takes_the_cores_another_lane_freed():
    """In a lane's process (`_lane_start`): one torch thread while both lanes run; each SIGUSR1 (the parent's, when a
    lane ends) gives it its share of the cores left, and never takes threads away."""
    import multiprocessing
    import os
    import signal

    from adaptkit.demo import _lane_start
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    running = multiprocessing.get_context("spawn").Value("i", 2)
    try:
        _lane_start(None, None, running)
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        os.kill(os.getpid(), signal.SIGUSR1)  # two lanes still running: half the cores each
        assert torch.get_num_threads() == max(1, _cores() // 2)
        running.value = 1
        os.kill(os.getpid(), signal.SIGUSR1)  # alone
        assert torch.get_num_threads() == _cores()
        running.value = 2
        os.kill(os.getpid(), signal.SIGUSR1)  # a late signal never narrows a lane mid-stage
        assert torch.get_num_threads() == _cores()
    finally:
        for s, handler in handlers.items(): signal.signal(s, handler)
        torch.set_num_threads(threads)
        if omp is None: os.environ.pop("OMP_NUM_THREADS")
        else: os.environ["OMP_NUM_THREADS"] = omp


def test_a_lane_stops_its_running_stage_when_another_lane_failed():
    """In a lane's process: SIGUSR2 (the parent's, when another lane failed) raises `_Stopped` in the running stage,
    past any `except Exception` on the way; between two stages it does nothing (the lane reads `stop` next)."""
    import os
    import signal

    from adaptkit.demo import _LANE, _halt, _Stopped
    handler = signal.signal(signal.SIGUSR2, _halt)
    caught = []
    try:
        _LANE["stage"] = None
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)  # the handler has run: nothing raised between stages
        _LANE["stage"] = "emr"
        with pytest.raises(_Stopped):
            try:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(5)  # a stage's work: the handler interrupts it
            except Exception as e: caught.append(e)  # what a library's retry would catch: never the stop
        assert not caught
    finally:
        signal.signal(signal.SIGUSR2, handler)
        _LANE.pop("stage", None)


def test_the_default_models_are_the_real_ones():
    "`make demo` (no DemoModels) starts from SmolLM2, Gemma and MiniLM with its own settings."
    assert DemoModels() == DemoModels(None, None, None, (14, 29), None, 72)


def test_a_gain_is_claimed_only_when_its_interval_is_above_zero():
    "Each stage's verdict: the paired gain with its 95% interval, 'better' only when the interval's low end is above 0."
    from adaptkit.demo import _gain
    fields, said = _gain([0] * 10, [0] * 10)
    assert not fields["shows_gain"] and said == "no gain shown: +0.000 [+0.000, +0.000]"
    fields, said = _gain([0] * 20, [1] * 20, "better than the LoRA")
    assert fields["shows_gain"] and said == "better than the LoRA by +1.000 [+1.000, +1.000]"
    fields, said = _gain([0] * 19 + [1], [1] + [0] * 19, none="no reduction shown")  # same mean, other items
    assert not fields["shows_gain"] and said.startswith("no reduction shown: +0.000 [-")
    fields, _ = _gain([0] * 30, [1] * 3 + [0] * 27)  # +0.1 on 30 items: the interval reaches 0
    assert fields["gain"]["low"] == 0 and not fields["shows_gain"]
    with pytest.raises(ValueError): _gain([0, 1], [1])  # scores of other items cannot be paired


def test_auto_precision_is_bf16_only_where_the_cpu_computes_it(monkeypatch):
    "`--precision auto` follows the CPU's bf16 flag; bf16 and fp32 are taken as given; anything else is refused."
    import adaptkit.models
    from adaptkit.demo import _cpu, _precision
    for native, auto in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(adaptkit.models, "cpu_has_bf16", lambda: native)
        assert [_precision(c) for c in ("auto", "bf16", "fp32")] == [auto, "bf16", "fp32"]
    with pytest.raises(ValueError, match="--precision 'fp16': use auto, bf16 or fp32"): _precision("fp16")
    assert _cpu(DemoArguments(precision="bf16"))["bf16"] and not _cpu(DemoArguments(precision="fp32"))["bf16"]
    assert DemoArguments().precision == "auto"


def test_the_demo_runs_only_the_stages_asked_for(tiny_bases, tmp_path, monkeypatch, capsys):
    """`--stages translora emr --lanes 1`: SmolLM2, then PiSSA (whose adapter Trans-LoRA moves), Trans-LoRA (pushing
    Gemma) and EMR (pushing MiniLM) one after another in this process, and nothing else."""
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    args = DemoArguments(namespace="tiny", pissa_steps=2, translora_synthetic=8, translora_steps=2, translora_batch=2,
                         emr_steps=2, n_test=8, stages=["translora", "emr"], precision="fp32", lanes=1)
    assert run_demo(args, tiny_bases) == 0
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "cache" / "demo" / "results.json").read_text())
    assert [r["step"] for r in results["rows"]] == (["base"] + ["pissa"] * 3 + ["base"] + ["translora"] * 4
                                                    + ["base"] + ["emr"] * 2 * len(EMR_TASKS))
    assert results["stages"] == ["pissa", "translora", "emr"] and results["lanes"] == [results["stages"]]
    assert set(results["stage_seconds"]) == {"bases", "pissa", "translora", "emr"}
    assert sum(results["stage_seconds"].values()) <= results["seconds"] + 1  # one after another
    assert "; stages: pissa translora emr" in out.splitlines()[0] and "lanes:" not in out.splitlines()[0]
    assert torch.get_num_threads() == 2  # this process's threads, as the fixture set them


def test_a_stage_that_fails_in_a_lane_names_itself_and_writes_no_results(tiny_bases, tmp_path, monkeypatch, capsys):
    "A RepNoise layer the tiny model lacks fails RepNoise in its lane: the error names the stage, the lane, the cause."
    from dataclasses import replace
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    args = DemoArguments(namespace="tiny", repnoise_steps=2, repnoise_attack_steps=2, emr_steps=2,
                         stages=["repnoise", "emr"], precision="fp32")
    with pytest.raises(RuntimeError) as failed: run_demo(args, replace(tiny_bases, repnoise_layers=(0, 99)))
    said = str(failed.value)
    # the other lane is stopped at once: before its first stage or during it (a race the test cannot fix), never after
    assert said.split("\n")[0] in ("adaptkit demo: stage repnoise failed in lane 1 (repnoise); "
                                   "lane 2 (emr) stopped after none of its stages",
                                   "adaptkit demo: stage repnoise failed in lane 1 (repnoise); "
                                   "lane 2 (emr) stopped during emr"), said[:300]
    assert "Traceback" in said and "ValueError: layers [99] out of range for a model with 2 decoder layers" in said
    out = capsys.readouterr().out
    assert "; lanes: repnoise | emr" in out.splitlines()[0]
    assert "adaptkit demo: repnoise failed in lane 1 (ValueError: layers [99] out of range" in out  # said at once
    assert "`chat` from the pulled EMR bundle" not in out and "emr failed" not in said  # its last step never ran
    assert not (tmp_path / "cache" / "demo" / "results.json").exists()  # no partial results


def test_an_unknown_stage_is_refused_before_the_hub_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="--stages pisa: use one or more of pissa, aligner, repnoise, translora, emr"):
        run_demo(DemoArguments(stages=["pissa", "pisa"]), DemoModels())
    with pytest.raises(ValueError, match="--lanes 0: use 1"): run_demo(DemoArguments(lanes=0), DemoModels())
    assert not (tmp_path / "cache").exists()
