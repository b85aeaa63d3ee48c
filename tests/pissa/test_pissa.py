"""PiSSA across modules: train with TRL, push the converted LoRA with its card to a LocalHub, load it with stock peft
on the untouched base pulled from the same hub."""
import json
import re
import warnings

import datasets
import numpy as np
import pytest
import torch
from huggingface_hub import HfApi
from peft import LoraConfig, PeftModel, get_peft_model

from adaptkit.hub import pull, push_folder, read_metadata
from adaptkit.models import load_causal_lm, load_tokenizer, tiny_causal_lm

# `_fingerprint_matches` (the init check's tolerance) and `_principal` (QPiSSA's principal part) are tested as the
# private helpers they are: their contract is what the public conversion and QPiSSA error rely on
from adaptkit.pissa import PiSSAConfig, PiSSATrainer, save_pissa_as_lora
from adaptkit.pissa.principal import (
    NF4_LEVELS,
    _fingerprint_matches,
    _principal,
    init_pissa,
    load_pissa_adapter,
    nf4_roundtrip,
    pissa_config,
    principal_parts,
    qpissa_error,
    qpissa_round_errors,
    quantization_error,
    save_pissa_residual,
)


def test_train_push_pull_load_on_untouched_base(hub, tiny_model_dir, tiny_model_copy, tmp_path):
    base_commit = push_folder(tiny_model_copy, "team/tiny-base", endpoint=hub.endpoint)
    rows = datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(12)])
    tok = load_tokenizer(tiny_model_dir)
    args = PiSSAConfig(str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                       save_strategy="no", disable_tqdm=True, use_cpu=True, logging_steps=1)
    trainer = PiSSATrainer("team/tiny-base", args, peft_config=pissa_config(4, niter=2), train_dataset=rows,
                           processing_class=tok, hub_endpoint=hub.endpoint)
    assert (trainer.base_model, trainer.base_revision) == ("team/tiny-base", base_commit)
    assert read_metadata(trainer.init_dir)["pissa"]["seed"] == args.seed == 42  # the init is seeded with the run's seed
    trainer.train()
    adapter = trainer.artifact()
    adapter.results = [{"task": "text-generation", "dataset": "tiny-sums", "metric": "loss", "value": 1.5}]
    commit = adapter.push_to_hub("team/tiny-pissa", endpoint=hub.endpoint)

    data = HfApi(endpoint=hub.endpoint).model_info("team/tiny-pissa").card_data
    assert (data.base_model, data.library_name) == ("team/tiny-base", "peft")
    assert "pissa" in data.tags and data.eval_results[0].metric_value == 1.5
    card = (pull("team/tiny-pissa", endpoint=hub.endpoint) / "README.md").read_text()
    assert "rank 8 and alpha 8" in card and base_commit in card

    base = load_causal_lm("team/tiny-base", endpoint=hub.endpoint, revision=base_commit)
    plain = PeftModel.from_pretrained(base, pull("team/tiny-pissa", endpoint=hub.endpoint, revision=commit))
    ids = tok(["3 plus 3 is"], return_tensors="pt")
    trainer.model.eval()
    assert torch.allclose(plain(**ids).logits, trainer.model(**ids).logits, atol=1e-4)


# ---- input checks, conversion safety, QPiSSA numbers checked independently, iterations, learning ----

def _init(model, cfg, folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return init_pissa(model, cfg, init_dir=folder, **kw)


def _named(tok, name, seed=0):
    model = tiny_causal_lm(tok, seed=seed)
    model.config._name_or_path = name
    return model


def test_conversion_refuses_the_initial_adapter_of_another_base_naming_both(tiny_tok, tmp_path):
    first = _init(_named(tiny_tok, "team/base-a"), pissa_config(4), tmp_path / "init-a")
    second = _init(_named(tiny_tok, "team/base-b", seed=7), pissa_config(4), tmp_path / "init-b")
    with pytest.raises(
        ValueError, match=r"init-a is the initial adapter of team/base-a, not of this model \(team/base-b\)"
    ):
        save_pissa_as_lora(second, tmp_path / "lora", init_dir=tmp_path / "init-a")
    assert not (tmp_path / "lora").exists()  # refused before anything was written
    assert (save_pissa_as_lora(first, tmp_path / "lora", init_dir=tmp_path / "init-a") / "adapter_config.json").exists()


def test_conversion_needs_an_initial_adapter(tiny_tok, tmp_path):
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    with pytest.raises(FileNotFoundError, match=r"empty: no initial PiSSA adapter here"):
        save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "empty")


