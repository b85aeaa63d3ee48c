"""Merges past one model's memory (issue 37, item 2): `adaptkit merge` (every method it shares with mergekit, streamed
to shards) on synthetic Llama-shaped models of about 0.1B, 0.5B and 1B parameters, against mergekit 0.1.5's
`mergekit-yaml` on the same YAML.

For each size the script builds a base and `--models` fine-tuned copies (the base plus 1% noise; bfloat16 safetensors
shards with a LlamaForCausalLM config, seeded), then runs, alternately for `--repeats` rounds, each in its own process
under `/usr/bin/time -v` (which reads the child's own peak RSS from wait4, so the driver's memory never counts):
- `adaptkit merge <method>.yml --output_dir out --max_shard_size ...` (the merge), for each of `--methods`;
- `adaptkit merge <method>.yml --dry-run` (the same interpreter, imports and headers, no tensor: the interpreter's own);
- `mergekit-yaml <method>.yml out --out-shard-size ...` from `.venv-mergekit` (the baseline), when it is installed, and
  `python -c 'import mergekit.scripts.run_yaml'` in its venv (mergekit's interpreter and imports: its own baseline).
`--methods` (default: every method both tools have: linear, task_arithmetic, ties, dare_ties, dare_linear,
breadcrumbs, breadcrumbs_ties; mergekit has no magnitude_prune, adaptkit no della/sce/slerp) picks the YAMLs, each
bfloat16 with weight 1 per model and `normalize: true`, over the base (linear: none, the mean of the models); the
pruning methods at density 0.5, breadcrumbs with gamma 0.01. Reported per size and method: the model's bytes, the load
average and threads as its timing starts, adaptkit's peak RSS above the interpreter's own and that over one model's
bytes (goal: flat and <= 0.25), mergekit's peak RSS and that above its own interpreter, each side's median wall time
and adaptkit's over mergekit's (the median of the per-round ratios; goal <= 1.0), the dry run's plan (bytes read,
every pass counted), and whether the two merged models agree (max abs difference, per tensor; DARE's differ by
design: each tool draws its own random masks, so `masks_drawn_alike` is false there).

Waits for a quiet machine and writes through benchmarks/_bench.py: benchmarks/results/merge_scale.json
(merge_scale.loaded.json on a loaded machine with ADAPTKIT_BENCH_ALLOW_LOADED=1). A run replaces the entries of the
sizes and methods it measured and keeps the others: each entry carries its own run (start time, rounds, shard size,
threads), so the sizes can be measured in separate quiet windows.

Run: .venv/bin/python benchmarks/merge_scale.py                     (0.1B, 0.5B and 1B, 7 methods, 3 rounds: hours;
                                                                      ~15 GB of temporary files)
     .venv/bin/python benchmarks/merge_scale.py --sizes 0.1 --repeats 1   (the smallest only, minutes)
     .venv/bin/python benchmarks/merge_scale.py --methods ties linear     (some methods only)
     .venv/bin/python benchmarks/merge_scale.py --sizes tiny --repeats 1 --max_shard_size 10MB   (a check that it
     runs: a 9.8M-parameter model, 19.5 MB in bfloat16, whose embeddings span several chunks; its numbers say little,
     and it writes merge_scale.tiny.json, never merge_scale.json)
     --threads N sets torch's threads in both tools (OMP_NUM_THREADS and mergekit's --num-threads)."""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import median, quiet_start, result_path, write_result  # noqa: E402

from adaptkit.emr.methods import MERGE_METHODS  # noqa: E402
from adaptkit.tensorfiles import TensorFiles, size_in_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ADAPTKIT = ROOT / ".venv" / "bin" / "adaptkit"
MERGEKIT = ROOT / ".venv-mergekit" / "bin" / "mergekit-yaml"
# parameters (billions) -> hidden size, layers, intermediate size, vocabulary: Llama's proportions
SIZES = {"0.1": (768, 12, 2048, 16000), "0.5": (1024, 32, 2816, 32000), "1": (2048, 16, 5632, 32000),
         "tiny": (256, 2, 688, 16000)}
