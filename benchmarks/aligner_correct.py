"""Aligner.correct throughput on SmolLM2-135M-Instruct: corrections per second batched (8, 16 and 32, sorted by length;
16 unsorted; 16 without prefix sharing, the path before it) vs one at a time, on question/answer pairs of mixed lengths
(8 to about 90 prompt tokens of text around the template), with min_new_tokens = max_new_tokens so every variant does
the same work. One at a time is each pair generated alone with its whole prompt (share_prefix=False: what a caller
correcting one pair per call gets). The batched variants share the template's opening (share_prefix=True, the default:
the common leading tokens run once per call, each batch's own tokens run without padding), except
batch_16_no_prefix_sharing (plain left-padded batches). The variants run interleaved in each repeat (so load changes
hit them alike); medians of the repeats and the speed-up measured within each repeat are reported, and every batched
variant's corrections are compared with the one-at-a-time corrections (greedy: they must be equal). A prefill-only pass
(1 new token) shows how much of the time is prefill, which batching alone does not save.
Run (quiet machine): .venv/bin/python benchmarks/aligner_correct.py   -> benchmarks/results/aligner.json
Smoke test (loaded), with ADAPTKIT_BENCH_ALLOW_LOADED=1 ADAPTKIT_BENCH_WAIT=0 in the environment:
    .venv/bin/python benchmarks/aligner_correct.py --pairs 16 --new-tokens 16 --repeats 1
"""
import argparse
import os
import time
import warnings

import torch
from _bench import median, quiet_start, write_result

from adaptkit.aligner import Aligner, format_aligner_prompt
from adaptkit.models import load_causal_lm, load_tokenizer, smollm2

warnings.filterwarnings("ignore")
QUESTIONS = [
    "What is {a} plus {b}?",
    "Could you please tell me, step by step and without skipping anything, what {a} plus {b} equals, and why?",
    "{a} + {b} = ?",
    "My teacher asked what the sum of {a} and {b} is; I have an exam tomorrow "
    "and I want to be sure I understand how to add two numbers like these. What is it?",
]
ANSWER = "I think {a} plus {b} is {s}, but I am not sure."
# name: (batch_size, sort_by_length, share_prefix)
VARIANTS = {
    "one_at_a_time": (1, True, False),
    "batch_8": (8, True, True),
    "batch_16": (16, True, True),
    "batch_32": (32, True, True),
    "batch_16_unsorted": (16, False, True),
    "batch_16_no_prefix_sharing": (16, True, False),
}
PREFILL_VARIANTS = ("one_at_a_time", "batch_16", "batch_16_no_prefix_sharing")


def pairs(n: int) -> tuple[list[str], list[str]]:
    "`n` questions of four lengths with answers of one to four sentences: lengths mix as in real use."
    qs, answers = [], []
    for i in range(n):
        a, b = 3 + i, 40 + i
        qs.append(QUESTIONS[i % 4].format(a=a, b=b))
        answers.append(" ".join(ANSWER.format(a=a, b=b, s=a + b + (i + k) % 3 - 1) for k in range(1 + (i * 7) % 4)))
    return qs, answers


def timed(aligner, qs, answers, batch_size, sort, share, **kw):
    "(seconds, corrections) of one `correct` call."
    t = time.perf_counter()
    out = aligner.correct(
        qs, answers, batch_size=batch_size, sort_by_length=sort, share_prefix=share, progress=False, **kw
    )
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=32, help="question/answer pairs corrected per variant")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per correction (min = max)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per variant (median reported)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    folder = smollm2()
    aligner = Aligner(load_causal_lm(folder), load_tokenizer(folder))
    qs, answers = pairs(a.pairs)
    prompts = [format_aligner_prompt(q, x, aligner.template) for q, x in zip(qs, answers)]
    rows = aligner.tokenizer(prompts, add_special_tokens=False)["input_ids"]  # as `correct` tokenises them
    lengths, shared = [len(r) for r in rows], len(os.path.commonprefix(rows))
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)
    aligner.correct(qs[:2], answers[:2], batch_size=2, max_new_tokens=2, progress=False)  # warm-up
    start = quiet_start()
    seconds, outputs, prefill = {v: [] for v in VARIANTS}, {}, {v: [] for v in PREFILL_VARIANTS}
    for r in range(a.repeats):
        for name, variant in VARIANTS.items():
            s, outputs[name] = timed(aligner, qs, answers, *variant, **kw)
            seconds[name].append(s)
            print(f"repeat {r}: {name:26s} {s:6.1f} s", flush=True)
        for name in prefill:
            prefill[name].append(timed(aligner, qs, answers, *VARIANTS[name], max_new_tokens=1)[0])
    single = seconds["one_at_a_time"]
    variants = {
        name: {
            "batch_size": VARIANTS[name][0],
            "sorted_by_length": VARIANTS[name][1],
            "share_prefix": VARIANTS[name][2],
            "seconds": s,
            "median_s": median(s),
            "corrections_per_s": a.pairs / median(s),
            "speedup_per_repeat": [one / x for one, x in zip(single, s)],
            "median_speedup_vs_one_at_a_time": median([one / x for one, x in zip(single, s)]),
            "identical_to_one_at_a_time": outputs[name] == outputs["one_at_a_time"],
            "identical_fraction": sum(x == y for x, y in zip(outputs[name], outputs["one_at_a_time"])) / a.pairs,
        }
        for name, s in seconds.items()
    }
    result = {
        "benchmark": "Aligner.correct, batched vs one at a time",
        "model": "SmolLM2-135M-Instruct (fp32, dequantized Q4_1 GGUF)",
        "pairs": a.pairs,
        "prompt_tokens": {"min": min(lengths), "max": max(lengths), "total": sum(lengths)},
        "shared_prefix_tokens": shared,
        "share_prefix": "share_prefix=True runs the prompts' common leading tokens (the template's opening) once per "
                        "call and each batch's own tokens without padding (generate_batched); one_at_a_time and "
                        "batch_16_no_prefix_sharing run every prompt whole, left-padded in batches",
        "new_tokens_per_correction": a.new_tokens,
        "repeats": a.repeats,
        "variants": variants,
        "prefill_only_s": {k: {"seconds": v, "median_s": median(v)} for k, v in prefill.items()},
        "all_batched_identical_to_one_at_a_time": all(v["identical_to_one_at_a_time"] for v in variants.values()),
    }
    for name, v in variants.items():
        print(f"{name:26s} {v['corrections_per_s']:.2f} corrections/s, x{v['median_speedup_vs_one_at_a_time']:.2f}, "
              f"identical: {v['identical_to_one_at_a_time']}")
    write_result("aligner", result, start)


if __name__ == "__main__":
    main()
