"""Every adaptkit trainer, a few steps on tiny random models, under `accelerate launch` on two CPU ranks.

    accelerate launch --multi_gpu --num_processes 2 ... ddp_trainers.py MODEL_DIR OUT NAME [NAME ...]

tests/project/test_multiprocess.py launches it, and calls `train(name, ...)` in its own process for the one-process
reference with the same global batch. For each trainer NAME (one of `TRAINERS`), each rank writes to OUT/NAME/:
- `rank{R}.safetensors`: its weights after training, `init.rank{R}.safetensors` before (PiSSA's: right after its init);
- `rank{R}.json`: the world size and steps it saw, and `writes`: what it wrote under `saved/` and `run/_pissa_init/`
  (files opened for writing, folders made or renamed, seen by an audit hook; safetensors' own writes are not seen);
then saves and pushes the way a user's script does, on every rank (`trainer.save_model`, `trainer.push_to_hub` to the
Hub at HF_ENDPOINT; `dpo_rounds(push_to=...)`), which must write and upload once. A trainer that fails stops the launch.

Every run: seed 0, SGD (its update is lr x gradient, so a loss scaled twice shows, which Adam's normalised step would
hide), no gradient clipping (which would hide it too), constant learning rate, a global batch of `GLOBAL_BATCH` rows.
"""
import json
import os
import sys
from pathlib import Path

GLOBAL_BATCH, STEPS = 4, 3
TRAINERS = ("aligner", "pissa", "repnoise", "translora", "dpo")
WATCHED = ("saved", "run/_pissa_init")  # what one process writes (the final save, PiSSA's initial adapter)


def _common(out: Path, per_device: int, accumulation: int) -> dict:
    "The training settings every trainer here shares (see the module's docstring)."
    return dict(output_dir=str(out / "run"), max_steps=STEPS, per_device_train_batch_size=per_device,
                gradient_accumulation_steps=accumulation, optim="sgd", lr_scheduler_type="constant", warmup_steps=0,
                max_grad_norm=0.0, weight_decay=0.0, seed=0, use_cpu=True, save_strategy="no", report_to="none",
                disable_tqdm=True, logging_steps=1, bf16=False)


def _prompts(n: int = 16) -> list[str]:
    return [f"what is {i} plus {i + 1}?" for i in range(n)]


def aligner(model_dir, tok, out, common):
    from adaptkit.aligner import AlignerConfig, AlignerTrainer
    rows = [{"question": q, "answer": f"{i}", "correction": f"{2 * i + 1}"} for i, q in enumerate(_prompts())]
    return AlignerTrainer(str(model_dir), AlignerConfig(**common, learning_rate=0.5, gradient_checkpointing=False),
                          rows, processing_class=tok)


def pissa(model_dir, tok, out, common):
    import datasets

    from adaptkit.pissa import PiSSAConfig, PiSSATrainer
    rows = datasets.Dataset.from_list([{"prompt": q, "completion": f" {2 * i + 1}."} for i, q in enumerate(_prompts())])
    args = PiSSAConfig(**common, pissa_r=2, learning_rate=0.5)
    return PiSSATrainer(str(model_dir), args, rows, processing_class=tok)


def repnoise(model_dir, tok, out, common, cls=None):
    from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer
    rows = [{"prompt": f"how do I do bad thing {i}?", "harmful": f"step {i}: do it", "harmless": "I can't help."}
            for i in range(16)]
    # beta 1: the noise term (MMD through the layer hooks) weighs on the update, not 1/1000 of it
    args = RepNoiseConfig(**common, learning_rate=0.2, beta=1.0, max_length=32)
    return (cls or RepNoiseTrainer)(str(model_dir), args, rows, processing_class=tok)


def translora(model_dir, tok, out, common):
    import datasets

    from adaptkit.translora import DistillationConfig, TransLoRATrainer
    rows = datasets.Dataset.from_list([{"prompt": q, "completion": f" {2 * i + 1}."} for i, q in enumerate(_prompts())])
    args = DistillationConfig(**common, learning_rate=0.5, lora_r=4)
    return TransLoRATrainer(str(model_dir), args, rows, processing_class=tok)


