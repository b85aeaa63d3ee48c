"""What the compact LM head saves per SFT training step: `PiSSATrainer` steps with `compact_lm_head` on (the default:
TRL's fused head projects only the labelled positions, `adaptkit.config.compact_lm_head`) and off (TRL's CPU path:
every position), on SmolLM2-135M-Instruct (49k vocabulary) and Gemma-3-270M (262k), in one run.

Per model, two trainers are built the same way but for `compact_lm_head` (each its own copy of the base, the same PiSSA
r16 init on all linear layers, seed, rows, batches, lr 2e-4 as in the demo, AdamW), on the demo's arithmetic rows
(`adaptkit.tasks.arithmetic_task`: prompt = the system line and the question rendered with SmolLM2's chat template, as
the demo gives them to Gemma, completion = the answer; completion-only loss), batch 4. First one step each with the LM
head's calls counted: the step-1 losses must agree (`torch.testing.assert_close`) and the compact head must have
projected fewer rows (one per label), or nothing is measured. Then `--repeats` paired repeats, the order of the two
alternating from one repeat to the next: each is one `trainer.train()` of `--warmup` + `--steps` steps from the same
seed, timed by a callback from each step's start to its end (forward, backward, clipping, AdamW, schedule; the batch is
collated before the step starts); a repeat's time is the median of its measured steps. Reported per model: the median
over repeats of seconds/step (wall, and the process's CPU seconds) with the head compact and not, the ratio off/on
(median and range of the paired ratios), the step-1 losses and the largest relative loss difference over every step.
Everything runs on the CPU (`use_cpu=True`): on a CUDA GPU TRL's head is compact already, with or without the switch.
Writes benchmarks/results/sft_step.json through `_bench.write_result` (which waits for a quiet machine first).
Run: .venv/bin/python benchmarks/sft_step.py [--repeats 5] [--models smollm2,gemma] [--precision fp32]
     About 5 minutes on a quiet 2-core box (an estimate: a 1-thread smoke on the loaded box took 1.3 CPU s a step
     compact and 1.6 TRL's on SmolLM2, 2.3 and 5.5 on Gemma; 2 x 5 x 4 steps a model, plus two PiSSA inits each).
     Only on a quiet machine: with other processes on the cores, torch's 2 threads wait on each other and the times
     grow several-fold (a 2-thread smoke at load 3 took 7 to 14 CPU s a step).
Smoke: .venv/bin/python benchmarks/sft_step.py --quick [--out x.json]  (tiny random Llama and Gemma 3, under a minute
     with the imports; no quiet-machine wait, writes nothing unless --out: its times measure nothing;
     tests/project/test_sft_step.py runs it)"""
import argparse
import contextlib
import copy
import gc
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from transformers import PrinterCallback, TrainerCallback, set_seed

sys.path.insert(0, str(Path(__file__).parent))
from _bench import code_commit, median, quiet_start, threads_at_start, write_result  # noqa: E402

MODES = {"on": True, "off": False}  # compact_lm_head
MODELS = ("smollm2", "gemma")
SEED = 42  # the trainers' seed (TrainingArguments' default)
warnings.filterwarnings("ignore")


class StepClock(TrainerCallback):
    """Wall and process CPU seconds of each optimiser step, from `on_step_begin` to `on_step_end` (the batch is collated
    before it begins)."""
    def __init__(self): self.seconds, self.cpu_seconds, self.t = [], [], None
    def on_step_begin(self, args, state, control, **kw): self.t = time.perf_counter(), time.process_time()
    def on_step_end(self, args, state, control, **kw):
        self.seconds.append(time.perf_counter() - self.t[0])
        self.cpu_seconds.append(time.process_time() - self.t[1])


def recorded_losses(trainer) -> list:
    "The loss of each `compute_loss` call of `trainer` (its own, the mixin's compact head inside), detached, in order."
    losses, inner = [], trainer.compute_loss
    def compute_loss(*a, **kw):
        out = inner(*a, **kw)
        losses.append((out[0] if isinstance(out, tuple) else out).detach().float().clone())
        return out
    trainer.compute_loss = compute_loss
    return losses


@contextlib.contextmanager
def head_rows():
    "Rows each call of TRL's fused LM head projects (`ChunkedLogProbFunction.apply`), in order, while the block runs."
    from trl.kernels import ChunkedLogProbFunction
    rows, apply = [], ChunkedLogProbFunction.apply
    def counted(hidden, *args):
        rows.append(int(hidden.shape[0]))
        return apply(hidden, *args)
    ChunkedLogProbFunction.apply = counted
    try: yield rows
    finally: ChunkedLogProbFunction.apply = apply


