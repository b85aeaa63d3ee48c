"""The GPU check: every adaptkit trainer, PiSSA's init, QPiSSA in 4 bits, batched Aligner generation and a merge, on
one CUDA GPU in bf16, each timed, in one run sized to take under 8 minutes on an H200 (not yet run on one: no GPU
was lent while it was written; `--budget-s` starts no check after 390 s).

Every model is built offline from a config with random weights (nothing downloads): the trainers and the generation
use Qwen2.5-0.5B's layers (24 x 896, MLP 4864, 14 query / 2 key-value heads; 358M parameters) with adaptkit's tiny
offline tokenizer (512 tokens); PiSSA's init, QPiSSA and the merge use the whole Qwen2.5-0.5B shape (its 151,936-token
vocabulary too, 494M parameters), the init's 168 projections given a decaying spectrum (singular values ~ 1/sqrt(k),
as trained weights' decay; a flat random spectrum would make every randomised SVD look bad). Trainers train fp32
weights under bf16 autocast (adaptkit's default on a CUDA GPU: `MethodConfig.bf16`); the other checks hold bf16
weights. Each check runs in its own try: a failure is recorded with its error and the rest still run; the script
exits 1 when any check failed (or was not reached within `--budget-s`).

Writes benchmarks/results/gpu.json: torch, CUDA and library versions, the device, each check's status, seconds,
peak GPU memory and what it measured, the commit (`_bench.code_commit`; set ADAPTKIT_COMMIT where the tree has no
.git), the load average at start and end. On a machine without CUDA it says so, measures and writes nothing (an
earlier GPU result stays: `make bench` runs this on the CPU box too), and exits 0.

Run on a GPU machine, from the repository root, with a CUDA torch already installed (pip keeps it):
    pip install -e . bitsandbytes && python benchmarks/gpu_check.py
(without bitsandbytes the QPiSSA check is skipped, saying so). The lent H200 reaches no package index and its image
lacks some of adaptkit's requirements (trl, datasets, fastcore, gguf, ...; its transformers, huggingface_hub and
tokenizers are older than settings.ini allows): carry the lock's pins of those as wheels (about 22 MB; the device
tool's notes say how), install them with `--target /tmp/site`, then run
    ADAPTKIT_COMMIT=<sha> PYTHONPATH=$PWD:/tmp/site python3 benchmarks/gpu_check.py
bitsandbytes' wheel is 41 MiB more, over the 64 MiB one call carries with the tree: install it into /tmp/site in an
earlier call on the same warm machine, or let the QPiSSA check skip.
`--dry-run` runs every check's code on the CPU with tiny fp32 models (seconds each; writes nothing unless `--out`):
tests/project/test_gpu_check.py runs it. `--only a,b` runs some checks (a partial run is written only to `--out`)."""
import argparse
import copy
import dataclasses
import gc
import importlib
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads; a lent GPU machine reaches no Hub anyway
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import datasets  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _bench import code_commit, quiet_start, write_result  # noqa: E402

from adaptkit.aligner import Aligner, AlignerConfig, AlignerDPOConfig, AlignerTrainer, dpo_rounds  # noqa: E402
from adaptkit.emr import merge_models  # noqa: E402
from adaptkit.models import BaseMismatchError, tiny_tokenizer  # noqa: E402
from adaptkit.pissa import (  # noqa: E402
    PiSSAConfig,
    PiSSATrainer,
    init_pissa,
    load_pissa_adapter,
    nf4_roundtrip,
    pissa_config,
    save_pissa_residual,
)
from adaptkit.pissa.principal import _PROJECTIONS  # noqa: E402
from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer  # noqa: E402
from adaptkit.translora import (  # noqa: E402
    DiscriminatorConfig,
    DistillationConfig,
    TransLoRATrainer,
    check_discriminator,
    train_discriminator,
)

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936)  # Qwen2.5-0.5B's config.json (tied embeddings)
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
TINY_LAYERS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)  # wide enough that PiSSA's init takes its block-Krylov branch on some layers