MERGEKIT_PYTHON = ROOT / ".venv-mergekit" / "bin" / "python"
# the per-model parameters of each method's YAML (weight 1 for every method), as both tools name them
SETTINGS = {"density": 0.5, "gamma": 0.01}


def methods_of_mergekit() -> list | None:
    "The merge methods the installed mergekit registers (None when it is not installed)."
    if not MERGEKIT_PYTHON.exists(): return None
    code = ("from mergekit.merge_methods.registry import registered_methods\n"
            "print(' '.join(m.spec.name for m in registered_methods()))")
    p = subprocess.run([str(MERGEKIT_PYTHON), "-c", code], capture_output=True, text=True, env={
        **os.environ, "TQDM_DISABLE": "1"})
    if p.returncode: raise RuntimeError(f"mergekit's methods could not be listed:\n{p.stderr[-2000:]}")
    return p.stdout.strip().splitlines()[-1].split()


def merge_config(method: str, folder: Path, n_models: int) -> dict:
    """The YAML both tools run: weight 1 per model, normalized, bfloat16; over the base (linear: none, the mean of the
    models); density 0.5 for the pruning methods, gamma 0.01 for breadcrumbs."""
    per_model = {"weight": 1.0} | {p: SETTINGS[p] for p in MERGE_METHODS[method].model_parameters if p in SETTINGS}
    models = [{"model": str(folder / f"ft{i}"), "parameters": per_model} for i in range(n_models)]
    cfg = {"merge_method": method, "dtype": "bfloat16", "parameters": {"normalize": True}, "models": models}
    return cfg | ({"base_model": str(folder / "base")} if method != "linear" else {})


def layout(hidden: int, layers: int, intermediate: int, vocab: int) -> dict:
    "Tensor name -> shape of a Llama causal LM (4 key/value heads of 64, untied embeddings), in the order saved."
    kv = 4 * 64
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                   p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                   p + "mlp.gate_proj.weight": (intermediate, hidden), p + "mlp.up_proj.weight": (intermediate, hidden),
                   p + "mlp.down_proj.weight": (hidden, intermediate), p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)}
    return shapes | {"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}


def config(hidden: int, layers: int, intermediate: int, vocab: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "num_hidden_layers": layers, "intermediate_size": intermediate, "vocab_size": vocab,
            "num_attention_heads": hidden // 64, "num_key_value_heads": 4, "head_dim": 64, "hidden_act": "silu",
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2}


def write_model(folder: Path, dims: tuple, task: int | None, shard_bytes: int = 2 * 10**9) -> int:
    "Seeded bfloat16 weights (a task: the base plus 1% noise of its own seed) in safetensors shards; the bytes written."
    import torch
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    shards, cur, size, total = [], {}, 0, 0
    for i, (name, shape) in enumerate(layout(*dims).items()):
        t = torch.randn(shape, generator=torch.Generator().manual_seed(i)) * 0.02
        if task is not None:
            t += 0.0002 * torch.randn(shape, generator=torch.Generator().manual_seed(10**6 * (task + 1) + i))
        t = t.bfloat16()
        if cur and size + t.nbytes > shard_bytes: shards.append(cur); cur, size = {}, 0
        cur[name], size, total = t, size + t.nbytes, total + t.nbytes
    shards.append(cur)
    wmap = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / fname, metadata={"format": "pt"})
        wmap |= {n: fname for n in shard}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": wmap}))
    (folder / "config.json").write_text(json.dumps(config(*dims)))
    return total


def timed(cmd: list, env: dict) -> dict:
    "Run `cmd` under /usr/bin/time -v: wall seconds and the child's peak RSS (bytes)."
    with tempfile.NamedTemporaryFile("r", suffix=".time") as f:
        t = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-v", "-o", f.name, *map(str, cmd)], env=env, capture_output=True,
                           text=True)
        seconds = time.perf_counter() - t
        report = f.read()
    if p.returncode: raise RuntimeError(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)[1]) * 1024
    return {"seconds": seconds, "peak_rss": rss, "stdout": p.stdout}