def test_input_checks_name_what_is_wrong(tiny_tok, tmp_path):
    with pytest.raises(ValueError, match=r"r must be at least 1, got 0"):
        pissa_config(0)
    with pytest.raises(ValueError, match=r"niter must be a positive number of iterations or None, got -2"):
        pissa_config(4, niter=-2)
    with pytest.raises(ValueError, match=r"pissa_r must be at least 1, got 0"):
        PiSSAConfig(str(tmp_path / "out"), pissa_r=0)
    with pytest.raises(ValueError, match=r"r must be between 1 and 3 for a \(3, 5\) weight, got 4"):
        principal_parts(torch.ones(3, 5), 4)
    with pytest.raises(ValueError, match=r"init_lora_weights is 'olora'; use pissa_config\(\)"):
        init_pissa(tiny_causal_lm(tiny_tok), LoraConfig(r=4, init_lora_weights="olora"), init_dir=tmp_path / "x")
    with pytest.raises(ValueError, match=r"init_lora_weights is 'pissa_niter_0': expected 'pissa' or 'pissa_niter_N'"):
        init_pissa(tiny_causal_lm(tiny_tok), LoraConfig(r=4, init_lora_weights="pissa_niter_0"), init_dir=tmp_path)
    int8 = tiny_causal_lm(tiny_tok)
    up = int8.model.layers[0].mlp.up_proj
    up.weight = torch.nn.Parameter(up.weight.to(torch.int8), requires_grad=False)
    with pytest.raises(TypeError, match=r"cannot be initialised on quantized weights"):
        init_pissa(int8, pissa_config(4), init_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match=r"no linear layer named any of \('nope',\) in the model"):
        quantization_error(tiny_causal_lm(tiny_tok), r=2, target_modules=("nope",))


def test_residual_adapter_refuses_a_base_that_is_not_its_residual(tiny_tok, tmp_path):
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    save_pissa_residual(pm, tmp_path / "official")
    with pytest.raises(
        ValueError,
        match=r"pissa_adapter is a PiSSA adapter trained on a residual model .* this base is not that residual",
    ):
        load_pissa_adapter(tiny_causal_lm(tiny_tok), tmp_path / "official" / "pissa_adapter")


def _nf4_direct(w: np.ndarray, blocksize: int = 64) -> np.ndarray:
    "NF4 round trip written independently: each value goes to the nearest level of its block's absmax scale."
    flat = w.astype(np.float64).ravel()
    out = np.empty_like(flat)
    levels = NF4_LEVELS.double().numpy()
    for start in range(0, flat.size, blocksize):
        block = flat[start:start + blocksize]
        scale = np.abs(block).max() or 1.0
        out[start:start + blocksize] = levels[np.abs(block[:, None] / scale - levels).argmin(1)] * scale
    return out.reshape(w.shape)


def _nuclear(x: np.ndarray) -> float:
    return float(np.linalg.svd(x, compute_uv=False).sum())


def _top(x: np.ndarray, r: int) -> np.ndarray:
    U, S, Vh = np.linalg.svd(x, full_matrices=False)
    return (U[:, :r] * S[:r]) @ Vh[:r]


def _qpissa_direct(w: np.ndarray, r: int, iters: int) -> tuple[float, float]:
    "QLoRA's and QPiSSA's nuclear-norm NF4 errors of `w`, computed directly in float64."
    part = _top(w, r)
    for _ in range(iters - 1):
        part = _top(w - _nf4_direct(w - part), r)
    return _nuclear(w - _nf4_direct(w)), _nuclear(w - (_nf4_direct(w - part) + part))


def test_nf4_and_qpissa_on_a_hand_computed_row():
    w = torch.zeros(1, 64)
    w[0, 0], w[0, 1] = 1.0, 0.5  # 0.5 rounds to the level 0.44070982933044434 (0.0593 away; 0.5626 is 0.0626 away)
    assert nf4_roundtrip(w)[0, 1].item() == pytest.approx(0.44070982933044434, abs=1e-7)
    err = qpissa_error(w, 1)
    assert err["qlora"] == pytest.approx(0.5 - 0.44070982933044434, rel=1e-5)  # the nuclear norm of one error entry
    assert err["qpissa"] < 1e-6 and err["reduction"] == pytest.approx(1.0, abs=1e-5)  # rank 1: nothing left to quantize


def test_qpissa_errors_match_a_direct_computation():
    torch.manual_seed(0)
    w = torch.randn(256, 8) @ torch.randn(8, 256) * 0.5 + torch.randn(256, 256) * 0.05
    one, two = qpissa_error(w, 8), qpissa_error(w, 8, iters=2)
    qlora, qpissa1 = _qpissa_direct(w.double().numpy(), 8, 1)
    _, qpissa2 = _qpissa_direct(w.double().numpy(), 8, 2)
    assert one["qlora"] == pytest.approx(qlora, rel=1e-4) and two["qlora"] == pytest.approx(qlora, rel=1e-4)
    assert one["qpissa"] == pytest.approx(qpissa1, rel=1e-3) and one["reduction"] == pytest.approx(
        1 - qpissa1 / qlora, rel=1e-4
    )
    # the second iteration re-fits the adapter to what quantizing the residual lost: 4.5% lower here
    assert two["qpissa"] == pytest.approx(qpissa2, rel=1e-3) and qpissa2 < 0.97 * qpissa1
    assert two["qpissa"] < 0.97 * one["qpissa"]


