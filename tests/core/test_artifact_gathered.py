"""A trainer's final save under FSDP / DeepSpeed ZeRO-3: transformers gathers the full state dict and passes it as
`_save(output_dir, state_dict=...)`, while the live model holds shards or empty placeholders. The artifact must be
written from the gathered tensors, once, by the process that saves (`args.should_save`).

Under FSDP with `SHARDED_STATE_DICT` transformers' `save_model` gathers nothing and writes nothing; the mixin's
`save_model` gathers the full weights itself (accelerate's `get_state_dict`) for a final save, and leaves checkpoints
sharded.

No FSDP or DeepSpeed runs here (CPU, one process): each test passes `_save` what transformers passes on the saving
process (or has `save_model` see what transformers and accelerate show under FSDP), a state dict that differs from the
live model's parameters, and reads the artifact back from disk."""
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


def _under_fsdp(trainer, state_dict_type: str, gathered: dict) -> list:
    """`trainer` as transformers' Trainer sees it under FSDP with `fsdp_state_dict_type: state_dict_type`; accelerate's
    `get_state_dict` returns `gathered` (the full weights, on the saving process). The list records its calls."""
    calls = []
    plugin = SimpleNamespace(state_dict_type=f"StateDictType.{state_dict_type}")  # how transformers reads it: str()
    trainer.is_fsdp_enabled = True
    trainer.accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin),
                                          get_state_dict=lambda model: calls.append(model) or gathered)
    return calls


def test_fsdp_sharded_state_dict_final_save_gathers_the_full_weights(tiny_model_dir, tmp_path, monkeypatch):
    """`SHARDED_STATE_DICT`: transformers' `save_model` would write nothing; the final save gathers the full weights
    and writes the artifact from them, and pushes as transformers' `save_model` does (not when transformers calls)."""
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run")
    live = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    gathered = {k: v - 0.5 for k, v in live.items()}
    calls = _under_fsdp(trainer, "SHARDED_STATE_DICT", gathered)
    pushes = []
    monkeypatch.setattr(trainer, "push_to_hub", lambda **kwargs: pushes.append(kwargs))
    trainer.save_model(str(tmp_path / "final"), _internal_call=True)  # as `trainer.push_to_hub()` calls it
    assert calls == [trainer.model] and pushes == []
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert saved.keys() == gathered.keys() and all(torch.equal(saved[k], gathered[k]) for k in saved)
    assert all(torch.equal(v, live[k]) for k, v in trainer.model.state_dict().items())  # the live model untouched
    assert _checked(tmp_path / "final")["artifact"] == "aligner"
    trainer.args.push_to_hub = True
    trainer.save_model()  # the user's own call, to `args.output_dir`
    assert (tmp_path / "run" / "model.safetensors").is_file() and len(calls) == 2
    assert pushes == [{"commit_message": "Model save", "revision": trainer.args.hub_revision}]


def test_fsdp_sharded_state_dict_checkpoints_stay_transformers(tiny_model_dir, tmp_path):
    """A `checkpoint-*` save under `SHARDED_STATE_DICT` is transformers' own (it writes the sharded model with the
    optimizer, in `_save_checkpoint`): nothing is gathered for it. `FULL_STATE_DICT` is transformers' own as well."""
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run")
    calls = _under_fsdp(trainer, "SHARDED_STATE_DICT", {})
    trainer.save_model(str(tmp_path / "run" / "checkpoint-1"), _internal_call=True)
    assert calls == [] and not (tmp_path / "run" / "checkpoint-1").exists()
    gathered = {k: v.detach() + 1 for k, v in trainer.model.state_dict().items()}
    calls = _under_fsdp(trainer, "FULL_STATE_DICT", gathered)
    trainer.save_model(str(tmp_path / "full"))  # transformers gathers and passes it to `_save`
    assert calls == [trainer.model]
    saved = load_file(tmp_path / "full" / "model.safetensors")
    assert all(torch.equal(saved[k], gathered[k]) for k in saved)


def test_fsdp_sharded_state_dict_gathers_on_every_process_and_one_writes(tiny_model_dir, tmp_path, monkeypatch):
    "The gather is collective: a process that does not save joins it (FSDP's rank0_only gather gives it nothing)."
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run")
    calls = _under_fsdp(trainer, "SHARDED_STATE_DICT", {})
    monkeypatch.setattr(type(trainer.args), "should_save", property(lambda self: False))  # rank 1 of 2
    trainer.save_model(str(tmp_path / "final"))
    assert calls == [trainer.model] and not (tmp_path / "final").exists()


@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_a_final_save_under_fsdp1_writes_from_the_model_inside_its_wrapper(tiny_model_dir, tmp_path, state_dict_type):
    """FSDP1 makes `trainer.model` its `FullyShardedDataParallel` wrapper; the artifact is built from the model inside
    (a `torch.nn.DataParallel` stands in: a container with `.module` that accelerate unwraps the same way)."""
    trainer = _aligner_trainer(tiny_model_dir, tmp_path / "run")
    gathered = {k: v.detach() * 2 for k, v in trainer.model.state_dict().items()}
    trainer.model = torch.nn.DataParallel(trainer.model)
    calls = _under_fsdp(trainer, state_dict_type, gathered)
    trainer.save_model(str(tmp_path / "final"))
    assert calls == [trainer.model]
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert saved.keys() == gathered.keys() and all(torch.equal(saved[k], gathered[k]) for k in saved)
    _checked(tmp_path / "final")
