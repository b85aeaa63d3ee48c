"""A trainer's final save under FSDP / DeepSpeed ZeRO-3: transformers gathers the full state dict and passes it as
`_save(output_dir, state_dict=...)`, while the live model holds shards or empty placeholders. The artifact must be
written from the gathered tensors, once, by the process that saves (`args.should_save`).

No FSDP or DeepSpeed runs here (CPU, one process): each test passes `_save` what transformers passes on the saving
process, a state dict that differs from the live model's parameters, and reads the artifact back from disk."""
import json
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file

from adaptkit.aligner import AlignerConfig, AlignerTrainer
from adaptkit.hub import read_metadata, verify_checksums
from adaptkit.models import load_tokenizer

ROWS = [{"question": f"What is {i} times 2?", "answer": f"{i}", "correction": f"{2 * i}."} for i in range(4)]


def _aligner_trainer(model_dir, out, **kwargs) -> AlignerTrainer:
    args = AlignerConfig(str(out), max_steps=1, save_strategy="no", use_cpu=True, disable_tqdm=True, report_to="none",
                         identity_warmup_ratio=0.0)
    return AlignerTrainer(str(model_dir), args, ROWS, processing_class=load_tokenizer(model_dir), **kwargs)


def _checked(folder) -> dict:
    "The record of the artifact in `folder`, its checksums verified against the files."
    record = read_metadata(folder)
    verify_checksums(folder, record["files"])
    return record


def test_final_save_writes_the_gathered_state_dict_not_the_live_parameters(tiny_model_dir, tmp_path):
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run")
    live = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    gathered = {k: v + 0.25 for k, v in live.items()}  # what FSDP's FULL_STATE_DICT / ZeRO-3 would hand over
    trainer._save(str(tmp_path / "final"), state_dict=gathered)
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert saved.keys() == gathered.keys()
    assert all(torch.equal(saved[k], gathered[k]) for k in saved), "the artifact holds the live weights"
    assert all(torch.equal(v, live[k]) for k, v in trainer.model.state_dict().items())  # the live model untouched
    record = _checked(tmp_path / "final")
    assert record["artifact"] == "aligner" and "model.safetensors" in record["files"]
    assert json.loads((tmp_path / "final" / "config.json").read_text())["aligner_template"]


def test_only_the_process_that_saves_writes_the_artifact(tiny_model_dir, tmp_path, monkeypatch):
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run")
    monkeypatch.setattr(type(trainer.args), "should_save", property(lambda self: False))  # rank 1 of 2
    trainer._save(str(tmp_path / "final"), state_dict={})  # FSDP's rank0_only gather leaves the others empty
    trainer.save_model(str(tmp_path / "plain"))
    assert not (tmp_path / "final").exists() and not (tmp_path / "plain").exists()


def test_a_merged_artifact_under_zero3_gathers_the_whole_peft_model(tiny_model_dir, tmp_path):
    """ZeRO-3 with a PEFT model gathers the trainable tensors only (`exclude_frozen_parameters`); an aligner trained
    with a LoRA is saved merged, so `_save` gathers the whole model (on every process) and writes it merged."""
    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run", peft_config=lora)
    full = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    for k in full:
        if "lora_B" in k: full[k] = torch.full_like(full[k], 0.3)  # the trained adapter, unlike the live one
    trainable = {k: v for k, v in full.items() if "lora_" in k}
    calls = []
    trainer.is_deepspeed_enabled = True  # what transformers' Trainer sees under ZeRO-3
    trainer.deepspeed = SimpleNamespace(config={"zero_optimization": {"stage": 3}})
    trainer.accelerator = SimpleNamespace(get_state_dict=lambda engine: calls.append(engine) or full)
    trainer._save(str(tmp_path / "final"), state_dict=trainable)
    assert calls == [trainer.deepspeed]
    _checked(tmp_path / "final")
    saved = load_file(tmp_path / "final" / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj"
    w, b, a = (full[f"base_model.model.{q}.{k}"] for k in ("base_layer.weight", "lora_B.default.weight",
                                                             "lora_A.default.weight"))
    scale = trainer.model.peft_config["default"].lora_alpha / 2
    assert torch.allclose(saved[f"{q}.weight"], w + scale * b @ a)
    with pytest.raises(RuntimeError, match="stage3_gather_16bit_weights_on_model_save"):
        trainer._save(str(tmp_path / "empty"), state_dict={})  # transformers' fallback when ZeRO-3 may not gather
    assert not (tmp_path / "empty").exists()


@pytest.mark.filterwarnings("ignore:init_pissa replaced")
def test_an_adapter_is_written_from_the_gathered_tensors(tiny_model_dir, tmp_path):
    "PiSSA under FSDP: its conversion reads the gathered adapter (and residual base), not the live parameters."
    import datasets

    from adaptkit.pissa import PiSSAConfig, PiSSATrainer
    rows = datasets.Dataset.from_list([{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(4)])
    args = PiSSAConfig(str(tmp_path / "run"), pissa_r=2, max_steps=1, save_strategy="no", use_cpu=True,
                       report_to="none", disable_tqdm=True)
    trainer = PiSSATrainer(str(tiny_model_dir), args, rows, processing_class=load_tokenizer(tiny_model_dir))
    gathered = {k: v.detach() + 0.1 if "lora_" in k else v.detach().clone()
                for k, v in trainer.model.state_dict().items()}
    trainer._save(str(tmp_path / "gathered"), state_dict=gathered)
    with torch.no_grad():  # the same tensors put in the live model: its plain save must be the same adapter
        for k, p in trainer.model.named_parameters():
            if "lora_" in k: p.copy_(gathered[k])
    trainer._save(str(tmp_path / "live"))
    for folder in ("gathered", "live"): _checked(tmp_path / folder)
    got, want = (load_file(tmp_path / f / "adapter_model.safetensors") for f in ("gathered", "live"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(RuntimeError, match="lacks"):
        trainer._save(str(tmp_path / "half"), state_dict={k: v for k, v in gathered.items() if "layers.0." not in k})
    assert not (tmp_path / "half").exists()