def test_quantization_error_sums_layer_errors_of_the_model(tiny_tok):
    model = tiny_causal_lm(tiny_tok, num_layers=1)
    names = ("q_proj", "up_proj")
    rep = quantization_error(model, r=2, target_modules=names)
    weights = {n: m.weight.detach().double().numpy() for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in names}
    direct = {n: _qpissa_direct(w, 2, 1) for n, w in weights.items()}
    assert set(rep["layers"]) == set(weights)
    qlora, qpissa = sum(d[0] for d in direct.values()), sum(d[1] for d in direct.values())
    assert qpissa < 0.99 * qlora  # the two sums are far apart, so swapping them cannot pass
    assert rep["qlora"] == pytest.approx(qlora, rel=1e-4) and rep["qpissa"] == pytest.approx(qpissa, rel=1e-3)
    assert rep["reduction"] == pytest.approx(1 - qpissa / qlora, rel=1e-3)
    per_layer = [1 - d[1] / d[0] for d in direct.values()]
    assert rep["mean_layer_reduction"] == pytest.approx(sum(per_layer) / len(per_layer), rel=1e-3)



def test_quantization_error_reads_a_peft_models_base_layers_and_refuses_a_pissa_one(tiny_tok, tmp_path):
    "Through PEFT's wrapper (`base_model.model.` names, each LoRA layer's `base_layer`): the plain model's report."
    names = ("q_proj", "up_proj")
    plain = quantization_error(tiny_causal_lm(tiny_tok, num_layers=1), r=2, target_modules=names)
    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    wrapped = get_peft_model(tiny_causal_lm(tiny_tok, num_layers=1), lora, adapter_name="mine")
    assert quantization_error(wrapped, r=2, target_modules=names) == plain
    assert set(plain["layers"]) == {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"}
    pm = _init(tiny_causal_lm(tiny_tok, num_layers=1), pissa_config(2), tmp_path / "init")
    with pytest.raises(ValueError, match=r"adapter 'default' \(init_lora_weights='pissa'\) replaced the weights it"):
        quantization_error(pm, r=2, target_modules=names)

def test_training_lowers_the_loss_on_the_training_rows_and_converts_exactly(tiny_tok, tmp_path):
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    ids = tiny_tok(["one plus two equals three", "two plus two equals four"], return_tensors="pt", padding=True)
    labels = ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100)
    before = pm(**ids, labels=labels).loss.item()
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=3e-2)
    for _ in range(20):
        pm(**ids, labels=labels).loss.backward(); opt.step(); opt.zero_grad()
    after = pm(**ids, labels=labels).loss.item()
    assert after < before - 0.3, (before, after)  # 6.18 -> 5.70 here; without training it stays at 6.18
    plain = PeftModel.from_pretrained(
        tiny_causal_lm(tiny_tok), save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    )
    # the plain LoRA is the trained model
    assert plain(**ids, labels=labels).loss.item() == pytest.approx(after, rel=1e-4)


def test_same_seed_same_adapter_and_accurate_default(tiny_tok, tmp_path):
    # hidden 128: the smaller side of every weight is >= 4 r niter = 128, so the default init takes the Krylov path
    model = lambda: tiny_causal_lm(tiny_tok, hidden_size=128, num_layers=1)
    weights = {n: m.weight.detach().clone() for n, m in model().named_modules() if isinstance(m, torch.nn.Linear)}
    def parts(seed, folder, niter=None):
        pm = _init(model(), pissa_config(4, niter=niter), tmp_path / folder, seed=seed)
        return {
            n.removeprefix("base_model.model."): (
                m.lora_B["default"].weight.detach().clone(),
                m.lora_A["default"].weight.detach().clone(),
            )
            for n, m in pm.named_modules()
            if hasattr(m, "lora_A") and "default" in m.lora_A
        }
    a, b, c = parts(3, "a"), parts(3, "b"), parts(4, "c")
    assert all(torch.equal(x, y) for n in a for x, y in zip(a[n], b[n]))  # same seed: identical, bit for bit
    assert not all(torch.equal(a[n][0], c[n][0]) for n in a)  # another seed: another Krylov start block
    errors = []
    for n, (B, A) in a.items():  # and the principal part is close to the exact one's
        U, S, Vh = torch.linalg.svd(weights[n].double())
        exact = (U[:, :4] * S[:4]) @ Vh[:4]
        errors.append((((B @ A).double() - exact).norm() / exact.norm()).item())
    # random weights have almost no gap between singular values 4 and 5 (real ones: 0.1% off, see the notebook)
    assert max(errors) < 0.03 and sum(errors) / len(errors) < 0.01, errors
    assert parts(3, "d", niter=2).keys() == a.keys()


