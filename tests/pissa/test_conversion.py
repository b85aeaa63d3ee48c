"""PiSSA's conversion choices and init record, each checked against an independent computation: the exact plain LoRA
(rank 2r) and the truncated one (rank k) against numpy's SVD of the trained change computed by hand (Eckart-Young),
and the initial adapter's record (method, seed, iterations, dtype, bf16 residual error) against the saved weights."""
import json
import re
import warnings

import numpy as np
import pytest
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file

from adaptkit.hub import read_metadata
from adaptkit.models import BaseMismatchError, load_causal_lm, tiny_causal_lm
from adaptkit.pissa import PiSSAAdapter, load_pissa_adapter, save_pissa_as_lora
from adaptkit.pissa.principal import (
    bf16_residual_error,
    init_pissa,
    pissa_config,
    truncate_lora,
)


def _init(model, cfg, folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return init_pissa(model, cfg, init_dir=folder, **kw)


def _trained(tok, folder, cfg=None, steps=3, **kw):
    "A PiSSA model after a few AdamW steps on two sentences (its change B A - B0 A0 is not zero)."
    pm = _init(tiny_causal_lm(tok), cfg or pissa_config(4), folder, **kw)
    ids = tok(["one plus two equals three", "two plus two equals four"], return_tensors="pt", padding=True)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        pm(**ids, labels=ids["input_ids"]).loss.backward(); opt.step(); opt.zero_grad()
    return pm


def _changes(pm, init_dir) -> dict[str, np.ndarray]:
    "name -> the trained change s (B A - B0 A0) of every layer, by hand in float64 from the model and the init file."
    initial = load_file(init_dir / "adapter_model.safetensors")
    out = {}
    for name, m in pm.base_model.model.named_modules():
        if isinstance(m, LoraLayer):
            B, A = (getattr(m, f"lora_{x}")["default"].weight.detach().double().numpy() for x in "BA")
            B0, A0 = (initial[f"base_model.model.{name}.lora_{x}.weight"].double().numpy() for x in "BA")
            out[name] = m.scaling["default"] * (B @ A - B0 @ A0)
    return out


def _written(folder, name) -> np.ndarray:
    "The product B A of layer `name` in a saved plain LoRA."
    state = load_file(folder / "adapter_model.safetensors")
    B, A = (state[f"base_model.model.{name}.lora_{x}.weight"].double().numpy() for x in "BA")
    return B @ A


def test_truncated_conversion_is_the_eckart_young_optimum_and_records_its_error(tiny_tok, tmp_path):
    pm = _trained(tiny_tok, tmp_path / "init")
    k = 3
    out = save_pissa_as_lora(pm, tmp_path / "low", init_dir=tmp_path / "init", rank=k)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["use_rslora"], cfg["rank_pattern"]) == (k, k, False, {})  # scaling 1
    rec = read_metadata(out)["pissa"]
    changes = _changes(pm, tmp_path / "init")
    assert set(rec["conversion_error"]) == set(changes) and len(changes) == 14
    for name, delta in changes.items():
        U, S, Vh = np.linalg.svd(delta, full_matrices=False)
        assert S[k] > 1e-3 * S[0]  # the change has more than k directions: truncating loses something
        best = (U[:, :k] * S[:k]) @ Vh[:k]
        assert np.allclose(_written(out, name), best, atol=1e-5 * S[0]), name
        eckart_young = np.sqrt((S[k:] ** 2).sum()) / np.sqrt((S ** 2).sum())
        assert rec["conversion_error"][name] == pytest.approx(eckart_young, rel=1e-4), name
    errors = list(rec["conversion_error"].values())
    assert rec["conversion_error_max"] == max(errors) and rec["conversion_error_mean"] == pytest.approx(np.mean(errors))
    assert (rec["rank"], rec["pissa_rank"], rec["lora_rank"], rec["lora_alpha"]) == (k, 4, k, k)


