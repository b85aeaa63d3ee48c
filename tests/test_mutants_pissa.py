"""adaptkit.pissa behaviours that mutation testing (`make mutation`, tests/mutation.json) found untested: the recipe
`pissa_config` writes, what `init_pissa` refuses and records, the init-folder checks of the conversion, the principal
part and the QPiSSA error against hand computations and known answers."""
import json
import re

import pytest
import torch

from adaptkit.models import tiny_causal_lm
from adaptkit.pissa.principal import (
    _fingerprint_matches,
    _principal,
    init_pissa,
    nf4_roundtrip,
    pissa_config,
    qpissa_error,
    save_pissa_as_lora,
)

# --- pissa_config ---------------------------------------------------------------------------------------------------

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
    assert record == {"role": "plain lora", "pissa_rank": 4, "lora_rank": 8, "init_lora_weights": "pissa"}
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
