"""Aligner.correct throughput on SmolLM2-135M: corrections per second batched (8, 16) vs one at a time, same pairs,
same number of new tokens per correction (min_new_tokens = max_new_tokens so every variant does equal work).
Writes benchmarks/results/aligner.json. Run: .venv/bin/python benchmarks/aligner_correct.py"""
import json
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch

from adaptkit.aligner import Aligner
from adaptkit.models import load_causal_lm, load_tokenizer, smollm2

N_PAIRS, NEW_TOKENS, REPEATS = 32, 32, 3
OUT = Path(__file__).parent / "results" / "aligner.json"
warnings.filterwarnings("ignore")


def pairs():
    qs = [f"What is {a} plus {b}?" for a, b in zip(range(3, 3 + N_PAIRS), range(40, 40 + N_PAIRS))]
    answers = [f"I think {a} plus {b} is {a + b + (i % 3) - 1}, but I am not sure." for i, (a, b) in enumerate(zip(range(3, 3 + N_PAIRS), range(40, 40 + N_PAIRS)))]
    return qs, answers


def main():
    global N_PAIRS, NEW_TOKENS, REPEATS
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=N_PAIRS, help="question/answer pairs corrected per variant")
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens generated per correction")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="runs per variant (median reported)")
    a = ap.parse_args()
    N_PAIRS, NEW_TOKENS, REPEATS = a.pairs, a.new_tokens, a.repeats
    folder = smollm2()
    aligner = Aligner(load_causal_lm(folder), load_tokenizer(folder))
    qs, answers = pairs()
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    aligner.correct(qs[:2], answers[:2], batch_size=2, **kw)  # warm-up
    result = {"model": "SmolLM2-135M-Instruct (fp32, CPU)", "pairs": N_PAIRS, "new_tokens_per_correction": NEW_TOKENS,
              "repeats": REPEATS, "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "variants": {}}
    outputs = {}
    for batch in (1, 8, 16):
        times = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            outputs[batch] = aligner.correct(qs, answers, batch_size=batch, **kw)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        result["variants"][f"batch_{batch}"] = {"seconds": times, "median_s": med, "corrections_per_s": N_PAIRS / med,
                                                "new_tokens_per_s": N_PAIRS * NEW_TOKENS / med}
        print(f"batch {batch:2d}: {N_PAIRS / med:.2f} corrections/s (median of {REPEATS}: {med:.1f} s)")
    base = result["variants"]["batch_1"]["median_s"]
    for v in result["variants"].values(): v["speedup_vs_one_at_a_time"] = base / v["median_s"]
    result["identical_to_one_at_a_time"] = {f"batch_{b}": sum(a == c for a, c in zip(outputs[b], outputs[1])) / N_PAIRS for b in (8, 16)}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
