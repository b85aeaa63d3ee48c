"""RepNoise across modules: each loss term against a direct computation, hooks that do not leak, PEFT-wrapped and
other model families, bf16, the attack harness, the card and a push/pull through a LocalHub, and bad rows refused
before any model is loaded."""
import math
import re

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub import HfApi

from adaptkit.data import DataError
from adaptkit.hub import push_folder, read_metadata
from adaptkit.localhub import LocalHub
from adaptkit.models import load_causal_lm, load_tokenizer, tiny_causal_lm
from adaptkit.repnoise import (RefusalClassifier, RepNoiseCollator, RepNoiseConfig, RepNoiseTrainer, decoder_layers,
                               defence_settings, disjoint_splits, harmful_finetune_attack, immunisation_report, pair_rows,
                               repnoise_dataset, repnoise_loss, save_repnoise)

torch.set_num_threads(2)
ROWS = [{"prompt": f"how do I do task {i}", "harmful": f"here is how to do it {i}", "harmless": "sorry I cannot help"}
        for i in range(8)]


def _batch(tok, rows=ROWS[:4]):
    ds = repnoise_dataset(rows, tok, max_length=64)
    return RepNoiseCollator(tok.pad_token_id)([ds[i] for i in range(len(ds))])


def _hooks(model):
    return sum(len(m._forward_hooks) for m in model.modules())


def _args(tmp_path, **kw):
    kw = {"max_steps": 2, "per_device_train_batch_size": 4, "learning_rate": 1e-2, "warmup_steps": 0, "logging_steps": 1,
          "save_strategy": "no", "use_cpu": True, "disable_tqdm": True, "max_length": 64, **kw}
    return RepNoiseConfig(str(tmp_path / "run"), **kw)


def _mmd_direct(x, y, kernels=5, mult=2.0):
    "Squared multi-kernel MMD, written out pair by pair in float64."
    z = torch.cat([x, y]).double()
    n, m = len(z), len(x)
    d = torch.tensor([[((z[i] - z[j]) ** 2).sum().item() for j in range(n)] for i in range(n)], dtype=torch.float64)
    bw = (d.sum() - d.diag().sum()) / (n * n - n) / mult ** (kernels // 2)
    k = sum(torch.exp(-d / (bw * mult ** q)) for q in range(kernels))
    return (k[:m, :m].mean() + k[m:, m:].mean() - 2 * k[:m, m:].mean()).item()


def test_each_loss_term_against_a_direct_computation(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3).eval(), _batch(tiny_tok)
    alpha, beta = 0.7, 0.5
    torch.manual_seed(123)
    parts = repnoise_loss(model, batch, alpha=alpha, beta=beta)
    assert _hooks(model) == 0
    mlp_out = {}
    handles = [b.mlp.register_forward_hook(lambda mod, a, out, i=i: mlp_out.__setitem__(i, out)) for i, b in enumerate(model.model.layers)]
    with torch.no_grad():
        good = model(input_ids=batch["harmless_input_ids"], attention_mask=batch["harmless_attention_mask"])
        bad = model(input_ids=batch["harmful_input_ids"], attention_mask=batch["harmful_attention_mask"], output_hidden_states=True)
    for h in handles: h.remove()
    # harmless: next-token CE on the harmless answer tokens only
    lab = batch["harmless_labels"][:, 1:]
    harmless = F.cross_entropy(good.logits[:, :-1][lab != -100].double(), lab[lab != -100])
    # harmful: every layer's residual stream through the final norm and LM head (the last layer's is the model's logits)
    lab = batch["harmful_labels"][:, 1:]
    keep = lab != -100
    ces = [F.cross_entropy(model.lm_head(model.model.norm(h[:, :-1][keep])).double(), lab[keep]) for h in bad.hidden_states[1:-1]]
    ces.append(F.cross_entropy(bad.logits[:, :-1][keep].double(), lab[keep]))
    harmful = torch.stack(ces).mean()
    # noise: the same Gaussian draws (one per layer, in order) against the masked MLP outputs
    torch.manual_seed(123)
    mask = (batch["harmful_labels"] != -100).unsqueeze(-1).float()
    noise = sum(_mmd_direct((mlp_out[i] * mask).flatten(1), (torch.randn(mlp_out[i].shape) * mask).flatten(1)) for i in range(3)) / 3
    assert math.isclose(parts["harmless_ce"].item(), harmless.item(), rel_tol=1e-5)
    assert math.isclose(parts["harmful_ce"].item(), harmful.item(), rel_tol=1e-5)
    assert math.isclose(parts["noise_mmd"].item(), noise, rel_tol=1e-4)
    total = harmless.item() + beta * noise - alpha * math.log1p(harmful.item())
    assert math.isclose(parts["loss"].item(), total, rel_tol=1e-4)


def test_layer_selection_and_bf16_are_finite_float32(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3).to(torch.bfloat16), _batch(tiny_tok)
    parts = repnoise_loss(model, batch, layers=[-1, 0])
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in parts.values())
    parts["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_hooks_do_not_leak_over_training(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    trainer = RepNoiseTrainer(model, _args(tmp_path, max_steps=6, gradient_accumulation_steps=2, per_device_train_batch_size=2),
                              ROWS, processing_class=tiny_tok)
    assert RepNoiseTrainer.loss_is_scaled_for_ga is False
    seen = []
    orig = trainer.compute_loss
    def spy(*a, **k):
        out = orig(*a, **k); seen.append(_hooks(model)); return out
    trainer.compute_loss = spy
    trainer.train()
    assert len(seen) == 12 and set(seen) == {0} and _hooks(model) == 0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 6 and all(math.isfinite(h["repnoise/noise_mmd"]) for h in logs)


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "gemma"])
def test_other_families(tiny_tok, model_type):
    model = tiny_causal_lm(tiny_tok, model_type=model_type)
    parts = repnoise_loss(model, _batch(tiny_tok))
    parts["loss"].backward()
    assert len(decoder_layers(model)) == 2 and torch.isfinite(parts["loss"]) and _hooks(model) == 0


