"""PiSSA beside another adapter, by PEFT's `adapter_name` (issue 46 item 4): `init_pissa` adds a named PiSSA adapter to
a PEFT model, `save_pissa_as_lora` converts that one alone, stock peft loads its plain LoRA on the untouched base, and
the first adapter is left as it was; what cannot work (PiSSA beside an adapter that rewrote the base, an init_dir of
another adapter) is refused by name before anything is written."""
import warnings

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from adaptkit.models import tiny_causal_lm
from adaptkit.pissa import (
    PiSSAAdapter,
    init_pissa,
    load_pissa_adapter,
    pissa_config,
    save_pissa_as_lora,
    save_pissa_residual,
)


def _init(model, config, init_dir, **kwargs):
    "`init_pissa` without its warning that the base was replaced (expected here)."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return init_pissa(model, config, init_dir=init_dir, **kwargs)


def _with_lora(tok):
    "The tiny model with a plain LoRA `default` on q_proj, its B not zero (as a trained one)."
    return get_peft_model(tiny_causal_lm(tok), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))


def _params(model, adapter: str) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{adapter}." in n}


def _train(model, ids, steps: int = 3):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        model(**ids, labels=ids["input_ids"]).loss.backward()
        opt.step()
        opt.zero_grad()


def test_a_second_pissa_adapter_converts_alone_to_a_lora_stock_peft_loads_on_the_untouched_base(tiny_tok, tmp_path):
    ids = tiny_tok(["one plus two equals three"], return_tensors="pt")
    base_logits = tiny_causal_lm(tiny_tok)(**ids).logits
    model = _with_lora(tiny_tok)
    first, first_config = _params(model, "default"), model.peft_config["default"].to_dict()
    pm = _init(model, pissa_config(4), tmp_path / "init", adapter_name="pissa")
    assert pm is model and set(pm.peft_config) == {"default", "pissa"} and pm.active_adapters == ["pissa"]
    assert torch.allclose(pm(**ids).logits, base_logits, atol=1e-5)  # the new adapter on: the model as it was
    _train(pm, ids)
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert trainable and all(".pissa." in n for n in trainable)  # the PiSSA adapter alone trains
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init", adapter_name="pissa")
    plain = PeftModel.from_pretrained(tiny_causal_lm(tiny_tok), lora)  # stock peft, the untouched base
    assert (plain(**ids).logits - pm(**ids).logits).abs().max() <= 1e-4
    assert not torch.allclose(plain(**ids).logits, base_logits, atol=1e-3)  # training changed it
    saved = load_file(lora / "adapter_model.safetensors")  # PiSSA's layers alone (every linear: 2 x 7), no name
    assert len(saved) == 2 * 2 * 7 and not any(".pissa" in k or ".default" in k for k in saved)
    assert sorted(p.name for p in lora.iterdir() if p.is_dir()) == []  # peft's subfolder for a named adapter: none
    loaded = PiSSAAdapter.from_pretrained(lora, base=tiny_causal_lm(tiny_tok)).model  # adaptkit's checked path
    assert (loaded(**ids).logits - pm(**ids).logits).abs().max() <= 1e-4
    # the first adapter untouched: its weights, its config, frozen and off, still beside; nothing else left behind
    assert all(torch.equal(v, first[k]) for k, v in _params(pm, "default").items()) and _params(pm, "default")
    assert pm.peft_config["default"].to_dict() == first_config
    assert set(pm.peft_config) == {"default", "pissa"} and pm.active_adapters == ["pissa"]
    assert {n for n, p in pm.named_parameters() if p.requires_grad} == trainable
    # the official layout (the residual QPiSSA quantizes) of the named adapter: residual + that adapter = the model
    save_pissa_residual(pm, tmp_path / "official", adapter_name="pissa")
    again = load_pissa_adapter(AutoModelForCausalLM.from_pretrained(tmp_path / "official" / "residual_model"),
                               tmp_path / "official" / "pissa_adapter")
    assert (again(**ids).logits - pm(**ids).logits).abs().max() <= 1e-5


def test_a_conversion_is_refused_for_an_adapter_its_init_dir_is_not_of(tiny_tok, tmp_path):
    pm = _init(_with_lora(tiny_tok), pissa_config(2), tmp_path / "init", adapter_name="pissa")
    with pytest.raises(ValueError, match="initial adapter of the adapter 'pissa', not of 'default': pass "
                                         "adapter_name='pissa'"):
        save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    pm.delete_adapter("pissa")
    with pytest.raises(ValueError, match=r"the model has no adapter 'pissa' \(it has \['default'\]\)"):
        save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init", adapter_name="pissa")
    assert not (tmp_path / "lora").exists()


def test_pissa_is_refused_beside_an_adapter_that_replaced_the_base_and_under_a_name_taken(tiny_tok, tmp_path):
    "Refused before the model or any folder changes: a second PiSSA would record the first's residual as its base."
    pm = _init(tiny_causal_lm(tiny_tok), pissa_config(2), tmp_path / "first")
    before = {n: p.detach().clone() for n, p in pm.named_parameters()}
    with pytest.raises(ValueError, match=r"adapter 'default' \(init_lora_weights='pissa'\) already replaced the base"):
        _init(pm, pissa_config(2), tmp_path / "second", adapter_name="second")
    lora = _with_lora(tiny_tok)
    with pytest.raises(ValueError, match="Adapter with name 'default' already exists"):  # peft's own refusal
        _init(lora, pissa_config(2), tmp_path / "taken")
    assert set(pm.peft_config) == {"default"} and set(lora.peft_config) == {"default"}
    assert all(torch.equal(p, before[n]) for n, p in pm.named_parameters())
    assert not (tmp_path / "second").exists() and not (tmp_path / "taken").exists()