def test_nf4_pads_the_last_block_and_matches_a_direct_rounding():
    w = torch.randn(5, 13, generator=torch.Generator().manual_seed(0))  # 65 values: one full block of 64 and one of 1
    for blocksize in (64, 8):
        assert np.allclose(nf4_roundtrip(w, blocksize).double().numpy(), _nf4_direct(w.numpy(), blocksize), atol=1e-6)
    assert nf4_roundtrip(w).shape == (5, 13) and nf4_roundtrip(w)[4, 12] == w[4, 12]  # a block of one keeps its value


def test_a_model_marked_quantized_is_refused(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    model.is_quantized = True
    with pytest.raises(TypeError, match=r"cannot be initialised on quantized weights"):
        init_pissa(model, pissa_config(4), init_dir=tmp_path / "x")


def test_load_pissa_adapter_loads_a_plain_lora_on_the_untouched_base(tiny_tok, tmp_path):
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    ids = tiny_tok(["one plus two"], return_tensors="pt")
    loaded = load_pissa_adapter(tiny_causal_lm(tiny_tok), lora)
    assert torch.allclose(loaded(**ids).logits, pm(**ids).logits, atol=1e-5)


def _lora_parts(pm) -> dict:
    "name -> (B, A, scaling, base weight) of every adapted layer."
    return {
        n.removeprefix("base_model.model."): (
            m.lora_B["default"].weight.detach().clone(),
            m.lora_A["default"].weight.detach().clone(),
            m.scaling["default"],
            m.get_base_layer().weight.detach().clone(),
        )
        for n, m in pm.named_modules()
        if hasattr(m, "lora_A") and "default" in m.lora_A
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_init_equals_peft_exact_and_the_residual_is_exact(tiny_tok, tmp_path, dtype):
    original = {n: m.weight.detach().clone() for n, m in tiny_causal_lm(tiny_tok).to(dtype).named_modules()
                if isinstance(m, torch.nn.Linear)}
    ours = _lora_parts(_init(tiny_causal_lm(tiny_tok).to(dtype), pissa_config(4, lora_alpha=8), tmp_path / "init"))
    from peft import get_peft_model
    peft_exact = _lora_parts(get_peft_model(tiny_causal_lm(tiny_tok).to(dtype), pissa_config(4, lora_alpha=8)))
    assert ours.keys() == peft_exact.keys() and len(ours) == 14
    for n, (B, A, scale, W) in ours.items():
        B2, A2, scale2, W2 = peft_exact[n]
        assert scale == scale2 == 2.0 and B.dtype == A.dtype == torch.float32 and W.dtype == dtype
        # the same principal part (scaled by 1 / scaling);
        # peft rounds its bf16 model's adapter through bf16, adaptkit does not
        assert torch.allclose(B @ A, B2 @ A2, atol=1e-5 if dtype == torch.float32 else 1e-3), n
        assert torch.equal(W, (original[n].float() - scale * B @ A).to(dtype)), n  # W_res = W - scaling B A, exactly


def test_chunked_decomposition_gives_the_same_adapter(tiny_tok, tmp_path, monkeypatch):
    whole = _lora_parts(_init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "a"))
    import adaptkit.pissa.principal as pissa
    monkeypatch.setattr(pissa, "_CHUNK_ELEMENTS", 1500)  # one 32x32 matrix per call instead of all same-shape ones
    chunked = _lora_parts(_init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "b"))
    assert whole.keys() == chunked.keys()
    for n in whole:
        assert torch.allclose(whole[n][0] @ whole[n][1], chunked[n][0] @ chunked[n][1], atol=1e-5), n
        assert torch.allclose(whole[n][3], chunked[n][3], atol=1e-5), n



# Boundary cases found by mutation testing (`make mutation`): each asserts a behaviour a mutant broke.

def test_pissa_config_is_the_papers_recipe():
    cfg = pissa_config()
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.init_lora_weights) == (16, 16, 0.0, "pissa")
    assert cfg.task_type == "CAUSAL_LM" and cfg.target_modules == "all-linear"
    assert pissa_config(4, niter=None).init_lora_weights == "pissa"
    assert pissa_config(4, niter=1).init_lora_weights == "pissa_niter_1"
    custom = pissa_config(8, target_modules=["q_proj"], lora_alpha=4, lora_dropout=0.1)
    assert (custom.r, custom.lora_alpha, custom.lora_dropout, custom.target_modules) == (8, 4, 0.1, {"q_proj"})


@pytest.mark.parametrize("niter", [0, -3])
def test_pissa_config_refuses_a_non_positive_niter(niter):
    with pytest.raises(
        ValueError, match=re.escape(f"niter must be a positive number of iterations or None, got {niter}")
    ):
        pissa_config(4, niter=niter)


# --- init_pissa -----------------------------------------------------------------------------------------------------

