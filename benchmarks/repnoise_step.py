"""RepNoise training step vs a plain SFT step on the same batch (SmolLM2-135M, fp32, CPU): time per step, peak memory,
and the multiply-adds each step does, counted analytically, so the time ratio can be read against the work ratio;
then the hook-leak check: RSS after 200 vs 20 RepNoiseTrainer steps (a tiny Llama; the per-step hook code is the same
for any model).
Each variant runs in its own process and reads its own peak RSS (VmHWM, which starts afresh at exec; ru_maxrss would
include the parent's peak). Times are medians of the measured steps after warm-up steps.
Writes benchmarks/results/repnoise.json through `_bench.write_result` (which waits for a quiet machine first).
Run: .venv/bin/python benchmarks/repnoise_step.py"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _bench import quiet_start, write_result  # noqa: E402

BATCH, WARMUP, STEPS = 4, 2, 5
warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def rows(n):
    "Neutral placeholder pairs (no harmful text is needed to time a step): ~25-token prompts, ~45-token answers."
    return [{"prompt": f"Please explain, in a few sentences, how step number {i} of the assembly of a wooden "
                       f"bookshelf works.",
             "harmful": f"Step {i}: take the side panel, align the pre-drilled holes with the shelf, insert the "
                        f"dowels and tighten each screw a quarter turn at a time until the frame is square and stable.",
             "harmless": "I would rather not go into that; the manufacturer's leaflet describes each step "
                         "with pictures."}
            for i in range(n)]


def rss_mb():
    "Current resident set size in MiB."
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb():
    "Peak resident set size of this process since it started, in MiB."
    with open("/proc/self/status") as f: return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024


def forward_macs(config, batch: int, seq: int, layers: int, head_tokens: int) -> int:
    "MACs of a Llama-style forward over `layers` decoder layers of `batch x seq` tokens, LM head on `head_tokens`."
    d, f, h, kv = config.hidden_size, config.intermediate_size, config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or d // h
    projections = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f  # q, k, v, o and the gated MLP, per token
    attention = 2 * seq * h * hd  # scores and weighted values, per token (full seq x seq, as SDPA with a mask computes)
    return layers * batch * seq * (projections + attention) + head_tokens * d * config.vocab_size


def step_macs(config, batch: dict, variant: str, layers=None) -> dict:
    "MACs of one training step (forward + backward = 3x forward for matmuls), by part; the optimiser is left out."
    n_layers = config.num_hidden_layers
    b, t_ok = batch["harmless_input_ids"].shape
    parts = {"harmless_model": 3 * forward_macs(config, b, t_ok, n_layers, b * t_ok)}
    if variant == "repnoise":
        chosen = sorted({i % n_layers for i in layers}) if layers is not None else list(range(n_layers))
        b, t = batch["harmful_input_ids"].shape
        answer = int((batch["harmful_labels"][:, 1:] != -100).sum())
        # the harmful forward runs every layer with the LM head on the last token only (logits_to_keep=1); backward
        # reaches only the layers up to the last one read out
        fwd = forward_macs(config, b, t, n_layers, b)
        parts["harmful_model"] = fwd + 2 * forward_macs(config, b, t, max(chosen) + 1, 0)
        parts["readouts_at_answer_tokens"] = 3 * len(chosen) * answer * config.hidden_size * config.vocab_size
        parts["mmd"] = 3 * len(chosen) * (2 * b) ** 2 * t * config.hidden_size
    parts["total"] = sum(parts.values())
    return parts


def step_variant(variant):
    "Time `variant` ('repnoise' or 'sft') steps on SmolLM2-135M with one fixed batch; report times, memory and MACs."
    from adaptkit.models import load_causal_lm, load_tokenizer, smollm2
    from adaptkit.repnoise.trainer import RepNoiseCollator, repnoise_dataset, repnoise_loss
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
    return {
        "seconds": times,
        "median_s": statistics.median(times),
        "rss_after_load_mb": loaded,
        "peak_rss_mb": peak_mb(),
        "peak_minus_loaded_mb": peak_mb() - loaded,
        "macs": step_macs(model.config, batch, variant),
        "answer_tokens": int((batch["harmful_labels"][:, 1:] != -100).sum()),
        "tokens": {
            "harmful": list(batch["harmful_input_ids"].shape),
            "harmless": list(batch["harmless_input_ids"].shape),
        },
    }


def leak_variant():
    "200 RepNoiseTrainer steps on a tiny Llama; RSS and hook count recorded at every step."
    from transformers import TrainerCallback

    from adaptkit.models import tiny_causal_lm, tiny_tokenizer
    from adaptkit.repnoise.trainer import RepNoiseConfig, RepNoiseTrainer
    tok = tiny_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=64, num_layers=4)
    record = {}

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            record[state.global_step] = {"rss_mb": rss_mb(), "peak_rss_mb": peak_mb(),
                                         "hooks": sum(len(m._forward_hooks) for m in model.modules())}

    args = RepNoiseConfig(
        tempfile.mkdtemp(),
        max_steps=200,
        per_device_train_batch_size=4,
        learning_rate=1e-4,
        warmup_steps=0,
        save_strategy="no",
        logging_steps=50,
        use_cpu=True,
        disable_tqdm=True,
        max_length=128,
    )
    RepNoiseTrainer(model, args, rows(64), processing_class=tok, callbacks=[Probe()]).train()
    return {
        "model": "tiny Llama (hidden 64, 4 layers, vocab 512)",
        "at_step_20": record[20],
        "at_step_200": record[200],
        "rss_growth_20_to_200_mb": record[200]["rss_mb"] - record[20]["rss_mb"],
        "peak_growth_20_to_200_mb": record[200]["peak_rss_mb"] - record[20]["peak_rss_mb"],
        "max_hooks_between_steps": max(r["hooks"] for r in record.values()),
    }


def run(mode):
    "Run one mode in a fresh process; its JSON result."
    out = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    start = quiet_start()
    result = {
        "model": "SmolLM2-135M-Instruct (fp32, CPU)",
        "batch_pairs": BATCH,
        "warmup_steps": WARMUP,
        "measured_steps": STEPS,
        "optimizer": "AdamW",
        "layers": "all",
        "note": "sft = forward+backward+AdamW on the harmless sequences only; repnoise = the full RepNoise loss "
        "(harmless forward + hooked harmful forward + per-layer read-out CE at the answer tokens + MMD) on "
        "the same batch. macs: multiply-adds of the matmuls (forward + backward = 3x forward), counted "
        "from the config and the padded batch; norms, activations, softmax and the optimiser are left out.",
        "variants": {v: run(v) for v in ("sft", "repnoise")},
    }
    sft, rep = result["variants"]["sft"], result["variants"]["repnoise"]
    result["time_ratio_repnoise_vs_sft"] = rep["median_s"] / sft["median_s"]
    result["mac_ratio_repnoise_vs_sft"] = rep["macs"]["total"] / sft["macs"]["total"]
    result["time_ratio_over_mac_ratio"] = result["time_ratio_repnoise_vs_sft"] / result["mac_ratio_repnoise_vs_sft"]
    result["peak_rss_ratio_repnoise_vs_sft"] = rep["peak_rss_mb"] / sft["peak_rss_mb"]
    result["step_memory_ratio_repnoise_vs_sft"] = rep["peak_minus_loaded_mb"] / sft["peak_minus_loaded_mb"]
    result["leak_check"] = run("leak")
    write_result("repnoise", result, start)
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}, indent=2))
    for v, r in result["variants"].items():
        print(f"{v}: median {r['median_s']:.2f} s/step, peak RSS {r['peak_rss_mb']:.0f} MiB, "
              f"{r['macs']['total'] / 1e9:.1f} GMAC")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(leak_variant() if sys.argv[1] == "leak" else step_variant(sys.argv[1])))
    else:
        main()
