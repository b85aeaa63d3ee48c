"""Issue 37: every method config has `save_max_shard_size` (on the shared base, `MethodConfig`), checked when the config
is made; a trainer's final save of a full model honours it: shards and an index as transformers writes them, loadable
by the artifact's class and by stock transformers. Its checkpoints are sharded at the same size and resume; a size
below the largest tensor gives that tensor a shard of its own, as transformers' `save_pretrained` does (issue 48); an
invalid size is refused before training; an adapter's trainer (PEFT writes one file) is not sharded."""
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, HfArgumentParser

from adaptkit.aligner import Aligner, AlignerConfig, AlignerDPOConfig, AlignerTrainer
from adaptkit.models import tiny_causal_lm
from adaptkit.pissa import PiSSAConfig
from adaptkit.repnoise import ImmunisedModel, RepNoiseConfig, RepNoiseTrainer
from adaptkit.translora import DiscriminatorConfig, DistillationConfig

CONFIGS = [AlignerConfig, AlignerDPOConfig, PiSSAConfig, RepNoiseConfig, DiscriminatorConfig, DistillationConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_method_config_takes_save_max_shard_size_checked_when_made(cls):
    assert cls("x", use_cpu=True).save_max_shard_size == "5GB"  # adaptkit's default (transformers' is 50GB)
    parsed, = HfArgumentParser(cls).parse_args_into_dataclasses(
        ["--output_dir", "x", "--use_cpu", "--save_max_shard_size", "200MB"], return_remaining_strings=False)
    assert parsed.save_max_shard_size == "200MB"  # the CLI's flag
    for bad in ("5 gigs", "-1GB", "0", "", "abc"):  # before any model is loaded or trained
        with pytest.raises(ValueError, match=f"save_max_shard_size: max_shard_size '{bad}' is invalid"):
            cls("x", use_cpu=True, save_max_shard_size=bad)
    assert cls("x", use_cpu=True, save_max_shard_size="32768").save_max_shard_size == "32768"  # bytes


def _aligner(tiny_model_dir, tiny_tok, out, shard, **settings):
    "An aligner's trainer (and its artifact class) saving full models in shards of `shard`; `settings` override."
    rows = [{"question": f"What is {i} + 1?", "answer": "?", "correction": f"{i + 1}."} for i in range(4)]
    args = AlignerConfig(str(out), **{**dict(max_steps=1, per_device_train_batch_size=4, identity_warmup_ratio=0.0,
                                             save_strategy="no", use_cpu=True, disable_tqdm=True), **settings},
                         save_max_shard_size=shard)
    return AlignerTrainer(str(tiny_model_dir), args, rows, processing_class=tiny_tok), Aligner


def _repnoise(tiny_model_dir, tiny_tok, out, shard, **settings):
    "RepNoise's trainer (and its artifact class) saving full models in shards of `shard`; `settings` override."
    rows = [{"prompt": f"how do I do task {i}", "harmful": f"here is how {i}", "harmless": "sorry, no"}
            for i in range(4)]
    args = RepNoiseConfig(str(out), **{**dict(max_steps=1, per_device_train_batch_size=4, save_strategy="no",
                                              use_cpu=True, disable_tqdm=True, max_length=32), **settings},
                          save_max_shard_size=shard)
    return RepNoiseTrainer(tiny_causal_lm(tiny_tok), args, rows, processing_class=tiny_tok), ImmunisedModel


def _tensor_sizes(tiny_tok) -> dict:
    "Bytes of each tensor of the tiny model both trainers train."
    return {k: v.nbytes for k, v in tiny_causal_lm(tiny_tok).state_dict().items()}


def _fitting_shard(tiny_tok) -> str:
    "A shard size the largest tensor fits in, several shards for the model."
    sizes = _tensor_sizes(tiny_tok)
    assert sum(sizes.values()) > 3 * max(sizes.values())
    return f"{math.ceil(max(sizes.values()) / 1000)}KB"


@pytest.mark.parametrize("make", [_aligner, _repnoise], ids=["aligner", "repnoise"])
def test_a_trainers_final_save_is_sharded_at_save_max_shard_size(tiny_model_dir, tiny_tok, tmp_path, make):
    "A trained model saved in shards of at most `save_max_shard_size`, with an index; it loads back, weights equal."
    shard = _fitting_shard(tiny_tok)  # the largest tensor fits; the model takes several shards
    out = tmp_path / "run"
    trainer, artifact_cls = make(tiny_model_dir, tiny_tok, out, shard)
    trainer.train()
    trainer.save_model()
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (out / "model.safetensors.index.json").is_file()
    assert not (out / "model.safetensors").exists()
    assert all(p.stat().st_size <= 1000 * int(shard[:-2]) + 8192 for p in shards)  # a shard's data, plus its header
    trained = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    loaded = artifact_cls.from_pretrained(out).model.state_dict()
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)
    stock = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(stock[k], trained[k]) for k in trained)


