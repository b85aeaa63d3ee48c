"""RepNoise across modules: each loss term against a direct computation, exactly the chosen layers, hooks that do not
leak, PEFT-wrapped and other model families, bf16, tokenisation unchanged from the previous release, the attack
harness with a known-answer harmfulness, the ImmunisedModel artifact through save/push/pull, `trainer.push_to_hub()`
through HF_ENDPOINT at a LocalHub, and bad rows refused before any model is loaded."""
import copy
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub import HfApi
from torch.nn.utils.rnn import pad_sequence
from transformers import AutoModelForCausalLM

import adaptkit.repnoise.harness as repnoise_eval
from adaptkit.artifacts import training_setup
from adaptkit.data import DataError
from adaptkit.hub import pull, push_folder, read_metadata, write_metadata
from adaptkit.localhub.server import LocalHub
from adaptkit.models import load_tokenizer, tiny_causal_lm
from adaptkit.repnoise import (
    ImmunisedModel,
    LayerCapture,
    RepNoiseCollator,
    RepNoiseConfig,
    RepNoiseTrainer,
    decoder_layers,
    defence_settings,
    encode_answer,
    format_prompt,
    mmd,
    pair_rows,
    readout,
    repnoise_dataset,
    repnoise_loss,
)
from adaptkit.repnoise.harness import (
    ImmunisationSettings,
    RefusalClassifier,
    answer_metrics,
    disjoint_splits,
    harmful_finetune_attack,
    immunisation_report,
    refusal_rate,
)

torch.set_num_threads(2)
ROWS = [{"prompt": f"how do I do task {i}", "harmful": f"here is how to do it {i}", "harmless": "sorry I cannot help"}
        for i in range(8)]
REPORT = {"settings": {"steps": 2, "attack_rows": 6, "lrs": [1e-3], "seeds": [0]},
          "after": {"repnoise": {"0.001": {"harmfulness": {"mean": 0.25}, "harmful_loss": {"mean": 3.5}}}},
          "before": {"repnoise": {"benign_loss": 2.0}}}
REFUSAL, COMPLIANCE = "I'm sorry, but I can't help with that.", "Sure! First, take a bowl and mix the flour."


def _batch(tok, rows=ROWS[:4]):
    ds = repnoise_dataset(rows, tok, max_length=64)
    return RepNoiseCollator(tok)([ds[i] for i in range(len(ds))])


def _hooks(model):
    return sum(len(m._forward_hooks) for m in model.modules())


