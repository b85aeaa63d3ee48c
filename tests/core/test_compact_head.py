"""TRL's fused LM head projecting only the labelled positions on a CPU (`adaptkit.config.compact_lm_head`; every SFT
trainer through `CompactHeadMixin`): on right-padded rows with prompts and completions of different lengths the loss,
every gradient and TRL's metrics are those of TRL's every-position path and of a hand-computed cross-entropy, one step
with gradient accumulation moves the weights the same, the head projects one row per label, `compact_lm_head=False`
gives TRL's path back, and each trainer built on `SFTTrainer` trains with it."""
import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import trl.trainer.utils as trl_utils
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer
from trl.kernels import ChunkedLogProbFunction

from adaptkit.config import CompactHeadMixin, SFTMethodConfig, compact_lm_head
from adaptkit.models import tiny_causal_lm

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_trainers.py"
_spec = importlib.util.spec_from_file_location("ddp_trainers", SCRIPT)
ddp = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(ddp)  # every trainer, built on tiny models

# prompts of 3 to 6 words' tokens and completions of 1 to 3 words: the collator pads each batch on the right
ROWS = [{"prompt": "the a of " * (1 + i % 4) + f"what is {i} plus {i}?", "completion": f" {2 * i}" + " ok" * (i % 3)}
        for i in range(8)]


@dataclasses.dataclass
class Config(SFTMethodConfig, SFTConfig):
    "An SFT method's config."


class Trainer(CompactHeadMixin, SFTTrainer):
    "An SFT trainer with the compact head."


@pytest.fixture
def head_calls(monkeypatch):
    "`[rows projected, positions with a label, positions]` of each call of TRL's fused LM head, in order."
    calls, apply, output = [], ChunkedLogProbFunction.apply, trl_utils.FusedCausalLMOutput
    def projected(hidden, *args):
        calls.append([hidden.shape[0]])
        return apply(hidden, *args)
    def returned(**fields):
        calls[-1] += [int(fields["label_mask"].sum()), fields["label_mask"].numel()]
        return output(**fields)
    monkeypatch.setattr(ChunkedLogProbFunction, "apply", projected)
    monkeypatch.setattr(trl_utils, "FusedCausalLMOutput", returned)
    return calls


def _trainer(tok, out, model_type="llama", lora=True, **kw):
    "A `CompactHeadMixin` SFT trainer of `ROWS` on a tiny model (seeded, so two of them start the same)."
    import datasets
    model = tiny_causal_lm(tok, model_type=model_type)
    if model_type == "gemma3_text": model.config.final_logit_softcapping = 3.0  # TRL's head and the model's cap it
    args = Config(str(out), use_cpu=True, report_to="none", disable_tqdm=True, bf16=False,
                  **{"per_device_train_batch_size": 8, "max_steps": 1, **kw})
    torch.manual_seed(0)  # the LoRA's draw; B random too (not zeros), so every LoRA weight has a gradient
    peft = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False) if lora else None
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(ROWS), processing_class=tok,
                      peft_config=peft)
    trainer.model.train()
    return trainer


def _trained(model) -> dict:
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def _hand_loss(model, batch) -> torch.Tensor:
    "Cross-entropy of the full logits against the next token, over the positions with a label."
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100,
                           reduction="sum")