def test_the_default_save_is_one_file(tiny_model_dir, tiny_tok, tmp_path):
    "Below the option's 5GB default, a model is one file, as before."
    trainer, _ = _aligner(tiny_model_dir, tiny_tok, tmp_path / "run", "5GB")
    trainer.save_model()
    assert (tmp_path / "run" / "model.safetensors").is_file() and not list((tmp_path / "run").glob("model-*"))


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("make", [_aligner, _repnoise], ids=["aligner", "repnoise"])
def test_checkpoints_are_sharded_at_save_max_shard_size_and_resume(tiny_model_dir, tiny_tok, tmp_path, make):
    """A `checkpoint-*` folder (transformers' `Trainer._save`) is written in shards of `save_max_shard_size` with an
    index, and `train(resume_from_checkpoint=...)` reads them: a run resumed from step 1, on a model changed first,
    ends where the run that was not interrupted did."""
    shard = _fitting_shard(tiny_tok)
    steps = dict(max_steps=2, save_strategy="steps", save_steps=1)
    trainer, _ = make(tiny_model_dir, tiny_tok, tmp_path / "run", shard, **steps)
    trainer.train()
    for ckpt in (tmp_path / "run" / "checkpoint-1", tmp_path / "run" / "checkpoint-2"):
        assert len(list(ckpt.glob("model-*-of-*.safetensors"))) >= 3, sorted(p.name for p in ckpt.iterdir())
        assert (ckpt / "model.safetensors.index.json").is_file() and not (ckpt / "model.safetensors").exists()
        assert all(p.stat().st_size <= 1000 * int(shard[:-2]) + 8192 for p in ckpt.glob("model-*.safetensors"))
    uninterrupted = _state(trainer.model)
    resumed, _ = make(tiny_model_dir, tiny_tok, tmp_path / "resumed", shard, **steps)
    with torch.no_grad():
        for p in resumed.model.parameters(): p.add_(1.0)  # unlike checkpoint-1: only its shards can bring it back
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert resumed.state.global_step == 2
    got = _state(resumed.model)
    # same rows, order, optimiser and RNG state: equal but for the order of float sums (CPU, one batch per step)
    assert all(torch.allclose(got[k], uninterrupted[k], atol=1e-6, rtol=0) for k in uninterrupted)


def _biggest(tiny_tok) -> tuple[str, int]:
    sizes = _tensor_sizes(tiny_tok)
    name = max(sizes, key=sizes.get)
    return name, sizes[name]


@pytest.mark.parametrize("make", [_aligner, _repnoise], ids=["aligner", "repnoise"])
def test_a_size_below_the_largest_tensor_gives_it_a_shard_as_save_pretrained_does(tiny_model_dir, tiny_tok, tmp_path,
                                                                                  make):
    """A `save_max_shard_size` below the largest tensor (issue 48): accepted, and the final save and the checkpoints
    are the files and index transformers' `save_pretrained` writes at that size, the largest tensors in shards of
    their own; `"20KiB"`, which transformers' own parser refuses, means 20,480 bytes to both."""
    _, size = _biggest(tiny_tok)
    assert size > 20 * 1024
    steps = dict(max_steps=1, save_strategy="steps", save_steps=1)
    trainer, _ = make(tiny_model_dir, tiny_tok, tmp_path / "run", "20KiB", **steps)
    trainer.train()
    trainer.save_model()
    trainer.model.save_pretrained(tmp_path / "stock", max_shard_size=20 * 1024)
    index = "model.safetensors.index.json"
    want = (tmp_path / "stock" / index).read_text()
    assert len(set(json.loads(want)["weight_map"].values())) > 3
    for folder in (tmp_path / "run", tmp_path / "run" / "checkpoint-1"):
        assert (folder / index).read_text() == want, folder
        assert sorted(p.name for p in folder.glob("model-*")) == sorted(p.name for p in (tmp_path / "stock").glob(
            "model-*"))


@pytest.mark.parametrize("make", [_aligner, _repnoise], ids=["aligner", "repnoise"])
def test_a_shard_size_changed_after_init_is_refused_when_train_starts(tiny_model_dir, tiny_tok, tmp_path, make):
    "`args` changed between the trainer's `__init__` and `train()` to an invalid size: refused before the first step."
    trainer, _ = make(tiny_model_dir, tiny_tok, tmp_path / "run", "5GB", save_strategy="steps", save_steps=1)
    before = _state(trainer.model)
    trainer.args.save_max_shard_size = "-1GB"
    with pytest.raises(ValueError, match=r"save_max_shard_size: max_shard_size '-1GB' is invalid"):
        trainer.train()
    assert trainer.state.global_step == 0 and not list((tmp_path / "run").glob("checkpoint-*"))
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


@pytest.mark.filterwarnings("ignore:PiSSA changes the base weights", "ignore:init_pissa replaced")
def test_an_adapters_trainer_is_not_sharded(tiny_model_dir, tiny_tok, tmp_path):
    """PiSSA writes a PEFT adapter (one file): with a shard size below the base's largest tensor, its checkpoint is
    PEFT's `adapter_model.safetensors`, unsharded, as before."""
    import datasets

    from adaptkit.pissa import PiSSATrainer
    rows = datasets.Dataset.from_list([{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(4)])
    args = PiSSAConfig(str(tmp_path / "run"), pissa_r=2, max_steps=1, save_strategy="steps", save_steps=1,
                       use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4, save_max_shard_size="1KB")
    trainer = PiSSATrainer(str(tiny_model_dir), args, rows, processing_class=tiny_tok)
    trainer.train()
    ckpt = tmp_path / "run" / "checkpoint-1"
    assert (ckpt / "adapter_model.safetensors").is_file()
    assert not list(ckpt.glob("*.safetensors.index.json")) and not list(ckpt.glob("model*.safetensors"))