def test_init_pissa_refuses_a_plain_lora_config(tiny_tok, tmp_path):
    from peft import LoraConfig
    with pytest.raises(ValueError, match=re.escape("config.init_lora_weights is True; use pissa_config()")):
        init_pissa(tiny_causal_lm(tiny_tok), LoraConfig(r=4), init_dir=tmp_path / "init")
    assert not (tmp_path / "init").exists()


def test_init_pissa_refuses_quantized_weights(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    model.lm_head.weight = torch.nn.Parameter(
        torch.zeros_like(model.lm_head.weight, dtype=torch.int8), requires_grad=False
    )
    with pytest.raises(TypeError, match="PiSSA cannot be initialised on quantized weights"):
        init_pissa(model, pissa_config(4, niter=None), init_dir=tmp_path / "init")
    assert not (tmp_path / "init").exists()


def test_init_pissa_records_the_initial_adapter_and_keeps_the_callers_config(tiny_tok, tmp_path):
    cfg = pissa_config(4, niter=2)
    with pytest.warns(UserWarning, match="init_pissa replaced the base model's adapted weights"):
        peft_model = init_pissa(tiny_causal_lm(tiny_tok), cfg, init_dir=tmp_path / "init")
    assert cfg.init_lora_weights == "pissa_niter_2" and peft_model.peft_config["default"] is not cfg
    saved = json.loads((tmp_path / "init" / "adapter_config.json").read_text())
    assert saved["init_lora_weights"] is True and saved["r"] == 4  # loads as a plain LoRA: no second decomposition
    record = json.loads((tmp_path / "init" / "adaptkit.json").read_text())["pissa"]
    assert (record["role"], record["init_lora_weights"]) == ("initial adapter", "pissa_niter_2")
    assert len(record["residual_fingerprint"]) == 4 and all(
        len(v) == 2 for v in record["residual_fingerprint"].values()
    )


# --- the conversion's init-folder checks ------------------------------------------------------------------------------

def test_conversion_checks_the_init_folder_and_records_the_ranks(tiny_tok, tmp_path):
    with pytest.warns(UserWarning):
        one = init_pissa(tiny_causal_lm(tiny_tok, seed=0), pissa_config(4, niter=None), init_dir=tmp_path / "init1")
        other = init_pissa(tiny_causal_lm(tiny_tok, seed=1), pissa_config(4, niter=None), init_dir=tmp_path / "init2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'empty'}: no initial PiSSA adapter here")):
        save_pissa_as_lora(one, tmp_path / "out", init_dir=tmp_path / "empty")
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{tmp_path / 'init2'} is the initial adapter of an unnamed model, "
            "not of this model (an unnamed model): their residual weights differ"
        ),
    ):
        save_pissa_as_lora(one, tmp_path / "out", init_dir=tmp_path / "init2")
    relabelled = tmp_path / "relabelled"  # the right files, but not marked as an initial adapter
    save_pissa_as_lora(other, relabelled, init_dir=tmp_path / "init2")
    with pytest.raises(FileNotFoundError, match="no initial PiSSA adapter here"):
        save_pissa_as_lora(other, tmp_path / "out", init_dir=relabelled)
    assert not (tmp_path / "out").exists()
    out = save_pissa_as_lora(one, tmp_path / "out", init_dir=tmp_path / "init1")
    record = json.loads((out / "adaptkit.json").read_text())["pissa"]
    keys = ("role", "pissa_rank", "lora_rank", "lora_alpha", "rank", "init_lora_weights")
    assert {k: record[k] for k in keys} == {"role": "plain lora", "pissa_rank": 4, "lora_rank": 8, "lora_alpha": 8,
                                            "rank": "exact", "init_lora_weights": "pissa"}
    assert record["init"]["seed"] == 0 and record["init"]["init_lora_weights"] == "pissa"  # the init's record, copied
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors",
                                                     "adaptkit.json"]  # no conversion scratch folder left


def test_fingerprints_match_within_tolerance_only():
    saved = {"a": [100.0, 2000.0], "b": [0.0, 1.0]}
    assert _fingerprint_matches(saved, {"a": [100.0 * (1 + 5e-5), 2000.0], "b": [5e-7, 1.0]})
    assert not _fingerprint_matches(saved, {"a": [100.0 * (1 + 5e-4), 2000.0], "b": [0.0, 1.0]})
    assert not _fingerprint_matches(saved, {"a": [100.0, 2000.0], "b": [2e-6, 1.0]})
    assert not _fingerprint_matches(saved, {"a": [100.0, 2000.0]})
    assert _fingerprint_matches(saved, {"a": [100.0, 2000.0 * 1.0005], "b": [0.0, 1.0]}, rtol=1e-3)


# --- QPiSSA -----------------------------------------------------------------------------------------------------------

def _rank2(n=12, m=10):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 2, generator=g) @ torch.randn(2, m, generator=g) * 3


