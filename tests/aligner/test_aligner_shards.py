"""The Aligner's full models in shards of `save_max_shard_size` (issue 37, item 1): `AlignerTrainer` refuses an invalid
size before its identity warm-up; `dpo_rounds` saves, pushes and checkpoints each round's policy at
`AlignerDPOConfig.save_max_shard_size`, refuses an invalid size before generating anything, and still takes a plain
TRL `DPOConfig`. A size below the largest tensor gives that tensor a shard of its own
(tests/core/test_trainer_shards)."""
import json
import re

import pytest
import torch
from huggingface_hub import HfApi

from adaptkit.aligner import AlignedPolicy, Aligner, AlignerConfig, AlignerDPOConfig, AlignerTrainer, dpo_rounds
from adaptkit.aligner import dpo as dpo_module
from adaptkit.models import tiny_causal_lm

ROWS = [{"question": f"What is {i} plus {i}?", "answer": f"It is {2 * i + 1}.",
         "correction": f"{i} plus {i} is {2 * i}."} for i in range(8)]
PROMPTS = ["What is 1 + 1?", "What is 2 + 2?", "Name a colour."]
SMALL = "70KB"  # the tiny model's largest tensors (embeddings, LM head) are 65,536 bytes each: several shards
INVALID = "-1GB"


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _sharded(files) -> bool:
    "An index and more than one `model-0000x-of-0000n.safetensors` shard, as transformers writes them."
    names = [str(f).rsplit("/", 1)[-1] for f in files]
    shards = [n for n in names if re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", n)]
    return "model.safetensors.index.json" in names and len(shards) > 1 and "model.safetensors" not in names


def test_aligner_trainer_refuses_a_shard_size_changed_after_init_before_the_warmup(tiny_tok, tmp_path):
    "A `save_max_shard_size` set on `args` after `__init__`: `train()` refuses it before a warm-up step is taken."
    args = AlignerConfig(str(tmp_path / "run"), identity_warmup_ratio=0.25, max_steps=1, per_device_train_batch_size=4,
                         learning_rate=1e-2, save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = AlignerTrainer(tiny_causal_lm(tiny_tok), args, ROWS, processing_class=tiny_tok)
    assert len(trainer.warmup) == 2
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.args.save_max_shard_size = INVALID  # set after the config checked it
    with pytest.raises(ValueError, match=r"save_max_shard_size: max_shard_size '-1GB' is invalid"):
        trainer.train()
    assert not hasattr(trainer, "warmup_log")  # the warm-up did not run
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())  # nor changed a weight


def test_dpo_rounds_saves_pushes_and_checkpoints_the_policy_in_shards(hub, tiny_tok, tmp_path):
    "A small `save_max_shard_size`: the round's checkpoint, the pushed policy and the returned one are sharded."
    args = AlignerDPOConfig(str(tmp_path / "dpo"), learning_rate=1e-3, max_steps=1, per_device_train_batch_size=2,
                            save_strategy="steps", save_steps=1, use_cpu=True, disable_tqdm=True,
                            save_max_shard_size=SMALL)
    aligner = Aligner(tiny_causal_lm(tiny_tok, seed=1), tiny_tok)  # untrained: its corrections differ from the answers
    trained = dpo_rounds(tiny_causal_lm(tiny_tok, seed=3), tiny_tok, aligner, PROMPTS, rounds=1, args=args,
                         push_to="team/policy", hub_endpoint=hub.endpoint, max_new_tokens=4)
    assert trained.rounds[0]["pairs"] > 0 and trained.settings["beta"] == 0.02  # AlignerDPOConfig's
    checkpoint = tmp_path / "dpo" / "round-1" / "checkpoint-1"
    assert _sharded(checkpoint.iterdir()), sorted(p.name for p in checkpoint.iterdir())
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(trained.model.state_dict())
    files = HfApi(endpoint=hub.endpoint).list_repo_files("team/policy", revision="round-1")
    assert _sharded(files), files
    pulled = AlignedPolicy.from_pretrained("team/policy", endpoint=hub.endpoint, revision="round-1")
    assert _equal(pulled.model, trained.model)
    saved = trained.save_pretrained(tmp_path / "policy")
    assert _sharded(saved.iterdir()) and _equal(AlignedPolicy.from_pretrained(saved).model, trained.model)


def test_dpo_rounds_refuses_an_invalid_shard_size_before_generating(tiny_tok, tmp_path, monkeypatch):
    "An invalid size set after the config checked it: refused naming the option, before anything generates."
    policy = tiny_causal_lm(tiny_tok)
    def generate(*args, **kwargs): raise AssertionError("the policy generated before the shard size was checked")
    monkeypatch.setattr(policy, "generate", generate)
    class NoAligner(Aligner):
        def correct(self, *args, **kwargs): raise AssertionError("the aligner ran before the shard size was checked")
    with pytest.raises(ValueError, match=r"save_max_shard_size: max_shard_size '-1GB' is invalid"):
        AlignerDPOConfig(str(tmp_path / "dpo"), max_steps=1, use_cpu=True, save_max_shard_size=INVALID)
    args = AlignerDPOConfig(str(tmp_path / "dpo"), max_steps=1, use_cpu=True)
    args.save_max_shard_size = INVALID
    with pytest.raises(ValueError, match=r"save_max_shard_size: max_shard_size '-1GB' is invalid"):
        dpo_rounds(policy, tiny_tok, NoAligner(tiny_causal_lm(tiny_tok), tiny_tok), PROMPTS, rounds=1, args=args)


def test_dpo_rounds_defaults_to_AlignerDPOConfig(tiny_tok, monkeypatch, tmp_path):
    "No `args`: the rounds train with `AlignerDPOConfig` (beta 0.02, lr 2e-5, no checkpoints, its shard size)."
    seen = []
    class Stop(Exception): pass
    class Recording(dpo_module.DPOTrainer):
        def __init__(self, *a, args, **k): seen.append(args); raise Stop
    monkeypatch.setattr(dpo_module, "DPOTrainer", Recording)
    monkeypatch.chdir(tmp_path)
    aligner = Aligner(tiny_causal_lm(tiny_tok, seed=1), tiny_tok)
    with pytest.raises(Stop):
        dpo_rounds(tiny_causal_lm(tiny_tok, seed=3), tiny_tok, aligner, PROMPTS, rounds=1, max_new_tokens=4)
    (args,) = seen
    assert isinstance(args, AlignerDPOConfig) and args.output_dir == "aligner-dpo/round-1"
    assert (args.beta, args.learning_rate, args.save_strategy, args.report_to) == (0.02, 2e-5, "no", [])
    assert args.save_max_shard_size == "5GB"


def test_dpo_rounds_still_takes_a_plain_DPOConfig(tiny_tok, tmp_path):
    """A plain TRL `DPOConfig` (no `save_max_shard_size`): the rounds run as before, and the policy is written at
    `AlignedPolicy`'s default, one file for this model."""
    from trl import DPOConfig
    args = DPOConfig(str(tmp_path / "dpo"), beta=0.02, learning_rate=1e-3, max_steps=1, per_device_train_batch_size=2,
                     report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, bf16=False)
    aligner = Aligner(tiny_causal_lm(tiny_tok, seed=1), tiny_tok)
    trained = dpo_rounds(tiny_causal_lm(tiny_tok, seed=3), tiny_tok, aligner, PROMPTS, rounds=1, args=args,
                         max_new_tokens=4)
    assert trained.rounds[0]["pairs"] > 0 and trained.max_shard_size == AlignedPolicy.max_shard_size == "5GB"
    saved = trained.save_pretrained(tmp_path / "policy")
    assert (saved / "model.safetensors").is_file() and not (saved / "model.safetensors.index.json").exists()
    assert _equal(AlignedPolicy.from_pretrained(saved).model, trained.model)
