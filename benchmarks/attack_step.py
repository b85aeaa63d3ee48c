"""The harmful fine-tuning attack's step (`adaptkit.repnoise.harness.finetuned_copy`, full fine-tuning of SmolLM2-135M
in fp32 on one torch thread, as in a demo lane) against the loop it replaced, in one process on the same rows:
- `earlier`: the model's own loss (the LM head at every position) and torch's default (for-each) AdamW;
- `fused_adamw`: `finetuned_copy(..., compact_lm_head=False)`: the every-position loss, fused AdamW (transformers'
  default);
- `finetuned_copy`: its default, fused AdamW and TRL's LM head at the answer positions only.
Each variant trains copies of the model for `STEPS` steps `REPEATS` times, the variants taking turns; the time per step
is the median over repeats of a copy's steps after its first. Batches of 8 rows drawn as finetuned_copy draws them.
Writes benchmarks/results/attack_step.json through `_bench.write_result` (which waits for a quiet machine first).
Run: .venv/bin/python benchmarks/attack_step.py"""
import copy
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).parent))
from _bench import quiet_start, write_result  # noqa: E402

BATCH, STEPS, REPEATS, MAX_LENGTH = 8, 4, 3, 72  # the demo's refusal training: batch 8, prompt + answer in 72 tokens
warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def rows(n):
    "Neutral placeholder rows (no harmful text is needed to time a step): ~25-token prompts, ~20-token answers."
    return [{"prompt": f"Please explain, in a few sentences, how step number {i} of the assembly of a wooden "
                       "bookshelf works.",
             "harmful": f"Step {i}: align the pre-drilled holes with the shelf and tighten each screw."}
            for i in range(n)]


def earlier_loop(model, data, tok, steps):
    "finetuned_copy's loop before the change: the model's own loss, the default AdamW."
    from adaptkit.repnoise.trainer import encode_answer, pad_answers
    encoded = [encode_answer(tok, r["prompt"], r["harmful"], MAX_LENGTH, i) for i, r in enumerate(data)]
    tuned, rng = copy.deepcopy(model), random.Random(0)
    tuned.train()
    opt = torch.optim.AdamW(tuned.parameters(), lr=1e-5, weight_decay=0.0)
    for _ in range(steps):
        batch = pad_answers(tok, [encoded[rng.randrange(len(encoded))] for _ in range(BATCH)])
        tuned(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main():
    from adaptkit.models import load_causal_lm, load_tokenizer, smollm2
    from adaptkit.repnoise import harness
    folder = smollm2()
    model, tok, data = load_causal_lm(folder), load_tokenizer(folder), rows(32)
    start = quiet_start()
    stamps = []  # the end of every optimiser step, of any variant (torch's global step hook)
    hook = register_optimizer_step_post_hook(lambda *_: stamps.append(time.perf_counter()))
    copy_run = lambda compact: harness.finetuned_copy(model, data, tokenizer=tok, column="harmful", lr=1e-5,
                                                      steps=STEPS, seed=0, batch_size=BATCH, max_length=MAX_LENGTH,
                                                      compact_lm_head=compact)
    variants = {"earlier": lambda: earlier_loop(model, data, tok, STEPS),
                "fused_adamw": lambda: copy_run(False), "finetuned_copy": lambda: copy_run(True)}
    seconds = {k: [] for k in variants}
    for _ in range(REPEATS):
        for name, fn in variants.items():
            stamps.clear()
            fn()
            seconds[name].append(statistics.median([b - a for a, b in zip(stamps, stamps[1:])]))  # after the first
            print(name, [round(s, 3) for s in seconds[name]], flush=True)
    hook.remove()
    med = {k: statistics.median(v) for k, v in seconds.items()}
    write_result("attack_step", {
        "model": "SmolLM2-135M-Instruct (fp32, all weights trained)", "batch": BATCH, "max_length": MAX_LENGTH,
        "steps_per_copy": STEPS, "repeats": REPEATS, "step_seconds": seconds, "median_step_s": med,
        "fused_adamw_vs_earlier": round(med["fused_adamw"] / med["earlier"], 3),
        "finetuned_copy_vs_earlier": round(med["finetuned_copy"] / med["earlier"], 3),
        "note": "a step's seconds: from the end of one optimiser step to the end of the next (the copy's first step, "
                "with its warm-up, left out); medians over repeats of each copy's median step",
    }, start)


if __name__ == "__main__":
    main()