def test_principal_is_the_top_r_singular_part():
    w = torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0]))
    B, A = _principal(w, 2, None)
    assert B.shape == (4, 2) and A.shape == (2, 4)
    assert torch.allclose(B @ A, torch.diag(torch.tensor([4.0, 3.0, 0.0, 0.0])), atol=1e-6)
    assert torch.allclose(B.abs().amax(0), torch.tensor([2.0, 3.0 ** 0.5]))  # B = U sqrt(S), A = sqrt(S) Vh
    assert torch.allclose(A.abs().amax(1), B.abs().amax(0))
    w = _rank2()
    B, A = _principal(w, 2, 4)  # the randomised SVD recovers an exactly rank-2 matrix
    assert B.shape == (12, 2) and torch.allclose(B @ A, w, atol=1e-4)


def test_qpissa_error_by_hand():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 24, generator=g)
    U, S, Vh = torch.linalg.svd(w, full_matrices=False)
    low = U[:, :3] * S[:3] @ Vh[:3]
    qlora = torch.linalg.matrix_norm(w - nf4_roundtrip(w), ord="nuc").item()
    qpissa = torch.linalg.matrix_norm(w - (nf4_roundtrip(w - low) + low), ord="nuc").item()
    got = qpissa_error(w, 3)
    assert got["qlora"] == pytest.approx(qlora, rel=1e-5) and got["qpissa"] == pytest.approx(qpissa, rel=1e-4)
    assert got["reduction"] == pytest.approx(1 - qpissa / qlora, rel=1e-4)
    assert qpissa_error(w, 8)["qpissa"] < got["qpissa"]  # a larger rank leaves less to quantize


def test_qpissa_of_a_low_rank_matrix_leaves_nothing_to_quantize():
    w = _rank2()
    got = qpissa_error(w, 2)
    assert got["qlora"] > 0.1 and got["qpissa"] < 1e-3 * got["qlora"] and got["reduction"] > 0.999


def test_qpissa_iterations_refit_the_adapter():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 16, generator=g)
    U, S, Vh = torch.linalg.svd(w, full_matrices=False)
    B, A = U[:, :2] * S[:2].sqrt(), S[:2].sqrt()[:, None] * Vh[:2]
    U, S, Vh = torch.linalg.svd(w - nf4_roundtrip(w - B @ A), full_matrices=False)  # the second fit
    B, A = U[:, :2] * S[:2].sqrt(), S[:2].sqrt()[:, None] * Vh[:2]
    want = torch.linalg.matrix_norm(w - (nf4_roundtrip(w - B @ A) + B @ A), ord="nuc").item()
    assert qpissa_error(w, 2, iters=2)["qpissa"] == pytest.approx(want, rel=1e-4)
    assert qpissa_error(w, 2, iters=2)["qpissa"] != pytest.approx(qpissa_error(w, 2)["qpissa"], rel=1e-4)


def _qpissa_rounds_direct(w: np.ndarray, r: int, iters: int) -> list[float]:
    "Iterative QPiSSA's relative Frobenius error after each round, computed directly in float64 (the official loop)."
    errors, target = [], w
    for _ in range(iters):
        part = _top(target, r)
        q = _nf4_direct(w - part)
        errors.append(float(np.linalg.norm(w - (q + part)) / np.linalg.norm(w)))
        target = w - q
    return errors


def _spiky(seed: int, m=96, n=64) -> torch.Tensor:
    "A matrix with four large singular values over a flat floor, as trained weights have."
    g = torch.Generator().manual_seed(seed)
    U, V = torch.linalg.qr(torch.randn(m, n, generator=g)).Q, torch.linalg.qr(torch.randn(n, n, generator=g)).Q
    return (U * torch.tensor([50.0, 30.0, 20.0, 10.0] + [1.0] * (n - 4))) @ V.T


@pytest.mark.parametrize("seed", [0, 1])
def test_iterative_qpissa_errors_match_a_direct_computation_and_do_not_increase(seed):
    w = _spiky(seed)
    got = qpissa_round_errors(w, 4, iters=4)
    want = _qpissa_rounds_direct(w.double().numpy(), 4, 4)
    assert len(got) == 4 and got == pytest.approx(want, rel=1e-3)
    assert got[-1] < 0.95 * got[0]  # 4 rounds: about 9% lower than plain QPiSSA on this spectrum
    assert all(b <= a for a, b in zip(got, got[1:]))
    qlora = float(np.linalg.norm(w.numpy() - _nf4_direct(w.numpy())) / np.linalg.norm(w.numpy()))
    assert got[0] < 0.2 * qlora  # QPiSSA's point: the principal part leaves a residual that quantizes far better
    # the last round is the one `qpissa_error(iters=4)` keeps: its nuclear-norm error agrees
    assert qpissa_error(w, 4, iters=4)["qpissa"] == pytest.approx(_qpissa_direct(w.double().numpy(), 4, 4)[1], rel=1e-3)


