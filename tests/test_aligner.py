"""Aligner across modules: train on a Q-A-C file, push with its card to a LocalHub, pull by repo id and correct;
bad rows are refused before training."""
import json
import re

import pytest
from huggingface_hub import HfApi

from adaptkit.aligner import ALIGNER_QAC_TEMPLATE, Aligner, AlignerConfig, AlignerTrainer, save_aligner
from adaptkit.data import DataError
from adaptkit.hub import push_folder
from adaptkit.localhub import LocalHub
from adaptkit.models import load_tokenizer


def _qac_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_push_pull_correct(tiny_model_dir, tmp_path):
    rows = [{"question": f"What is {i} times 2?", "answer": f"{i}", "correction": f"{i} times 2 is {2 * i}."} for i in range(8)]
    tok = load_tokenizer(tiny_model_dir)
    args = AlignerConfig(str(tmp_path / "run"), template=ALIGNER_QAC_TEMPLATE, identity_warmup_ratio=0.25, max_steps=2,
                         per_device_train_batch_size=4, learning_rate=1e-3, save_strategy="no", use_cpu=True, disable_tqdm=True)
    with LocalHub(tmp_path / "hub") as hub:
        push_folder(tiny_model_dir, "team/base", endpoint=hub.endpoint)
        trainer = AlignerTrainer("team/base", args, _qac_file(tmp_path / "qac.jsonl", rows), processing_class=tok,
                                 hub_endpoint=hub.endpoint)
        assert trainer.base_model == "team/base"
        trainer.train()
        results = [{"task": "text-generation", "dataset": "tiny-times", "metric": "accuracy", "value": 0.0}]
        out = save_aligner(trainer, tmp_path / "aligner", name="tiny-aligner", results=results, datasets=["tiny-times"])
        commit = push_folder(out, "team/tiny-aligner", endpoint=hub.endpoint)
        data = HfApi(endpoint=hub.endpoint).model_info("team/tiny-aligner").card_data
        assert (data.base_model, data.datasets) == ("team/base", ["tiny-times"])
        assert "aligner" in data.tags and data.eval_results[0].metric_value == 0.0
        aligner = Aligner.from_pretrained("team/tiny-aligner", endpoint=hub.endpoint, revision=commit)
    assert aligner.template == ALIGNER_QAC_TEMPLATE  # the template travels with the aligner
    local = Aligner.from_pretrained(out)
    qs, ans = [r["question"] for r in rows[:3]], [r["answer"] for r in rows[:3]]
    assert aligner.correct(qs, ans, max_new_tokens=5) == local.correct(qs, ans, max_new_tokens=5)


@pytest.mark.parametrize("bad, message", [
    ({"question": "q", "answer": "a"}, "row 1, column 'correction': missing value (null)"),
    ({"question": "q", "answer": "", "correction": "c"}, "row 1, column 'answer': empty text"),
    ({"question": "q", "answer": "a", "correction": 3}, "row 1, column 'correction': expected str, got int"),
])
def test_bad_rows_are_refused_before_training(tiny_model_dir, tmp_path, bad, message):
    good = {"question": "q0", "answer": "a0", "correction": "c0"}
    args = AlignerConfig(str(tmp_path / "run"), max_steps=1, use_cpu=True, report_to="none")
    with pytest.raises(DataError, match=re.escape(message)):
        AlignerTrainer(str(tiny_model_dir), args, _qac_file(tmp_path / "bad.jsonl", [good, bad]),
                       processing_class=load_tokenizer(tiny_model_dir))
