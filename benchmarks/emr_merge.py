"""EMR-Merging at scale: merge time and peak RSS of `adaptkit.emr.emr_merge` for N=4 and N=8 fine-tuned models at two
sizes (~111M and ~419M float32 parameters, random Llama-shaped safetensors shards with a classification head per task),
against (a) the I/O floor, reading every input tensor once with safetensors, and (b) a naive in-memory implementation of
the official code; bundle bytes against N separate checkpoints and the cost of each added task; `load_task_model` of one
task followed by one pass over every weight against `from_pretrained` of a plain checkpoint of the same size followed by
the same pass (and the same at the state-dict level: `task_state_dict` against safetensors' `load_file`, each summed);
time to open a bundle with every file's sha256 verified. Every variant runs in its own subprocess, which reports its own
peak memory: VmHWM (resident pages, memory-mapped file pages included) and the peak of RssAnon (anonymous memory, what
the process allocated), sampled every 2 ms. A variant and its baseline run alternately, repeat after repeat; each ratio
is the median of the per-repeat ratios (and the ratio of the medians is recorded too). Waits for a quiet machine and
writes through benchmarks/_bench.py: benchmarks/results/emr.json (emr.loaded.json on a loaded machine, with
ADAPTKIT_BENCH_ALLOW_LOADED=1).

Run: .venv/bin/python benchmarks/emr_merge.py --threads 1 --cold  (full: ~25 GB of temporary files, tens of minutes)
     .venv/bin/python benchmarks/emr_merge.py --sizes 100M --threads 1  (one size)
     .venv/bin/python benchmarks/emr_merge.py --quick  (small sizes, minutes; writes emr_quick[.loaded].json)
     --threads 1 sets torch's threads in every variant: on a small machine shared with other work, torch's default
     (one thread per core) makes the elementwise ops several times slower; the run records what it used.
     --cold also times the I/O floor and the merge from an empty page cache (root only: drops the kernel's caches)."""
import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import median, quiet_start, write_result  # noqa: E402

SIZES = {"100M": (768, 12, 32000), "400M": (1024, 30, 32768)}  # hidden size, layers, vocabulary
QUICK_SIZES = {"4M": (256, 4, 4096), "12M": (384, 6, 4096)}


def layout(hidden: int, layers: int, vocab: int) -> dict:
    "Tensor name -> shape of an LLM-like model: embeddings, attention and MLP projections, norms."
    mlp = int(hidden * 2.75) // 64 * 64
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + f"self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"}
        shapes |= {p + "mlp.gate_proj.weight": (mlp, hidden), p + "mlp.up_proj.weight": (mlp, hidden),
                   p + "mlp.down_proj.weight": (hidden, mlp), p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)}
    return shapes | {"model.norm.weight": (hidden,)}


def write_model(folder: Path, shapes: dict, task: int | None, shard_bytes: int = 10**9):
    "Random weights (the base's seeded per tensor; a task adds small noise and its own head) as safetensors shards."
    import torch
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    shards, cur, size = [], {}, 0
    names = list(shapes) + (["score.weight"] if task is not None else [])
    for i, name in enumerate(names):
        if name == "score.weight": t = torch.randn(2 + task, shapes["model.norm.weight"][0])  # heads differ per task
        else:
            t = torch.randn(shapes[name], generator=torch.Generator().manual_seed(i))
            if task is not None:
                t += 0.01 * torch.randn(shapes[name], generator=torch.Generator().manual_seed(10**6 * (task + 1) + i))
        if cur and size + t.numel() * 4 > shard_bytes: shards.append(cur); cur, size = {}, 0
        cur[name], size = t, size + t.numel() * 4
    shards.append(cur)
    wmap = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / fname)
        wmap |= {n: fname for n in shard}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    (folder / "config.json").write_text(json.dumps(llama_config(shapes, 2 + task if task is not None else 2)))