def max_difference(ours: Path, theirs: Path) -> float:
    "The largest absolute difference between two merged checkpoints, tensor by tensor (float32)."
    a, b = TensorFiles.of_folder(ours), TensorFiles.of_folder(theirs)
    if set(a.specs) != set(b.specs): return float("inf")
    return max((a.read(n).float() - b.read(n).float()).abs().max().item() for n in a.specs)


def method_prune(method: str) -> str:
    "How `method` prunes (adaptkit's `MergeMethod.prune`): '' for none, 'magnitude', 'random' (DARE), 'breadcrumbs'."
    return MERGE_METHODS[method].prune or ""


def bench_size(label: str, work: Path, n_models: int, repeats: int, shard: str, threads: int | None,
               methods: list, mergekit_methods: list | None) -> dict:
    dims = SIZES[label]
    folder = work / label
    model_bytes = write_model(folder / "base", dims, None)
    for i in range(n_models): write_model(folder / f"ft{i}", dims, i)
    try:
        return {m: bench_method(m, folder, dims, model_bytes, n_models, repeats, shard, threads,
                                m in (mergekit_methods or ())) for m in methods}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_method(method: str, folder: Path, dims: tuple, model_bytes: int, n_models: int, repeats: int, shard: str,
                 threads: int | None, mergekit_has: bool) -> dict:
    import torch
    config = folder / f"{method}.yml"
    config.write_text(json.dumps(merge_config(method, folder, n_models)))  # JSON is YAML
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    if threads: env["OMP_NUM_THREADS"] = str(threads)
    ours, theirs = folder / "adaptkit-out", folder / "mergekit-out"
    runs = {"adaptkit": [], "interpreter": [], "mergekit": [], "mergekit_interpreter": []}
    start = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()],
             "omp_num_threads": env.get("OMP_NUM_THREADS"), "torch_threads_of_driver": torch.get_num_threads()}
    # mergekit's --out-shard-size counts parameters: bfloat16 holds 2 bytes each
    mergekit_args = ["--out-shard-size", str(size_in_bytes(shard) // 2), "--quiet", "--no-copy-tokenizer"] + (
        ["--num-threads", str(threads)] if threads else [])
    for _ in range(repeats):
        shutil.rmtree(ours, ignore_errors=True)
        runs["adaptkit"].append(timed([ADAPTKIT, "merge", config, "--output_dir", ours, "--max_shard_size", shard],
                                      env))
        runs["interpreter"].append(timed([ADAPTKIT, "merge", config, "--output_dir", folder / "none", "--dry-run",
                                          "--max_shard_size", shard], env))
        if mergekit_has:
            shutil.rmtree(theirs, ignore_errors=True)
            runs["mergekit"].append(timed([MERGEKIT, config, theirs, *mergekit_args], env))
            runs["mergekit_interpreter"].append(timed([MERGEKIT_PYTHON, "-c", "import mergekit.scripts.run_yaml"], env))
    over = [a["peak_rss"] - b["peak_rss"] for a, b in zip(runs["adaptkit"], runs["interpreter"])]
    result = {
        **start, "yaml": merge_config(method, Path("models"), n_models),
        "parameters": sum(math.prod(s) for s in layout(*dims).values()), "model_bytes": model_bytes,
        "dims": dict(zip(("hidden", "layers", "intermediate", "vocab"), dims)), "models": n_models,
        "largest_tensor_bytes": 2 * max(math.prod(s) for s in layout(*dims).values()),
        "adaptkit_s": [r["seconds"] for r in runs["adaptkit"]], "adaptkit_median_s": median(
            [r["seconds"] for r in runs["adaptkit"]]),
        "adaptkit_peak_rss_bytes": max(r["peak_rss"] for r in runs["adaptkit"]),
        "interpreter_peak_rss_bytes": max(r["peak_rss"] for r in runs["interpreter"]),
        "adaptkit_peak_rss_over_interpreter_bytes": max(over),
        "peak_over_interpreter_per_model": max(over) / model_bytes,
        "shards_written": len(list(ours.glob("model-*.safetensors"))) or 1,
        "plan": json.loads(runs["interpreter"][-1]["stdout"].strip().splitlines()[-1]),
    }
    if runs["mergekit"]:
        mk = [r["seconds"] for r in runs["mergekit"]]
        mk_over = [a["peak_rss"] - b["peak_rss"] for a, b in zip(runs["mergekit"], runs["mergekit_interpreter"])]
        result |= {"mergekit_s": mk, "mergekit_median_s": median(mk),
                   "mergekit_peak_rss_bytes": max(r["peak_rss"] for r in runs["mergekit"]),
                   "mergekit_interpreter_peak_rss_bytes": max(r["peak_rss"] for r in runs["mergekit_interpreter"]),
                   "mergekit_peak_rss_over_interpreter_bytes": max(mk_over),
                   "mergekit_peak_over_interpreter_per_model": max(mk_over) / model_bytes,
                   "time_ratio_median_of_ratios": median([a / b for a, b in zip(result["adaptkit_s"], mk)]),
                   "time_ratio_of_medians": result["adaptkit_median_s"] / median(mk),
                   "max_abs_difference_vs_mergekit": max_difference(ours, theirs),
                   "masks_drawn_alike": "random" not in method_prune(method)}
    else: result["mergekit"] = f"not run: mergekit {'lacks ' + method if MERGEKIT.exists() else 'is not installed'}"
    shutil.rmtree(ours, ignore_errors=True), shutil.rmtree(theirs, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["0.1", "0.5", "1"], choices=list(SIZES),
                    help="model sizes in billions of parameters (0.1, 0.5, 1), or tiny (a check that it runs)")
    ap.add_argument("--methods", nargs="+", default=None, choices=list(MERGE_METHODS),
                    help="merge methods (default: every one that both adaptkit and mergekit have)")
    ap.add_argument("--models", type=int, default=3, help="fine-tuned models merged (besides the base)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each runs every variant once, in turn")
    ap.add_argument("--max_shard_size", default="1GB", help="shard size of both outputs (mergekit: in parameters)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in both tools (default: their own)")
    ap.add_argument("--work", default=None, help="folder for the models (default: a temporary one)")
    args = ap.parse_args()
    mergekit_methods = methods_of_mergekit()
    both = [m for m in MERGE_METHODS if mergekit_methods is None or m in mergekit_methods]
    methods = args.methods or both
    try: size_in_bytes(args.max_shard_size)  # refused now, not after the models are built
    except ValueError as e: ap.error(str(e))
    start = quiet_start()
    work = Path(args.work or tempfile.mkdtemp(prefix="merge-scale-"))
    try:
        sizes = {s: bench_size(s, work, args.models, args.repeats, args.max_shard_size, args.threads, methods,
                               mergekit_methods) for s in args.sizes}
    finally:
        if not args.work: shutil.rmtree(work, ignore_errors=True)
    name = "merge_scale.tiny" if "tiny" in args.sizes else "merge_scale"
    run = {"started": start["started"], "repeats": args.repeats, "max_shard_size": args.max_shard_size,
           "threads": args.threads}
    stored = json.loads(path.read_text())["sizes"] if (path := result_path(name, start)).exists() else {}
    for s, per_method in sizes.items():
        for m, r in per_method.items(): stored.setdefault(s, {})[m] = {**r, "run": run}
    write_result(name, {
        "what": "adaptkit merge (each method's YAML: weight 1, normalize, bfloat16, density 0.5 where it prunes, "
                "streamed to shards) vs mergekit-yaml 0.1.5, same YAML; peak RSS of each child from /usr/bin/time -v; "
                "interpreter = the same command with --dry-run (mergekit: its venv's python importing mergekit-yaml's "
                "module)",
        "goal": "peak_over_interpreter_per_model flat and <= 0.25; time ratio <= 1.0 for every method",
        "sizes": stored, "last_run": {**run, "sizes": args.sizes, "methods": methods}, "methods_of_both": both,
        "mergekit_methods": mergekit_methods,
    }, start)
    for s, per_method in sizes.items():
        for m, r in per_method.items():
            print(s, m, {k: v for k, v in r.items() if not isinstance(v, (list, dict))})


if __name__ == "__main__":
    main()