def dpo(model_dir, tok, out, common, push_to=None):
    "One round of `dpo_rounds`; corrections made by a stand-in aligner, so every row is a pair (the same on each rank)."
    from trl import DPOConfig

    from adaptkit.aligner import Aligner, dpo_rounds
    from adaptkit.models import load_causal_lm

    class Fixed(Aligner):
        def correct(self, questions, answers, **kwargs): return [f"{a} (corrected)" for a in answers]

    common = {**common, "max_steps": STEPS - 1, "logging_steps": 1}
    args = DPOConfig(**common, beta=0.1, learning_rate=2.0)
    return dpo_rounds(load_causal_lm(model_dir), tok, Fixed(load_causal_lm(model_dir), tok), _prompts(8), rounds=1,
                      args=args, push_to=push_to, hub_endpoint=os.environ.get("HF_ENDPOINT"), max_new_tokens=3)


def train(name: str, model_dir: Path, out: Path, *, per_device: int = GLOBAL_BATCH, accumulation: int = 1,
          trainer_class=None, push: bool = False):
    """Train `name`: (the trained model, its trainer (dpo: the `AlignedPolicy`), the state dict it started from).
    `trainer_class` replaces RepNoise's trainer class (the one-process reference's)."""
    from transformers import set_seed

    from adaptkit.models import load_tokenizer
    set_seed(0)  # a user's script seeds: the LoRA that peft draws before the Trainer seeds is then the same
    tok, common = load_tokenizer(model_dir), _common(out, per_device, accumulation)
    if name == "dpo":
        policy = dpo(model_dir, tok, out, common, push_to="team/ddp-dpo" if push else None)
        from safetensors.torch import load_file
        return policy.model, policy, load_file(Path(model_dir) / "model.safetensors")
    trainer = globals()[name](model_dir, tok, out, common, **({"cls": trainer_class} if trainer_class else {}))
    init = _state(trainer.model)  # PiSSA's: its seeded init and the residual base; a LoRA's: peft's draw
    trainer.train()
    return trainer.model, trainer, init


def _state(model) -> dict:
    return {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}


def watch_writes(writes: dict) -> None:
    """Record in `writes["seen"]` every path under `writes["root"]/WATCHED` this process opens for writing, makes or
    renames (Python's audit events: `open`, `os.mkdir`, `os.rename`, `os.replace`)."""
    def hook(event, args):
        if writes.get("root") is None: return
        if event == "open":
            path, mode, flags = args
            if not (mode and any(c in mode for c in "wax+")) and not (flags and flags & (os.O_WRONLY | os.O_RDWR)):
                return
            paths = [path]
        elif event in ("os.mkdir", "os.rename", "os.replace"): paths = list(args[:2])
        else: return
        for p in paths:
            if not isinstance(p, (str, os.PathLike)): continue
            try: rel = Path(os.fspath(p)).absolute().relative_to(writes["root"]).as_posix()
            except ValueError: continue
            if rel.startswith(WATCHED): writes["seen"].append(rel)
    sys.addaudithook(hook)


def main(model_dir: Path, out: Path, names: list[str]):
    from safetensors.torch import save_file
    rank = int(os.environ.get("RANK", 0))
    writes = {"root": None, "seen": []}
    watch_writes(writes)
    for name in names:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        writes.update(root=folder.absolute(), seen=[])
        model, trainer, init = train(name, model_dir, folder, per_device=GLOBAL_BATCH // 2, push=True)
        if init is not None: save_file(init, folder / f"init.rank{rank}.safetensors")
        save_file(_state(model), folder / f"rank{rank}.safetensors")
        record = {"name": name}
        if name == "dpo":
            record |= {"rounds": trainer.rounds, "world_size": int(os.environ.get("WORLD_SIZE", 1))}
        else:
            trainer.save_model(str(folder / "saved"))  # every rank calls it, as a user's script does
            trainer.args.hub_model_id = f"team/ddp-{name}"
            trainer.push_to_hub()
            record |= {"world_size": trainer.args.world_size, "global_step": trainer.state.global_step}
        record["writes"] = sorted(set(writes["seen"]))
        writes["root"] = None
        (folder / f"rank{rank}.json").write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
