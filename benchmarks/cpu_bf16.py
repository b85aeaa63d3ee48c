"""bf16 against fp32 on this CPU: the evidence behind `models.default_bf16` keeping bf16 off where there is no GPU.

Three measurements, each fp32 and bf16 in the same run, on SmolLM2-135M-Instruct (the demo's model, converted from its
GGUF package once per machine) with torch's threads as set (2 on the 2-core box):
- a 2048x2048 matmul (GFLOPS, median of 20 after 3 warm-ups): what the CPU's bf16 instructions (AMX or AVX512-BF16,
  named in `cpu_flags`) give a dense product;
- sampled generation, 8 prompts x 32 new tokens, with the weights in fp32 and in bf16 (seconds, median of 3);
- a LoRA r16 training step (batch 8 x 96 tokens, all linear layers, AdamW) in fp32 and under CPU bf16 autocast, as
  `TrainingArguments(bf16=True, use_cpu=True)` runs it (seconds, median of 4 after 1 warm-up).
Writes benchmarks/results/cpu_bf16.json through `_bench.write_result` (which waits for a quiet machine first).
Run: .venv/bin/python benchmarks/cpu_bf16.py"""
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _bench import median, quiet_start, write_result  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(min(2, torch.get_num_threads()))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cpu_flags() -> list[str]:
    "The CPU's bf16-related instruction flags from /proc/cpuinfo (amx_bf16, avx512_bf16), empty where there are none."
    try: flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split()
    except (OSError, StopIteration): return []
    return sorted(f for f in flags if "bf16" in f)


def timed(fn, repeats: int, warmup: int) -> float:
    "Median seconds of `repeats` calls of `fn` after `warmup` calls."
    for _ in range(warmup): fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return median(times)


def matmul_gflops(dtype) -> float:
    "GFLOPS of a 2048x2048 matmul in `dtype`."
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    return round(2 * 2048**3 / timed(lambda: a @ b, 20, 3) / 1e9, 1)


def generation_s(path, tok, dtype) -> float:
    "Seconds of sampled generation, 8 prompts x 32 new tokens, weights in `dtype`."
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    batch = tok(["Calculate 3 + 5."] * 8, return_tensors="pt")
    run = lambda: model.generate(**batch, max_new_tokens=32, min_new_tokens=32, do_sample=True,
                                 pad_token_id=tok.eos_token_id)
    return round(timed(run, 3, 1), 2)


def lora_step_s(path, autocast: bool) -> float:
    "Seconds of one LoRA r16 training step (batch 8 x 96 tokens), fp32 or under CPU bf16 autocast."
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(r=16, target_modules="all-linear"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    x = torch.randint(0, 1000, (8, 96), generator=torch.Generator().manual_seed(0))
    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast): loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return round(timed(step, 4, 1), 2)


def main():
    from transformers import AutoTokenizer

    from adaptkit.models import smollm2
    path = smollm2()  # converted before timing starts
    tok = AutoTokenizer.from_pretrained(path)
    start = quiet_start()
    result = {
        "cpu_flags": cpu_flags(),
        "matmul_2048_gflops": {k: matmul_gflops(dt) for k, dt in DTYPES.items()},
        "generate_8x32_s": {k: generation_s(path, tok, dt) for k, dt in DTYPES.items()},
        "lora_step_s": {"fp32": lora_step_s(path, False), "bf16_autocast": lora_step_s(path, True)},
    }
    result["bf16_speedup"] = {
        "matmul": round(result["matmul_2048_gflops"]["bf16"] / result["matmul_2048_gflops"]["fp32"], 2),
        "generate": round(result["generate_8x32_s"]["fp32"] / result["generate_8x32_s"]["bf16"], 2),
        "lora_step": round(result["lora_step_s"]["fp32"] / result["lora_step_s"]["bf16_autocast"], 2),
    }
    write_result("cpu_bf16", result, start)


if __name__ == "__main__": main()
