"""EMR-Merging when the task is unknown (issue 27 item 1), on the EMR tutorial's tasks and models: all-MiniLM-L6-v2
fine-tuned separately on news, chat, puzzle and qa_match (60 steps, seeds 0-2, as nbs/tutorials/14_repro_emr.ipynb;
models already in /tmp/repro-emr are reused), the encoder merged with `emr_merge(exclude=["classifier.*"])`.

For each seed and each router (method "prototype" or "linear", fitted with `EMRBundle.fit_router` on K texts per task
drawn from the training splits, K in --shots), on every test row of the four tasks pooled (tasks unknown to the router):
- routing accuracy: the router picks the row's task;
- routed accuracy: the routed model's answer (`load_routed_model`: the picked task's model) is right; a row routed to
  another task counts as wrong (its answer is in another task's label space);
- known-task accuracy: EMR's task model with the task named (the tutorial's EMR number, the ceiling of routing);
- the unified model alone: base + unified task vector (no mask, no rescaler) with the task's own head.
Intervals: Wilson 95% for every accuracy, on the test rows pooled over seeds (the same rows recur across seeds, so these
intervals are somewhat too narrow), and per seed; the tutorial's bootstrap (seeds, then rows) for the mean over tasks
(each task weighted alike) and for the paired differences routed - known and routed - unified. Also the cost: seconds
per 100 texts of routed inference (routing pass + task model) against the task model alone, one full routed pass per
seed (the other routers reuse its routing features: the same batches, so the same routes as the routed path's).

Run (quiet machine): .venv/bin/python benchmarks/emr_route.py   -> benchmarks/results/emr_route.json
     full: 3 seeds x 4 routers, ~700 test rows; estimated ~5 min on 2 quiet cores with the tutorial's models in
     /tmp/repro-emr, ~10-15 min when the 12 models must be fine-tuned first.
Smoke test (seconds once the models exist; writes emr_route_smoke[.loaded].json), in a loaded shell with
     ADAPTKIT_BENCH_ALLOW_LOADED=1 ADAPTKIT_BENCH_WAIT=0:
     .venv/bin/python benchmarks/emr_route.py --limit 8 --seeds 0 --shots 4 --steps 2
"""
import argparse
import math
import random
import statistics
import time
import warnings
from pathlib import Path

import torch
from _bench import quiet_start, write_result

from adaptkit.emr import emr_merge
from adaptkit.tasks import bootstrap_ci, finetune_classifier, minilm, text_task

warnings.filterwarnings("ignore")
TASKS, METHODS, Z95 = ["news", "chat", "puzzle", "qa_match"], ["prototype", "linear"], 1.959963984540054
MAX_LENGTH = 64  # tokens per text, as the tutorial scores its models


def wilson(hits: list[int]) -> dict:
    "Accuracy of 0/1 `hits` with its Wilson score 95% interval."
    n, k = len(hits), sum(hits)
    if n == 0: return {"mean": None, "low": None, "high": None, "n": 0}
    p, z2 = k / n, Z95 * Z95
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return {"mean": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half), "n": n}


def task_weighted(hits: dict, sizes: dict) -> list[float]:
    "One seed's rows of every task, scaled so that their plain mean is the mean of the task accuracies."
    return [h * sum(sizes.values()) / (len(sizes) * sizes[t]) for t in sizes for h in hits[t]]


def ci(lists: list[list[float]]) -> dict:
    return {k: v for k, v in bootstrap_ci(lists).items() if k in ("mean", "low", "high")}


def split_by_task(flat: list, tasks: list[str]) -> dict:
    "Row values in test order -> task -> values."
    out = {t: [] for t in TASKS}
    for t, v in zip(tasks, flat): out[t].append(v)
    return out


def timed_forward(routed, texts, tasks=None) -> tuple[list, float]:
    t0 = time.perf_counter()
    out = routed.forward(texts, tasks)
    return out, time.perf_counter() - t0


