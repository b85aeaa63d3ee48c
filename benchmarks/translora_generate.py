"""Trans-LoRA generation on SmolLM2-135M: synthetic prompts per second when the target base writes them in left-padded
batches vs one at a time (same seeds, same settings), and the time of each stage of a small transfer
(source LoRA -> SmolLM2 target, with a discriminator). Batched and one-at-a-time synthesis run interleaved with the same
seed in each repeat; medians and the speed-up within each repeat are reported, and the same few-shot prompts continued
greedily batched and one at a time must give equal text (sampling draws differ with the batch, greedy must not).
Run (quiet machine): .venv/bin/python benchmarks/translora_generate.py   -> benchmarks/results/translora.json
Smoke test (loaded), with ADAPTKIT_BENCH_ALLOW_LOADED=1 ADAPTKIT_BENCH_WAIT=0 in the environment:
    .venv/bin/python benchmarks/translora_generate.py --n 8 --repeats 1 --no-transfer"""
import argparse
import dataclasses
import json
import random
import tempfile
import time
import warnings
from pathlib import Path

import datasets
import torch
from _bench import median, quiet_start, write_result
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from adaptkit.models import load_causal_lm, load_tokenizer, smollm2
from adaptkit.translora import (
    DiscriminatorConfig,
    DistillationConfig,
    SynthesisConfig,
    fewshot_prompt,
    generate_texts,
    synthesize_prompts,
    train_discriminator,
    transfer_lora,
)

warnings.filterwarnings("ignore")
CPU = {"use_cpu": True, "disable_tqdm": True, "bf16": False}


def arithmetic(n, seed):
    "Two-term addition/subtraction prompts with answers, as prompt/completion rows."
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice("+-")
        rows.append(
            {"prompt": f"Question: What is {a} {op} {b}?\nAnswer:", "completion": f" {a + b if op == '+' else a - b}"}
        )
    return rows


def synthesis_run(model, tok, seeds, cfg, n, batch_size, seed):
    "Seconds and distinct prompts of one `synthesize_prompts` call."
    t = time.perf_counter()
    prompts = synthesize_prompts(
        model, tok, seeds, dataclasses.replace(cfg, synthesis_seed=seed), n=n, batch_size=batch_size, progress=False
    )
    s = time.perf_counter() - t
    return {"seconds": s, "prompts": len(prompts), "prompts_per_s": len(prompts) / s}


def greedy_check(model, tok, seeds, cfg, n, batch_size):
    "The synthesis prompts (few-shot from the seeds) continued greedily, batched and one at a time: equal?"
    cores = [s["prompt"] for s in seeds]
    shown = [fewshot_prompt(random.Random(i).sample(cores, cfg.shots), cfg) for i in range(n)]
    kw = dict(max_new_tokens=cfg.prompt_max_new_tokens, stop_strings=[cfg.stop], progress=False)
    batched = generate_texts(model, tok, shown, batch_size=batch_size, **kw)
    single = generate_texts(model, tok, shown, batch_size=1, **kw)
    return {
        "prompts": n,
        "identical": batched == single,
        "identical_fraction": sum(a == b for a, b in zip(batched, single)) / n,
    }