def test_iterative_qpissa_by_hand():
    "Row 0 = 4 e0 is the principal part; row 1 = e1 + 0.5 e2 is the residual, whose 0.5 rounds to NF4's 0.44071."
    w = torch.zeros(2, 64)
    w[0, 0], w[1, 1], w[1, 2] = 4.0, 1.0, 0.5
    by_hand = (0.5 - 0.44070982933044434) / (16 + 1 + 0.25) ** 0.5
    # the next SVD sees row 0 and the lost 0.0593 in row 1: it picks row 0 again, so every round is the same
    assert qpissa_round_errors(w, 1, iters=3) == pytest.approx([by_hand] * 3, rel=1e-5)
    assert qpissa_round_errors(w, 2, iters=2) == pytest.approx([0.0, 0.0], abs=1e-7)  # rank 2 holds all of it
    with pytest.raises(ValueError, match=re.escape("iters must be at least 1 (1: plain QPiSSA), got 0")):
        qpissa_round_errors(w, 1, iters=0)


# --- principal_parts and the default ("pissa") init ------------------------------------------------------------------

def test_principal_parts_exact_tall_wide_and_batched():
    from adaptkit.pissa.principal import principal_parts
    U, S, Vh = principal_parts(torch.diag(torch.tensor([4.0, 3.0, 2.0, 1.0])), 2, niter=None)
    assert S.tolist() == [4.0, 3.0] and torch.allclose((U * S) @ Vh, torch.diag(torch.tensor([4.0, 3.0, 0.0, 0.0])))
    wide = _rank2(3, 8)
    U, S, Vh = principal_parts(wide, 2)
    assert (U.shape, S.shape, Vh.shape) == ((3, 2), (2,), (2, 8)) and torch.allclose((U * S) @ Vh, wide, atol=1e-4)
    stack = torch.stack([_rank2(), 2 * _rank2()])
    U, S, Vh = principal_parts(stack, 2, niter=None)
    assert (
        U.shape == (2, 12, 2)
        and torch.allclose(S[1], 2 * S[0])
        and torch.allclose((U * S[:, None]) @ Vh, stack, atol=1e-4)
    )


