"""Why the bare-number aligner of tutorial 11 (run of 2026-11-25) wrote empty corrections: the EOS diagnosis.

Re-trains that run's aligners (the correction is the bare right number, seed 0, identity warm-up 0/20/50%, the same
142/100 split of reasoning-gym's two-term 0-10 +/- questions, 24 LoRA steps at lr 2e-4) and measures:
- at the first generated position, P(EOS) against the largest P(digit token), one plain forward pass per test prompt;
- the loss on the number's tokens and on EOS after every step, on a fixed probe of 28 training rows;
- one run (warm-up 0%) with a pad token other than EOS (`<|endoftext|>`), to rule masking in or out;
- that the prompt ids `Aligner.correct` feeds equal those `aligner_rows` trains on, and that batched shared-prefix
  decoding gives the same corrections as plain left-padded batches.
Not a timing benchmark (so not under `make bench`); about 20 minutes alone on 2 cores.
Run: .venv/bin/python benchmarks/diagnostics/aligner_eos.py   -> benchmarks/results/aligner_eos.json
"""
import json
import os
import random
import re
import sys
import time
import warnings
from pathlib import Path

import datasets
import reasoning_gym
import torch
import transformers
from peft import LoraConfig
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _bench, shared by every benchmark
from _bench import code_commit  # noqa: E402

from adaptkit.aligner import (  # noqa: E402
    ALIGNER_V1_TEMPLATE,
    AlignerConfig,
    AlignerTrainer,
    aligner_rows,
    format_aligner_prompt,
)
from adaptkit.data import QAC, load_rows  # noqa: E402
from adaptkit.models import generate_batched, load_causal_lm, load_tokenizer, smollm2  # noqa: E402
from adaptkit.tasks import arithmetic_prompts  # noqa: E402

warnings.filterwarnings("ignore"); datasets.disable_progress_bars(); transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(2)
RESULT = Path(__file__).parents[1] / "results" / "aligner_eos.json"
WARMUPS, STEPS, BATCH, LR, R = [0.0, 0.2, 0.5], 24, 8, 2e-4, 16


def split():
    "The last run's split: every distinct two-term 0-10 +/- question, 100 test and 142 training, disjoint."
    ds = reasoning_gym.create_dataset("basic_arithmetic", size=4000, seed=0, min_terms=2, max_terms=2, min_digits=1,
                                      max_digits=1, operators=("+", "-"), allow_parentheses=False)
    items = sorted({x["question"]: str(x["answer"]) for x in ds}.items())
    random.Random(0).shuffle(items)
    rows = [{"question": q, "answer": a} for q, a in items]
    return rows[100:], rows[:100]


@torch.no_grad()
def split_loss(model, rows, eos_id):
    "Mean cross-entropy on the number's tokens and on EOS, over the labelled positions of `rows`."
    was, losses = model.training, {"number_loss": [], "eos_loss": []}
    model.eval()
    for r in rows:
        logp = model(input_ids=torch.tensor([r["input_ids"]])).logits[0, :-1].float().log_softmax(-1)
        for j, t in enumerate(r["labels"][1:]):
            if t != -100: losses["eos_loss" if t == eos_id else "number_loss"].append(-logp[j, t].item())
    model.train(was)
    return {k: sum(v) / len(v) for k, v in losses.items()}


class LossSplit(TrainerCallback):
    "After every optimizer step: `split_loss` on a fixed probe of training rows."
    def __init__(self, rows, eos_id): self.rows, self.eos_id, self.log = rows, eos_id, []
    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.log.append({"step": state.global_step, **split_loss(model, self.rows, self.eos_id)})


@torch.no_grad()
def first_position(model, tok, prompts, digit_ids):
    "P(EOS) and the largest P(digit) at the first generated position, one unpadded forward pass per prompt."
    model.eval()
    probs = [model(input_ids=torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])).logits[0, -1].float()
             .softmax(-1) for p in prompts]
    p_eos, p_digit = [p[tok.eos_token_id].item() for p in probs], [p[digit_ids].max().item() for p in probs]
    return {"p_eos_mean": sum(p_eos) / len(p_eos), "p_max_number_mean": sum(p_digit) / len(p_digit),
            "eos_wins": sum(e > d for e, d in zip(p_eos, p_digit)),
            "eos_argmax": sum(int(p.argmax()) == tok.eos_token_id for p in probs), "n": len(probs),
            "p_eos": p_eos, "p_max_number": p_digit}


