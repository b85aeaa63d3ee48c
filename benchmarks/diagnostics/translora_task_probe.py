"""Which task and direction leave Trans-LoRA headroom? The measurement that chose tutorial 13's setting.

Issue 34 asks for a generative, exact-match task where the source LoRA beats the target trained on the 5 seeds alone by
at least 10 points. For a + b / a - b with a, b in 0..20 ('Question: a op b = ?\\nAnswer:', the first number of the
greedy answer must be the result), and for each of SmolLM2-135M-Instruct and Gemma-3-270M, it trains LoRA r=8
(all linear layers, lr 5e-4, batch 8, seed 0) on: the 5 seeds (16 steps), 128 real rows (16 steps: the student's
budget with perfect labels) and 320 real rows (40 steps: the source LoRA's budget), and scores 200 held-out questions.
The split is tutorial 13's (shuffle of the 882 questions with seed 0: test first, then the source rows).
Not a timing benchmark (so not under `make bench`); about 10 minutes alone on 2 cores.
Run: .venv/bin/python benchmarks/diagnostics/translora_task_probe.py   -> benchmarks/results/translora_task_probe.json
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
import numpy as np
import torch
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _bench, shared by every benchmark
from _bench import code_commit  # noqa: E402

from adaptkit.models import gemma3_270m, load_causal_lm, load_tokenizer, smollm2  # noqa: E402
from adaptkit.translora import generate_texts  # noqa: E402

warnings.filterwarnings("ignore"); torch.set_num_threads(2); torch.manual_seed(0)
OUT = Path(__file__).resolve().parents[1] / "results" / "translora_task_probe.json"
CPU = {"use_cpu": True, "disable_tqdm": True, "bf16": False, "gradient_checkpointing": False, "report_to": "none"}


def row(q):
    a, op, b = q
    r = a + b if op == "+" else a - b
    return {"prompt": f"Question: {a} {op} {b} = ?\nAnswer:", "completion": f" {r}", "answer": str(r)}


qs = [(a, op, b) for a in range(21) for b in range(21) for op in "+-"]
random.Random(0).shuffle(qs)
rows = [row(q) for q in qs]
test, src, seeds = rows[:200], rows[200:520], rows[600:605]


def accuracy(model, tok):
    out = generate_texts(model, tok, [r["prompt"] for r in test], batch_size=50, max_new_tokens=4, progress=False)
    return float(np.mean([(m := re.search(r"-?\d+", a)) is not None and m.group() == r["answer"]
                          for a, r in zip(out, test)]))


def lora(path, tok, data, steps):
    "A LoRA on `path` trained `steps` steps of batch 8 on `data`; the model and the training seconds."
    t = time.perf_counter()
    trainer = SFTTrainer(
        model=load_causal_lm(path), processing_class=tok,
        train_dataset=datasets.Dataset.from_list([{k: r[k] for k in ("prompt", "completion")} for r in data]),
        args=SFTConfig("/tmp/translora-probe", max_steps=steps, per_device_train_batch_size=8, learning_rate=5e-4,
                       save_strategy="no", seed=0, logging_steps=steps, **CPU),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainer.train()
    return trainer.model.eval(), time.perf_counter() - t


gemma = gemma3_270m()
t0, load_at_start = time.perf_counter(), os.getloadavg()
result = {**code_commit(), "task": "a + b / a - b, a and b in 0..20, exact match of the first number",
          "n_test": len(test), "lora": {"r": 8, "alpha": 16, "lr": 5e-4, "batch": 8, "seed": 0}, "accuracy": {},
          "train_seconds": {}}
for name, path in (("SmolLM2-135M-Instruct", smollm2()), ("Gemma-3-270M", gemma)):
    tok = load_tokenizer(path)
    result["accuracy"][f"{name} base"] = accuracy(load_causal_lm(path), tok)
    for label, data, steps in (("5 seeds, 16 steps", seeds, 16), ("128 real, 16 steps", src[:128], 16),
                               ("320 real, 40 steps", src, 40)):
        model, seconds = lora(path, tok, data, steps)
        result["accuracy"][f"{name} + {label}"] = accuracy(model, tok)
        result["train_seconds"][f"{name} + {label}"] = round(seconds, 1)
        print(f"{name} + {label}: {result['accuracy'][f'{name} + {label}']:.3f}", flush=True)
acc = result["accuracy"]
result["headroom"] = {
    "SmolLM2 -> Gemma (source 320 real - target 5 seeds)":
        acc["SmolLM2-135M-Instruct + 320 real, 40 steps"] - acc["Gemma-3-270M + 5 seeds, 16 steps"],
    "Gemma -> SmolLM2 (source 320 real - target 5 seeds)":
        acc["Gemma-3-270M + 320 real, 40 steps"] - acc["SmolLM2-135M-Instruct + 5 seeds, 16 steps"]}
result.update(torch_threads=torch.get_num_threads(), load_average_at_start=[round(x, 2) for x in load_at_start],
              load_average_at_end=[round(x, 2) for x in os.getloadavg()], wall_seconds=round(time.perf_counter() - t0))
OUT.write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result["headroom"], indent=1))