def bases(quick: bool) -> dict:
    "Model name -> (a function loading the base, its tokenizer), and the tokenizer whose chat template renders prompts."
    from adaptkit.models import gemma3_270m, load_causal_lm, load_tokenizer, smollm2, tiny_causal_lm, tiny_tokenizer
    if quick:
        tok = tiny_tokenizer()
        return {"smollm2": (lambda: tiny_causal_lm(tok), tok),
                "gemma": (lambda: tiny_causal_lm(tok, model_type="gemma3_text"), tok)}, tok
    smol, gemma = smollm2(), gemma3_270m()  # converted once from their GGUF packages, before anything is timed
    return {"smollm2": (lambda: load_causal_lm(smol), load_tokenizer(smol)),
            "gemma": (lambda: load_causal_lm(gemma), load_tokenizer(gemma))}, load_tokenizer(smol)


def sft_rows(chat_tok, n: int):
    "`n` of the demo's arithmetic rows as prompt/completion text: the chat-rendered system line and question, answer."
    import datasets

    from adaptkit.tasks import arithmetic_prompts, arithmetic_task
    train = arithmetic_task(n, 1)["train"]
    return datasets.Dataset.from_dict({"prompt": arithmetic_prompts(chat_tok, train), "completion": train["answer"]})


def trainers(load, tok, rows, work: Path, a) -> dict:
    "Mode -> (PiSSATrainer, its StepClock, its losses): built alike (own base copy, same init and seed) but the head."
    from adaptkit.pissa import PiSSAConfig, PiSSATrainer
    base, out = load(), {}
    for mode, on in MODES.items():
        cfg = PiSSAConfig(str(work / mode), pissa_r=16, max_steps=1, per_device_train_batch_size=a.batch,
                          learning_rate=2e-4, seed=SEED, compact_lm_head=on, use_cpu=True, bf16=a.precision == "bf16",
                          disable_tqdm=True, report_to="none", save_strategy="no", gradient_checkpointing=False)
        clock = StepClock()
        trainer = PiSSATrainer(copy.deepcopy(base), cfg, rows, processing_class=tok, callbacks=[clock])
        trainer.remove_callback(PrinterCallback)  # no metrics printed at each train()'s end
        out[mode] = (trainer, clock, recorded_losses(trainer))
    return out


def run(trainer, clock, losses, steps: int) -> dict:
    "One `train()` of `steps` steps from the trainers' seed: each step's wall and CPU seconds, and its loss."
    for x in (clock.seconds, clock.cpu_seconds, losses): x.clear()
    trainer.args.max_steps = steps
    set_seed(SEED)  # the same data order for both heads, at every repeat
    trainer.train()
    return {"seconds": list(clock.seconds), "cpu_seconds": list(clock.cpu_seconds),
            "losses": [float(x) for x in losses]}


def first_step(ts: dict, precision: str) -> dict:
    "One step of each, the head's rows counted: the step-1 losses agree and the compact head projected fewer rows."
    loss, rows = {}, {}
    for mode, t in ts.items():
        with head_rows() as calls: loss[mode] = run(*t, 1)["losses"][0]
        rows[mode] = calls
    tol = {"rtol": 1e-5, "atol": 1e-6} if precision == "fp32" else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(torch.tensor(loss["on"]), torch.tensor(loss["off"]), **tol,
                               msg=lambda m: f"step-1 losses of the compact head and TRL's differ: {m}")
    if not (len(rows["on"]) == len(rows["off"]) == 1 and rows["on"][0] < rows["off"][0]):
        raise AssertionError(f"the LM head's projected rows per call, compact {rows['on']} vs TRL's {rows['off']}: the "
                             "compact head should project one row per label, TRL's CPU path every position")
    return {"loss": loss, "loss_abs_diff": abs(loss["on"] - loss["off"]), "tolerance": tol,
            "head_rows": {"on (labelled positions)": rows["on"][0], "off (every position)": rows["off"][0]}}


def summary(runs: dict, key: str, warmup: int) -> dict:
    "Median over repeats of each repeat's median measured `key` ('seconds', 'cpu_seconds') per head; paired ratios."
    per_repeat = {m: [median(r[key][warmup:]) for r in rs] for m, rs in runs.items()}
    ratios = [off / on for on, off in zip(per_repeat["on"], per_repeat["off"])]
    return {"per_step": {m: median(v) for m, v in per_repeat.items()},
            "saved_per_step": median(per_repeat["off"]) - median(per_repeat["on"]),
            "ratio_off_over_on": {"median": median(ratios), "min": min(ratios), "max": max(ratios)},
            "per_repeat_median": per_repeat, "paired_ratios": ratios}