@dataclasses.dataclass(frozen=True)
class Setup:
    "Where the checks run and how big they are: the GPU run and the dry run differ here and nowhere else."
    device: str  # "cuda" or "cpu"
    dtype: torch.dtype  # weights of the models that are initialised, quantized, generated with or merged
    body: dict  # config sizes of the models trained and generated with (vocabulary: the tokenizer's)
    layers: dict  # config sizes of the model PiSSA's init, QPiSSA and the merge work on
    pissa_r: int  # PiSSA's rank (trainer and init)
    qpissa_r: int  # QPiSSA's rank (the paper's 64)
    rows: int  # training rows per trainer
    batch: int  # rows per training step
    steps: int  # training steps per trainer
    max_length: int  # longest training sequence
    prompts: int  # prompts of the generation check
    gen_batch: int  # prompts per generate call
    new_tokens: int  # tokens generated per prompt
    one_at_a_time: int  # prompts also generated one at a time, for comparison

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "dtype": str(self.dtype).removeprefix("torch.")}


GPU = Setup("cuda", torch.bfloat16, body={**QWEN25_05B, "vocab_size": None}, layers=QWEN25_05B, pissa_r=16,
            qpissa_r=64, rows=32, batch=8, steps=2, max_length=128, prompts=64, gen_batch=16, new_tokens=64,
            one_at_a_time=8)
DRY = Setup("cpu", torch.float32, body={**TINY, "vocab_size": None}, layers={**TINY_LAYERS, "vocab_size": None},
            pissa_r=2, qpissa_r=4, rows=8, batch=4, steps=2, max_length=64, prompts=4, gen_batch=2, new_tokens=8,
            one_at_a_time=2)
CHECKS = {}  # name -> check function, in the order they run


class Skipped(Exception):
    "A check that cannot run here, with the reason (recorded as status 'skipped')."


def check(fn):
    """Register `fn(setup, tok, tmp) -> dict` as a check named after it; its docstring says what it measures. It fails
    by raising, or by returning `problems` (a non-empty list) beside what it still measured."""
    CHECKS[fn.__name__] = fn
    return fn


def ensure(ok: bool, what: str) -> None:
    "Fail the check, saying `what`, unless `ok`."
    if not ok: raise AssertionError(what)


def synced(setup: Setup) -> float:
    "`time.perf_counter()` once the device has finished its queued work."
    if setup.device == "cuda": torch.cuda.synchronize()
    return time.perf_counter()


def causal_lm(setup: Setup, sizes: dict, tok, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    "A Qwen2 causal LM of `sizes` (vocabulary: the tokenizer's when None) with random weights, built on the device."
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model("qwen2", **{**sizes, "vocab_size": sizes["vocab_size"] or len(tok)},
                                  max_position_embeddings=2048, tie_word_embeddings=True,
                                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    with torch.device(setup.device): model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(setup.device)


def spectral_(w: torch.Tensor, gen: torch.Generator) -> None:
    "Overwrite `w` with a random matrix of the same Frobenius norm whose singular values fall as 1/sqrt(k)."
    (m, n), k = w.shape, min(w.shape)
    U = torch.linalg.qr(torch.randn(m, k, generator=gen, device=w.device)).Q
    V = torch.linalg.qr(torch.randn(n, k, generator=gen, device=w.device)).Q
    s = torch.arange(1, k + 1, device=w.device, dtype=torch.float32).rsqrt()
    w.copy_(((U * (s * w.float().norm() / s.norm())) @ V.T).to(w.dtype))


def layer_set(setup: Setup, tok):
    "The `setup.layers` model in `setup.dtype`, its attention and MLP projections given a decaying spectrum."
    model = causal_lm(setup, setup.layers, tok, dtype=setup.dtype)
    gen = torch.Generator(setup.device).manual_seed(0)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in _PROJECTIONS: spectral_(mod.weight, gen)
    return model


def train_args(setup: Setup, out: Path, **kw) -> dict:
    "The settings every trainer check shares: a few logged steps, no saving; bf16 left to adaptkit's default."
    return {"output_dir": str(out), "max_steps": setup.steps, "per_device_train_batch_size": setup.batch,
            "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True, "report_to": "none", "seed": 0,
            "use_cpu": setup.device == "cpu", **kw}


def trained(setup: Setup, trainer, steps: int | None = None) -> dict:
    "Train `trainer`; its seconds, steps, losses, device and bf16 setting, checked (on CUDA: bf16 on the GPU)."
    t = synced(setup)
    trainer.train()
    seconds = synced(setup) - t
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    device = next(trainer.model.parameters()).device.type
    ensure(trainer.state.global_step == (steps or setup.steps), f"ran {trainer.state.global_step} steps")
    ensure(bool(losses) and all(math.isfinite(x) for x in losses), f"losses not finite: {losses}")
    ensure(device == setup.device, f"trained on {device}, not {setup.device}")
    ensure(trainer.args.bf16 == (setup.device == "cuda"), f"bf16 is {trainer.args.bf16} on {setup.device}")
    return {"train_s": seconds, "steps": trainer.state.global_step, "losses": losses, "bf16": trainer.args.bf16,
            "trained_on": device}


def sft_rows(setup: Setup) -> datasets.Dataset:
    return datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."}
                                       for i in range(setup.rows)])


