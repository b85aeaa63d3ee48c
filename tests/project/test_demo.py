"""`make demo`'s steps (adaptkit.demo.run_demo) at tiny scale: tiny random models stand in for SmolLM2, Gemma and
MiniLM, every step trains a few steps, and every artifact goes through the embedded LocalHub and back."""
import json
import math
import time

import pytest
import torch
from huggingface_hub import HfApi

from adaptkit.demo import EMR_TASKS, DemoArguments, DemoModels, run_demo
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


def test_the_demo_runs_every_step_through_the_hub(tiny_bases, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ADAPTKIT_CACHE", str(tmp_path / "cache"))
    args = DemoArguments(namespace="tiny", pissa_steps=2, aligner_steps=2, repnoise_steps=2, translora_synthetic=8,
                         translora_steps=2, emr_steps=2, n_test=8)
    start = time.perf_counter()
    assert run_demo(args, tiny_bases) == 0
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "cache" / "demo" / "results.json").read_text())
    rows = results["rows"]
    assert [r["step"] for r in rows] == (["base"] * 3 + ["pissa"] * 2 + ["aligner"] * 2 + ["repnoise"] * 2
                                         + ["translora"] * 4 + ["emr"] * 2 * len(EMR_TASKS))
    assert [r["what"] for r in rows[:3]] == ["SmolLM2-135M-Instruct", "Gemma-3-270M", "all-MiniLM-L6-v2"]
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
    assert len(scored) == 2 + 2 + 3 + 2 * len(EMR_TASKS)  # Trans-LoRA: the source, the target alone, the transfer
    for what in [w for w in scored if not w.startswith(("task model", "`"))]:  # the arithmetic rows: 8 held-out sums
        assert scored[what] * 8 == round(scored[what] * 8), (what, scored[what])
    losses = [r[k] for r in rows if r["step"] == "repnoise" for k in ("harmful_loss", "benign_loss")]
    assert len(losses) == 4 and all(math.isfinite(x) and x > 0 for x in losses)
    assert "kept 8 of 8 prompts" in out and "threshold 0.000" in out  # the stand-in threshold was used
    for repo_id, commit in pushed.items(): assert f"{repo_id}@{commit[:8]}" in out  # the final table names every commit
    assert out.rstrip().endswith(f"results: {tmp_path / 'cache' / 'demo' / 'results.json'}")
    print(f"tiny demo: {seconds:.0f} s")


def test_the_default_models_are_the_real_ones():
    "`make demo` (no DemoModels) starts from SmolLM2, Gemma and MiniLM with its own settings."
    assert DemoModels() == DemoModels(None, None, None, (14, 29), None, 96)