def small_transfer(folder, tok, seeds, n, work: Path):
    "Train a source LoRA (a few steps) and a discriminator, then time transfer_lora's stages."
    t = time.perf_counter()
    train = arithmetic(64, seed=1)
    args = SFTConfig(
        str(work / "src"),
        max_steps=8,
        per_device_train_batch_size=8,
        learning_rate=5e-4,
        report_to="none",
        save_strategy="no",
        seed=0,
        **CPU,
    )
    src = SFTTrainer(
        model=load_causal_lm(folder),
        args=args,
        train_dataset=datasets.Dataset.from_list(train),
        processing_class=tok,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    src.train(); src.model.save_pretrained(work / "src-lora")
    source_lora_s = time.perf_counter() - t
    synthesis = SynthesisConfig(num_synthetic=n, prompt_max_new_tokens=24, completion_max_new_tokens=6)
    distillation = DistillationConfig(str(work / "tgt-work"), max_steps=4, per_device_train_batch_size=8, **CPU)
    t = time.perf_counter()
    fake = synthesize_prompts(load_causal_lm(folder), tok, seeds, synthesis, progress=False)
    disc = train_discriminator(
        folder,
        tok,
        [r["prompt"] for r in train[:n]],
        fake,
        DiscriminatorConfig(str(work / "disc"), num_train_epochs=1, per_device_train_batch_size=8, **CPU),
    )
    disc.save_pretrained(work / "disc-out")
    discriminator_s = time.perf_counter() - t
    res = transfer_lora(
        folder,
        work / "src-lora",
        folder,
        seeds,
        output_dir=work / "tgt",
        discriminator=work / "disc-out",
        discriminator_base=folder,
        synthesis=synthesis,
        distillation=distillation,
        threshold=0.0,
    )  # keep all: timing, not quality
    return {
        "source_lora_train_s": source_lora_s,
        "discriminator_prep_and_train_s": discriminator_s,
        "threshold": 0.0,
        "stages_s": res.timings,
        "counts": res.counts,
        "kept_fraction": res.kept_fraction,
        "settings": {
            "num_synthetic": n,
            "prompt_max_new_tokens": 24,
            "completion_max_new_tokens": 6,
            "distill_steps": 4,
            "batch": 8,
            "source_lora_steps": 8,
            "target": "SmolLM2-135M-Instruct (same base: timing only)",
        },
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16, help="distinct synthetic prompts per synthesis run (and batch size)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved batched/one-at-a-time runs (median reported)")
    p.add_argument("--no-transfer", action="store_true", help="skip the timed small transfer")
    a = p.parse_args()
    torch.set_num_threads(2)
    folder = smollm2()
    tok, model = load_tokenizer(folder), load_causal_lm(folder)
    seeds = arithmetic(5, seed=0)
    cfg = SynthesisConfig(num_synthetic=a.n, prompt_max_new_tokens=24)
    synthesis_run(model, tok, seeds, cfg, 2, 2, 99)  # warm-up
    start = quiet_start()
    runs = {"batched": [], "one_at_a_time": []}
    for r in range(a.repeats):  # same seed for both in each repeat; interleaved so load changes hit both
        runs["batched"].append(synthesis_run(model, tok, seeds, cfg, a.n, a.n, r))
        runs["one_at_a_time"].append(synthesis_run(model, tok, seeds, cfg, a.n, 1, r))
        print(
            f"repeat {r}: " + ", ".join(f"{k} {v[-1]['prompts_per_s']:.2f} prompts/s" for k, v in runs.items()),
            flush=True,
        )
    ratios = [b["prompts_per_s"] / o["prompts_per_s"] for b, o in zip(runs["batched"], runs["one_at_a_time"])]
    check = greedy_check(model, tok, seeds, cfg, a.n, a.n)
    result = {
        "benchmark": "Trans-LoRA synthesis, batched vs one at a time",
        "model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)",
        "n_prompts": a.n,
        "batch_size": a.n,
        "repeats": a.repeats,
        "prompt_max_new_tokens": 24,
        "synthesis": {
            **{
                k: {"runs": v, "median_prompts_per_s": median([x["prompts_per_s"] for x in v])} for k, v in runs.items()
            },
            "speedup_per_repeat": ratios,
            "median_speedup_batched_vs_single": median(ratios),
        },
        "greedy_batched_identical_to_one_at_a_time": check,
    }
    print(f"speed-up batched vs one at a time: x{median(ratios):.2f} "
          f"(per repeat {[round(x, 2) for x in ratios]}); greedy check {check}")
    if not a.no_transfer:
        with tempfile.TemporaryDirectory() as d:
            result["small_transfer"] = small_transfer(folder, tok, [r["prompt"] for r in seeds], a.n, Path(d))
        print(json.dumps(result["small_transfer"], indent=2))
    write_result("translora", result, start)


if __name__ == "__main__":
    main()