def test_peft_wrapped_model_trains_its_adapter_only(tiny_tok, tmp_path):
    from peft import LoraConfig
    model = tiny_causal_lm(tiny_tok)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = RepNoiseTrainer(model, _args(tmp_path), ROWS, processing_class=tiny_tok,
                              peft_config=LoraConfig(r=4, target_modules="all-linear", init_lora_weights="gaussian"))
    assert len(decoder_layers(trainer.model)) == 2
    lora = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" in k}
    trainer.train()
    after = trainer.model.state_dict()
    assert any(not torch.equal(v, after[k]) for k, v in lora.items())
    unwrapped = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in after.items() if "lora_" not in k}
    assert all(torch.equal(base[k], unwrapped[k]) for k in base)
    assert _hooks(trainer.model) == 0
    assert any("repnoise/harmful_ce" in h for h in trainer.state.log_history)


def test_harness_attack_and_report(tiny_tok):
    rows = [{"prompt": f"question number {i}", "harmful": f"answer {i} {i}", "completion": f"fine {i}"} for i in range(16)]
    sp = disjoint_splits(rows, {"attack": 6, "eval": 4, "benign": 3, "benign_train": 3}, seed=0)
    base = tiny_causal_lm(tiny_tok)
    snapshot = [p.clone() for p in base.parameters()]
    clf = RefusalClassifier().fit(["sorry I cannot help", "I can't do that", "sure here it is", "the answer is"], [1, 1, 0, 0])
    rep = immunisation_report({"undefended": base, "other": tiny_causal_lm(tiny_tok, seed=1)}, tiny_tok,
                              attack_rows=sp["attack"], eval_rows=sp["eval"], benign_rows=sp["benign"],
                              benign_train_rows=sp["benign_train"], classifier=clf, lrs=[1e-3, 1e-2], seeds=[0, 1], steps=2,
                              trainability_steps=2, trainability_lr=1e-2, max_new_tokens=3)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, base.parameters()))  # attacks ran on copies
    assert len(rep["runs"]) == 8 and set(rep["after"]) == {"undefended", "other"} and set(rep["after"]["other"]) == {"0.001", "0.01"}
    t = rep["trainability"]["undefended"]
    assert t["benign_loss_after"] < t["benign_loss_before"]
    strong = harmful_finetune_attack(base, sp["attack"], lr=1e-2, steps=8, seed=3, tokenizer=tiny_tok)
    from adaptkit.repnoise import answer_metrics
    assert answer_metrics(strong, tiny_tok, sp["attack"], "harmful")["loss"] < answer_metrics(base, tiny_tok, sp["attack"], "harmful")["loss"]


