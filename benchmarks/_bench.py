"""What every benchmark shares: a quiet machine before timing, the device named, medians, and one way to write results.

A benchmark calls `start = quiet_start()` before its first timed run and `write_result(name, result, start)` at the
end: every result records the load average and torch's thread count at its start, the load at its end, and
`cpu_steal_share`: the share of the machine's CPU time the hypervisor took between the two (steal, from /proc/stat by
`adaptkit.models.cpu_times`; None where unreadable), which slows a run as load does but is not in the load average. On a
loaded machine (1-minute load average above 0.75 per core, i.e. 1.5 on the 2-core box) `quiet_start` waits up to
`ADAPTKIT_BENCH_WAIT` seconds (default 600) for the load to fall; if it does not, the benchmark refuses to run, unless
`ADAPTKIT_BENCH_ALLOW_LOADED=1`, in which case the results are written to `<name>.loaded.json`, marked
`"loaded": true`, and never replace the quiet `<name>.json`. Results from a GPU machine go to `<name>.<device>.json`
(unless the benchmark is for a GPU alone: `device_suffix=False`). Every result records the commit it measured (taken
as it starts, `code_commit`) and whether adaptkit/ or benchmarks/ (its results aside) differed from that commit.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MAX_LOAD_PER_CORE = 0.75
# what a result measured: the library and the benchmarks, not the results earlier runs wrote
CODE_PATHS = ("adaptkit", "benchmarks", ":(exclude)benchmarks/results")


def max_load() -> float:
    "The highest 1-minute load average at which timings are trusted on this machine (1.5 on 2 cores)."
    return MAX_LOAD_PER_CORE * (os.cpu_count() or 1)


def device() -> str:
    "'cpu', or the CUDA device's name with spaces as dashes (e.g. 'NVIDIA-H100-80GB-HBM3')."
    import torch
    return torch.cuda.get_device_name().replace(" ", "-") if torch.cuda.is_available() else "cpu"


def quiet_start(wait_s: float | None = None) -> dict:
    """Wait for a quiet machine; return the start record (load average, time, whether it stayed loaded, the commit
    measured, the CPU and steal time so far for `write_result`'s steal share); exit if loaded."""
    wait_s = float(os.environ.get("ADAPTKIT_BENCH_WAIT", 600)) if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] > max_load() and time.monotonic() < deadline: time.sleep(10)
    load = os.getloadavg()
    loaded = load[0] > max_load()
    if loaded and os.environ.get("ADAPTKIT_BENCH_ALLOW_LOADED") != "1":
        sys.exit(f"load average {load[0]:.2f} > {max_load():.2f} after waiting {wait_s:.0f} s: timings would be "
                 f"inflated, so nothing is measured (ADAPTKIT_BENCH_ALLOW_LOADED=1 writes results marked loaded)")
    threads = threads_at_start()  # before adaptkit.models imports torch: the threads the benchmark itself set up
    from adaptkit.models import cpu_times
    return {"load_average_at_start": [round(x, 2) for x in load], "loaded": loaded, **threads,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **code_commit(),
            "cpu_times_at_start": cpu_times()}


def threads_at_start() -> dict:
    """The threads torch computes with as timing starts (None when the benchmark has not imported torch: then
    OMP_NUM_THREADS and the CPUs this process may run on, which torch's default follows), for the start record."""
    torch = sys.modules.get("torch")
    return {"torch_threads_at_start": torch.get_num_threads() if torch else None,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus_allowed": len(os.sched_getaffinity(0))}


def code_commit(root: Path | None = None) -> dict:
    """The commit measured: `git rev-parse HEAD` of this checkout (`$ADAPTKIT_COMMIT` where there is no git, e.g. a copy
    of the tree on a lent GPU machine), and whether adaptkit/ or benchmarks/ differed from it (None: unknown), with the
    paths that did (at most 20). Results are left out: benchmarks/results/ holds what earlier runs wrote, which is not
    the code measured (one benchmark after another would otherwise mark every later result changed)."""
    root = Path(__file__).parent.parent if root is None else Path(root)
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=30)
    try: head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", *CODE_PATHS)
    except (OSError, subprocess.SubprocessError): head = status = None
    if head is not None and head.returncode == 0 and status.returncode == 0:
        changed = [line[3:] for line in status.stdout.splitlines() if line.strip()]
        return {"commit": head.stdout.strip(), "uncommitted_changes": bool(changed), "uncommitted_paths": changed[:20]}
    return {"commit": os.environ.get("ADAPTKIT_COMMIT"), "uncommitted_changes": None, "uncommitted_paths": None}


def commit_record(start: dict) -> dict:
    """The commit a result measured: the one its start record holds (`quiet_start` takes it), else the checkout's now;
    with `code_at_end` beside it when the code changed while the benchmark ran."""
    now = code_commit()
    if "commit" not in start: return now
    at_start = {k: start.get(k) for k in now}
    return at_start if at_start == now else {**at_start, "code_at_end": now}


def cpu_model() -> str | None:
    """The CPU's model name as Linux gives it (None elsewhere): results from two machines of one size differ by it
    (an Intel with AMX ran the fp32 demo in 747 s, an AMD EPYC in 1,015 s)."""
    try: lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError: return None
    return next((line.partition(":")[2].strip() for line in lines if line.startswith("model name")), None)


def median(xs) -> float:
    "Median of a non-empty sequence of numbers."
    return statistics.median(xs)


def result_path(name: str, start: dict, device_suffix: bool = True) -> Path:
    """Where `write_result(name, ..., start)` writes: results/<name>[.<device>][.loaded].json (the device's name only
    on a GPU, and only with `device_suffix`: a benchmark of a GPU alone has no CPU result to keep apart)."""
    dev = device() if device_suffix else "cpu"
    return RESULTS / f"{name}{'' if dev == 'cpu' else f'.{dev}'}{'.loaded' if start['loaded'] else ''}.json"


def write_result(name: str, result: dict, start: dict, device_suffix: bool = True) -> Path:
    """Write `result` with the start record, commit, machine, device and the steal share since the start (None when
    the start record has no `cpu_times_at_start`) to results/<name>[.<device>][.loaded].json."""
    from adaptkit.models import cpu_steal_share, cpu_times
    dev, times = device(), start.get("cpu_times_at_start")
    record = {**commit_record(start), **result, **{k: v for k, v in start.items() if k != "cpu_times_at_start"},
              "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
              "cpu_steal_share": cpu_steal_share(times, cpu_times()), "device": dev, "machine": platform.machine(),
              "cpu_model": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()}
    import torch
    record["torch"], record["torch_threads"] = torch.__version__, torch.get_num_threads()
    out = result_path(name, start, device_suffix)
    RESULTS.mkdir(exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")
    return out
