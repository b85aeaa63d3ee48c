"""Start-up time of the `adaptkit` command: `adaptkit --help` and `adaptkit <command> --help` for every command, each
run as a fresh process, against `python -c pass` (the interpreter's own start) and against building the command's real
parser (`parser_for(name).format_help()`: what `--help` cost before the help texts were stored). Runs are interleaved
(one of each per round) so load drifts hit every command alike; medians of ROUNDS (default 7, at least 5). Waits for a
quiet machine and writes through benchmarks/_bench.py: benchmarks/results/startup.json (startup.loaded.json when
ADAPTKIT_BENCH_ALLOW_LOADED=1 on a loaded machine). Run: .venv/bin/python benchmarks/startup.py [ROUNDS]"""
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import median, quiet_start, write_result  # noqa: E402

ROUNDS = max(5, int(sys.argv[1])) if len(sys.argv) > 1 else 7
EXE = str(Path(sys.executable).parent / "adaptkit")
BUDGET_S = 1.0  # what `adaptkit <command> --help` must stay under


def commands() -> dict[str, list[str]]:
    "Name -> argv of every timed process: the baseline, top-level help, each command's help, the old parser path."
    from adaptkit.cli import COMMANDS  # light: the command table imports nothing heavy
    runs = {"python -c pass": [sys.executable, "-c", "pass"], "adaptkit --help": [EXE, "--help"]}
    runs |= {f"adaptkit {name} --help": [EXE, *name.split(), "--help"] for name in COMMANDS}
    runs |= {
        f"parser_for({name!r}) (before)": [
            sys.executable,
            "-c",
            f"from adaptkit.cli import parser_for; parser_for({name!r}).format_help()",
        ]
        for name in ("pissa", "hub serve")
    }
    return runs


def timed(argv: list[str]) -> float:
    "Wall seconds of one run of `argv` to its exit; a failing run stops the benchmark."
    t = time.perf_counter()
    out = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    if out.returncode != 0: sys.exit(f"{' '.join(argv)} exited {out.returncode}: {out.stderr[-2000:]}")
    return took


def main():
    runs = commands()
    for argv in runs.values(): timed(argv)  # warm the page cache: every round then reads the same files from memory
    start = quiet_start()
    times = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, argv in runs.items(): times[name].append(timed(argv))
    base = median(times["python -c pass"])
    result = {"rounds": ROUNDS, "budget_s": BUDGET_S, "baseline": "python -c pass", "baseline_median_s": base,
              "commands": {}}
    for name, ts in times.items():
        m = median(ts)
        result["commands"][name] = {"runs_s": [round(t, 4) for t in ts], "median_s": m, "vs_baseline": m / base,
                                    "above_baseline_s": m - base, "under_budget": m < BUDGET_S}
        print(f"{name:45} median {m:6.3f} s  ({m / base:5.1f}x python -c pass, +{m - base:.3f} s)", flush=True)
    helps = [c for n, c in result["commands"].items() if n.startswith("adaptkit ")]
    result["slowest_help_median_s"] = max(c["median_s"] for c in helps)
    result["all_help_under_budget"] = all(c["under_budget"] for c in helps)
    write_result("startup", result, start)


if __name__ == "__main__":
    main()
