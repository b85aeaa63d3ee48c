"""PiSSA across modules: train with TRL, push the converted LoRA with its card to a LocalHub, load it with stock peft
on the untouched base pulled from the same hub."""
import datasets
import pytest
import torch
from huggingface_hub import HfApi
from peft import PeftModel

from adaptkit.hub import pull, push_folder
from adaptkit.models import load_causal_lm, load_tokenizer
from adaptkit.pissa import PiSSATrainer, pissa_config, pissa_sft_config


def test_train_push_pull_load_on_untouched_base(hub, tiny_model_dir, tmp_path):
    base_commit = push_folder(tiny_model_dir, "team/tiny-base", endpoint=hub.endpoint)
    rows = datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(12)])
    tok = load_tokenizer(tiny_model_dir)
    args = pissa_sft_config(tmp_path / "out", max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
                            save_strategy="no", disable_tqdm=True, use_cpu=True, logging_steps=1)
    trainer = PiSSATrainer("team/tiny-base", args, peft_config=pissa_config(4, niter=2), train_dataset=rows,
                           processing_class=tok, hub_endpoint=hub.endpoint)
    assert (trainer.base_model, trainer.base_revision) == ("team/tiny-base", base_commit)
    trainer.train()
    results = [{"task": "text-generation", "dataset": "tiny-sums", "metric": "loss", "value": 1.5}]
    commit = trainer.push_lora("team/tiny-pissa", endpoint=hub.endpoint, results=results)

    data = HfApi(endpoint=hub.endpoint).model_info("team/tiny-pissa").card_data
    assert (data.base_model, data.library_name) == ("team/tiny-base", "peft")
    assert "pissa" in data.tags and data.eval_results[0].metric_value == 1.5
    card = (pull("team/tiny-pissa", endpoint=hub.endpoint) / "README.md").read_text()
    assert "rank 8 and alpha 8" in card and base_commit in card

    base = load_causal_lm("team/tiny-base", endpoint=hub.endpoint, revision=base_commit)
    plain = PeftModel.from_pretrained(base, pull("team/tiny-pissa", endpoint=hub.endpoint, revision=commit))
    ids = tok(["3 plus 3 is"], return_tensors="pt")
    trainer.model.eval()
    assert torch.allclose(plain(**ids).logits, trainer.model(**ids).logits, atol=1e-4)