def measure(load, tok, rows, a) -> dict:
    "Step-1 check, then `a.repeats` paired, alternating repeats of `a.warmup` + `a.steps` steps per head."
    with tempfile.TemporaryDirectory(prefix="adaptkit-sft-step-") as work:
        ts = trainers(load, tok, rows, Path(work), a)
        model = ts["on"][0].model
        record = {"vocab_size": model.config.get_text_config().vocab_size,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                  "step_1": first_step(ts, a.precision)}
        runs = {m: [] for m in MODES}
        for r in range(a.repeats):
            for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                runs[mode].append(run(*ts[mode], a.warmup + a.steps))
                s = runs[mode][-1]
                print(f"  repeat {r + 1}/{a.repeats} head {mode:3}: {median(s['seconds'][a.warmup:]):.3f} s/step "
                      f"({median(s['cpu_seconds'][a.warmup:]):.3f} CPU s)", flush=True)
        del ts, model
        gc.collect()
    pairs = [(x, y) for on, off in zip(runs["on"], runs["off"]) for x, y in zip(on["losses"], off["losses"])]
    return {**record, "wall": summary(runs, "seconds", a.warmup), "cpu": summary(runs, "cpu_seconds", a.warmup),
            "loss_max_rel_diff_all_steps": max(abs(x - y) / max(abs(y), 1e-12) for x, y in pairs), "runs": runs}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=None, help="paired repeats per model, the order alternating "
                    "(default 5; 2 with --quick)")
    ap.add_argument("--warmup", type=int, default=1, help="steps at the start of each repeat left out of its time")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per repeat (their median is the repeat's)")
    ap.add_argument("--batch", type=int, default=4, help="prompt/completion rows per step")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: smollm2, gemma")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="fp32, or bf16: training under CPU bf16 autocast, as the demo's --precision bf16")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the 2-core box's: 2)")
    ap.add_argument("--quick", action="store_true", help="tiny random Llama and Gemma 3 models: a smoke run of the "
                    "code, no quiet-machine wait, nothing written unless --out")
    ap.add_argument("--out", default=None, help="write the JSON here instead of benchmarks/results/<name>.json")
    ap.add_argument("--name", default="sft_step", help="results name under benchmarks/results/ (a run of one model "
                    "or another precision should get its own, e.g. sft_step_bf16)")
    a = ap.parse_args(argv)
    a.repeats = a.repeats or (2 if a.quick else 5)
    a.models = a.models.split(",")
    if unknown := [m for m in a.models if m not in MODELS]:
        ap.error(f"--models {','.join(unknown)}: use smollm2, gemma")
    if min(a.repeats, a.steps, a.batch, a.threads) < 1 or a.warmup < 0:
        ap.error("--repeats, --steps, --batch and --threads must be at least 1, --warmup at least 0")
    return a


def main(argv=None) -> int:
    import datasets
    import transformers
    a = parse(argv)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    loaders, chat_tok = bases(a.quick)
    rows = sft_rows(chat_tok, a.batch * (a.warmup + a.steps))  # each repeat reads every row once
    start = quiet_start() if not a.quick else {"loaded": None, **threads_at_start(), **code_commit()}
    result = {"quick": a.quick, "trainer": "adaptkit.pissa.PiSSATrainer (CompactHeadMixin + TRL SFTTrainer)",
              "adapter": "PiSSA r16, alpha 16, all linear layers", "optimizer": "AdamW, lr 2e-4", "batch": a.batch,
              "precision": a.precision, "repeats": a.repeats, "warmup_steps": a.warmup, "measured_steps": a.steps,
              "rows": "adaptkit.tasks.arithmetic_task: SmolLM2-chat-rendered system line + question, the answer as "
                      "the completion (completion-only loss)",
              "note": "on = compact_lm_head=True (the default; TRL's fused head on the labelled positions only), off = "
                      "compact_lm_head=False (TRL's CPU path, every position). wall / cpu: seconds (process CPU "
                      "seconds, all threads) per step, the median over repeats of each repeat's median measured "
                      "step; ratio_off_over_on from the paired repeats. Each repeat is one train() from the seed: "
                      "the schedule restarts, AdamW's state carries over; runs: every step of every repeat.",
              "models": {}}
    for name in a.models:
        load, tok = loaders[name]
        print(f"{name}:", flush=True)
        r = result["models"][name] = measure(load, tok, rows, a)
        w, c = r["wall"], r["cpu"]
        print(f"{name}: {w['per_step']['on']:.3f} s/step compact, {w['per_step']['off']:.3f} s TRL's; off/on "
              f"{w['ratio_off_over_on']['median']:.2f} [{w['ratio_off_over_on']['min']:.2f}, "
              f"{w['ratio_off_over_on']['max']:.2f}] (CPU s: {c['ratio_off_over_on']['median']:.2f}); step-1 loss "
              f"{r['step_1']['loss']['on']:.6f} vs {r['step_1']['loss']['off']:.6f}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({**result, **start, "torch_threads": torch.get_num_threads()}, indent=1)
                               + "\n")
    elif not a.quick:
        write_result(a.name, result, start)
    return 0


if __name__ == "__main__": sys.exit(main())
