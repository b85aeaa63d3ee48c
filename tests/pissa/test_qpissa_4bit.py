"""QPiSSA's save/load round trip on a 4-bit residual: `save_pissa_residual`'s adapter records its residual before
quantization, and `load_pissa_adapter` takes that residual model loaded in 4 bits while it still refuses the untouched
base in 4 bits; the shared plain LoRA goes the other way (QLoRA on the untouched base).

bitsandbytes is not in adaptkit's lock, so the round trip is tested on a stand-in with bitsandbytes' storage: packed
bytes (two 4-bit indices a byte, the first in the high half) with a `quant_state` (`code`, `absmax`, `blocksize`,
`shape`, `dtype`; nested: 8-bit scales with `state2` and `offset`), what `models.fingerprint` reads. Where
bitsandbytes is installed, the stand-in's bytes are checked against its own and the round trip runs on the 4-bit
model transformers loads (on the CPU since bitsandbytes 0.46; run with 0.50.2 when this was written)."""
import copy
import importlib.util
import warnings
from types import SimpleNamespace

import pytest
import torch

# the fingerprint's fixed positions and its entries' decoding, private to models: what a 4-bit entry holds is read here
from adaptkit.models import (
    BaseMismatchError,
    _positions,
    _values,
    fingerprint,
    load_adapter,
    load_causal_lm,
    tiny_causal_lm,
)
from adaptkit.pissa import init_pissa, load_pissa_adapter, pissa_config, save_pissa_as_lora, save_pissa_residual
from adaptkit.pissa.principal import NF4_LEVELS

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


