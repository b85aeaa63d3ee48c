"""Issue 37: every method config has `save_max_shard_size` (on the shared base, `MethodConfig`), checked when the config
is made; a trainer's final save of a full model honours it: shards and an index as transformers writes them, loadable
by the artifact's class and by stock transformers."""
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, HfArgumentParser

from adaptkit.aligner import Aligner, AlignerConfig, AlignerTrainer
from adaptkit.models import tiny_causal_lm
from adaptkit.pissa import PiSSAConfig
from adaptkit.repnoise import ImmunisedModel, RepNoiseConfig, RepNoiseTrainer
from adaptkit.translora import DiscriminatorConfig, DistillationConfig

CONFIGS = [AlignerConfig, PiSSAConfig, RepNoiseConfig, DiscriminatorConfig, DistillationConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_method_config_takes_save_max_shard_size_checked_when_made(cls):
    assert cls("x", use_cpu=True).save_max_shard_size == "5GB"  # transformers' save_pretrained default
    parsed, = HfArgumentParser(cls).parse_args_into_dataclasses(
        ["--output_dir", "x", "--use_cpu", "--save_max_shard_size", "200MB"], return_remaining_strings=False)
    assert parsed.save_max_shard_size == "200MB"  # the CLI's flag
    with pytest.raises(ValueError, match="save_max_shard_size: max_shard_size '5 gigs': expected bytes"):
        cls("x", use_cpu=True, save_max_shard_size="5 gigs")  # before any model is loaded or trained


def _aligner(tiny_model_dir, tiny_tok, out, shard):
    rows = [{"question": f"What is {i} + 1?", "answer": "?", "correction": f"{i + 1}."} for i in range(4)]
    args = AlignerConfig(str(out), max_steps=1, per_device_train_batch_size=4, identity_warmup_ratio=0.0,
                         save_strategy="no", use_cpu=True, disable_tqdm=True, save_max_shard_size=shard)
    return AlignerTrainer(str(tiny_model_dir), args, rows, processing_class=tiny_tok), Aligner


def _repnoise(tiny_model_dir, tiny_tok, out, shard):
    rows = [{"prompt": f"how do I do task {i}", "harmful": f"here is how {i}", "harmless": "sorry, no"}
            for i in range(4)]
    args = RepNoiseConfig(str(out), max_steps=1, per_device_train_batch_size=4, save_strategy="no", use_cpu=True,
                          disable_tqdm=True, max_length=32, save_max_shard_size=shard)
    return RepNoiseTrainer(tiny_causal_lm(tiny_tok), args, rows, processing_class=tiny_tok), ImmunisedModel


@pytest.mark.parametrize("make", [_aligner, _repnoise], ids=["aligner", "repnoise"])
def test_a_trainers_final_save_is_sharded_at_save_max_shard_size(tiny_model_dir, tiny_tok, tmp_path, make):
    "A trained model saved in shards of at most `save_max_shard_size`, with an index; it loads back, weights equal."
    sizes = {k: v.nbytes for k, v in tiny_causal_lm(tiny_tok).state_dict().items()}
    shard = f"{math.ceil(max(sizes.values()) / 1000)}KB"  # the largest tensor fits; the model takes several shards
    assert sum(sizes.values()) > 3 * max(sizes.values())
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
    "Below transformers' 5GB default, a model is one file, as before."
    trainer, _ = _aligner(tiny_model_dir, tiny_tok, tmp_path / "run", "5GB")
    trainer.save_model()
    assert (tmp_path / "run" / "model.safetensors").is_file() and not list((tmp_path / "run").glob("model-*"))
