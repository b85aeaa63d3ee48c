"""Iterative QPiSSA against one-shot QPiSSA (and QLoRA) on SmolLM2-135M's projections: the NF4 quantization error
after each round of `adaptkit.pissa.qpissa_round_errors` (the official code's `--iter N`: round 1 is one-shot QPiSSA,
round N re-decomposes W - nf4(W_res) N - 1 times).

Error per layer and round: ||W - (nf4(W_res) + B A)||_F / ||W||_F (exact SVD, NF4 blocks of 64 as QLoRA stores
weights); QLoRA's ||W - nf4(W)||_F / ||W||_F in the same units. Over the model: the mean of the per-layer errors, the
whole-model error sqrt(sum ||error||^2) / sqrt(sum ||W||^2), and round N against round 1 (per layer: how many fell,
how many rose at some round). Waits for a quiet machine and writes through benchmarks/_bench.py:
benchmarks/results/qpissa_iter.json (qpissa_iter.loaded.json on a loaded machine, with ADAPTKIT_BENCH_ALLOW_LOADED=1).

Run: .venv/bin/python benchmarks/qpissa_iter.py                 (r 16 and 64, 5 rounds, all 210 projections)
     .venv/bin/python benchmarks/qpissa_iter.py --ranks 64 --iters 8
     .venv/bin/python benchmarks/qpissa_iter.py --layers 1 --no-write   (smoke check: one projection, nothing written,
                                                                          no wait for a quiet machine)"""
import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _bench import quiet_start, write_result  # noqa: E402

from adaptkit.models import load_causal_lm, smollm2  # noqa: E402
from adaptkit.pissa.principal import _PROJECTIONS, nf4_roundtrip, qpissa_round_errors  # noqa: E402


def projections(model, limit: int | None) -> dict[str, torch.Tensor]:
    "name -> float32 weight of the model's attention and MLP projections (the first `limit` of them)."
    out = {n: m.weight.detach().float() for n, m in model.named_modules()
           if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in _PROJECTIONS}
    return dict(list(out.items())[:limit]) if limit else out


def measure(weights: dict[str, torch.Tensor], r: int, iters: int) -> dict:
    "Per-layer errors of QLoRA and of every QPiSSA round at rank `r`, and their summaries."
    layers, seconds = {}, time.perf_counter()
    for name, w in weights.items():
        layers[name] = {"qlora": ((w - nf4_roundtrip(w)).norm() / w.norm()).item(),
                        "rounds": qpissa_round_errors(w, r, iters=iters)}
    seconds = time.perf_counter() - seconds
    norms2 = {n: w.norm().item() ** 2 for n, w in weights.items()}
    whole = lambda err: math.sqrt(sum(err(n) ** 2 * norms2[n] for n in layers) / sum(norms2.values()))
    per_round = [
        {"round": i + 1, "mean_layer_error": statistics.mean(v["rounds"][i] for v in layers.values()),
         "max_layer_error": max(v["rounds"][i] for v in layers.values()),
         "whole_model_error": whole(lambda n, i=i: layers[n]["rounds"][i])}
        for i in range(iters)
    ]
    first, last = per_round[0], per_round[-1]
    return {
        "r": r, "iters": iters, "seconds": seconds,
        "qlora": {"mean_layer_error": statistics.mean(v["qlora"] for v in layers.values()),
                  "whole_model_error": whole(lambda n: layers[n]["qlora"])},
        "rounds": per_round,
        "last_vs_first_whole_model": last["whole_model_error"] / first["whole_model_error"],
        "last_vs_first_mean_layer": last["mean_layer_error"] / first["mean_layer_error"],
        "layers_lower_at_last_round": sum(v["rounds"][-1] < v["rounds"][0] for v in layers.values()),
        "layers_rising_at_some_round": sum(any(b > a for a, b in zip(v["rounds"], v["rounds"][1:]))
                                           for v in layers.values()),
        "layers": layers,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="16,64", help="adapter ranks, comma-separated (paper: 64)")
    ap.add_argument("--iters", type=int, default=5, help="SVD rounds (the official --iter; 1: one-shot QPiSSA)")
    ap.add_argument("--layers", type=int, default=None, help="measure only the first N projections (smoke check)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--no-write", action="store_true", help="print only: no results file, no wait for a quiet machine")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = smollm2()
    start = None if args.no_write else quiet_start()
    weights = projections(load_causal_lm(folder), args.layers)
    result = {"model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)", "projections": len(weights),
              "quantizer": "NF4, blocks of 64 (adaptkit.pissa.nf4_roundtrip; bit-identical to bitsandbytes 0.50.2)",
              "svd": "exact (torch.linalg.svd)",
              "error_metric": "||W - (nf4(W_res) + B A)||_F / ||W||_F per layer; whole model: sqrt(sum err^2 ||W||^2 / "
                              "sum ||W||^2); round 1 = one-shot QPiSSA",
              "by_rank": {}}
    for r in (int(x) for x in args.ranks.split(",")):
        rep = measure(weights, r, args.iters)
        result["by_rank"][str(r)] = rep
        print(f"r={r}: QLoRA {rep['qlora']['whole_model_error']:.4f}; QPiSSA by round (whole model) "
              + " ".join(f"{x['whole_model_error']:.4f}" for x in rep["rounds"])
              + f"; last/first {rep['last_vs_first_whole_model']:.3f}; {rep['layers_lower_at_last_round']}/"
              f"{len(weights)} layers lower; {rep['seconds']:.1f} s", flush=True)
    if not args.no_write: write_result("qpissa_iter", result, start)


if __name__ == "__main__":
    main()