def qac_rows(setup: Setup) -> list[dict]:
    return [{"question": f"What is {i} + {i}?", "answer": f"{i}", "correction": f"{i} + {i} = {2 * i}."}
            for i in range(setup.rows)]


@check
def pissa_trainer(setup, tok, tmp):
    "PiSSATrainer: adaptkit's PiSSA init of every linear layer, `steps` SFT steps, the adapter saved as a plain LoRA."
    t = synced(setup)
    trainer = PiSSATrainer(causal_lm(setup, setup.body, tok), PiSSAConfig(**train_args(setup, tmp),
                           pissa_r=setup.pissa_r), train_dataset=sft_rows(setup), processing_class=tok)
    build_s = synced(setup) - t
    out = trained(setup, trainer)
    t = time.perf_counter()
    trainer.save_model()
    return {"build_and_init_s": build_s, **out, "save_as_lora_s": time.perf_counter() - t,
            "lora_rank": trainer.artifact().settings["lora_rank"]}


@check
def aligner_trainer(setup, tok, tmp):
    "AlignerTrainer: the identity warm-up (20% of the rows, one epoch), then `steps` SFT steps on the corrections."
    trainer = AlignerTrainer(causal_lm(setup, setup.body, tok), AlignerConfig(**train_args(setup, tmp)),
                             qac_rows(setup), processing_class=tok)
    out = trained(setup, trainer)
    ensure(trainer.warmup_log.get("train_runtime") is not None, "the identity warm-up did not train")
    return {**out, "warmup_rows": len(trainer.warmup), "warmup_s": trainer.warmup_log["train_runtime"]}