def test_exact_conversion_is_the_change_itself_with_rank_and_alpha_doubled(tiny_tok, tmp_path):
    pm = _trained(tiny_tok, tmp_path / "init", pissa_config(4, lora_alpha=8))  # scaling 2
    out = save_pissa_as_lora(pm, tmp_path / "exact", init_dir=tmp_path / "init")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"]) == (8, 16)  # alpha / r stays 2
    for name, delta in _changes(pm, tmp_path / "init").items():
        assert np.allclose(2.0 * _written(out, name), delta, atol=1e-6 * np.abs(delta).max()), name
    rec = read_metadata(out)["pissa"]
    assert (rec["rank"], rec["lora_rank"], rec["lora_alpha"]) == ("exact", 8, 16)
    assert rec["conversion_error_max"] < 1e-12 and rec["conversion_error_mean"] <= rec["conversion_error_max"]
    ids = tiny_tok(["one plus two"], return_tensors="pt")
    plain = PeftModel.from_pretrained(tiny_causal_lm(tiny_tok), out)
    assert torch.allclose(plain(**ids).logits, pm(**ids).logits, atol=1e-4)


@pytest.mark.parametrize("extra, k", [
    ({"use_rslora": True}, 8),  # rank 8 = 2r: every layer's whole change
    ({"rank_pattern": {"q_proj": 2}, "alpha_pattern": {"q_proj": 6}}, 4),  # q_proj's whole change (2 * 2), not others'
])
def test_conversion_measures_the_scaling_the_written_config_gives(tiny_tok, tmp_path, extra, k):
    "rsLoRA (alpha grows by sqrt 2) and per-layer rank/alpha patterns: the error uses the scaling peft will apply."
    pm = _trained(tiny_tok, tmp_path / "init", pissa_config(4, lora_alpha=8, **extra))
    ids = tiny_tok(["one plus two"], return_tensors="pt")
    exact = save_pissa_as_lora(pm, tmp_path / "exact", init_dir=tmp_path / "init")
    assert read_metadata(exact)["pissa"]["conversion_error_max"] < 1e-6
    full = save_pissa_as_lora(pm, tmp_path / "full", init_dir=tmp_path / "init", rank=k)
    rec, q = read_metadata(full)["pissa"], "model.layers.0.self_attn.q_proj"
    assert rec["conversion_error"][q] < 1e-6
    lossy = "rank_pattern" in extra  # the other layers' changes have rank 8 > 4
    assert (rec["conversion_error_max"] > 0.01) == lossy
    delta = _changes(pm, tmp_path / "init")[q]
    for folder in (exact, full):
        plain = PeftModel.from_pretrained(tiny_causal_lm(tiny_tok), folder)
        layer = plain.base_model.model.model.layers[0].self_attn.q_proj
        got = (layer.scaling["default"] * layer.lora_B["default"].weight @ layer.lora_A["default"].weight).detach()
        assert np.allclose(got.double().numpy(), delta, atol=1e-6 * np.abs(delta).max())  # with peft's own scaling
        if folder == exact or not lossy: assert torch.allclose(plain(**ids).logits, pm(**ids).logits, atol=1e-4)


def test_truncate_lora_matches_numpy_svd_of_the_product():
    g = torch.Generator().manual_seed(0)
    B, A = torch.randn(20, 6, generator=g), torch.randn(6, 12, generator=g)
    U, S, Vh = np.linalg.svd(B.double().numpy() @ A.double().numpy(), full_matrices=False)
    for k in (1, 4, 6):
        Bk, Ak = truncate_lora(B, A, k)
        assert Bk.shape == (20, k) and Ak.shape == (k, 12) and Bk.dtype == torch.float64
        assert np.allclose((Bk @ Ak).numpy(), (U[:, :k] * S[:k]) @ Vh[:k], atol=1e-10)
        # balanced: B_k = U_k S_k^1/2 and A_k = S_k^1/2 V_k^T have the same column / row norms, sqrt(S)
        root = np.sqrt(S[:k])
        assert np.allclose(Bk.norm(dim=0).numpy(), root) and np.allclose(Ak.norm(dim=1).numpy(), root)
    with pytest.raises(ValueError, match=re.escape("k must be between 1 and 6 for these factors, got 7")):
        truncate_lora(B, A, 7)


@pytest.mark.parametrize("rank, message", [
    (0, "rank must be 'exact' or a positive integer, got 0"),
    ("4", "rank must be 'exact' or a positive integer, got '4'"),
    (True, "rank must be 'exact' or a positive integer, got True"),
    (9, "rank=9 is above what the trained change of model.layers.0.self_attn.q_proj has (32x32, PiSSA rank 4: "
        "at most rank 8); rank='exact' is lossless at rank 8"),
])
def test_a_rank_that_cannot_be_written_is_refused_before_anything_is_written(tiny_tok, tmp_path, rank, message):
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    with pytest.raises(ValueError, match=re.escape(message)):
        save_pissa_as_lora(pm, tmp_path / "out", init_dir=tmp_path / "init", rank=rank)
    assert not (tmp_path / "out").exists()


