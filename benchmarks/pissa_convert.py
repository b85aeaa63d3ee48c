"""PiSSA's conversion to a plain LoRA at a chosen rank, on a trained adapter: SmolLM2-135M, PiSSA r = 16 (adaptkit's
init, seed 0), trained 40 AdamW steps (lr 2e-5, batch 8) on the arithmetic task's chat rows, then written with
`save_pissa_as_lora(rank=...)` for rank "exact" (2r = 32) and k = 32, 16, 8, 4. Reports the relative error of each
layer's written change against the trained change (what the adapter's record and card carry: mean and max over the
210 layers) and the mean token-level cross-entropy of the converted LoRA on the untouched base over 64 held-out rows,
against the trained PiSSA model's own. Run: .venv/bin/python benchmarks/pissa_convert.py -> results/pissa_convert.json
"""
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from peft import PeftModel

sys.path.insert(0, str(Path(__file__).parent))
from _bench import quiet_start, write_result  # noqa: E402

from adaptkit.hub import read_metadata  # noqa: E402
from adaptkit.models import load_causal_lm, load_tokenizer, smollm2  # noqa: E402
from adaptkit.pissa import init_pissa, pissa_config, save_pissa_as_lora  # noqa: E402
from adaptkit.tasks import arithmetic_task  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
STEPS, BATCH, LR, R, RANKS = 40, 8, 2e-5, 16, ["exact", 32, 16, 8, 4]


def encode(tok, rows):
    "Prompt + completion chat texts as one padded batch, loss on the completion tokens only."
    texts = [tok.apply_chat_template(p + c, tokenize=False) for p, c in zip(rows["prompt"], rows["completion"])]
    prompt_lens = [len(tok.apply_chat_template(p, tokenize=True, add_generation_prompt=True)) for p in rows["prompt"]]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = batch["input_ids"].clone()
    for i, n in enumerate(prompt_lens): labels[i, :n] = -100
    labels[batch["attention_mask"] == 0] = -100
    return batch, labels


@torch.no_grad()
def loss_of(model, tok, rows) -> float:
    model.eval()
    batch, labels = encode(tok, rows)
    return model(**batch, labels=labels).loss.item()


def main():
    folder = smollm2()
    tok = load_tokenizer(folder)
    tok.padding_side = "right"
    data = arithmetic_task(1000, 64, seed=1)
    train, test = data["train"], data["test"]
    start = quiet_start()
    with tempfile.TemporaryDirectory() as d:
        init_dir = Path(d) / "init"
        pm = init_pissa(load_causal_lm(folder), pissa_config(R), init_dir=init_dir, seed=0)
        opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=LR)
        g = torch.Generator().manual_seed(0)
        for step in range(STEPS):
            pm.train()
            idx = torch.randint(len(train), (BATCH,), generator=g).tolist()
            batch, labels = encode(tok, train.select(idx))
            loss = pm(**batch, labels=labels).loss
            loss.backward(); opt.step(); opt.zero_grad()
        trained = loss_of(pm, tok, test)
        out = {"trained_pissa_test_loss": trained, "ranks": {}}
        for rank in RANKS:
            lora = save_pissa_as_lora(pm, Path(d) / f"lora-{rank}", init_dir=init_dir, rank=rank)
            rec = read_metadata(lora)["pissa"]
            conv = PeftModel.from_pretrained(load_causal_lm(folder), lora)
            out["ranks"][str(rank)] = {"lora_rank": rec["lora_rank"], "lora_alpha": rec["lora_alpha"],
                                       "rel_error_mean": rec["conversion_error_mean"],
                                       "rel_error_max": rec["conversion_error_max"],
                                       "test_loss_on_untouched_base": loss_of(conv, tok, test)}
            print(rank, out["ranks"][str(rank)], flush=True)
    base_loss = loss_of(load_causal_lm(folder), tok, test)
    result = {"model": "SmolLM2-135M-Instruct", "r": R, "steps": STEPS, "batch": BATCH, "lr": LR, "seed": 0,
              "base_test_loss": base_loss, **out}
    write_result("pissa_convert", result, start)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