@check
def aligner_dpo(setup, tok, tmp):
    """The Aligner DPO path (`dpo_rounds`, one round): the policy answers, the aligner corrects (both batched
    generation), then one DPO step with a reference copy of the policy."""
    policy, aligner = causal_lm(setup, setup.body, tok, seed=1), Aligner(causal_lm(setup, setup.body, tok, seed=2), tok)
    args = AlignerDPOConfig(**train_args(setup, tmp, max_steps=1))
    t = synced(setup)
    out = dpo_rounds(policy, tok, aligner, [f"What is {i} + {i}?" for i in range(setup.rows)], rounds=1, args=args,
                     max_new_tokens=setup.new_tokens // 2)
    seconds, m = synced(setup) - t, out.rounds[0]
    ensure(m["pairs"] > 0 and m.get("train_runtime") is not None, f"no DPO step ran: {m}")
    device = next(out.model.parameters()).device.type
    ensure(device == setup.device and args.bf16 == (device == "cuda"), f"the policy is on {device}, bf16 {args.bf16}")
    return {"round_s": seconds, "pairs": m["pairs"], "dpo_s": m["train_runtime"], "train_loss": m.get("train_loss"),
            "bf16": args.bf16, "trained_on": device}


@check
def repnoise_trainer(setup, tok, tmp):
    "RepNoiseTrainer: `steps` steps of RepNoise's loss (harmless CE, noise MMD at every layer, harmful-CE ascent)."
    rows = [{"prompt": f"How do I pick lock {i}?", "harmful": f"Use pick {i}...", "harmless": "I can't."}
            for i in range(setup.rows)]
    trainer = RepNoiseTrainer(causal_lm(setup, setup.body, tok), RepNoiseConfig(**train_args(setup, tmp),
                              max_length=setup.max_length), rows, processing_class=tok)
    out = trained(setup, trainer)
    parts = {k: v for h in trainer.state.log_history for k, v in h.items() if k.startswith("repnoise/")}
    ensure(bool(parts) and all(math.isfinite(v) for v in parts.values()), f"loss parts: {parts}")
    return {**out, "last_loss_parts": parts}


@check
def translora_sequence(setup, tok, tmp):
    "TransLoRATrainer (sequence-level distillation): `steps` SFT steps of a fresh LoRA on the teacher's answers."
    trainer = TransLoRATrainer(causal_lm(setup, setup.body, tok), DistillationConfig(**train_args(setup, tmp)),
                               sft_rows(setup), processing_class=tok)
    return trained(setup, trainer)


@check
def translora_logit(setup, tok, tmp):
    "TransLoRAGKDTrainer (logit level, TRL's GKD with lmbda 0): `steps` steps matching a teacher's logits."
    from adaptkit.translora import trainer as translora_trainers
    student, teacher = causal_lm(setup, setup.body, tok, seed=1), causal_lm(setup, setup.body, tok, seed=2).eval()
    trainer = translora_trainers.TransLoRAGKDTrainer(
        student, teacher, DistillationConfig(**train_args(setup, tmp), distillation="logit"), sft_rows(setup),
        processing_class=tok)
    return trained(setup, trainer)


@check
def translora_discriminator(setup, tok, tmp):
    "Trans-LoRA's discriminator: `steps` LoRA steps on real vs synthetic texts, then scored on held-out ones."
    real = [f"Question: what is {i} plus {i}?" for i in range(setup.rows)]
    fake = [f"Tell me a story about {i} cats." for i in range(setup.rows)]
    t = synced(setup)
    disc = train_discriminator(causal_lm(setup, setup.body, tok), tok, real, fake,
                               DiscriminatorConfig(**train_args(setup, tmp)))
    train_s = synced(setup) - t
    held = check_discriminator(disc, real[:4], fake[:4])
    ensure(0 <= held["accuracy"] <= 1, f"held-out accuracy {held['accuracy']}")
    return {"train_s": train_s, "heldout_accuracy": held["accuracy"], "steps": disc.settings.get("max_steps")}


def adapter_products(peft_model) -> dict[str, torch.Tensor]:
    "scaling * B A (float32) of every LoRA layer of `peft_model`, by name."
    from peft.tuners.lora import LoraLayer
    return {n: m.scaling["default"] * m.lora_B["default"].weight.float() @ m.lora_A["default"].weight.float()
            for n, m in peft_model.named_modules() if isinstance(m, LoraLayer)}


def rel_error(a: dict, b: dict) -> list[float]:
    "‖a - b‖_F / ‖b‖_F for each name of `b`."
    return [((a[k] - b[k]).norm() / b[k].norm()).item() for k in b]


@check
def pissa_init(setup, tok, tmp):
    """PiSSA's init of the layer set's projections at r = pissa_r (the 0.5B shape: 168 projections), each from the
    same bf16 weights: peft's exact init (`init_lora_weights="pissa"`, one SVD per layer), adaptkit's `init_pissa`
    (seeded block Krylov, same-shape layers batched) and peft's `pissa_niter_4` (through `init_pissa`, which also
    saves the initial adapter); seconds of each and B A's relative Frobenius error against the exact init's."""
    from peft import get_peft_model
    base = layer_set(setup, tok)
    warm = torch.randn(256, 128, device=setup.device)  # the decompositions' first calls, outside the timings
    for first_call in (torch.linalg.svd, torch.linalg.qr, lambda w: torch.linalg.eigh(w.T @ w), torch.svd_lowrank):
        first_call(warm)
    runs, exact = {}, None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="init_pissa replaced")
        for name, niter in (("peft_exact", "exact"), ("adaptkit", None), ("peft_niter_4", 4)):
            model = copy.deepcopy(base)
            t = synced(setup)
            if niter == "exact": pm = get_peft_model(model, pissa_config(setup.pissa_r))
            else: pm = init_pissa(model, pissa_config(setup.pissa_r, niter=niter), init_dir=tmp / name, seed=0)
            seconds = synced(setup) - t
            parts = adapter_products(pm)
            exact = exact or parts
            errors = rel_error(parts, exact)
            runs[name] = {"seconds": seconds, "rel_error_vs_exact_mean": sum(errors) / len(errors),
                          "rel_error_vs_exact_max": max(errors)}
            del model, pm, parts
    ensure(len(exact) > 0, "no layer was adapted")
    return {"layers": len(exact), "r": setup.pissa_r, "init": runs,
            "adaptkit_vs_peft_niter_4_time": runs["adaptkit"]["seconds"] / runs["peft_niter_4"]["seconds"],
            "adaptkit_vs_peft_exact_time": runs["adaptkit"]["seconds"] / runs["peft_exact"]["seconds"]}


