"""PiSSA initialisation on SmolLM2-135M (210 projections, r = 16): error and time of adaptkit's default init vs the
exact SVD and peft's `pissa_niter_4` / `pissa_niter_16`, where the time goes (SVD compute vs per-layer overhead), and
QPiSSA's NF4 quantization error reduction at r = 64.

Error: mean (and max) over layers of ||B A - (B A)_exact||_F / ||(B A)_exact||_F, the exact part from peft's own
`init_lora_weights="pissa"`. Time: whole `init_pissa` (wrap, decompose, save the initial adapter), medians of REPEATS
runs, settings interleaved within each repeat, ratios taken within a repeat. `svd_compute_s` times the decompositions
alone on the same weights (peft: one `torch.svd_lowrank` / `torch.linalg.svd` per layer; adaptkit: `principal_parts`
on same-shape stacks); `overhead_s` = whole - compute. `wrap_s`: `get_peft_model` with a plain LoRA init (the layers,
no decomposition). Run on a quiet machine: `.venv/bin/python benchmarks/pissa_init.py` (writes results/pissa.json;
`--skip-qpissa` keeps the QPiSSA numbers of an earlier quiet run)."""
import copy
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from peft import get_peft_model
from peft.tuners.lora import LoraLayer

sys.path.insert(0, str(Path(__file__).parent))
from _bench import RESULTS, median, quiet_start, write_result  # noqa: E402

from adaptkit.models import load_causal_lm, smollm2  # noqa: E402
from adaptkit.pissa.principal import init_pissa, pissa_config, principal_parts, quantization_error  # noqa: E402

R, REPEATS = 16, 3
SETTINGS = {"exact": "peft_exact", "adaptkit": None, "peft_niter_4": 4, "peft_niter_16": 16}
warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def products(peft_model) -> dict:
    "The initial adapter product scaling * B A of every adapted layer."
    return {n: (m.scaling["default"] * m.lora_B["default"].weight @ m.lora_A["default"].weight).detach()
            for n, m in peft_model.base_model.model.named_modules() if isinstance(m, LoraLayer)}


def init_once(folder, setting) -> tuple[float, dict]:
    "Seconds of one whole-model init with `setting`, and its adapter products."
    model = load_causal_lm(folder)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        if setting == "exact":  # peft's own exact SVD, one layer at a time, as a user of peft gets it
            pm = get_peft_model(model, pissa_config(R))
        else:
            pm = init_pissa(model, pissa_config(R, niter=SETTINGS[setting]), init_dir=d, seed=0)
        return time.perf_counter() - t, products(pm)


def svd_compute(weights: list[torch.Tensor], setting) -> float:
    "Seconds of the decompositions alone that `setting` runs on `weights` (no layers, no copies, no saving)."
    t = time.perf_counter()
    if setting == "exact":
        for w in weights: torch.linalg.svd(w, full_matrices=False)
    elif setting == "adaptkit":
        groups = {}
        for w in weights: groups.setdefault(tuple(w.shape), []).append(w)
        gen = torch.Generator().manual_seed(0)
        for ws in groups.values(): principal_parts(torch.stack(ws), R, generator=gen)
    else:
        for w in weights: torch.svd_lowrank(w, q=R, niter=SETTINGS[setting])
    return time.perf_counter() - t


def wrap_once(folder) -> float:
    "Seconds of `get_peft_model` with peft's plain LoRA init on the same layers (the per-layer wrapping alone)."
    model = load_causal_lm(folder)
    cfg = copy.deepcopy(pissa_config(R)); cfg.init_lora_weights = True
    t = time.perf_counter()
    get_peft_model(model, cfg)
    return time.perf_counter() - t


def rel_errors(parts: dict, exact: dict) -> list[float]:
    return [((parts[k] - exact[k]).norm() / exact[k].norm()).item() for k in exact]


def timing(folder) -> dict:
    "Error and time per setting, medians over REPEATS interleaved repeats, with within-repeat ratios."
    weights = [m.weight.detach().float() for n, m in load_causal_lm(folder).named_modules()
               if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1].endswith("proj")]
    runs = {s: {"seconds": [], "svd_compute_s": []} for s in SETTINGS}
    wraps, parts = [], {}
    for rep in range(REPEATS):
        wraps.append(wrap_once(folder))
        for s in SETTINGS:
            seconds, parts[s] = init_once(folder, s)
            runs[s]["seconds"].append(seconds)
            runs[s]["svd_compute_s"].append(svd_compute(weights, s))
            print(
                f"repeat {rep}: {s}: {seconds:.2f} s (decompositions alone {runs[s]['svd_compute_s'][-1]:.2f} s)",
                flush=True,
            )
    out = {"layers": len(weights), "wrap_s": {"seconds": wraps, "median_s": median(wraps)}, "init": {}}
    for s, run in runs.items():
        errs = rel_errors(parts[s], parts["exact"])
        ratio = [a / b for a, b in zip(run["seconds"], runs["peft_niter_16"]["seconds"])]
        out["init"][s] = {"median_s": median(run["seconds"]), "seconds": run["seconds"],
                          "svd_compute_median_s": median(run["svd_compute_s"]), "svd_compute_s": run["svd_compute_s"],
                          "overhead_median_s": median([a - b for a, b in zip(run["seconds"], run["svd_compute_s"])]),
                          "time_vs_peft_niter_16_median": median(ratio), "time_vs_peft_niter_16": ratio,
                          "rel_error_vs_exact_mean": statistics.mean(errs), "rel_error_vs_exact_max": max(errs)}
    return out


def qpissa(folder) -> dict:
    "QPiSSA's NF4 quantization error reduction vs QLoRA at r = 64, plain and iterative (5 iterations)."
    model, out = load_causal_lm(folder), {}
    for iters in (1, 5):
        t = time.perf_counter()
        rep = quantization_error(model, r=64, iters=iters)
        out[f"iters_{iters}"] = {
            "reduction": rep["reduction"],
            "mean_layer_reduction": rep["mean_layer_reduction"],
            "qlora_nuclear": rep["qlora"],
            "qpissa_nuclear": rep["qpissa"],
            "seconds": time.perf_counter() - t,
        }
        print(f"QPiSSA r=64 iters={iters}: error reduction {rep['reduction']:.1%}", flush=True)
    out["paper_llama2_7b_reduction"] = 0.19
    return out


def main():
    folder = smollm2()
    start = quiet_start()
    result = {"model": "SmolLM2-135M-Instruct (dequantized Q4_1 GGUF)", "r": R, "repeats": REPEATS, "seed": 0,
              "error_metric": "relative Frobenius error of scaling * B A vs peft's exact init, over layers",
              **timing(folder)}
    if "--skip-qpissa" in sys.argv and (RESULTS / "pissa.json").exists():
        earlier = json.loads((RESULTS / "pissa.json").read_text())
        # kept from an earlier run: the commit that run measured (None where it recorded none) goes with them
        result["qpissa"] = {**earlier["qpissa"], "commit": earlier["qpissa"].get("commit", earlier.get("commit"))}
    else:
        result["qpissa"] = {**qpissa(folder), "commit": start["commit"]}
    write_result("pissa", result, start)
    print(json.dumps(result["init"], indent=1))


if __name__ == "__main__":
    main()