def test_the_smaller_side_limits_the_rank(tiny_tok, tmp_path):
    "k_proj is 16 x 32: with r = 10 its change has at most rank 16, not 2r = 20; 16 is accepted."
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(10), tmp_path / "init")
    with pytest.raises(ValueError, match=re.escape("k_proj has (16x32, PiSSA rank 10: at most rank 16)")):
        save_pissa_as_lora(pm, tmp_path / "out", init_dir=tmp_path / "init", rank=17)
    out = save_pissa_as_lora(pm, tmp_path / "out", init_dir=tmp_path / "init", rank=16)
    assert read_metadata(out)["pissa"]["rank"] == 16


def test_an_untrained_adapter_converts_to_a_zero_change_with_no_error(tiny_tok, tmp_path):
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4), tmp_path / "init")
    out = save_pissa_as_lora(pm, tmp_path / "low", init_dir=tmp_path / "init", rank=2)
    rec = read_metadata(out)["pissa"]
    assert rec["conversion_error_max"] < 1e-6  # float noise of the factors, relative to the adapter's own product
    assert np.abs(_written(out, "model.layers.1.mlp.up_proj")).max() < 1e-6
    json.loads((out / "adaptkit.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the record"))


# --- the initial adapter's record --------------------------------------------------------------------------------

def test_init_record_errors_match_a_direct_computation_from_the_saved_adapter(tiny_tok, tmp_path):
    original = {n: m.weight.detach().double() for n, m in tiny_causal_lm(tiny_tok).named_modules()
                if isinstance(m, torch.nn.Linear)}
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4, lora_alpha=8), tmp_path / "init", seed=11)
    rec = read_metadata(tmp_path / "init")["pissa"]
    assert (rec["init_lora_weights"], rec["niter"], rec["seed"], rec["dtype"], rec["adapter_dtype"]) == (
        "pissa", 10, 11, "float32", "float32")
    assert rec["init_method"].startswith("adaptkit principal_parts (seeded block Krylov, 10 iterations")
    initial = load_file(tmp_path / "init" / "adapter_model.safetensors")
    by_hand, residual = {}, {}
    for name in rec["bf16_residual_error"]:
        W = original[name]
        part = 2.0 * initial[f"base_model.model.{name}.lora_B.weight"].double() @ initial[
            f"base_model.model.{name}.lora_A.weight"].double()
        by_hand[name] = ((W - ((W - part).to(torch.bfloat16).double() + part)).norm() / W.norm()).item()
        base = dict(pm.base_model.model.named_modules())[name].get_base_layer().weight.detach().double()
        residual[name] = ((W - (base + part)).norm() / W.norm()).item()
    assert len(by_hand) == 14
    assert all(rec["bf16_residual_error"][n] == pytest.approx(e, rel=1e-3) for n, e in by_hand.items())
    worst = max(by_hand, key=by_hand.get)
    assert rec["bf16_residual_error_layer"] == worst
    assert rec["bf16_residual_error_max"] == rec["bf16_residual_error"][worst]
    assert 1e-4 < rec["bf16_residual_error_max"] < 1e-2  # bf16 keeps 8 significant bits
    assert rec["residual_error_max"] == pytest.approx(max(residual.values()), abs=1e-7)
    assert rec["residual_error_max"] < 1e-6  # float32: the output is unchanged at init


def test_the_randomised_init_is_seeded_and_recorded(tiny_tok, tmp_path):
    def adapter(seed, folder):
        pm = _init(tiny_causal_lm(tiny_tok), pissa_config(4, niter=3), tmp_path / folder, seed=seed)
        return {n: (m.lora_B["default"].weight.detach().clone(), m.lora_A["default"].weight.detach().clone())
                for n, m in pm.named_modules() if isinstance(m, LoraLayer)}
    state = torch.get_rng_state()
    one, two, other = adapter(7, "a"), adapter(7, "b"), adapter(8, "c")
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched
    assert all(torch.equal(x, y) for n in one for x, y in zip(one[n], two[n]))  # same seed: bit for bit
    assert not any(torch.equal(one[n][0], other[n][0]) for n in one)  # another seed: another start in every layer
    rec = read_metadata(tmp_path / "a")["pissa"]
    assert (rec["init_lora_weights"], rec["niter"], rec["seed"]) == ("pissa_niter_3", 3, 7)
    assert rec["init_method"].startswith("peft pissa_niter_3 (torch.svd_lowrank, q = r, 3 subspace iterations")