def run(folder, tok, qac, test, up_test, warmup):
    "One bare-number aligner: its loss split over the steps, its first-position masses, its corrections."
    transformers.set_seed(0)
    rows = aligner_rows(load_rows(qac, QAC), ALIGNER_V1_TEMPLATE, tok)
    probe = [rows[i] for i in range(0, len(rows), 5)][:28]
    args = AlignerConfig(f"/tmp/aligner-eos/{tok.pad_token_id}-{warmup}", identity_warmup_ratio=warmup, max_steps=STEPS,
                         per_device_train_batch_size=BATCH, learning_rate=LR, seed=0, data_seed=0, logging_steps=6,
                         save_strategy="no", disable_tqdm=True, use_cpu=True, gradient_checkpointing=False)
    lora = LoraConfig(r=R, lora_alpha=R, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = AlignerTrainer(load_causal_lm(folder), args, qac, processing_class=tok, peft_config=lora)
    callback = LossSplit(probe, tok.eos_token_id)
    trainer.add_callback(callback)
    before = split_loss(trainer.model, probe, tok.eos_token_id)
    t = time.perf_counter(); trainer.train(); seconds = time.perf_counter() - t
    prompts = [format_aligner_prompt(r["question"], a, ALIGNER_V1_TEMPLATE) for r, a in zip(test, up_test)]
    digits = [i for i, s in enumerate(tok.batch_decode([[i] for i in range(len(tok))])) if re.fullmatch(r"\s?\d+", s)]
    fp = first_position(trainer.model, tok, prompts, digits)
    outs = {shared: generate_batched(trainer.model, tok, prompts, batch_size=25, max_new_tokens=8, progress=False,
                                     share_prefix=shared) for shared in (True, False)}
    trained = aligner_rows(load_rows([{"question": r["question"], "answer": a, "correction": r["answer"]}
                                      for r, a in zip(test, up_test)], QAC), ALIGNER_V1_TEMPLATE, tok)
    n_prompt = lambda labels: next(j for j, x in enumerate(labels) if x != -100)
    inferred = tok(prompts, add_special_tokens=False)["input_ids"]
    return {"warmup": warmup, "seed": 0, "pad_token": tok.pad_token, "pad_token_id": tok.pad_token_id,
            "train_seconds": seconds, "loss_before": before, "loss_by_step": callback.log,
            "warmup_rows": len(trainer.warmup), "steps": trainer.state.global_step, "first_position": fp,
            "empty": sum(not c.strip() for c in outs[True]), "empty_unshared": sum(not c.strip() for c in outs[False]),
            "shared_equals_unshared": outs[True] == outs[False],
            "prompt_tokens_equal": all(r["input_ids"][:n_prompt(r["labels"])] == i for r, i in zip(trained, inferred)),
            "digit_tokens": len(digits), "corrections": outs[True]}


def main():
    t0, load, commit = time.perf_counter(), os.getloadavg(), code_commit()
    folder = smollm2(); tok = load_tokenizer(folder); upstream = load_causal_lm(folder)
    train, test = split()
    answer = lambda rows: generate_batched(upstream, tok, arithmetic_prompts(tok, rows), batch_size=25,
                                           max_new_tokens=16, progress=False)
    up_train, up_test = answer(train), answer(test)
    qac = [{"question": r["question"], "answer": a, "correction": r["answer"]} for r, a in zip(train, up_train)]
    runs = [run(folder, tok, qac, test, up_test, w) for w in WARMUPS]
    other_pad = load_tokenizer(folder); other_pad.pad_token = "<|endoftext|>"
    runs.append(run(folder, other_pad, qac, test, up_test, 0.0))
    RESULT.write_text(json.dumps({**commit, "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
                                  "runs": runs, "torch_threads": torch.get_num_threads(),
                                  "load_average_at_start": list(load), "load_average_at_end": list(os.getloadavg()),
                                  "wall_seconds": time.perf_counter() - t0}, indent=1))
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