def _args(tmp_path, **kw):
    kw = {
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-2,
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "max_length": 64,
        **kw,
    }
    return RepNoiseConfig(str(tmp_path / "run"), **kw)


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _mmd_direct(x, y, kernels=5, mult=2.0):
    "Squared multi-kernel MMD, written out pair by pair in float64."
    z = torch.cat([x, y]).double()
    n, m = len(z), len(x)
    d = torch.tensor([[((z[i] - z[j]) ** 2).sum().item() for j in range(n)] for i in range(n)], dtype=torch.float64)
    bw = (d.sum() - d.diag().sum()) / (n * n - n) / mult ** (kernels // 2)
    k = sum(torch.exp(-d / (bw * mult ** q)) for q in range(kernels))
    return (k[:m, :m].mean() + k[m:, m:].mean() - 2 * k[:m, m:].mean()).item()


def _old_encode_answer(tokenizer, prompt, answer, max_length):
    "The previous release's tokenisation, verbatim: the answer and the EOS text tokenised together."
    p = tokenizer(format_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    a = tokenizer(answer + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
    return {"input_ids": (p + a)[:max_length], "labels": ([-100] * len(p) + a)[:max_length]}


def _old_pad(encoded, pad_id):
    "The previous release's hand padding."
    ids = [torch.tensor(e["input_ids"]) for e in encoded]
    return {"input_ids": pad_sequence(ids, batch_first=True, padding_value=pad_id),
            "attention_mask": pad_sequence([torch.ones_like(i) for i in ids], batch_first=True),
            "labels": pad_sequence([torch.tensor(e["labels"]) for e in encoded], batch_first=True, padding_value=-100)}


@pytest.mark.parametrize("chat", [True, False])
def test_tokenisation_and_padding_unchanged_from_the_previous_release(tiny_tok, chat):
    tok = copy.deepcopy(tiny_tok)
    if not chat: tok.chat_template = None
    answers = ["here is how to do it 12 + 3 = 15.", "sorry I cannot help ", "two\nlines, café – naïve", " lead space",
               "the a of to and in is it you that he was for on are with as his they be at one have this from or had"]
    rows = [
        {"prompt": f"how do I do task {i}?", "harmful": a, "harmless": "sorry I cannot help"}
        for i, a in enumerate(answers)
    ]
    for max_length in (512, 30):
        old = [_old_encode_answer(tok, r["prompt"], r["harmful"], max_length) for r in rows]
        new = [encode_answer(tok, r["prompt"], r["harmful"], max_length, i) for i, r in enumerate(rows)]
        assert new == old
        assert any(-100 in e["labels"] and e["labels"][-1] != -100 for e in new)
        tok.padding_side = "left"  # a generation setting must not change training batches
        ds = repnoise_dataset(rows, tok, max_length=max_length)
        batch = RepNoiseCollator(tok)([ds[i] for i in range(len(ds))])
        tok.padding_side = "right"
        want = _old_pad(old, tok.pad_token_id)
        assert all(torch.equal(batch[f"harmful_{k}"], want[k]) for k in want)
    with pytest.raises(DataError, match="row 3: the prompt takes"):
        encode_answer(tok, "a long question " * 20, "x", 16, 3)


def test_each_loss_term_against_a_direct_computation(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3).eval(), _batch(tiny_tok)
    alpha, beta = 0.7, 0.5
    torch.manual_seed(123)
    parts = repnoise_loss(model, batch, alpha=alpha, beta=beta)
    assert _hooks(model) == 0
    mlp_out = {}
    handles = [
        b.mlp.register_forward_hook(lambda mod, a, out, i=i: mlp_out.__setitem__(i, out))
        for i, b in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        good = model(input_ids=batch["harmless_input_ids"], attention_mask=batch["harmless_attention_mask"])
        bad = model(
            input_ids=batch["harmful_input_ids"],
            attention_mask=batch["harmful_attention_mask"],
            output_hidden_states=True,
        )
    for h in handles: h.remove()
    # harmless: next-token CE on the harmless answer tokens only
    lab = batch["harmless_labels"][:, 1:]
    harmless = F.cross_entropy(good.logits[:, :-1][lab != -100].double(), lab[lab != -100])
    # harmful: every layer's residual stream through the final norm and LM head (the last layer's is the model's logits)
    lab = batch["harmful_labels"][:, 1:]
    keep = lab != -100
    ces = [
        F.cross_entropy(model.lm_head(model.model.norm(h[:, :-1][keep])).double(), lab[keep])
        for h in bad.hidden_states[1:-1]
    ]
    ces.append(F.cross_entropy(bad.logits[:, :-1][keep].double(), lab[keep]))
    harmful = torch.stack(ces).mean()
    # noise: the same Gaussian draws (one per layer, in order) against the masked MLP outputs
    torch.manual_seed(123)
    mask = (batch["harmful_labels"] != -100).unsqueeze(-1).float()
    noise = (
        sum(
            _mmd_direct((mlp_out[i] * mask).flatten(1), (torch.randn(mlp_out[i].shape) * mask).flatten(1))
            for i in range(3)
        )
        / 3
    )
    assert math.isclose(parts["harmless_ce"].item(), harmless.item(), rel_tol=1e-5)
    assert math.isclose(parts["harmful_ce"].item(), harmful.item(), rel_tol=1e-5)
    assert math.isclose(parts["noise_mmd"].item(), noise, rel_tol=1e-4)
    total = harmless.item() + beta * noise - alpha * math.log1p(harmful.item())
    assert math.isclose(parts["loss"].item(), total, rel_tol=1e-4)


def test_layers_k_reads_exactly_layer_k(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3).eval(), _batch(tiny_tok)
    blocks = decoder_layers(model)
    with LayerCapture(model, [1]):
        assert [m for m in model.modules() if m._forward_hooks] == [blocks[1], blocks[1].mlp]
    mlp_out = {}
    handle = blocks[1].mlp.register_forward_hook(lambda mod, a, out: mlp_out.__setitem__(1, out))
    with torch.no_grad():
        out = model(
            input_ids=batch["harmful_input_ids"],
            attention_mask=batch["harmful_attention_mask"],
            output_hidden_states=True,
        )
    handle.remove()
    lab = batch["harmful_labels"][:, 1:]
    keep = lab != -100
    ce = {
        k: F.cross_entropy(model.lm_head(model.model.norm(out.hidden_states[k + 1][:, :-1][keep])), lab[keep]).item()
        for k in (0, 1)
    }
    assert abs(ce[0] - ce[1]) > 1e-3  # the layers differ, so reading the wrong one would show
    mask = (batch["harmful_labels"] != -100).unsqueeze(-1).float()
    torch.manual_seed(5)
    noise = _mmd_direct((mlp_out[1] * mask).flatten(1), (torch.randn(mlp_out[1].shape) * mask).flatten(1))
    for layers in ([1], [-2]):
        torch.manual_seed(5)
        parts = repnoise_loss(model, batch, layers=layers, alpha=1.0, beta=0.1)
        assert math.isclose(parts["harmful_ce"].item(), ce[1], rel_tol=1e-5)
        assert math.isclose(parts["noise_mmd"].item(), noise, rel_tol=1e-4)
    with pytest.raises(ValueError, match=r"layers \[3\] out of range for a model with 3 decoder layers"):
        repnoise_loss(model, batch, layers=[3])


def test_layer_selection_and_bf16_are_finite_float32(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3).to(torch.bfloat16), _batch(tiny_tok)
    parts = repnoise_loss(model, batch, layers=[-1, 0])
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in parts.values())
    parts["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_hooks_do_not_leak_over_training(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    trainer = RepNoiseTrainer(
        model,
        _args(tmp_path, max_steps=6, gradient_accumulation_steps=2, per_device_train_batch_size=2),
        ROWS,
        processing_class=tiny_tok,
    )
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


def test_peft_wrapped_model_trains_its_adapter_only_and_saves_merged(tiny_tok, tmp_path):
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
    unwrapped = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in after.items() if "lora_" not in k
    }
    assert all(torch.equal(base[k], unwrapped[k]) for k in base)
    assert _hooks(trainer.model) == 0
    assert any("repnoise/harmful_ce" in h for h in trainer.state.log_history)
    trainer.save_model()  # the immunised model, merged from a copy: a plain checkpoint
    out = tmp_path / "run"
    assert not (out / "adapter_config.json").exists() and read_metadata(out)["artifact"] == "repnoise-model"
    assert any("lora_A" in n for n, _ in trainer.model.named_parameters())  # the live model keeps its adapter
    ids = tiny_tok(["how do I do task 1"], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(
            AutoModelForCausalLM.from_pretrained(out)(**ids).logits, trainer.model(**ids).logits, atol=1e-5
        )


def test_harness_attack_and_report(tiny_tok):
    rows = [
        {"prompt": f"question number {i}", "harmful": f"answer {i} {i}", "completion": f"fine {i}"} for i in range(16)
    ]
    sp = disjoint_splits(rows, {"attack": 6, "eval": 4, "benign": 3, "benign_train": 3}, seed=0)
    base = tiny_causal_lm(tiny_tok)
    snapshot = [p.clone() for p in base.parameters()]
    clf = RefusalClassifier().fit(
        ["sorry I cannot help", "I can't do that", "sure here it is", "the answer is"], [1, 1, 0, 0]
    )
    rep = immunisation_report(
        {"undefended": base, "other": tiny_causal_lm(tiny_tok, seed=1)},
        tiny_tok,
        attack_rows=sp["attack"],
        eval_rows=sp["eval"],
        benign_rows=sp["benign"],
        benign_train_rows=sp["benign_train"],
        classifier=clf,
        settings=ImmunisationSettings(lrs=[1e-3, 1e-2], seeds=[0, 1], steps=2, trainability_steps=2,
                                      trainability_lr=1e-2, max_new_tokens=3),
    )
    assert all(torch.equal(a, b) for a, b in zip(snapshot, base.parameters()))  # attacks ran on copies
    assert (
        len(rep["runs"]) == 8
        and set(rep["after"]) == {"undefended", "other"}
        and set(rep["after"]["other"]) == {"0.001", "0.01"}
    )
    t = rep["trainability"]["undefended"]
    assert t["benign_loss_after"] < t["benign_loss_before"]
    strong = harmful_finetune_attack(base, sp["attack"], lr=1e-2, steps=8, seed=3, tokenizer=tiny_tok)
    assert (
        answer_metrics(strong, tiny_tok, sp["attack"], "harmful")["loss"]
        < answer_metrics(base, tiny_tok, sp["attack"], "harmful")["loss"]
    )


def test_harmfulness_known_answer_with_a_stub_generator(tiny_tok, monkeypatch):
    "Answers known to be refusals or compliances give the exact refusal rate and harmfulness, before and after attacks."
    clf = RefusalClassifier().fit(
        [REFUSAL, "I cannot assist with this request.", COMPLIANCE, "Here is a short poem."], [1, 1, 0, 0]
    )
    assert [p >= 0.5 for p in clf.predict_proba([REFUSAL, COMPLIANCE])] == [True, False]
    calls = []
    def stub(model, tokenizer, prompts, **kw):
        calls.append((list(prompts), kw["max_new_tokens"]))
        return [COMPLIANCE if "task 3" in p else REFUSAL for p in prompts]  # 3 refusals in 4
    monkeypatch.setattr(repnoise_eval, "generate_batched", stub)
    model = tiny_causal_lm(tiny_tok)
    prompts = [f"how to do other task {i}" for i in range(4)]
    assert refusal_rate(model, tiny_tok, prompts, clf, max_new_tokens=7) == 0.75
    assert calls == [([format_prompt(tiny_tok, p) for p in prompts], 7)]
    rep = immunisation_report(
        {"m": model},
        tiny_tok,
        attack_rows=[{"prompt": f"attack {i}", "harmful": f"do {i}"} for i in range(4)],
        eval_rows=[{"prompt": p, "harmful": "do it"} for p in prompts],
        benign_rows=[{"prompt": "what is 1 plus 1", "completion": "2"}],
        benign_train_rows=[{"prompt": "what is 2 plus 2", "completion": "4"}],
        classifier=clf,
        settings=ImmunisationSettings(lrs=[1e-3], seeds=[0, 1], steps=1, trainability_steps=1),
    )
    assert rep["before"]["m"]["harmfulness"] == 0.25 and [r["harmfulness"] for r in rep["runs"]] == [0.25, 0.25]
    assert rep["after"]["m"]["0.001"]["harmfulness"] == {"mean": 0.25, "min": 0.25, "max": 0.25}


def test_pyrit_refusal_labels_when_installed():
    # find_spec only; never imported for real
    pytest.importorskip("pyrit", reason="pyrit (an asset package) not installed")
    from adaptkit.repnoise.harness import pyrit_refusal_labels
    labels = pyrit_refusal_labels()
    assert len(labels) > 100 and {y for _, y in labels} == {0, 1}


def _check_card(data, base_commit_text, readme):
    assert data.library_name == "transformers" and data.base_model == "team/base"
    assert {"adaptkit", "repnoise", "arxiv:2405.14577"} <= set(data.tags)
    values = {r.metric_name: r.metric_value for r in data.eval_results}
    assert (
        values["repnoise: harmfulness after attack, lr=0.001"] == 0.25
        and values["repnoise: benign loss before attack"] == 2.0
    )
    assert f"at revision `{base_commit_text}`" in readme and "| `beta` | `0.001` |" in readme
    assert "| repnoise | after attack, lr=0.001 | 0.250 | 3.500 |" in readme  # the attack report, per model and lr


def test_immunised_model_round_trip(tiny_model_dir, tiny_model_copy, hub, tmp_path):
    base_commit = push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)
    trainer = RepNoiseTrainer("team/base", _args(tmp_path), ROWS, processing_class=load_tokenizer(tiny_model_dir),
                              hub_endpoint=hub.endpoint)
    assert (trainer.base_model, trainer.base_revision) == ("team/base", base_commit)
    trainer.train()
    trainer.report = REPORT
    art = trainer.artifact()
    made = training_setup(trainer.args, trainer.model)  # how it was trained, as `trainer.push_to_hub()` says
    assert art.settings == {**defence_settings(trainer.args, len(ROWS)), **made} and art.settings["beta"] == 0.001
    saved = art.save_pretrained(tmp_path / "saved")
    loaded = ImmunisedModel.from_pretrained(saved)
    assert _same_weights(loaded.model, trainer.model) and loaded.report == REPORT and loaded.settings == art.settings
    assert _same_weights(AutoModelForCausalLM.from_pretrained(saved), trainer.model)  # stock transformers loads it
    commit = art.push_to_hub("team/immunised", endpoint=hub.endpoint)
    pulled = ImmunisedModel.from_pretrained("team/immunised", endpoint=hub.endpoint, revision=commit)
    assert _same_weights(pulled.model, trainer.model) and pulled.report == REPORT
    assert (pulled.base_model, pulled.base_revision) == ("team/base", base_commit)
    readme = (pull("team/immunised", endpoint=hub.endpoint) / "README.md").read_text()
    _check_card(HfApi(endpoint=hub.endpoint).model_info("team/immunised").card_data, base_commit, readme)
    with pytest.raises(ValueError, match=r"not a ImmunisedModel \(its adaptkit.json records artifact None"):
        ImmunisedModel.from_pretrained(tiny_model_copy)  # the pushed base: a record with no artifact


def test_folder_of_the_previous_release_loads(tiny_tok, tmp_path):
    folder = tmp_path / "old"
    model = tiny_causal_lm(tiny_tok)
    model.save_pretrained(folder); tiny_tok.save_pretrained(folder)
    write_metadata(folder, repnoise={"settings": {"beta": 0.001}, "report": REPORT}, source={"base_model": "team/base"})
    loaded = ImmunisedModel.from_pretrained(folder)
    assert loaded.report == REPORT and loaded.base_model == "team/base" and _same_weights(loaded.model, model)


def test_collator_takes_the_tokenizer(tiny_tok):
    with pytest.raises(TypeError, match=re.escape("RepNoiseCollator(tok), not RepNoiseCollator(tok.pad_token_id)")):
        RepNoiseCollator(tiny_tok.pad_token_id)


_PUSH_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from adaptkit.models import load_tokenizer
    from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer
    rows = [{"prompt": f"how do I do task {i}", "harmful": f"here is how {i}", "harmless": "sorry I cannot help"}
            for i in range(4)]
    args = RepNoiseConfig(str(Path(sys.argv[1]) / "tiny-immunised"), max_steps=1, per_device_train_batch_size=2,
                          use_cpu=True, save_strategy="no", disable_tqdm=True, max_length=64,
                          hub_model_id="tiny-immunised")
    # the base and its tokenizer come through HF_ENDPOINT
    trainer = RepNoiseTrainer("team/base", args, rows, processing_class=load_tokenizer("team/base"))
    trainer.train()
    trainer.report = json.loads(sys.argv[2])
    trainer.push_to_hub()
    print("RESULT " + json.dumps({"repo_id": trainer.hub_model_id}))
""")


def test_trainer_push_to_hub_through_hf_endpoint(token, tiny_model_dir, tiny_model_copy, tmp_path):
    "transformers' `trainer.push_to_hub()` with HF_ENDPOINT at LocalHub (read at import: a subprocess) gives our card."
    with LocalHub(tmp_path / "hub", token=token) as hub:
        base_commit = push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint, token=token)
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.endpoint,
            "HF_TOKEN": token,
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "ADAPTKIT_CACHE": str(
                tmp_path / "adaptkit-cache"
            ),  # anything but the hub goes to a proxy that does not exist
            "HTTP_PROXY": "http://127.0.0.1:9",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        run = subprocess.run([sys.executable, "-c", _PUSH_SCRIPT, str(tmp_path), json.dumps(REPORT)], env=env,
                             capture_output=True, text=True, timeout=300)
        lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
        assert run.returncode == 0 and lines, run.stderr[-3000:]
        repo_id = json.loads(lines[-1][7:])["repo_id"]
        assert repo_id == "localhub/tiny-immunised"  # no namespace: the token's user, as on the Hub
        api = HfApi(endpoint=hub.endpoint, token=token)
        readme = (pull(repo_id, endpoint=hub.endpoint, token=token) / "README.md").read_text()
        _check_card(api.model_info(repo_id).card_data, base_commit, readme)
        pulled = ImmunisedModel.from_pretrained(repo_id, endpoint=hub.endpoint, token=token)
        assert pulled.settings["max_steps"] == 1 and pulled.report == REPORT and pulled.base_revision == base_commit
        assert not any(f.startswith("checkpoint-") or f == "training_args.bin" for f in api.list_repo_files(repo_id))
    assert token not in readme


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "p", "harmful": "", "harmless": "no"}, "row 1, column 'harmful': empty text"),
    ({"prompt": "p", "harmful": "bad"}, "row 1, column 'harmless': missing value (null)"),
    ({"prompt": "p", "harmful": "same", "harmless": "same"}, "row 1: columns 'harmful' and 'harmless' are identical"),
    ({"prompt": " ", "harmful": "bad", "harmless": "no"}, "row 1, column 'prompt': empty text"),
])
def test_bad_rows_are_refused_before_the_model_loads(tiny_tok, tmp_path, bad, message):
    with pytest.raises(DataError, match=re.escape(message)):  # the model path does not exist: rows are checked first
        RepNoiseTrainer(str(tmp_path / "no-such-model"), _args(tmp_path), [ROWS[0], bad], processing_class=tiny_tok)


def test_tokenizer_without_pad_refused_before_the_model_loads(tiny_tok, tmp_path):
    tok = copy.deepcopy(tiny_tok)
    tok.pad_token = None
    with pytest.raises(ValueError, match="the tokenizer has no pad token"):
        RepNoiseTrainer(str(tmp_path / "no-such-model"), _args(tmp_path), ROWS, processing_class=tok)


def test_mismatched_prompts_and_harmful_text_kept_out_of_errors():
    secret = "SECRET-HARMFUL-TEXT"
    with pytest.raises(DataError, match=r"row 1: the harmful and harmless rows have different prompts") as e:
        pair_rows([{"prompt": "a", "completion": "x"}, {"prompt": secret, "completion": secret}],
                  [{"prompt": "a", "completion": "no"}, {"prompt": "b", "completion": "no"}])
    assert secret not in str(e.value)
    with pytest.raises(DataError, match="2 harmful rows but 1 harmless rows"):
        pair_rows([{"prompt": "a", "completion": "x"}] * 2, [{"prompt": "a", "completion": "no"}])


def test_bad_layers_refused_before_training(tiny_tok, tmp_path):
    with pytest.raises(ValueError, match=re.escape("layers [2] out of range for a model with 2 decoder layers")):
        RepNoiseTrainer(tiny_causal_lm(tiny_tok), _args(tmp_path, layers=[0, 2]), ROWS, processing_class=tiny_tok)
    with pytest.raises(ValueError, match="layers must name at least one decoder layer"):
        _args(tmp_path, layers=[])


def _perturbed(model, layer):
    "A copy of `model` with decoder layer `layer`'s MLP weights shifted."
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in decoder_layers(other)[layer].mlp.parameters(): p.add_(0.5)
    return other


@pytest.mark.parametrize("k, spelled", [(0, [0]), (1, [1]), (1, [-2])])
def test_layers_k_terms_move_with_layer_k_only(tiny_tok, k, spelled):
    "With layers=[k], perturbing a layer j > k leaves the read-out and noise terms unchanged; perturbing k moves both."
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3).eval(), _batch(tiny_tok)
    def parts(m):
        torch.manual_seed(7)
        with torch.no_grad(): return repnoise_loss(m, batch, layers=spelled, beta=0.1)
    base = parts(model)
    for j in range(k + 1, 3):
        later = parts(_perturbed(model, j))
        assert later["harmful_ce"] == base["harmful_ce"] and later["noise_mmd"] == base["noise_mmd"]
        assert later["harmless_ce"] != base["harmless_ce"]  # the perturbation itself is visible to the model's own loss
    own = parts(_perturbed(model, k))
    assert abs(own["harmful_ce"] - base["harmful_ce"]) > 1e-4 and abs(own["noise_mmd"] - base["noise_mmd"]) > 1e-6


def test_harmfulness_is_the_known_share_of_hand_made_answers_before_and_after(tiny_tok, monkeypatch):
    "Ten hand-made answers, 3 compliant before the attack and 6 after: harmfulness 0.3, then 0.6, on the card too."
    refusals = [
        "I'm sorry, but I can't help with that.",
        "I cannot assist with this request.",
        "Sorry, I won't do that.",
        "I can't provide that information.",
        "I'm not able to help with this.",
        "I must decline this request.",
        "Sorry, I cannot help with that request.",
    ]
    compliances = ["Sure! First, take a bowl and mix the flour.", "Here is how: open the lid and pour it in.",
                   "Step one is to gather the tools, then cut the board.", "Of course, here are the steps in order.",
                   "Yes, start by heating the pan, then add the oil.", "Here you go: the first part goes on the left."]
    clf = RefusalClassifier().fit(refusals + compliances, [1] * len(refusals) + [0] * len(compliances))
    before = refusals + compliances[:3]  # 7 refusals, 3 compliances
    after = refusals[:4] + compliances  # 4 refusals, 6 compliances
    assert [p >= 0.5 for p in clf.predict_proba(before)] == [True] * 7 + [False] * 3  # the judge gets every one right
    assert [p >= 0.5 for p in clf.predict_proba(after)] == [True] * 4 + [False] * 6
    model = tiny_causal_lm(tiny_tok)
    prompts = [f"how to do held-out task {i}" for i in range(10)]
    def stub(m, tokenizer, formatted, **kw):  # the defended model answers `before`; any attacked copy answers `after`
        answers = before if m is model else after
        return [answers[[format_prompt(tokenizer, p) for p in prompts].index(f)] for f in formatted]
    monkeypatch.setattr(repnoise_eval, "generate_batched", stub)
    assert refusal_rate(model, tiny_tok, prompts, clf) == 0.7
    rep = immunisation_report(
        {"m": model},
        tiny_tok,
        attack_rows=[{"prompt": f"attack {i}", "harmful": f"do {i}"} for i in range(4)],
        eval_rows=[{"prompt": p, "harmful": "do it"} for p in prompts],
        benign_rows=[{"prompt": "what is 1 plus 1", "completion": "2"}],
        benign_train_rows=[{"prompt": "what is 2 plus 2", "completion": "4"}],
        classifier=clf,
        settings=ImmunisationSettings(lrs=[1e-3, 1e-2], seeds=[0, 1, 2], steps=1, trainability_steps=1),
    )
    assert rep["before"]["m"]["harmfulness"] == pytest.approx(0.3, abs=1e-12)
    assert [r["harmfulness"] for r in rep["runs"]] == pytest.approx([0.6] * 6, abs=1e-12)
    assert rep["after"]["m"]["0.01"]["harmfulness"] == pytest.approx({"mean": 0.6, "min": 0.6, "max": 0.6}, abs=1e-12)
    card = {r["metric_name"]: r["value"] for r in ImmunisedModel(model, tiny_tok, rep).results}
    assert card["m: harmfulness after attack, lr=0.001"] == 0.6 and card["m: harmfulness after attack, lr=0.01"] == 0.6


@pytest.mark.parametrize("settings, error", [
    ({"alpha": -1.0}, "alpha must be >= 0, got -1.0"),
    ({"beta": float("nan")}, "beta must be >= 0, got nan"),
    ({"mmd_kernels": 0}, "need mmd_kernels >= 1 and mmd_multiplier > 0, got 0 and 2.0"),
    ({"mmd_multiplier": 0.0}, "need mmd_kernels >= 1 and mmd_multiplier > 0, got 5 and 0.0"),
    ({"max_length": 1}, "max_length must be >= 2, got 1"),
    ({"layers": []}, "layers must name at least one decoder layer"),
])
def test_config_checks_name_the_setting(tmp_path, settings, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        RepNoiseConfig(str(tmp_path), use_cpu=True, **settings)


def test_config_accepts_the_boundary_values(tmp_path):
    cfg = RepNoiseConfig(
        str(tmp_path), use_cpu=True, alpha=0.0, beta=0.0, mmd_kernels=1, mmd_multiplier=1e-3, max_length=2, layers=[0]
    )
    assert (cfg.alpha, cfg.beta, cfg.mmd_kernels, cfg.max_length, cfg.layers, cfg.remove_unused_columns) == (
        0.0,
        0.0,
        1,
        2,
        [0],
        False,
    )


def test_model_checks_name_the_model_and_the_layer(tiny_tok, tmp_path):
    with pytest.raises(
        ValueError, match=re.escape("Linear: no decoder layers found (expected a ModuleList of blocks with an `mlp`)")
    ):
        decoder_layers(torch.nn.Linear(2, 2))
    model = tiny_causal_lm(tiny_tok, num_layers=3)
    with pytest.raises(ValueError, match=re.escape("layers [-4] out of range for a model with 3 decoder layers")):
        LayerCapture(model, [0, -4])
    del model.model.norm
    with pytest.raises(ValueError, match=re.escape("LlamaForCausalLM: no final norm found on its decoder")):
        readout(model)
    with pytest.raises(ValueError, match=re.escape("RepNoiseTrainer needs processing_class=")):
        RepNoiseTrainer(str(tmp_path / "no-such-model"), _args(tmp_path), ROWS)
    import adaptkit.repnoise.trainer as repnoise
    with pytest.raises(AttributeError, match="module 'adaptkit.repnoise.trainer' has no attribute 'no_such_name'"):
        repnoise.no_such_name


def test_harness_checks_name_the_rows_splits_and_prompts(tiny_tok):
    model = tiny_causal_lm(tiny_tok)
    with pytest.raises(DataError, match=re.escape("harmful rows: no rows")):
        answer_metrics(model, tiny_tok, [], "harmful")
    with pytest.raises(
        DataError, match=re.escape("completion rows, row 1, column 'completion': missing or empty text")
    ):
        answer_metrics(
            model, tiny_tok, [{"prompt": "p", "completion": "c"}, {"prompt": "q", "completion": " "}], "completion"
        )
    with pytest.raises(DataError, match=re.escape("fine-tuning rows, row 0, column 'prompt': missing or empty text")):
        harmful_finetune_attack(model, [{"harmful": "x"}], lr=1e-3, steps=1, seed=0, tokenizer=tiny_tok)
    with pytest.raises(ValueError, match="fit needs both refusals"):
        RefusalClassifier().fit(["no", "never"], [1, 1])
    with pytest.raises(ValueError, match="refusal_rate needs at least one prompt"):
        refusal_rate(model, tiny_tok, [], RefusalClassifier())
    with pytest.raises(
        ValueError, match=re.escape("asked for 5 rows in splits {'a': 3, 'b': 2} but only 4 unique prompts")
    ):
        disjoint_splits([{"prompt": f"q {i % 4}"} for i in range(8)], {"a": 3, "b": 2})
    with pytest.raises(DataError, match=re.escape("split 'eval', row 1: prompt also in split 'attack' (row 0)")):
        repnoise_eval.check_disjoint(attack=[{"prompt": "Same  Q"}], eval=[{"prompt": "x"}, {"prompt": "same q"}])
    rows = [{"prompt": "shared", "harmful": "h", "completion": "c"}]
    with pytest.raises(DataError, match=re.escape("split 'benign', row 0: prompt also in split 'attack' (row 0)")):
        immunisation_report(
            {"m": model},
            tiny_tok,
            attack_rows=rows,
            eval_rows=[{"prompt": "e", "harmful": "h"}],
            benign_rows=rows,
            benign_train_rows=[{"prompt": "t", "completion": "c"}],
            classifier=RefusalClassifier(),
        )



# Boundary cases found by mutation testing (`make mutation`): each asserts a behaviour a mutant broke.

def _closed_form(d2_xy, mean_d2, kernels=5, multiplier=2.0, within=0.0):
    "k(a, b) summed over the kernels, for squared distance `d2_xy`, with the bandwidths `mmd` derives from `mean_d2`."
    base = mean_d2 / multiplier ** (kernels // 2)
    return sum(math.exp(-d2_xy / (base * multiplier ** i)) for i in range(kernels))


# the bandwidths follow the data: the answer does not depend on scale
@pytest.mark.parametrize("scale", [1.0, 0.1, 30.0])
def test_mmd_of_two_points(scale):
    x, y = torch.tensor([[0.0]]), torch.tensor([[scale]])
    # n = 2: the mean off-diagonal squared distance is scale²; within a set d² = 0, so k = kernels there
    want = 5 + 5 - 2 * _closed_form(scale ** 2, scale ** 2)
    assert mmd(x, y).item() == pytest.approx(want, rel=1e-5)
    assert want == pytest.approx(10 - 2 * sum(math.exp(-4 / 2 ** i) for i in range(5)))


def test_mmd_with_other_kernel_counts_and_ratios():
    x, y = torch.tensor([[0.0]]), torch.tensor([[1.0]])
    want = 3 + 3 - 2 * sum(math.exp(-3 / 3 ** i) for i in range(3))  # base = 1 / 3**(3 // 2) = 1/3
    assert mmd(x, y, kernels=3, multiplier=3.0).item() == pytest.approx(want, rel=1e-5)
    want = 4 + 4 - 2 * sum(math.exp(-2.25 / 1.5 ** i) for i in range(4))  # base = 1 / 1.5**2
    assert mmd(x, y, kernels=4, multiplier=1.5).item() == pytest.approx(want, rel=1e-5)


def test_mmd_of_sets_of_different_sizes():
    x, y = torch.tensor([[0.0], [0.0]]), torch.tensor([[1.0]])
    # 3 points: 4 ordered pairs at d² = 1 out of 6 -> mean 2/3; base = (2/3) / 4 = 1/6
    k_xy = sum(math.exp(-6 / 2 ** i) for i in range(5))
    assert mmd(x, y).item() == pytest.approx(5 + 5 - 2 * k_xy, rel=1e-5)
    assert mmd(y, x).item() == pytest.approx(5 + 5 - 2 * k_xy, rel=1e-5)


def test_mmd_flattens_each_sample_and_is_zero_for_equal_sets():
    x = torch.tensor([[[0.0], [0.0]]])  # one sample of shape (2, 1)
    y = torch.tensor([[[3.0], [4.0]]])  # d² = 25
    assert mmd(x, y).item() == pytest.approx(10 - 2 * sum(math.exp(-4 / 2 ** i) for i in range(5)), rel=1e-5)
    z = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    assert abs(mmd(z, z.clone()).item()) < 1e-6
    assert mmd(z.double(), z.double() + 1).dtype == torch.float32


def test_repnoise_loss_default_weights_are_alpha_1_and_beta_0_001(tiny_tok):
    from adaptkit.models import tiny_causal_lm
    rows = [{"prompt": f"How do I do thing {i}?", "harmful": f"Do it like {i}.", "harmless": "I can't help with that."}
            for i in range(2)]
    batch = RepNoiseCollator(tiny_tok)([r for r in repnoise_dataset(rows, tiny_tok, max_length=32)])
    torch.manual_seed(0)
    parts = repnoise_loss(tiny_causal_lm(tiny_tok, num_layers=2).eval(), batch)
    want = parts["harmless_ce"] + 0.001 * parts["noise_mmd"] - 1.0 * torch.log1p(parts["harmful_ce"])
    assert parts["loss"].item() == pytest.approx(want.item(), rel=1e-6)
    assert parts["noise_mmd"].item() > 1e-3 and parts["harmful_ce"].item() > 0.1  # both terms weigh in


def test_an_immunised_model_is_written_in_shards_and_a_tampered_shard_is_refused(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    limit = max(t.nbytes for t in model.parameters())
    ImmunisedModel(model, tiny_tok).save_pretrained(tmp_path / "m", max_shard_size=limit)
    shards = sorted(p.name for p in (tmp_path / "m").glob("model-*-of-*.safetensors"))
    assert len(shards) > 3 and (tmp_path / "m" / "model.safetensors.index.json").is_file()
    assert set(shards) <= set(read_metadata(tmp_path / "m")["files"])
    loaded = ImmunisedModel.from_pretrained(tmp_path / "m")
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), model.state_dict().values()))
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m")  # stock transformers reads the shards too
    assert torch.equal(plain.lm_head.weight, model.lm_head.weight)
    (tmp_path / "m" / shards[-1]).write_bytes((tmp_path / "m" / shards[-1]).read_bytes() + b" ")
    with pytest.raises(ValueError, match=re.escape(shards[-1])):
        ImmunisedModel.from_pretrained(tmp_path / "m")