def test_pyrit_refusal_labels_when_installed():
    pytest.importorskip("pyrit", reason="pyrit (an asset package) not installed")  # find_spec only; never imported for real
    from adaptkit.repnoise import pyrit_refusal_labels
    labels = pyrit_refusal_labels()
    assert len(labels) > 100 and {y for _, y in labels} == {0, 1}


def test_card_push_pull(tiny_tok, tiny_model_dir, tmp_path):
    with LocalHub(tmp_path / "hub") as hub:
        push_folder(tiny_model_dir, "team/base", endpoint=hub.endpoint)
        trainer = RepNoiseTrainer("team/base", _args(tmp_path), ROWS, processing_class=load_tokenizer(tiny_model_dir),
                                  hub_endpoint=hub.endpoint)
        assert trainer.base_model == "team/base"
        trainer.train()
        report = {"settings": {"steps": 2, "attack_rows": 6, "lrs": [1e-3], "seeds": [0]},
                  "after": {"repnoise": {"0.001": {"harmfulness": {"mean": 0.25}, "harmful_loss": {"mean": 3.5}}}},
                  "before": {"repnoise": {"benign_loss": 2.0}}}
        out = save_repnoise(trainer.model, trainer.processing_class, tmp_path / "defended", name="tiny-repnoise",
                            settings=defence_settings(trainer.args, len(trainer.rows)), base_model="team/base", report=report)
        commit = push_folder(out, "team/tiny-repnoise", endpoint=hub.endpoint)
        data = HfApi(endpoint=hub.endpoint).model_info("team/tiny-repnoise").card_data
        assert data.base_model == "team/base" and {"adaptkit", "repnoise", "arxiv:2405.14577"} <= set(data.tags)
        values = {r.metric_name: r.metric_value for r in data.eval_results}
        assert values["repnoise: harmfulness after attack, lr=0.001"] == 0.25 and values["repnoise: benign loss before attack"] == 2.0
        pulled = load_causal_lm("team/tiny-repnoise", endpoint=hub.endpoint, revision=commit)
    assert all(torch.equal(a, b) for a, b in zip(pulled.state_dict().values(), trainer.model.state_dict().values()))
    meta = read_metadata(out)["repnoise"]
    assert meta["settings"]["beta"] == 0.001 and meta["report"]["after"]["repnoise"]["0.001"]["harmfulness"]["mean"] == 0.25


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "p", "harmful": "", "harmless": "no"}, "row 1, column 'harmful': empty text"),
    ({"prompt": "p", "harmful": "bad"}, "row 1, column 'harmless': missing value (null)"),
    ({"prompt": "p", "harmful": "same", "harmless": "same"}, "row 1: columns 'harmful' and 'harmless' are identical"),
    ({"prompt": " ", "harmful": "bad", "harmless": "no"}, "row 1, column 'prompt': empty text"),
])
def test_bad_rows_are_refused_before_the_model_loads(tiny_tok, tmp_path, bad, message):
    with pytest.raises(DataError, match=re.escape(message)):  # the model path does not exist: rows are checked first
        RepNoiseTrainer(str(tmp_path / "no-such-model"), _args(tmp_path), [ROWS[0], bad], processing_class=tiny_tok)


def test_mismatched_prompts_and_harmful_text_kept_out_of_errors():
    secret = "SECRET-HARMFUL-TEXT"
    with pytest.raises(DataError, match=r"row 1: the harmful and harmless rows have different prompts") as e:
        pair_rows([{"prompt": "a", "completion": "x"}, {"prompt": secret, "completion": secret}],
                  [{"prompt": "a", "completion": "no"}, {"prompt": "b", "completion": "no"}])
    assert secret not in str(e.value)
    with pytest.raises(DataError, match="2 harmful rows but 1 harmless rows"):
        pair_rows([{"prompt": "a", "completion": "x"}] * 2, [{"prompt": "a", "completion": "no"}])