def test_principal_parts_by_block_krylov_are_seeded_and_recover_a_low_rank_matrix():
    from adaptkit.pissa.principal import principal_parts
    w = _rank2(40, 24)  # 4 * r * niter = 16 <= 24: the Krylov path
    one = principal_parts(w, 2, niter=2, generator=torch.Generator().manual_seed(5))
    two = principal_parts(w, 2, niter=2, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    U, S, Vh = one
    assert (U.shape, Vh.shape) == ((40, 2), (2, 24)) and torch.allclose((U * S) @ Vh, w, atol=1e-3)
    assert torch.allclose(S, torch.linalg.svdvals(w)[:2], rtol=1e-4)
    U, S, Vh = principal_parts(w.T, 2, niter=2)  # wide: decomposed as its transpose, handed back the right way round
    assert (U.shape, Vh.shape) == ((24, 2), (2, 40)) and torch.allclose((U * S) @ Vh, w.T, atol=1e-3)


@pytest.mark.parametrize("r, niter, message", [
    (0, 8, "r must be between 1 and 4 for a (4, 6) weight, got 0"),
    (5, 8, "r must be between 1 and 4 for a (4, 6) weight, got 5"),
    (2, 0, "niter must be at least 1 or None, got 0"),
])
def test_principal_parts_checks(r, niter, message):
    from adaptkit.pissa.principal import principal_parts
    with pytest.raises(ValueError, match=re.escape(message)):
        principal_parts(torch.ones(4, 6), r, niter=niter)


def test_default_init_splits_each_weight_into_its_principal_part_and_the_residual(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    with pytest.warns(UserWarning):
        peft_model = init_pissa(model, pissa_config(4), init_dir=tmp_path / "init", seed=3)
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    BA = layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    U, S, Vh = torch.linalg.svd(before)
    assert torch.allclose(BA, (U[:, :4] * S[:4]) @ Vh[:4], atol=1e-3 * S[0].item())
    assert torch.allclose(layer.get_base_layer().weight + BA, before, atol=1e-5)
    record = json.loads((tmp_path / "init" / "adaptkit.json").read_text())["pissa"]
    assert (record["init_lora_weights"], record["seed"]) == ("pissa", 3)


def test_the_shared_lora_and_the_initial_adapter_record_the_base_each_goes_on(tiny_tok, tmp_path):
    "The plain LoRA records the untouched base, the initial adapter the residual model: each refuses the other base."
    from adaptkit.models import BaseMismatchError, fingerprint, load_adapter
    base = tiny_causal_lm(tiny_tok)
    base.config._name_or_path = "team/base"  # as a model loaded from the Hub names itself
    pm = _init(base, pissa_config(4), tmp_path / "init")
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    source = read_metadata(lora)["source"]
    assert source == {
        "base_model": "team/base",
        "base_revision": None,
        "base_path": None,
        "fingerprint": fingerprint(tiny_causal_lm(tiny_tok)),
    }
    with pytest.raises(BaseMismatchError, match="differs in"):
        load_adapter(tiny_causal_lm(tiny_tok, seed=7), lora)  # same shapes, other weights
    with pytest.raises(BaseMismatchError, match="differs in"):
        load_adapter(tiny_causal_lm(tiny_tok), tmp_path / "init")  # the initial adapter needs the residual model
    load_adapter(tiny_causal_lm(tiny_tok), lora)  # the untouched base: accepted
    initial = read_metadata(tmp_path / "init")
    assert initial["source"]["fingerprint"] == initial["pissa"]["residual_fingerprint"]
    assert initial["pissa"]["base_fingerprint"] == source["fingerprint"]


def test_the_smallest_and_largest_ranks_and_one_iteration_are_accepted():
    "The bounds of the rank and iteration checks are inclusive: r = 1, r = the smaller side, niter = 1."
    assert pissa_config(1).r == 1 and pissa_config(4, niter=1).init_lora_weights == "pissa_niter_1"
    w = torch.randn(6, 4)
    for r in (1, 4):
        U, S, Vh = principal_parts(w, r)
        assert S.shape == (r,) and torch.allclose(S, torch.linalg.svdvals(w)[:r], atol=1e-5)
    principal_parts(w, 2, niter=1)


def test_the_krylov_path_is_seeded_and_recovers_the_exact_parts_of_a_wide_low_rank_matrix():
    "Past 2·(r + 4)·niter columns the Krylov path runs: its start block comes from `generator`; same seed, same parts."
    g = torch.Generator().manual_seed(0)
    w = torch.randn(120, 3, generator=g) @ torch.randn(3, 100, generator=g)  # rank 3, 100 >= 2 * (2 + 4) * 8 columns
    parts = [principal_parts(w, 2, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert all(torch.equal(a, b) for a, b in zip(parts[0], parts[1]))  # the same seed, bit for bit
    assert not all(torch.equal(a, b) for a, b in zip(parts[0], parts[2]))  # another seed, another start block
    assert torch.allclose(parts[0][1], torch.linalg.svdvals(w)[:2], rtol=1e-4)


def test_an_adapter_folder_without_the_init_record_is_not_taken_for_the_initial_adapter(tiny_tok, tmp_path):
    "A LoRA folder that `init_pissa` did not write (no `pissa` record) is refused by name before conversion."
    import shutil

    from adaptkit.hub import write_json
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    shutil.copytree(tmp_path / "init", tmp_path / "plain")
    write_json(tmp_path / "plain" / "adaptkit.json", {"source": read_metadata(tmp_path / "init")["source"]})
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'plain'}: no initial PiSSA adapter here")):
        save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "plain")
    assert not (tmp_path / "lora").exists()


def test_init_records_its_seed_and_residual_and_keeps_the_pissa_init_on_the_model(tiny_tok, tmp_path):
    "Unseeded, init uses seed 0; an unnamed base is recorded as no repo id; the model's config still says PiSSA."
    from adaptkit.models import fingerprint
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    record = read_metadata(tmp_path / "init")
    assert record["pissa"]["seed"] == 0 and pm.peft_config["default"].init_lora_weights == "pissa"
    assert record["source"] == {"base_model": None, "base_revision": None,
                                "fingerprint": record["pissa"]["residual_fingerprint"]}
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    assert read_metadata(lora)["source"] == {"base_model": None, "base_revision": None, "base_path": None,
                                             "fingerprint": fingerprint(tiny_causal_lm(tiny_tok))}


def test_only_the_process_that_saves_writes_the_initial_adapter(tiny_model_dir, tmp_path, monkeypatch):
    """Under `accelerate launch` every process initialises PiSSA (seeded alike); one writes `_pissa_init`. A process
    that does not save (rank 1: `args.should_save` is False) ends with the same adapter and writes nothing there."""
    rows = datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(4)])
    tok = load_tokenizer(tiny_model_dir)
    def trainer(out):
        args = PiSSAConfig(str(out), pissa_r=2, max_steps=1, save_strategy="no", use_cpu=True, report_to="none")
        return PiSSATrainer(str(tiny_model_dir), args, rows, processing_class=tok)
    saver = trainer(tmp_path / "rank0")
    with monkeypatch.context() as m:
        m.setattr(PiSSAConfig, "should_save", property(lambda self: False))
        other = trainer(tmp_path / "rank1")
    assert (tmp_path / "rank0" / "_pissa_init" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "rank1").exists() or not any((tmp_path / "rank1").iterdir())
    assert other.init_dir == tmp_path / "rank1" / "_pissa_init"  # where the process that saves keeps it
    mine, theirs = saver.model.state_dict(), other.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)  # the same seeded adapter and residual base
