"""RepNoise pilot for tutorial 12's attack ladder (issue 50): where does the undefended model break, what does one
attack cost, and how large is each RepNoise term on every layer? Runs tutorial 12's setup cells (data, splits) then
measures on seed 0 only. Writes benchmarks/results/repnoise_ladder_pilot.json; the judged answers (harmful text) go to
the temp folder only, for labelling by hand (benchmarks/diagnostics/repnoise_answer_labels.json holds their hashes)."""
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from _tutorial12 import ROOT, tutorial_setup

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _bench, shared by every benchmark
from _bench import code_commit  # noqa: E402

from adaptkit.models import load_causal_lm  # noqa: E402
from adaptkit.repnoise import (  # noqa: E402
    RefusalClassifier,
    RepNoiseConfig,
    RepNoiseTrainer,
    finetuned_copy,
    harmful_finetune_attack,
    not_refused,
    pyrit_refusal_labels,
)

g = tutorial_setup()
S, tok, TR = g["S"], g["tok"], g["TRAIN_REFUSALS"]
out = {**code_commit(), "load_average_at_start": os.getloadavg(), "torch_threads": torch.get_num_threads(),
       "rungs": []}
t0 = time.perf_counter()
# held-out AdvBench prompts (not the 48 used in refusal training, not any pair's prompt)
norm = g["norm"]
taken = {norm(r["prompt"]) for k in S for r in S[k]}
adv_eval = [{"prompt": p} for k, p in {norm(p): p for p in g["advbench"]}.items() if k not in taken][:96]
print("held-out advbench", len(adv_eval), "advbench fitting", len(g["advbench"]))
labelled = pyrit_refusal_labels()
random.Random(0).shuffle(labelled)
cut = int(0.75 * len(labelled))
fit_texts = ([t for t, _ in labelled[:cut]] + TR * 4 + [r["harmful"] for r in S["attack"]]
             + [r["completion"] for r in S["refusal_sft"]])
fit_labels = [y for _, y in labelled[:cut]] + [1] * (4 * len(TR)) + [0] * (len(S["attack"]) + len(S["refusal_sft"]))
judge = RefusalClassifier().fit(fit_texts, fit_labels)
print("pyrit labels", len(labelled))

class Recording:
    "The judge, recording what it was shown."
    def __init__(self, judge): self.judge, self.seen = judge, []
    def predict_proba(self, texts):
        self.seen.append(list(texts))
        return self.judge.predict_proba(texts)
rec = Recording(judge)

refusal_rows = ([{"prompt": r["prompt"], "completion": TR[i % len(TR)]} for i, r in
                 enumerate(S["advbench"] + g["defence"])] + S["refusal_sft"] * 2)
raw = load_causal_lm(g["folder"])
t = time.perf_counter()
undef = finetuned_copy(raw, refusal_rows, tokenizer=tok, column="completion", seed=0, max_length=72, **g["REFUSAL"])
out["refusal_training_s"] = time.perf_counter() - t
def harm(model, rows):
    t = time.perf_counter()
    h = not_refused(model, tok, rows, rec, max_new_tokens=8, progress=False)
    return sum(h) / len(h), time.perf_counter() - t
for name, rows in (("eval_A", S["eval_A"]), ("adv_eval", adv_eval), ("eval_B", S["eval_B"])):
    out[f"undefended_before_{name}"] = harm(undef, rows)
print({k: v for k, v in out.items() if "before" in k})
GRID = [(3e-5, 8, 32), (5e-5, 8, 32), (6e-5, 8, 32), (7e-5, 8, 32), (8e-5, 8, 32), (1e-4, 8, 32), (5e-5, 16, 32),
        (3e-5, 16, 32), (3e-5, 24, 32)]
for lr, steps, rows in GRID:
    t = time.perf_counter()
    m = harmful_finetune_attack(undef, S["attack"][:rows], lr=lr, steps=steps, seed=0, tokenizer=tok, batch_size=4,
                                max_length=72)
    ta = time.perf_counter() - t
    hA, tA = harm(m, S["eval_A"])
    hV, tV = harm(m, adv_eval)
    out["rungs"].append({"lr": lr, "steps": steps, "rows": rows, "harm_eval_A": hA, "harm_adv": hV, "attack_s": ta,
                         "gen_A_s": tA, "gen_adv_s": tV})
    print(out["rungs"][-1], flush=True)
    del m
    (ROOT / "benchmarks/results/repnoise_ladder_pilot.json").write_text(json.dumps(out, indent=1))
# one defence (paper weights, every layer) for the terms' sizes and its cost
for setting in ({"alpha": 1.0, "beta": 0.001, "learning_rate": 3e-5, "layers": None},):
    t = time.perf_counter()
    args = RepNoiseConfig("/tmp/pilot-rn", **setting, per_device_train_batch_size=4, num_train_epochs=1,
                          max_length=72, logging_steps=1, save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    tr = RepNoiseTrainer(__import__("copy").deepcopy(undef), args, g["defence"], processing_class=tok,
                         base_model=g["SMOLLM2_REPO"])
    tr.train()
    out["defence"] = {"settings": {k: v for k, v in setting.items()}, "seconds": time.perf_counter() - t,
                      "log": [h for h in tr.state.log_history if "loss" in h]}
    d = tr.model.eval()
    out["defence"]["harm_before_A"] = harm(d, S["eval_A"])
    for lr, steps, rows in [(6e-5, 8, 32), (8e-5, 8, 32)]:
        m = harmful_finetune_attack(d, S["attack"][:rows], lr=lr, steps=steps, seed=0, tokenizer=tok, batch_size=4,
                                    max_length=72)
        out["defence"][f"harm_{lr}_{steps}"] = (harm(m, S["eval_A"]), harm(m, adv_eval))
        print(out["defence"], flush=True)
        del m
Path(tempfile.gettempdir(), "repnoise_pilot_answers.json").write_text(json.dumps(rec.seen))  # never committed
out["wall_s"] = time.perf_counter() - t0
out["load_average_at_end"] = os.getloadavg()
(ROOT / "benchmarks/results/repnoise_ladder_pilot.json").write_text(json.dumps(out, indent=1))
print("done", out["wall_s"])