def _nearest(values: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    "The index of the entry of `table` nearest to each of `values`."
    return (values.reshape(-1, 1) - table).abs().argmin(dim=1)


def packed_4bit(w: torch.Tensor, *, blocksize: int = 64, nested: bool = False) -> torch.nn.Parameter:
    """`w` as bitsandbytes stores an NF4 weight: each value divided by its block's absmax, rounded to the nearest NF4
    level, two indices a byte; nested: the scales stored in 8 bits around their mean (an evenly spaced table here)."""
    flat = w.detach().float().reshape(-1)
    blocks = torch.nn.functional.pad(flat, (0, -flat.numel() % blocksize)).view(-1, blocksize)
    absmax = blocks.abs().amax(dim=1)
    index = _nearest(blocks / absmax[:, None], NF4_LEVELS)[:flat.numel()]
    index = torch.nn.functional.pad(index, (0, index.numel() % 2))
    p = torch.nn.Parameter((index[0::2] << 4 | index[1::2]).to(torch.uint8)[:, None], requires_grad=False)
    state = {"code": NF4_LEVELS, "absmax": absmax, "blocksize": blocksize, "shape": w.shape, "dtype": w.dtype,
             "nested": False}
    if nested:
        offset, table = absmax.mean(), torch.linspace(-1, 1, 256)
        step = (absmax - offset).abs().max()
        state.update(nested=True, offset=offset, absmax=_nearest((absmax - offset) / step, table).to(torch.uint8),
                     state2=SimpleNamespace(code=table, absmax=step[None], blocksize=len(absmax)))
    p.quant_state = SimpleNamespace(**state)
    return p


def in_4bit(model, **kw):
    "`model` with every linear layer but the head stored as `packed_4bit` weights, as `load_in_4bit=True` leaves it."
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head": mod.weight = packed_4bit(mod.weight, **kw)
    return model


def _saved(tok, tmp_path):
    "A tiny base saved to a folder, its PiSSA model's residual layout and its plain LoRA beside it."
    base = tiny_causal_lm(tok)
    base.save_pretrained(tmp_path / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = init_pissa(load_causal_lm(tmp_path / "base"), pissa_config(4), init_dir=tmp_path / "init")
    save_pissa_residual(pm, tmp_path / "qpissa")
    save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    return tmp_path / "base", tmp_path / "qpissa" / "residual_model", tmp_path / "qpissa" / "pissa_adapter"


@pytest.mark.parametrize("nested", [False, True])
def test_a_residual_adapter_loads_on_its_residual_in_4_bits_and_not_on_the_untouched_base(tiny_tok, tmp_path, nested):
    base, residual, adapter = _saved(tiny_tok, tmp_path)
    quantized = in_4bit(load_causal_lm(residual), nested=nested)
    assert quantized.model.layers[0].self_attn.q_proj.weight.dtype == torch.uint8
    loaded = load_pissa_adapter(quantized, adapter)
    assert loaded.active_adapter == "default"
    with pytest.raises(BaseMismatchError, match=r"this base is not that residual.* differs in 'model\.layers\.0\."):
        load_pissa_adapter(in_4bit(load_causal_lm(base), nested=nested), adapter)
    with pytest.raises(BaseMismatchError, match="this base is not that residual"):  # nor a full-precision other base
        load_pissa_adapter(tiny_causal_lm(tiny_tok, seed=5), adapter)


def test_the_plain_lora_loads_on_the_untouched_base_in_4_bits_and_not_on_the_residual(tiny_tok, tmp_path):
    base, residual, _ = _saved(tiny_tok, tmp_path)
    assert load_adapter(in_4bit(load_causal_lm(base)), tmp_path / "lora").active_adapter == "default"
    with pytest.raises(BaseMismatchError, match="differs in 'model.layers.0."):
        load_adapter(in_4bit(load_causal_lm(residual)), tmp_path / "lora")


def test_a_4bit_fingerprint_holds_the_stored_values_and_what_rounds_to_them(tiny_tok):
    "Read independently: each sampled value is its NF4 level times its block's scale, and its record lies in range."
    model = tiny_causal_lm(tiny_tok)
    weight = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    fp = fingerprint(in_4bit(copy.deepcopy(model)))["model.layers.0.mlp.up_proj.weight"]
    assert fp["shape"] == list(weight.shape) and {"low", "high"} <= set(fp)
    at = torch.tensor(_positions(weight.numel()))
    flat = weight.reshape(-1)
    scale = flat.view(-1, 64).abs().amax(dim=1)[at // 64]
    level = NF4_LEVELS[_nearest(flat[at] / scale, NF4_LEVELS)]
    assert torch.equal(_values(fp), level * scale)
    low, high = _values(fp, "low"), _values(fp, "high")
    assert bool(((low <= flat[at]) & (flat[at] <= high)).all()) and bool((high - low < 0.25 * scale).all())


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed (it is not in adaptkit's lock)")
@pytest.mark.parametrize("nested", [False, True])
def test_the_stand_in_stores_what_bitsandbytes_stores(nested):
    import bitsandbytes.functional as bnbf
    w = torch.randn(48, 128) * torch.rand(48, 1)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)
    ours = packed_4bit(w, nested=nested)
    assert torch.equal(ours.reshape(-1), packed.reshape(-1))  # the same levels, packed the same way
    if not nested: assert torch.equal(ours.quant_state.absmax, state.absmax)
    assert tuple(ours.quant_state.shape) == tuple(state.shape) and ours.quant_state.blocksize == state.blocksize


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed (it is not in adaptkit's lock)")
@pytest.mark.parametrize("how", [{"bnb_4bit_quant_type": "nf4"}, {"bnb_4bit_quant_type": "fp4"},
                                 {"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}])
def test_the_round_trip_on_bitsandbytes_4bit_models(tiny_tok, tmp_path, how):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    base, residual, adapter = _saved(tiny_tok, tmp_path)
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, **how)
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, quantization_config=config, dtype=torch.bfloat16,
                                                          device_map={"": "cpu"})
    assert load_pissa_adapter(load(residual), adapter, is_trainable=True).active_adapter == "default"
    with pytest.raises(BaseMismatchError, match="this base is not that residual"):
        load_pissa_adapter(load(base), adapter)
    assert load_adapter(load(base), tmp_path / "lora").active_adapter == "default"
    with pytest.raises(BaseMismatchError, match="differs in"):
        load_adapter(load(residual), tmp_path / "lora")