def llama_config(shapes: dict, num_labels: int) -> dict:
    "The transformers config of `layout`'s tensors: a Llama sequence classifier (the task models' heads are `score`)."
    vocab, hidden = shapes["model.embed_tokens.weight"]
    return {"model_type": "llama", "architectures": ["LlamaForSequenceClassification"], "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": shapes["model.layers.0.mlp.up_proj.weight"][0],
            "num_hidden_layers": sum(n.endswith("input_layernorm.weight") for n in shapes),
            "num_attention_heads": hidden // 64, "num_key_value_heads": hidden // 64, "num_labels": num_labels,
            "pad_token_id": 0, "tie_word_embeddings": False, "torch_dtype": "float32"}


# ---- what runs in each child process ----

def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def child_io_floor(root: Path, n: int, **_):
    "Read every tensor of the base and the n tasks once with safetensors (touching every byte)."
    from safetensors import safe_open
    total = 0.0
    for folder in [root / "base", *[root / f"ft{i}" for i in range(n)]]:
        for path in _files(folder):
            with safe_open(path, "pt") as f: keys = list(f.keys())
            for k in keys:
                with safe_open(path, "pt") as f: total += float(f.get_tensor(k).sum())
    return {"checksum": total}


def child_io_floor_with_writes(root: Path, n: int, out: Path, **_):
    """The I/O floor plus the bytes a merge must write: every input tensor read once (as `child_io_floor`), and the
    base's tensors written twice (the unified vector and the base's copy) plus n masks of one bit a parameter."""
    import numpy as np
    from safetensors import safe_open
    out.mkdir(parents=True)
    total, files = 0.0, [open(out / f, "wb") for f in ("unified", "base", "masks")]
    try:
        for folder in [root / "base", *[root / f"ft{i}" for i in range(n)]]:
            for path in _files(folder):
                with safe_open(path, "pt") as f: keys = list(f.keys())
                for k in keys:
                    with safe_open(path, "pt") as f: t = f.get_tensor(k)
                    total += float(t.sum())
                    if folder.name == "base":
                        for w in files[:2]: w.write(t.numpy().tobytes())
                        files[2].write(np.zeros(n * ((t.numel() + 7) // 8), dtype=np.uint8).tobytes())
    finally:
        for w in files: w.close()
    return {"checksum": total}


def child_emr(root: Path, n: int, out: Path, **_):
    "adaptkit's streaming merge into a bundle."
    from adaptkit.emr.merge import emr_merge
    emr_merge(root / "base", {f"t{i}": root / f"ft{i}" for i in range(n)}, out_dir=out, progress=False)
    return {}


def child_naive(root: Path, n: int, out: Path, **_):
    "The official code's way: every model in memory, task vectors, elect/mask/rescale, then save (masks as bool)."
    import torch
    from safetensors.torch import load_file, save_file
    load = lambda folder: {k: v.clone() for p in _files(folder) for k, v in load_file(p).items()}
    pre = load(root / "base")
    tvs = []
    for i in range(n):
        ft = load(root / f"ft{i}")
        tvs.append({k: ft[k].sub_(pre[k]) for k in pre})  # the task vector replaces the fine-tuned weights in place
        del ft
    uni, masks, scales, new_scales = {}, [{} for _ in range(n)], torch.zeros(n), torch.zeros(n)
    for k in pre:
        flag = (torch.stack([tv[k] for tv in tvs]).mean(0) > 0) * 2 - 1
        top = torch.zeros_like(pre[k])
        for m in range(n):
            masks[m][k] = (tvs[m][k] * flag) > 0
            top = torch.maximum(top, torch.abs(masks[m][k] * tvs[m][k]))
            scales[m] += torch.mean(torch.abs(tvs[m][k]))
        uni[k] = top * flag
    for m in range(n):
        for k in uni: new_scales[m] += torch.mean(torch.abs(uni[k] * masks[m][k]))
    out.mkdir(parents=True)
    save_file(uni, out / "unified.safetensors")
    for m in range(n): save_file(masks[m], out / f"mask{m}.safetensors")
    return {"rescalers": (scales / new_scales).tolist()}


def one_pass(tensors) -> float:
    "Touch every byte of every tensor once (a sum of each)."
    return float(sum(float(t.sum()) for t in tensors))


def child_materialise(root: Path, out: Path, **_):
    "Task t0's weights from the bundle, every one summed (opened without the sha256 check, timed on its own below)."
    from adaptkit.emr.merge import EMRBundle
    sd = EMRBundle(out, verify=False).task_state_dict("t0")
    return {"tensors": len(sd), "checksum": one_pass(sd.values())}


def child_task_model(root: Path, out: Path, **_):
    "Task t0's transformers model from the bundle (`load_task_model`, weights computed as loaded), every weight summed."
    from adaptkit.emr.merge import EMRBundle
    model = EMRBundle(out, verify=False).load_task_model("t0")
    return {"tensors": len(model.state_dict()), "checksum": one_pass(model.state_dict().values())}


def child_task_model_cached(root: Path, out: Path, **_):
    "Task t0's model through `load_task_model(cache_dir=...)`: written once as a plain checkpoint, memory-mapped after."
    from adaptkit.emr.merge import EMRBundle
    model = EMRBundle(out, verify=False).load_task_model("t0", cache_dir=root / "task_cache")
    return {"tensors": len(model.state_dict()), "checksum": one_pass(model.state_dict().values())}


def child_plain_model(root: Path, **_):
    "A plain checkpoint of the same architecture and size through transformers' `from_pretrained`, every weight summed."
    import torch
    from transformers import LlamaForSequenceClassification
    model = LlamaForSequenceClassification.from_pretrained(root / "ft0", dtype=torch.float32)
    return {"tensors": len(model.state_dict()), "checksum": one_pass(model.state_dict().values())}


def child_open_verified(root: Path, out: Path, **_):
    "Open the bundle as `EMRBundle.from_pretrained` does: emr.json checked, every file's sha256 verified, headers read."
    from adaptkit.emr.merge import EMRBundle
    return {"tasks": len(EMRBundle(out).tasks)}


def child_plain(root: Path, **_):
    "Load a plain fine-tuned checkpoint (every shard, every byte touched)."
    from safetensors.torch import load_file
    sd = {k: v for p in _files(root / "ft0") for k, v in load_file(p).items()}
    return {"tensors": len(sd), "checksum": one_pass(sd.values())}


CHILDREN = {
    "io_floor": child_io_floor,
    "io_floor_with_writes": child_io_floor_with_writes,
    "emr_merge": child_emr,
    "naive": child_naive,
    "materialise": child_materialise,
    "task_model": child_task_model,
    "task_model_cached": child_task_model_cached,
    "plain_model": child_plain_model,
    "open_verified": child_open_verified,
    "plain_load": child_plain,
}


def status(*keys: str) -> dict:
    "Fields of /proc/self/status in bytes."
    return {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.split(":")[0] in keys}


def child_main(spec: str):
    args = json.loads(spec)
    import threading

    import torch  # imported (and warmed up) before the clock starts, like every variant's libraries

    # noqa: F401 (the modeling code, imported for every variant)
    import adaptkit.emr.merge
    if args.get("threads"): torch.set_num_threads(args["threads"])
    adaptkit.emr.emr_elect(torch.randn(4, 1 << 16))
    start = status("VmRSS", "RssAnon")
    peak_anon, done = [start["RssAnon"]], threading.Event()
    def sample():  # the kernel keeps no peak of anonymous memory: sample it
        while not done.wait(0.002): peak_anon[0] = max(peak_anon[0], status("RssAnon")["RssAnon"])
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    extra = CHILDREN[args["variant"]](Path(args["root"]), n=args.get("n", 0), out=Path(args.get("out", "/nonexistent")))
    seconds = time.perf_counter() - t
    done.set(), sampler.join()
    end = status("VmHWM", "RssAnon")
    print(
        json.dumps(
            {
                "seconds": seconds,
                "start_rss": start["VmRSS"],
                "peak_rss": end["VmHWM"],
                "start_anon": start["RssAnon"],
                "peak_anon": max(peak_anon[0], end["RssAnon"]),
                **extra,
            }
        )
    )


# ---- the driver ----

THREADS, COLD, NAIVE = None, False, True


def drop_page_cache():
    "Write dirty pages out and empty the kernel's page cache, so that the next run reads from the disk (root only)."
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def summary(runs: list[dict]) -> dict:
    "Median time and peak RSS of one variant's runs."
    secs = [r["seconds"] for r in runs]
    return {"median_s": median(secs), "seconds": secs, "peak_rss_bytes": max(r["peak_rss"] for r in runs),
            "peak_rss_over_start_bytes": max(r["peak_rss"] - r["start_rss"] for r in runs),
            "peak_anon_over_start_bytes": max(r["peak_anon"] - r["start_anon"] for r in runs)}


def measured(variant: str, repeats: int, clean: Path | None = None, cold: bool = False, **kw) -> dict:
    "Median time and peak RSS of `repeats` runs (`clean` removed before each run; `cold` also empties the page cache)."
    return alternated({variant: (variant, clean, kw)}, repeats, cold)[variant]


def alternated(variants: dict, repeats: int, cold: bool = False) -> dict:
    """label -> (variant, folder to remove before each run, its arguments): the variants run in turn, `repeats` rounds
    (a slow drift of the machine's load hits each alike); label -> `summary` of its runs."""
    runs = {label: [] for label in variants}
    for _ in range(repeats):
        for label, (variant, clean, kw) in variants.items():
            if clean is not None: shutil.rmtree(clean, ignore_errors=True)
            if cold: drop_page_cache()
            runs[label].append(run_peak(variant, **kw))
    return {label: summary(rs) for label, rs in runs.items()}


def ratio(variant: dict, baseline: dict) -> dict:
    "The variant's time over its baseline's: the median of the per-round ratios, and the ratio of the medians."
    per_round = [a / b for a, b in zip(variant["seconds"], baseline["seconds"])]
    return {"median_of_ratios": median(per_round), "ratios": per_round,
            "ratio_of_medians": variant["median_s"] / baseline["median_s"]}


def run_peak(variant: str, **kw) -> dict:
    """One run in a child process, which measures its own memory: wait4's ru_maxrss would be no use, Linux carries the
    parent's peak RSS over exec into the child's."""
    spec = {"variant": variant, "threads": THREADS, **{k: str(v) if isinstance(v, Path) else v for k, v in kw.items()}}
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    if p.returncode: raise RuntimeError(f"{variant} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def folder_bytes(folder: Path, skip: str | None = None) -> int:
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and not (skip and skip in p.relative_to(folder).parts)
    )


def mem_available() -> int:
    return int(next(l for l in open("/proc/meminfo") if l.startswith("MemAvailable")).split()[1]) * 1024


def bench_size(label: str, dims: tuple, work: Path, repeats: int, ns: list[int]) -> dict:
    shapes = layout(*dims)
    params = sum(math.prod(s) for s in shapes.values())
    model_bytes = params * 4
    root = work / label
    print(f"[{label}] writing base + {max(ns)} fine-tuned models of {params / 1e6:.0f}M parameters ...", flush=True)
    write_model(root / "base", shapes, None)
    for i in range(max(ns)): write_model(root / f"ft{i}", shapes, i)
    res = {"params": params, "model_bytes": model_bytes, "tensors": len(shapes)}
    for n in ns:
        print(f"[{label}] N={n}: I/O floor, emr_merge, naive ...", flush=True)
        merge = {
            "io_floor": ("io_floor", None, dict(root=root, n=n)),
            "io_floor_with_writes": (
                "io_floor_with_writes",
                root / "floor_out",
                dict(root=root, n=n, out=root / "floor_out"),
            ),
            "emr_merge": ("emr_merge", root / f"bundle{n}", dict(root=root, n=n, out=root / f"bundle{n}")),
        }
        r = alternated(merge, repeats)
        need = (1.25 * n + 2.5) * model_bytes  # base, n task vectors, n bool masks, the unified vector, temporaries
        if not NAIVE: r["naive"] = {"skipped": "--no-naive"}
        elif need < 0.7 * mem_available():
            r["naive"] = measured("naive", repeats, clean=root / "naive", root=root, n=n, out=root / "naive")
            shutil.rmtree(root / "naive", ignore_errors=True)
            r["merge_vs_naive_time"] = r["emr_merge"]["median_s"] / r["naive"]["median_s"]  # (naive: separate rounds)
            r["merge_vs_naive_peak_rss"] = r["emr_merge"]["peak_rss_bytes"] / r["naive"]["peak_rss_bytes"]
        else:
            r["naive"] = {
                "skipped": f"needs ~{need / 2**30:.1f} GiB of memory, {mem_available() / 2**30:.1f} GiB available"
            }
        r["merge_vs_io_floor"] = ratio(r["emr_merge"], r["io_floor"])
        r["merge_vs_io_floor_time"] = r["merge_vs_io_floor"]["median_of_ratios"]
        r["merge_vs_io_floor_with_writes"] = ratio(r["emr_merge"], r["io_floor_with_writes"])
        if COLD:
            print(f"[{label}] N={n}: I/O floor and emr_merge from a cold page cache ...", flush=True)
            cold = alternated(merge, repeats, cold=True)
            r["io_floor_cold"], r["emr_merge_cold"] = cold["io_floor"], cold["emr_merge"]
            r["io_floor_with_writes_cold"] = cold["io_floor_with_writes"]
            r["merge_vs_io_floor_cold"] = ratio(r["emr_merge_cold"], r["io_floor_cold"])
            r["merge_vs_io_floor_time_cold"] = r["merge_vs_io_floor_cold"]["median_of_ratios"]
            r["merge_vs_io_floor_with_writes_cold"] = ratio(r["emr_merge_cold"], r["io_floor_with_writes_cold"])
            print(f"  cold: merge {r['emr_merge_cold']['median_s']:.2f}s = "
                  f"{r['merge_vs_io_floor_time_cold']:.2f}x the I/O floor ({r['io_floor_cold']['median_s']:.2f}s), "
                  f"{r['merge_vs_io_floor_with_writes_cold']['median_of_ratios']:.2f}x "
                  f"the floor with the merge's writes ({r['io_floor_with_writes_cold']['median_s']:.2f}s)", flush=True)
        r["merge_peak_rss_growth_over_model_bytes"] = r["emr_merge"]["peak_rss_over_start_bytes"] / model_bytes
        r["merge_peak_anon_growth_over_model_bytes"] = r["emr_merge"]["peak_anon_over_start_bytes"] / model_bytes
        b = root / f"bundle{n}"
        r["bundle_bytes"] = folder_bytes(b)
        r["bundle_bytes_without_base_copy"] = folder_bytes(b, skip="base")
        r["separate_checkpoints_bytes"] = sum(folder_bytes(root / f"ft{i}") for i in range(n))
        r["bundle_vs_separate_checkpoints"] = r["bundle_bytes_without_base_copy"] / r["separate_checkpoints_bytes"]
        r["mask_bytes_per_task"] = folder_bytes(b / "tasks" / "t0")
        res[f"N={n}"] = r
        print(f"  merge {r['emr_merge']['median_s']:.2f}s = {r['merge_vs_io_floor_time']:.2f}x the I/O floor "
              f"({r['io_floor']['median_s']:.2f}s); "
              f"peak RSS growth {r['merge_peak_rss_growth_over_model_bytes']:.2f}x one model, "
              f"anonymous {r['merge_peak_anon_growth_over_model_bytes']:.3f}x", flush=True)
    n0, n1 = min(ns), max(ns)
    if n1 > n0:
        res["bytes_per_added_task"] = (res[f"N={n1}"]["bundle_bytes"] - res[f"N={n0}"]["bundle_bytes"]) / (n1 - n0)
        res["bytes_per_added_task_over_params_div_8"] = res["bytes_per_added_task"] / (params / 8)
    print(
        f"[{label}] one task's model vs a plain checkpoint, each followed by a pass over every weight ...", flush=True
    )
    bundle = dict(root=root, out=root / f"bundle{n1}")
    res |= alternated(
        {
            "task_model_load": ("task_model", None, bundle),
            "plain_model_load": ("plain_model", None, bundle),
            "task_model_first_cached_load": ("task_model_cached", root / "task_cache", bundle),  # writes the cache
            "task_model_cached_load": ("task_model_cached", None, bundle),  # memory-maps what the one before wrote
            "materialise_task": ("materialise", None, bundle),
            "plain_checkpoint_load": ("plain_load", None, bundle),
        },
        repeats,
    )
    shutil.rmtree(root / "task_cache", ignore_errors=True)
    for variant in ("task_model", "task_model_first_cached", "task_model_cached"):
        res[f"{variant}_vs_plain_model"] = ratio(res[f"{variant}_load"], res["plain_model_load"])
        res[f"{variant}_vs_plain_model_time"] = res[f"{variant}_vs_plain_model"]["median_of_ratios"]
    res["materialise_vs_plain_load"] = ratio(res["materialise_task"], res["plain_checkpoint_load"])
    res["materialise_vs_plain_load_time"] = res["materialise_vs_plain_load"]["median_of_ratios"]
    print(f"  load_task_model + pass {res['task_model_load']['median_s']:.2f}s = "
          f"{res['task_model_vs_plain_model_time']:.2f}x "
          f"from_pretrained + pass ({res['plain_model_load']['median_s']:.2f}s); with cache_dir: first "
          f"{res['task_model_first_cached_vs_plain_model_time']:.2f}x, "
          f"after {res['task_model_cached_vs_plain_model_time']:.2f}x; "
          f"task_state_dict + pass = {res['materialise_vs_plain_load_time']:.2f}x load_file + pass", flush=True)
    res["open_verified"] = measured("open_verified", repeats, root=root, out=root / f"bundle{n1}")
    res["open_verified_bytes_hashed"] = folder_bytes(root / f"bundle{n1}") - sum(
        (root / f"bundle{n1}" / f).stat().st_size for f in ("emr.json", "README.md", "adaptkit.json"))
    shutil.rmtree(root)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models (~4M and ~12M parameters), 2 repeats")
    ap.add_argument("--sizes", nargs="+", choices=[*SIZES, *QUICK_SIZES], default=None, help="only these model sizes")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in every variant (default: torch's own)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per variant (default 3; 2 with --quick)")
    ap.add_argument("--workdir", default=None, help="where the temporary models go (default: the system temp folder)")
    ap.add_argument(
        "--ns", nargs="+", type=int, default=[4, 8], help="numbers of fine-tuned models merged (default 4 8)"
    )
    ap.add_argument("--name", default=None, help="results name under benchmarks/results/ (default emr; emr_quick with "
                    "--quick; a run of a subset of sizes or ns should get its own, e.g. emr_400M_cold)")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="also time the I/O floor and the merge from an empty page cache "
        "(drops the kernel's caches before each run: root only)",
    )
    ap.add_argument("--no-naive", action="store_true", help="skip the naive in-memory baseline (the slowest variant)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child: return child_main(args.child)
    global THREADS, COLD, NAIVE
    THREADS, COLD, NAIVE = args.threads, args.cold, not args.no_naive
    if COLD: drop_page_cache()  # fails here, before any work, where it is not allowed
    import torch
    start = quiet_start()  # before the models are written: a loaded machine is refused before 25 GB are generated
    sizes, repeats = (QUICK_SIZES, args.repeats or 2) if args.quick else (SIZES, args.repeats or 3)
    if args.sizes: sizes = {k: {**SIZES, **QUICK_SIZES}[k] for k in args.sizes}
    name = args.name or ("emr_quick" if args.quick else "emr")
    work = Path(tempfile.mkdtemp(prefix="adaptkit-emr-bench-", dir=args.workdir))
    result = {
        "benchmark": "emr_merge",
        "quick": args.quick,
        "repeats": repeats,
        "dtype": "float32",
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": args.threads or torch.get_num_threads(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "cold": args.cold,
        "ns": args.ns,
        "notes": [
            "every variant in its own process; peak RSS = the child's VmHWM, "
            "peak anon = max of RssAnon sampled every 2 ms; "
            "start = after imports; growth = peak - start",
            "warm runs: the page cache holds the files where they fit in memory; with --cold the *_cold runs "
            "start from an empty page cache (sync + drop_caches before each run), so reads come from the disk",
            "I/O floor: safe_open + get_tensor + sum of every input tensor, one at a time; I/O floor with "
            "writes: the same, plus writing the bytes a merge writes (two copies of the base's tensors and "
            "N one-bit masks), so that a cold merge is compared with reading and writing what it must",
            "naive: the official code's structure, all models in memory, masks saved as bool",
            "bundle bytes include the copied base (base/) unless noted; a base on a hub is referenced instead",
            "a variant and its baseline run in alternation, one round after another; *_time ratios are "
            "medians of the per-round ratios (ratio_of_medians beside them)",
            "task_model: EMRBundle.load_task_model (each weight computed as transformers loads it) then a sum "
            "of every weight; plain_model: LlamaForSequenceClassification.from_pretrained of one fine-tuned "
            "checkpoint (memory-mapped safetensors) then the same sums; task_model_first_cached: "
            "load_task_model(cache_dir=...) with an empty cache (computes and writes the plain checkpoint, "
            "then loads it); task_model_cached: the same call once the cache holds the task",
            "materialise: EMRBundle.task_state_dict then a sum of every tensor; plain_checkpoint_load: "
            "safetensors load_file then the same sums",
        ],
        "sizes": {},
    }
    try:
        for label, dims in sizes.items():
            result["sizes"][label] = bench_size(label, dims, work, repeats, sorted(args.ns))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["summary"] = {
        f"{label} N={n}": {
            "merge_vs_io_floor_time": r[f"N={n}"]["merge_vs_io_floor_time"],
            "merge_vs_io_floor_time_cold": r[f"N={n}"].get("merge_vs_io_floor_time_cold"),
            "merge_vs_io_floor_with_writes_time_cold": r[f"N={n}"]
            .get("merge_vs_io_floor_with_writes_cold", {})
            .get("median_of_ratios"),
            "merge_vs_naive_time": r[f"N={n}"].get("merge_vs_naive_time"),
            "merge_peak_rss_growth_MiB": r[f"N={n}"]["emr_merge"]["peak_rss_over_start_bytes"] / 2**20,
            "naive_peak_rss_growth_MiB": r[f"N={n}"]["naive"].get("peak_rss_over_start_bytes", float("nan")) / 2**20,
            "merge_peak_anon_growth_MiB": r[f"N={n}"]["emr_merge"]["peak_anon_over_start_bytes"] / 2**20,
            "naive_peak_anon_growth_MiB": r[f"N={n}"]["naive"].get("peak_anon_over_start_bytes", float("nan")) / 2**20,
            "merge_peak_rss_growth_over_model_bytes": r[f"N={n}"]["merge_peak_rss_growth_over_model_bytes"],
            "bundle_vs_separate_checkpoints": r[f"N={n}"]["bundle_vs_separate_checkpoints"],
            "bytes_per_added_task_over_params_div_8": r.get("bytes_per_added_task_over_params_div_8"),
            "task_model_vs_plain_model_time": r["task_model_vs_plain_model_time"],
            "task_model_first_cached_vs_plain_model_time": r["task_model_first_cached_vs_plain_model_time"],
            "task_model_cached_vs_plain_model_time": r["task_model_cached_vs_plain_model_time"],
            "materialise_vs_plain_load_time": r["materialise_vs_plain_load_time"],
        }
        for label, r in result["sizes"].items()
        for n in args.ns
    }
    result["targets"] = {
        "merge_vs_io_floor_time": "<= 1.5",
        "peak_rss": "independent of model size, well under one model",
        "bytes_per_added_task": "~ params / 8",
        "task_model_cached_vs_plain_model_time": "<= 2",
    }
    write_result(name, result, start)


if __name__ == "__main__":
    main()