def _step(trainer, batch, on: bool):
    "(loss, gradients, TRL's metrics, tokens counted) of one `compute_loss` and backward, the head compact or not."
    trainer.args.compact_lm_head = on
    trainer.model.zero_grad()
    trainer._metrics["train"].clear()
    tokens = trainer._total_train_tokens
    loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=(batch["labels"][:, 1:] != -100).sum())
    loss.backward()
    grads = {k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = {k: v for k, v in trainer._metrics["train"].items() if k != "num_tokens"}
    return loss.detach(), grads, metrics, trainer._total_train_tokens - tokens


@pytest.mark.parametrize("model_type,lora", [("llama", True), ("gemma3_text", True), ("llama", False)])
def test_loss_gradients_and_metrics_are_trls_from_one_row_per_label(tiny_tok, tmp_path, head_calls, model_type, lora):
    trainer = _trainer(tiny_tok, tmp_path, model_type, lora)
    batch = next(iter(trainer.get_train_dataloader()))
    mask, labels = batch["attention_mask"], batch["labels"]
    assert len(set(mask.sum(1).tolist())) > 2 and (mask[:, -1] == 0).any() and (mask[:, 0] == 1).all()  # right pads
    first = (labels != -100).int().argmax(1)
    assert len(set(first.tolist())) > 2 and len(set((labels != -100).sum(1).tolist())) > 1  # prompts, completions
    full, compact = _step(trainer, batch, False), _step(trainer, batch, True)
    labelled, positions = int((labels[:, 1:] != -100).sum()), labels[:, 1:].numel()
    assert head_calls == [[positions, labelled, positions], [labelled, labelled, positions]]  # TRL's, then compact
    with torch.no_grad(): hand = _hand_loss(trainer.model, batch) / labelled
    torch.testing.assert_close(compact[0], full[0])
    torch.testing.assert_close(full[0], hand)
    assert compact[1].keys() == full[1].keys() and len(full[1]) >= 2
    for name, grad in full[1].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(compact[1][name], grad, msg=lambda m, name=name: f"{name}: {m}")
    assert set(full[2]) == {"entropy", "mean_token_accuracy"}
    torch.testing.assert_close(compact[2], full[2])
    assert compact[3] == full[3] == int(mask.sum())  # num_tokens: the batch's attended tokens


def test_an_accumulated_step_moves_the_weights_as_trls_and_by_hand(tiny_tok, tmp_path, head_calls):
    "SGD at lr 1, no clipping: the update is minus the gradient, normalised over both micro-batches' labels."
    sgd = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, optim="sgd", learning_rate=1.0,
               lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, logging_steps=1)
    moved, logs = {}, {}
    for on in (False, True):
        trainer = _trainer(tiny_tok, tmp_path / str(on), compact_lm_head=on, **sgd)
        start = _trained(trainer.model)
        if not on:  # by hand: all 8 rows at once, summed over their labels, divided by their count
            batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ROWS))])
            n = int((batch["labels"][:, 1:] != -100).sum())
            (_hand_loss(trainer.model, batch) / n).backward()
            by_hand = {k: p.detach() - p.grad for k, p in trainer.model.named_parameters() if p.requires_grad}
            trainer.model.zero_grad()
        trainer.train()
        moved[on] = {k: v - start[k] for k, v in _trained(trainer.model).items()}
        logs[on] = {k: trainer.state.log_history[0][k] for k in ("loss", "entropy", "mean_token_accuracy",
                                                                 "num_tokens")}
        if not on: trained_full = _trained(trainer.model)
    assert [c[0] == c[2] for c in head_calls] == [True, True, False, False]  # TRL's path, then one row per label
    assert all(c[0] == c[1] < c[2] for c in head_calls[2:])
    assert all(d.abs().sum() > 0 for d in moved[True].values())
    for name in moved[False]:
        torch.testing.assert_close(moved[True][name], moved[False][name], msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(trained_full[name], by_hand[name], msg=lambda m, name=name: f"{name}: {m}")
    assert logs[True] == pytest.approx(logs[False])


def test_the_switch_is_trls_outside_the_block_and_on_other_devices(monkeypatch):
    trls = trl_utils._use_triton
    with compact_lm_head(False): assert trl_utils._use_triton is trls
    with pytest.raises(RuntimeError, match="in the block"), compact_lm_head():
        assert trl_utils._use_triton(torch.device("cpu")) and not trl_utils._use_triton(torch.device("meta"))
        with compact_lm_head(): assert trl_utils._use_triton(torch.device("cpu"))
        assert trl_utils._use_triton is not trls and trl_utils._use_triton(torch.device("cpu"))  # the outer one's
        raise RuntimeError("in the block")
    assert trl_utils._use_triton is trls
    monkeypatch.delattr(trl_utils, "_use_triton")  # a TRL without the switch: left without one
    with compact_lm_head(): assert not hasattr(trl_utils, "_use_triton")
    assert not hasattr(trl_utils, "_use_triton")


def _discriminator(model_dir, tok, out, common):
    "Trans-LoRA's discriminator (a plain `SFTTrainer` inside `train_discriminator`), trained here."
    from adaptkit.translora import DiscriminatorConfig, train_discriminator
    keep = ("output_dir", "max_steps", "per_device_train_batch_size", "use_cpu", "disable_tqdm", "compact_lm_head")
    config = DiscriminatorConfig(**{k: common[k] for k in keep})
    return train_discriminator(str(model_dir), tok, [f"apple {i} is green" for i in range(4)],
                               [f"zero {i} minus" for i in range(4)], config)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("name", ["pissa", "aligner", "translora", "discriminator"])
def test_each_sft_trainer_trains_with_it_unless_turned_off(tiny_model_dir, tiny_tok, tmp_path, head_calls, name, on):
    common = ddp._common(tmp_path, 4, 1) | {"compact_lm_head": on}
    if name == "discriminator": _discriminator(tiny_model_dir, tiny_tok, tmp_path, common)
    else: getattr(ddp, name)(tiny_model_dir, tiny_tok, tmp_path, common).train()
    steps = ddp.STEPS + (name == "aligner")  # the aligner's identity warm-up: one step of 4 rows first
    assert len(head_calls) == steps and all(c[1] < c[2] for c in head_calls)
    assert all(c[0] == (c[1] if on else c[2]) for c in head_calls), head_calls