def run_seed(seed: int, args, data: dict, base: Path, tok) -> dict:
    "Every measure for one seed: known-task, unified, and per router its routing and routed accuracy."
    work = Path(args.workdir) / f"s{seed}"
    models = {t: work / t for t in TASKS}
    for t, out in models.items():
        if not (out / "model.safetensors").exists():
            finetune_classifier(base, data[t], out, steps=args.steps, seed=seed)
    bundle = emr_merge(base, models, exclude=["classifier.*"], progress=False)
    test = {t: data[t]["test"].select(range(min(len(data[t]["test"]), args.limit or 10**9))) for t in TASKS}
    texts = [x for t in TASKS for x in test[t]["text"]]
    truth = [t for t in TASKS for _ in test[t]["text"]]
    labels = [y for t in TASKS for y in test[t]["label"]]
    def hits_of(outputs): return [int(o.task == t and int(o.logits.argmax()) == y)
                                  for o, t, y in zip(outputs, truth, labels)]

    rng = random.Random(seed)  # the router's examples: K training rows per task, the same rows as K grows
    pool = {t: rng.sample(data[t]["train"]["text"], max(args.shots)) for t in TASKS}
    bundle.fit_router({t: pool[t][: max(args.shots)] for t in TASKS}, tok, max_length=MAX_LENGTH)
    routed = bundle.load_routed_model(tok, batch_size=args.batch_size)
    for t in TASKS: routed.task_model(t)  # every task model loaded before the timings
    known_out, known_s = timed_forward(routed, texts, truth)  # the task named: no routing
    full_out, routed_s = timed_forward(routed, texts)  # the whole routed path: routing features + the task's model
    # the routing pass, reused by every router below: the same batches as the routed path, so the same features
    features = bundle.router_features(texts, tok, max_length=MAX_LENGTH, batch_size=args.batch_size)
    assert [o.task for o in full_out] == bundle.router.predict(features)
    unified = {}
    for t in TASKS:
        model = bundle.load_unified_model(t).eval()
        with torch.no_grad():
            for i in range(0, len(test[t]), args.batch_size):
                rows = test[t][i : i + args.batch_size]
                batch = tok(rows["text"], truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
                unified.setdefault(t, []).extend((model(**batch).logits.argmax(-1) == torch.tensor(rows["label"]))
                                                 .int().tolist())
    per_100 = {"known_task": 100 * known_s / len(texts), "routed": 100 * routed_s / len(texts)}
    result = {"seed": seed, "rows": {t: len(test[t]) for t in TASKS}, "known": split_by_task(hits_of(known_out), truth),
              "unified": unified, "routers": {}, "seconds_per_100_texts": per_100}
    for method in METHODS:
        for k in args.shots:
            router = bundle.fit_router({t: pool[t][:k] for t in TASKS}, tok, method=method, max_length=MAX_LENGTH)
            tasks = router.predict(features)
            outputs = routed.forward(texts, tasks)
            result["routers"][f"{method}/{k}"] = {
                "routing": split_by_task([int(a == b) for a, b in zip(tasks, truth)], truth),
                "routed": split_by_task(hits_of(outputs), truth),
                "confusion": {t: {u: sum(1 for a, b in zip(tasks, truth) if b == t and a == u) for u in TASKS}
                              for t in TASKS}}
    def acc(h): return statistics.mean(x for t in TASKS for x in h[t])
    print(f"seed {seed}: known {acc(result['known']):.3f}  unified {acc(result['unified']):.3f}  " + "  ".join(
        f"{n}: routing {acc(r['routing']):.3f} routed {acc(r['routed']):.3f}" for n, r in result["routers"].items()))
    return result


def summarise(runs: list[dict]) -> dict:
    "Wilson intervals (pooled rows, per task and per seed), bootstrap means over tasks, paired differences."
    sizes = runs[0]["rows"]
    measures = {"known": [r["known"] for r in runs], "unified": [r["unified"] for r in runs]}
    for name in runs[0]["routers"]:
        measures[f"routing {name}"] = [r["routers"][name]["routing"] for r in runs]
        measures[f"routed {name}"] = [r["routers"][name]["routed"] for r in runs]
    out = {}
    for m, per_seed in measures.items():
        out[m] = {"all rows (Wilson)": wilson([h for s in per_seed for t in TASKS for h in s[t]]),
                  "per task (Wilson)": {t: wilson([h for s in per_seed for h in s[t]]) for t in TASKS},
                  "per seed (Wilson)": [wilson([h for t in TASKS for h in s[t]]) for s in per_seed],
                  "mean over tasks (bootstrap)": ci([task_weighted(s, sizes) for s in per_seed])}
    def paired(a, b):
        return ci([[x - y for x, y in zip(task_weighted(sa, sizes), task_weighted(sb, sizes))]
                   for sa, sb in zip(measures[a], measures[b])])
    diffs = {}
    for name in runs[0]["routers"]:
        diffs[f"routed {name} - known"] = paired(f"routed {name}", "known")
        diffs[f"routed {name} - unified"] = paired(f"routed {name}", "unified")
    best = max(runs[0]["routers"], key=lambda n: out[f"routed {n}"]["all rows (Wilson)"]["mean"])
    return {"accuracy": out, "paired_differences": diffs, "best_router_by_routed_accuracy": best}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="fine-tuning seeds (the tutorial's: 0 1 2)")
    ap.add_argument("--shots", type=int, nargs="+", default=[4, 16], help="router examples per task (K)")
    ap.add_argument("--steps", type=int, default=60, help="fine-tuning steps per task model (the tutorial's: 60)")
    ap.add_argument("--limit", type=int, default=None, help="test rows per task (smoke runs; default all)")
    ap.add_argument("--workdir", default=None, help="fine-tuned models (default /tmp/repro-emr, the tutorial's, for 60 "
                                                    "steps; /tmp/emr-route-steps<N> otherwise)")
    ap.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the tutorial's: 2)")
    args = ap.parse_args()
    if args.workdir is None:
        args.workdir = "/tmp/repro-emr" if args.steps == 60 else f"/tmp/emr-route-steps{args.steps}"
    if min(args.shots) < 2: ap.error("--shots: a router needs at least 2 examples per task")
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    start = quiet_start()
    t0 = time.perf_counter()
    data, base = {t: text_task(t) for t in TASKS}, minilm()
    tok = AutoTokenizer.from_pretrained(base)
    runs = [run_seed(seed, args, data, base, tok) for seed in args.seeds]
    summary = summarise(runs)
    for m, v in summary["accuracy"].items():
        w, b = v["all rows (Wilson)"], v["mean over tasks (bootstrap)"]
        print(f"{m:24s} {w['mean']:.3f} [{w['low']:.3f}, {w['high']:.3f}] (n={w['n']})  "
              f"mean over tasks {b['mean']:.3f} [{b['low']:.3f}, {b['high']:.3f}]")
    for k, v in summary["paired_differences"].items():
        print(f"  {k:32s} {v['mean']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]")
    result = {
        "model": "all-MiniLM-L6-v2", "tasks": TASKS, "seeds": args.seeds, "steps": args.steps, "shots": args.shots,
        "methods": METHODS, "limit": args.limit, "max_length": MAX_LENGTH, "threads": args.threads,
        "router": "EMRBundle.fit_router: the unified model's last hidden states, mean-pooled; K training rows per task",
        "interval": "Wilson 95% on test rows pooled over seeds (rows recur across seeds: a bit narrow) and per seed; "
                    "bootstrap 95% (seeds, then rows; adaptkit.tasks.bootstrap_ci) for the mean over tasks, each task "
                    "weighted alike, and for paired differences",
        **summary,
        "seconds_per_100_texts": [r["seconds_per_100_texts"] for r in runs],
        "runs": [{"seed": r["seed"], "rows": r["rows"],
                  "hits": {"known": {t: "".join(map(str, h)) for t, h in r["known"].items()},
                           "unified": {t: "".join(map(str, h)) for t, h in r["unified"].items()},
                           **{f"{kind} {n}": {t: "".join(map(str, h)) for t, h in v[kind].items()}
                              for n, v in r["routers"].items() for kind in ("routing", "routed")}},
                  "confusion (true -> routed)": {n: v["confusion"] for n, v in r["routers"].items()}} for r in runs],
        "wall_seconds": time.perf_counter() - t0,
    }
    write_result("emr_route_smoke" if args.limit else "emr_route", result, start)


if __name__ == "__main__":
    main()
