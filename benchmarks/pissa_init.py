"""PiSSA initialisation on SmolLM2-135M: time of all projection layers with randomised SVD (niter 2/4/16) vs the
exact SVD, the reconstruction error of each vs exact, and QPiSSA's NF4 quantization error reduction at r=64.
Writes benchmarks/results/pissa.json. Run: .venv/bin/python benchmarks/pissa_init.py [--skip-qpissa]"""
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from peft.tuners.lora import LoraLayer

from adaptkit.models import load_causal_lm, smollm2
from adaptkit.pissa import init_pissa, pissa_config, quantization_error

R, REPEATS = 16, 3
OUT = Path(__file__).parent / "results" / "pissa.json"
warnings.filterwarnings("ignore")


def principal_parts(peft_model):
    "The initial adapter product B A of every adapted layer."
    return {n: (m.lora_B["default"].weight @ m.lora_A["default"].weight).detach()
            for n, m in peft_model.base_model.model.named_modules() if isinstance(m, LoraLayer)}


def init_once(folder, niter):
    model = load_causal_lm(folder)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        pm = init_pissa(model, pissa_config(R, niter=niter), init_dir=d)
        return time.perf_counter() - t, principal_parts(pm)


def main():
    torch.manual_seed(0)
    folder = smollm2()
    runs = {}
    for niter in [None, 2, 4, 16]:
        times, parts = [], None
        for _ in range(REPEATS):
            seconds, parts = init_once(folder, niter)
            times.append(seconds)
        runs["exact" if niter is None else f"niter_{niter}"] = {"seconds": times, "median_s": statistics.median(times), "parts": parts}
        print(f"{'exact' if niter is None else f'niter={niter}'}: median {statistics.median(times):.2f} s over {REPEATS}")
    exact = runs["exact"]["parts"]
    result = {"model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)", "r": R, "layers": len(exact), "repeats": REPEATS,
              "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(), "init": {}}
    for name, run in runs.items():
        errs = [((run["parts"][k] - exact[k]).norm() / exact[k].norm()).item() for k in exact]
        # share of the exact top-r singular energy the randomised adapter captures (1.0 = all of it)
        energy = [(run["parts"][k].norm() ** 2 / exact[k].norm() ** 2).item() for k in exact]
        result["init"][name] = {"median_s": run["median_s"], "seconds": run["seconds"],
                                "speedup_vs_exact": runs["exact"]["median_s"] / run["median_s"],
                                "rel_error_vs_exact_mean": statistics.mean(errs), "rel_error_vs_exact_max": max(errs),
                                "energy_captured_mean": statistics.mean(energy), "energy_captured_min": min(energy)}
    if "--skip-qpissa" in sys.argv and OUT.exists():  # keep the (slow) quantization numbers of an earlier run
        result["qpissa"] = json.loads(OUT.read_text())["qpissa"]
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        return print(json.dumps(result["init"], indent=2))
    model = load_causal_lm(folder)
    result["qpissa"] = {}
    for iters in (1, 5):
        t = time.perf_counter()
        rep = quantization_error(model, r=64, iters=iters)
        result["qpissa"][f"iters_{iters}"] = {"reduction": rep["reduction"], "mean_layer_reduction": rep["mean_layer_reduction"],
                                              "qlora_nuclear": rep["qlora"], "qpissa_nuclear": rep["qpissa"],
                                              "seconds": time.perf_counter() - t}
        print(f"QPiSSA r=64 iters={iters}: error reduction {rep['reduction']:.1%} (mean per layer {rep['mean_layer_reduction']:.1%})")
    result["qpissa"]["paper_llama2_7b_reduction"] = 0.19
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "qpissa"}, indent=2))


if __name__ == "__main__":
    main()