def test_a_bf16_model_records_its_init_error_and_a_float32_adapter(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok).to(torch.bfloat16)
    original = {n: m.weight.detach().double() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    pm = _init(model, pissa_config(4, niter=2), tmp_path / "init")
    rec = read_metadata(tmp_path / "init")["pissa"]
    assert (rec["dtype"], rec["adapter_dtype"]) == ("bfloat16", "float32")
    q = dict(pm.base_model.model.named_modules())["model.layers.0.self_attn.q_proj"]
    W = original["model.layers.0.self_attn.q_proj"]
    got = q.get_base_layer().weight.double() + (q.lora_B["default"].weight @ q.lora_A["default"].weight).double()
    assert rec["bf16_residual_error"]["model.layers.0.self_attn.q_proj"] == pytest.approx(
        ((W - got.detach()).norm() / W.norm()).item(), rel=1e-3)  # the bf16 residual is the model's own
    assert rec["residual_error_max"] == pytest.approx(rec["bf16_residual_error_max"], rel=1e-5)


def test_bf16_residual_error_by_hand():
    # B A = the 2; the residual keeps 1 + 2^-10, which bf16 (8 significant bits) rounds to 1
    w = torch.tensor([[2.0, 0.0], [0.0, 1 + 2**-10]])
    B, A = torch.tensor([[1.0], [0.0]]), torch.tensor([[2.0, 0.0]])
    assert bf16_residual_error(w, B, A) == pytest.approx(2**-10 / (4 + (1 + 2**-10) ** 2) ** 0.5, rel=1e-6)
    assert bf16_residual_error(w, 2 * B, A, scaling=0.5) == pytest.approx(2**-10 / (4 + (1 + 2**-10) ** 2) ** 0.5,
                                                                         rel=1e-6)
    w = torch.tensor([[3.0, 1 + 2**-10]])  # rank 1: the adapter holds all of it, nothing is left to round
    assert bf16_residual_error(w, torch.tensor([[1.0]]), w) == 0.0
    assert bf16_residual_error(torch.zeros(2, 2), torch.zeros(2, 1), torch.zeros(1, 2)) == 0.0


# --- the artifact: the record on the card, kept through a reload ----------------------------------------------------

def test_the_adapter_card_shows_the_conversion_and_init_and_a_reload_keeps_them(tiny_tok, tmp_path):
    pm = _trained(tiny_tok, tmp_path / "init", seed=3)
    low = PiSSAAdapter(pm, tiny_tok, init_dir=tmp_path / "init", rank=2)
    low.settings = {"pissa_rank": 4, "pissa_alpha": 4, "init_lora_weights": "pissa"}
    low.save_pretrained(tmp_path / "low")
    rec = read_metadata(tmp_path / "low")["pissa"]
    assert low.conversion == rec and rec["rank"] == 2 and rec["init"]["seed"] == 3
    card = (tmp_path / "low" / "README.md").read_text()
    assert "**rank 2 (alpha 2, scaling 1)**" in card
    assert f"**max {rec['conversion_error_max']:.3g}, mean {rec['conversion_error_mean']:.3g}**" in card
    assert "| seed | 3 |" in card and "| iterations (`niter`) | 10 |" in card
    assert "| base weight dtype | float32 |" in card and "| adapter dtype | float32 |" in card
    assert f"{rec['init']['bf16_residual_error_max']:.2e} (`{rec['init']['bf16_residual_error_layer']}`)" in card
    pulled = PiSSAAdapter.from_pretrained(tmp_path / "low", base=tiny_causal_lm(tiny_tok))
    assert (pulled.rank, pulled.conversion) == (2, rec)
    pulled.save_pretrained(tmp_path / "again")
    assert read_metadata(tmp_path / "again")["pissa"] == rec
    conversion = card.split("### Conversion")[1].split("###")[0]
    assert "Truncated to rank 2" in conversion and conversion in (tmp_path / "again" / "README.md").read_text()
    exact = PiSSAAdapter(pm, tiny_tok, init_dir=tmp_path / "init")
    exact.save_pretrained(tmp_path / "exact")
    card = (tmp_path / "exact" / "README.md").read_text()
    assert "Exact: the trained change" in card and "rank 2r = 8 with alpha doubled to 8" in card


# --- a base from a local folder is named by the converted LoRA's record -----------------------------------------------

@pytest.mark.parametrize("save", ["save_pissa_as_lora", "PiSSAAdapter"])
@pytest.mark.parametrize("rank", ["exact", 2])
def test_a_converted_lora_of_a_local_base_records_its_folder_and_is_checked_from_the_record_alone(
        tiny_tok, tiny_model_copy, tmp_path, save, rank):
    """The record names the local base's folder (`base_path`) beside its fingerprint: the base to load the adapter on,
    and the one a refusal names."""
    base = tiny_model_copy  # a plain checkpoint: a folder, no repo id
    pm = _init(load_causal_lm(base), pissa_config(4), tmp_path / "init")
    ids = tiny_tok(["one plus two equals three", "two plus two equals four"], return_tensors="pt", padding=True)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        pm(**ids, labels=ids["input_ids"]).loss.backward(); opt.step(); opt.zero_grad()
    init, out = tmp_path / "init", tmp_path / "lora"
    if save == "save_pissa_as_lora": lora = save_pissa_as_lora(pm, out, init_dir=init, rank=rank)
    else: lora = PiSSAAdapter(pm, tiny_tok, init_dir=init, rank=rank).save_pretrained(out)
    src = read_metadata(lora)["source"]
    assert (src["base_model"], src["base_revision"], src["base_path"]) == (None, None, str(base.resolve()))
    other = tmp_path / "other-base"  # the same shapes, other weights
    tiny_causal_lm(tiny_tok, seed=7).save_pretrained(other)
    with pytest.raises(BaseMismatchError, match=rf"made on the base {re.escape(str(base.resolve()))}, but the model "
                                                rf"given \('{re.escape(str(other))}'\) differs in"):
        PiSSAAdapter.from_pretrained(lora, base=str(other))
    with pytest.raises(BaseMismatchError, match=rf"made on the base {re.escape(str(base.resolve()))}, but"):
        load_pissa_adapter(load_causal_lm(other), lora)
    loaded = PiSSAAdapter.from_pretrained(lora, base=src["base_path"]).model.eval()  # the base the record names
    with torch.no_grad():
        got, want = loaded(**ids).logits, pm.eval()(**ids).logits
    if rank == "exact": assert torch.allclose(got, want, atol=1e-5)
    else: assert not torch.equal(got, load_causal_lm(other)(**ids).logits)


def test_the_conversion_record_names_a_repo_id_base_and_keeps_both_recipes(tiny_tok, tmp_path):
    """A base loaded by repo id is recorded as that repo id, the one to load the plain LoRA on; the record keeps PiSSA's
    own rank and alpha beside the LoRA's; with one adapted layer, the mean conversion error is that layer's error."""
    model = tiny_causal_lm(tiny_tok)
    model.config._name_or_path = "team/tiny-base"  # as from_pretrained("team/tiny-base") leaves it
    cfg = pissa_config(4, lora_alpha=8, target_modules=["q_proj"], layers_to_transform=[0])
    pm = _init(model, cfg, tmp_path / "init")
    ids = tiny_tok(["one plus two equals three", "two plus two equals four"], return_tensors="pt", padding=True)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        pm(**ids, labels=ids["input_ids"]).loss.backward(); opt.step(); opt.zero_grad()
    meta = read_metadata(save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init", rank=2))
    rec = meta["pissa"]
    assert meta["source"]["base_model"] == "team/tiny-base"
    assert (rec["pissa_rank"], rec["pissa_alpha"], rec["lora_rank"], rec["rank"]) == (4, 8, 2, 2)
    (error,) = rec["conversion_error"].values()  # one layer: q_proj of layer 0
    assert error > 0 and rec["conversion_error_mean"] == rec["conversion_error_max"] == error
