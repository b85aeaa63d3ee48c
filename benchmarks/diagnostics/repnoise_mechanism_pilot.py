"""RepNoise diagnosis before tutorial 12's ladder (issue 50): what each defence does to the representations, per
layer, on seed 0: the noise term's MMD, the harmful answers' read-out CE and a linear probe, before and after one
attack (lr 6e-5, 8 steps, 32 rows), for the control, the paper's weights on every layer and candidate arms.
Writes benchmarks/results/repnoise_mechanism_pilot.json (a pilot: the tutorial measures the chosen arms on 3
seeds)."""
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
from _tutorial12 import ROOT, tutorial_setup

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _bench, shared by every benchmark
from _bench import code_commit  # noqa: E402

from adaptkit.models import load_causal_lm  # noqa: E402
from adaptkit.repnoise import (  # noqa: E402
    RefusalKeywords,
    RepNoiseConfig,
    RepNoiseTrainer,
    finetuned_copy,
    harmful_finetune_attack,
    not_refused,
    representation_readouts,
)

g = tutorial_setup()
S, tok, TR = g["S"], g["tok"], g["TRAIN_REFUSALS"]
harmful_eval, harmless_eval = S["eval_A"] + S["eval_B"], S["benign_eval"][:56]
judge = RefusalKeywords()
refusal_rows = ([{"prompt": r["prompt"], "completion": TR[i % len(TR)]} for i, r in
                 enumerate(S["advbench"] + g["defence"])] + S["refusal_sft"] * 2)
undef = finetuned_copy(load_causal_lm(g["folder"]), refusal_rows, tokenizer=tok, column="completion", seed=0,
                       max_length=72, **g["REFUSAL"])
ARMS = {"control": {"alpha": 0.0, "beta": 0.0}, "paper": {"alpha": 1.0, "beta": 0.001},
        "beta 1": {"alpha": 1.0, "beta": 1.0}, "alpha 4": {"alpha": 4.0, "beta": 0.001}}
out = {**code_commit(), "load_average_at_start": os.getloadavg(), "torch_threads": torch.get_num_threads(),
       "arms": {}}
def read(model, name):
    t = time.perf_counter()
    r = representation_readouts(model, tok, harmful_eval, harmless_eval, max_length=72)
    h = not_refused(model, tok, S["eval_A"], judge, max_new_tokens=8, progress=False)
    r["harm_eval_A"], r["seconds"] = sum(h) / len(h), time.perf_counter() - t
    print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, list)},
          "mmd", [round(x, 2) for x in r["noise_mmd"][::4]], "ce", [round(x, 1) for x in r["harmful_ce"][::4]],
          "probe", [round(x, 2) for x in r["probe_accuracy"][::4]], flush=True)
    return r
def attacked(model):
    return harmful_finetune_attack(model, S["attack"], lr=6e-5, steps=8, seed=0, tokenizer=tok, batch_size=4,
                                   max_length=72)
out["arms"]["undefended"] = {"before": read(undef, "undefended"), "after": read(attacked(undef), "undefended+att")}
for name, s in ARMS.items():
    args = RepNoiseConfig("/tmp/pilot-rn", **s, learning_rate=3e-5, layers=None, per_device_train_batch_size=4,
                          num_train_epochs=1, max_length=72, logging_steps=1, save_strategy="no", use_cpu=True,
                          disable_tqdm=True, seed=0)
    tr = RepNoiseTrainer(copy.deepcopy(undef), args, g["defence"], processing_class=tok, base_model=g["SMOLLM2_REPO"])
    tr.train()
    d = tr.model.eval()
    out["arms"][name] = {"log": [h for h in tr.state.log_history if "loss" in h], "before": read(d, name),
                         "after": read(attacked(d), name + "+att")}
    out["load_average_at_end"] = os.getloadavg()  # at this write: the last one's is the end's
    (ROOT / "benchmarks/results/repnoise_mechanism_pilot.json").write_text(json.dumps(out, indent=1))
print("done")
