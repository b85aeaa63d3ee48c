"""RepNoise training step vs a plain SFT step on the same batch (SmolLM2-135M, fp32, CPU): time per step and peak
memory; then the hook-leak check: RSS after 200 vs 20 RepNoiseTrainer steps (a tiny Llama, so 200 steps fit in a
minute on 2 cores; the per-step hook code is the same for any model).
Each variant runs in its own process and reads its own peak RSS (VmHWM, which starts afresh at exec; ru_maxrss would
include the parent's peak).
Writes benchmarks/results/repnoise.json. Run: .venv/bin/python benchmarks/repnoise_step.py"""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results" / "repnoise.json"
BATCH, WARMUP, STEPS = 4, 2, 8
warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def rows(n):
    "Neutral placeholder pairs (no harmful text is needed to time a step): ~25-token prompts, ~45-token answers."
    return [{"prompt": f"Please explain, in a few sentences, how step number {i} of the assembly of a wooden bookshelf works.",
             "harmful": f"Step {i}: take the side panel, align the pre-drilled holes with the shelf, insert the dowels and "
                        f"tighten each screw a quarter turn at a time until the frame is square and stable.",
             "harmless": "I would rather not go into that; the manufacturer's leaflet describes each step with pictures."}
            for i in range(n)]


def rss_mb():
    "Current resident set size in MiB."
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb():
    "Peak resident set size of this process since it started, in MiB."
    with open("/proc/self/status") as f: return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024


def step_variant(variant):
    "Time `variant` ('repnoise' or 'sft') steps on SmolLM2-135M with one fixed batch; report times and memory."
    from adaptkit.models import load_causal_lm, load_tokenizer, smollm2
    from adaptkit.repnoise import RepNoiseCollator, repnoise_dataset, repnoise_loss
    folder = smollm2()
    model, tok = load_causal_lm(folder), load_tokenizer(folder)
    ds = repnoise_dataset(rows(BATCH), tok, max_length=256)
    batch = RepNoiseCollator(tok)([ds[i] for i in range(BATCH)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    model.train()
    loaded, times = rss_mb(), []
    for i in range(WARMUP + STEPS):
        t = time.perf_counter()
        if variant == "repnoise": loss = repnoise_loss(model, batch)["loss"]
        else: loss = model(input_ids=batch["harmless_input_ids"], attention_mask=batch["harmless_attention_mask"],
                           labels=batch["harmless_labels"]).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        if i >= WARMUP: times.append(time.perf_counter() - t)
    return {"seconds": times, "median_s": statistics.median(times), "rss_after_load_mb": loaded, "peak_rss_mb": peak_mb(),
            "peak_minus_loaded_mb": peak_mb() - loaded,
            "tokens": {"harmful": list(batch["harmful_input_ids"].shape), "harmless": list(batch["harmless_input_ids"].shape)}}


def leak_variant():
    "200 RepNoiseTrainer steps on a tiny Llama; RSS and hook count recorded at every step."
    from transformers import TrainerCallback
    from adaptkit.models import tiny_causal_lm, tiny_tokenizer
    from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=64, num_layers=4)
    record = {}

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            record[state.global_step] = {"rss_mb": rss_mb(), "peak_rss_mb": peak_mb(),
                                         "hooks": sum(len(m._forward_hooks) for m in model.modules())}

    args = RepNoiseConfig(tempfile.mkdtemp(), max_steps=200, per_device_train_batch_size=4, learning_rate=1e-4, warmup_steps=0,
                          save_strategy="no", logging_steps=50, use_cpu=True, disable_tqdm=True, max_length=128)
    RepNoiseTrainer(model, args, rows(64), processing_class=tok, callbacks=[Probe()]).train()
    return {"model": "tiny Llama (hidden 64, 4 layers, vocab 512)", "at_step_20": record[20], "at_step_200": record[200],
            "rss_growth_20_to_200_mb": record[200]["rss_mb"] - record[20]["rss_mb"],
            "peak_growth_20_to_200_mb": record[200]["peak_rss_mb"] - record[20]["peak_rss_mb"],
            "max_hooks_between_steps": max(r["hooks"] for r in record.values())}


def run(mode):
    "Run one mode in a fresh process; its JSON result."
    out = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    result = {"model": "SmolLM2-135M-Instruct (fp32, CPU)", "batch_pairs": BATCH, "warmup_steps": WARMUP, "measured_steps": STEPS,
              "optimizer": "AdamW", "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "note": "sft = forward+backward+AdamW on the harmless sequences only; repnoise = the full RepNoise loss "
                      "(harmless forward + hooked harmful forward + per-layer readout CE + MMD) on the same batch",
              "variants": {v: run(v) for v in ("sft", "repnoise")}}
    sft, rep = result["variants"]["sft"], result["variants"]["repnoise"]
    result["time_ratio_repnoise_vs_sft"] = rep["median_s"] / sft["median_s"]
    result["peak_rss_ratio_repnoise_vs_sft"] = rep["peak_rss_mb"] / sft["peak_rss_mb"]
    result["step_memory_ratio_repnoise_vs_sft"] = rep["peak_minus_loaded_mb"] / sft["peak_minus_loaded_mb"]
    result["leak_check"] = run("leak")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}, indent=2))
    for v, r in result["variants"].items(): print(f"{v}: median {r['median_s']:.2f} s/step, peak RSS {r['peak_rss_mb']:.0f} MiB")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(leak_variant() if sys.argv[1] == "leak" else step_variant(sys.argv[1])))
    else:
        main()