def lora_layers(peft_model) -> dict:
    "The LoRA layers of `peft_model` by their name in the base model."
    from peft.tuners.lora import LoraLayer
    return {n.removeprefix("base_model.model."): m for n, m in peft_model.named_modules() if isinstance(m, LoraLayer)}


@check
def qpissa_4bit(setup, tok, tmp):
    """QPiSSA with bitsandbytes: PiSSA's init at r = qpissa_r, the residual saved and loaded in NF4 (4 bits, blocks
    of 64, bf16 compute), the adapter loaded on it (`load_pissa_adapter`) and one AdamW step. Measures the 4-bit
    error ‖W - (nf4(W_res) + B A)‖_F / ‖W‖_F over all projections against QLoRA's ‖W - nf4(W)‖_F / ‖W‖_F, and how
    many of adaptkit's `nf4_roundtrip` values equal bitsandbytes' dequantized residual."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise Skipped("bitsandbytes is not importable (`pip install bitsandbytes`; it is not in adaptkit's lock)")
    bnb = importlib.import_module("bitsandbytes.functional")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    model = layer_set(setup, tok)
    weights = {n: m.weight.detach().float().clone() for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in _PROJECTIONS}
    t = synced(setup)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="init_pissa replaced")
        pm = init_pissa(model, pissa_config(setup.qpissa_r), init_dir=tmp / "init", seed=0)
    residual = {n: m.get_base_layer().weight.detach().clone() for n, m in lora_layers(pm).items()}
    save_pissa_residual(pm, tmp / "qpissa")
    init_s = synced(setup) - t
    del model, pm
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=setup.dtype)
    t = synced(setup)
    q = AutoModelForCausalLM.from_pretrained(tmp / "qpissa" / "residual_model", quantization_config=quant,
                                             dtype=setup.dtype, device_map={"": setup.device})
    problems = []
    try: qpm = load_pissa_adapter(q, tmp / "qpissa" / "pissa_adapter", is_trainable=True)
    except BaseMismatchError as e:  # recorded; the rest is measured on the adapter loaded past the check
        problems.append(f"load_pissa_adapter refused the 4-bit residual model it was saved beside: {e}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qpm = load_pissa_adapter(q, tmp / "qpissa" / "pissa_adapter", is_trainable=True, ignore_base_mismatch=True)
    load_s = synced(setup) - t
    parts, layers = adapter_products(qpm), lora_layers(qpm)
    sq = {"w": 0.0, "qpissa": 0.0, "qlora": 0.0}
    same = total = 0
    with torch.no_grad():
        for name, layer in layers.items():
            w4 = layer.get_base_layer().weight
            deq = bnb.dequantize_4bit(w4.data, w4.quant_state).float()
            w = weights[name]
            qlora = bnb.dequantize_4bit(*bnb.quantize_4bit(w.to(setup.dtype), blocksize=64, quant_type="nf4")).float()
            sq["w"] += w.norm().item() ** 2
            sq["qpissa"] += (w - (deq + parts[f"base_model.model.{name}"])).norm().item() ** 2
            sq["qlora"] += (w - qlora).norm().item() ** 2
            ours = nf4_roundtrip(residual[name]).to(setup.dtype).float()
            same, total = same + (ours == deq).sum().item(), total + deq.numel()
    ensure(len(layers) == len(weights), f"{len(layers)} of {len(weights)} projections carry the adapter in 4 bits")
    batch = tok([f"{i} plus {i} is {2 * i}." for i in range(setup.batch)], return_tensors="pt", padding=True)
    batch = {k: v.to(setup.device) for k, v in batch.items()}
    trainable = [p for p in qpm.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    t = synced(setup)
    loss = qpm(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    opt.step()
    step_s = synced(setup) - t
    moved = sum(not torch.equal(a, p) for a, p in zip(before, trainable))
    ensure(math.isfinite(loss.item()) and moved == len(trainable), f"loss {loss.item()}, {moved} tensors moved")
    qpissa, qlora = math.sqrt(sq["qpissa"] / sq["w"]), math.sqrt(sq["qlora"] / sq["w"])
    return {"layers": len(layers), "r": setup.qpissa_r, "init_and_save_s": init_s, "load_4bit_s": load_s,
            "step_s": step_s, "loss": loss.item(), "qlora_error": qlora, "qpissa_error": qpissa,
            "error_reduction": 1 - qpissa / qlora, "nf4_roundtrip_equal_fraction": same / total,
            "bitsandbytes": importlib.import_module("bitsandbytes").__version__, "problems": problems}


@check
def aligner_generate(setup, tok, tmp):
    """Batched Aligner generation: `Aligner.correct` (`generate_batched`: prompts sorted by length, the template's
    shared prefix prefilled once) of `prompts` pairs, `gen_batch` per call, exactly `new_tokens` greedy tokens each,
    against the same call one prompt at a time on the first `one_at_a_time`; bf16 weights."""
    aligner = Aligner(causal_lm(setup, setup.body, tok, dtype=setup.dtype), tok)
    qs = [f"What is {i} + {i * 3}? Say it in words, please." + " Thanks." * (i % 4) for i in range(setup.prompts)]
    ans = [f"{i} + {i * 3} = {4 * i + 1}" for i in range(setup.prompts)]
    gen = {"max_new_tokens": setup.new_tokens, "min_new_tokens": setup.new_tokens, "progress": False}
    aligner.correct(qs[:2], ans[:2], batch_size=2, max_new_tokens=2, progress=False)  # warm-up
    t = synced(setup)
    batched = aligner.correct(qs, ans, batch_size=setup.gen_batch, **gen)
    batched_s = synced(setup) - t
    k = setup.one_at_a_time
    t = synced(setup)
    single = [aligner.correct([q], [a], batch_size=1, **gen)[0] for q, a in zip(qs[:k], ans[:k])]
    single_s = synced(setup) - t
    ensure(len(batched) == setup.prompts and all(isinstance(x, str) for x in batched), "not one text per prompt")
    per_batched, per_single = batched_s / setup.prompts, single_s / k
    return {"prompts": setup.prompts, "batch_size": setup.gen_batch, "new_tokens": setup.new_tokens,
            "batched_s": batched_s, "tokens_per_s_batched": setup.prompts * setup.new_tokens / batched_s,
            "per_prompt_batched_s": per_batched, "per_prompt_one_at_a_time_s": per_single,
            "batched_speedup_per_prompt": per_single / per_batched,
            "same_text_as_one_at_a_time": sum(a == b for a, b in zip(batched, single)) / k}


@check
def merge(setup, tok, tmp):
    """`merge_models` (TIES, density 0.5) of two fine-tunes of the layer-set model (bf16 safetensors folders; each
    fine-tune the base plus noise of 1% of each tensor's scale), streamed to 200 MB shards; then the merged
    checkpoint is loaded and run on the device."""
    from transformers import AutoModelForCausalLM
    base = causal_lm(setup, setup.layers, tok, dtype=setup.dtype)
    base.save_pretrained(tmp / "base")
    tok.save_pretrained(tmp / "base")
    with torch.no_grad():
        for task, seed in (("a", 1), ("b", 2)):
            torch.manual_seed(seed)
            tuned = copy.deepcopy(base)
            for p in tuned.parameters(): p.add_(0.01 * p.float().std() * torch.randn_like(p))
            tuned.save_pretrained(tmp / task)
            del tuned
    params = sum(p.numel() for p in base.parameters())
    del base
    t = time.perf_counter()
    merge_models(tmp / "base", {"a": tmp / "a", "b": tmp / "b"}, method="ties", density=0.5, out_dir=tmp / "merged",
                 max_shard_size="200MB", progress=False)
    merge_s = time.perf_counter() - t
    shards = len(list((tmp / "merged").glob("*.safetensors")))
    t = synced(setup)
    merged = AutoModelForCausalLM.from_pretrained(tmp / "merged", dtype=setup.dtype, device_map={"": setup.device})
    ids = tok(["1 plus 1 is"], return_tensors="pt")["input_ids"].to(setup.device)
    with torch.no_grad(): logits = merged(ids).logits
    load_and_forward_s = synced(setup) - t
    ensure(bool(torch.isfinite(logits).all()), "the merged model's logits are not finite")
    return {"parameters": params, "merge_s": merge_s, "shards": shards, "load_and_forward_s": load_and_forward_s}


def run_one(fn, setup: Setup, tok) -> dict:
    "Run one check in its own try, timed, in a fresh temporary folder: status, seconds, peak GPU memory, measurements."
    if setup.device == "cuda": torch.cuda.reset_peak_memory_stats()
    t = synced(setup)
    try:
        with tempfile.TemporaryDirectory(prefix=f"adaptkit-gpu-check-{fn.__name__}-") as d:
            measured = fn(setup, tok, Path(d))
        status = "failed" if measured.get("problems") else "ok"  # measured, but something it checks went wrong
    except Skipped as e: status, measured = "skipped", {"reason": str(e)}
    except Exception as e:
        status, measured = "failed", {"error": f"{type(e).__name__}: {e}"[:2000],
                                      "traceback": traceback.format_exc()[-4000:]}
    rec = {"status": status, "seconds": round(synced(setup) - t, 3), "what": " ".join(fn.__doc__.split()), **measured}
    if setup.device == "cuda":
        rec["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        gc.collect()
        torch.cuda.empty_cache()
    return rec


def run_checks(setup: Setup, names: list[str], budget_s: float) -> dict:
    "Every check in `names`, in order; one not started within `budget_s` seconds of the first is 'not run'."
    tok, start, results = tiny_tokenizer(), time.perf_counter(), {}
    for name in names:
        if time.perf_counter() - start > budget_s:
            results[name] = {"status": "not run", "reason": f"the {budget_s:.0f} s budget was spent before it started"}
        else: results[name] = run_one(CHECKS[name], setup, tok)
        r = results[name]
        why = r.get("error") or r.get("reason") or "; ".join(r.get("problems") or [])
        print(f"{name}: {r['status']} ({r.get('seconds', 0):.1f} s)" + (f": {why}" if why else ""), flush=True)
    return results


def versions() -> dict:
    "torch, CUDA and the libraries the checks run on."
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "peft", "trl", "accelerate", "bitsandbytes"):
        try: out[name] = importlib.import_module(name).__version__
        except ImportError: out[name] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="run every check on the CPU with tiny fp32 models")
    ap.add_argument("--only", default=None, help="comma-separated checks to run (default: all): " + ",".join(CHECKS))
    ap.add_argument("--out", default=None, help="write the JSON here (default on a GPU: benchmarks/results/gpu.json)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no check after this many seconds (default: 390 on a GPU, no limit in a dry run)")
    args = ap.parse_args(argv)
    names = list(CHECKS) if args.only is None else args.only.split(",")
    if unknown := [n for n in names if n not in CHECKS]: ap.error(f"no such check {unknown}; checks: {list(CHECKS)}")
    if not args.dry_run and not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}): nothing measured, nothing "
              "written; --dry-run runs the checks' code on the CPU")
        return 0
    setup = DRY if args.dry_run else GPU
    if not args.dry_run and not torch.cuda.is_bf16_supported():
        print(f"{torch.cuda.get_device_name()} does not support bf16: the checks are for a GPU that does")
        return 1
    datasets.disable_progress_bars()
    start = quiet_start(float(os.environ.get("ADAPTKIT_BENCH_WAIT", 60))) if not args.dry_run else None
    t = time.perf_counter()
    budget = args.budget_s if args.budget_s is not None else math.inf if args.dry_run else 390.0
    checks = run_checks(setup, names, budget)
    failed = [n for n, r in checks.items() if r["status"] in ("failed", "not run")]
    result = {"dry_run": args.dry_run, **code_commit(), **versions(),
              "device_name": torch.cuda.get_device_name() if setup.device == "cuda" else "cpu",
              "setup": setup.to_json(), "checks": checks, "failed": failed, "total_s": time.perf_counter() - t}
    print(f"{len(checks) - len(failed)} of {len(checks)} checks ok or skipped in {result['total_s']:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.out:
        Path(args.out).write_text(json.dumps({**result, **(start or {}), "device": setup.device}, indent=1) + "\n")
    elif not args.dry_run and args.only is None:
        write_result("gpu", result, start, device_suffix=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
