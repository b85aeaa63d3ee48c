"""Trans-LoRA generation on SmolLM2-135M: synthetic prompts per second when the target base writes them in left-padded
batches vs one at a time (same seeds, same settings), and the time of each stage of a small transfer
(source LoRA -> SmolLM2 target, with a discriminator). Writes benchmarks/results/translora.json.
Run: .venv/bin/python benchmarks/translora_generate.py [--n 16] [--repeats 3]"""
import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import datasets
import torch
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from adaptkit.models import load_causal_lm, load_tokenizer, smollm2
from adaptkit.translora import (DiscriminatorConfig, DistillationConfig, SynthesisConfig, synthesize_prompts, train_discriminator,
                                transfer_lora)

OUT = Path(__file__).parent / "results" / "translora.json"
warnings.filterwarnings("ignore")
CPU = {"use_cpu": True, "disable_tqdm": True, "bf16": False}


def arithmetic(n, seed):
    "Two-term addition/subtraction prompts with answers, as prompt/completion rows."
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice("+-")
        rows.append({"prompt": f"Question: What is {a} {op} {b}?\nAnswer:", "completion": f" {a + b if op == '+' else a - b}"})
    return rows


def generation_rate(model, tok, seeds, cfg, n, batch_size, repeats):
    "Distinct synthetic prompts per second over `repeats` runs (fresh seed each run)."
    runs = []
    for r in range(repeats):
        c = dataclasses.replace(cfg, synthesis_seed=r)
        t = time.perf_counter()
        prompts = synthesize_prompts(model, tok, seeds, c, n=n, batch_size=batch_size, progress=False)
        s = time.perf_counter() - t
        runs.append({"seconds": s, "prompts": len(prompts), "prompts_per_s": len(prompts) / s})
    return {"batch_size": batch_size, "runs": runs, "median_prompts_per_s": statistics.median(r["prompts_per_s"] for r in runs)}


def small_transfer(folder, tok, seeds, n, work: Path):
    "Train a source LoRA (a few steps) and a discriminator, then time transfer_lora's stages."
    t = time.perf_counter()
    train = arithmetic(64, seed=1)
    args = SFTConfig(str(work / "src"), max_steps=8, per_device_train_batch_size=8, learning_rate=5e-4, report_to="none",
                     save_strategy="no", seed=0, **CPU)
    src = SFTTrainer(model=load_causal_lm(folder), args=args, train_dataset=datasets.Dataset.from_list(train), processing_class=tok,
                     peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    src.train(); src.model.save_pretrained(work / "src-lora")
    source_lora_s = time.perf_counter() - t
    synthesis = SynthesisConfig(num_synthetic=n, prompt_max_new_tokens=24, completion_max_new_tokens=6)
    distillation = DistillationConfig(str(work / "tgt-work"), max_steps=4, per_device_train_batch_size=8, **CPU)
    t = time.perf_counter()
    fake = synthesize_prompts(load_causal_lm(folder), tok, seeds, synthesis, progress=False)
    disc = train_discriminator(folder, tok, [r["prompt"] for r in train[:n]], fake,
                               DiscriminatorConfig(str(work / "disc"), num_train_epochs=1, per_device_train_batch_size=8, **CPU))
    disc.save_pretrained(work / "disc-out")
    discriminator_s = time.perf_counter() - t
    res = transfer_lora(folder, work / "src-lora", folder, seeds, output_dir=work / "tgt", discriminator=work / "disc-out",
                        discriminator_base=folder, synthesis=synthesis, distillation=distillation,
                        threshold=0.0)  # keep all: timing, not quality
    return {"source_lora_train_s": source_lora_s, "discriminator_prep_and_train_s": discriminator_s, "threshold": 0.0, "stages_s": res.timings,
            "counts": res.counts, "kept_fraction": res.kept_fraction,
            "settings": {"num_synthetic": n, "prompt_max_new_tokens": 24, "completion_max_new_tokens": 6, "distill_steps": 4,
                         "batch": 8, "source_lora_steps": 8, "target": "SmolLM2-135M-Instruct (same base: timing only)"}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(2)
    load = os.getloadavg()[0]  # the 2 cores are shared: a high load average slows everything below
    folder = smollm2()
    tok, model = load_tokenizer(folder), load_causal_lm(folder)
    seeds = [r["prompt"] for r in arithmetic(5, seed=0)]
    cfg = SynthesisConfig(num_synthetic=a.n, prompt_max_new_tokens=24)
    batched = generation_rate(model, tok, seeds, cfg, a.n, a.n, a.repeats)
    print(f"batched ({a.n}): {batched['median_prompts_per_s']:.2f} prompts/s")
    single = generation_rate(model, tok, seeds, cfg, a.n, 1, a.repeats)
    print(f"one at a time: {single['median_prompts_per_s']:.2f} prompts/s")
    result = {"model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)", "torch_threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "n_prompts": a.n, "repeats": a.repeats,
              "prompt_max_new_tokens": 24, "synthesis": {"batched": batched, "one_at_a_time": single,
              "speedup_batched_vs_single": batched["median_prompts_per_s"] / single["median_prompts_per_s"]},
              "load_average_1min_at_start": load}
    print(f"speedup batched vs one at a time: {result['synthesis']['speedup_batched_vs_single']:.2f}x")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")  # the synthesis numbers first, in case the transfer fails
    with tempfile.TemporaryDirectory() as d:
        result["small_transfer"] = small_transfer(folder, tok, seeds, a.n, Path(d))
    print(json.dumps(result["small_transfer"], indent=2))
    OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
