"""An in-memory `datasets.Dataset` with an empty or missing field fails at the Aligner's entry points (AlignerTrainer,
dpo_rounds) before any model loads or generates, naming the row and the column (issue 38, item 17)."""
import re

import datasets
import pytest

from adaptkit.data import DataError

GOOD = {"question": "what is two plus two", "answer": "five", "correction": "four"}


def bad_rows(columns: dict, column: str, fault: str) -> tuple[datasets.Dataset, str]:
    "Five good rows in memory with row 2's `column` empty, null, or gone from the whole Dataset; the message expected."
    rows = [dict(columns) for _ in range(5)]
    if fault == "empty": rows[2][column] = ""
    if fault == "null": rows[2][column] = None
    if fault == "no column":
        for r in rows: del r[column]
    ds = datasets.Dataset.from_list(rows)
    assert fault == "no column" or ds[2][column] in ("", None)  # the fault survived into the Dataset
    return ds, {"empty": f"row 2, column {column!r}: empty text", "null": f"row 2, column {column!r}: missing value",
                "no column": f"missing column(s) {column!r}"}[fault]


@pytest.mark.parametrize("fault", ["empty", "null", "no column"])
@pytest.mark.parametrize("column", ["question", "answer", "correction"])
def test_aligner_trainer_refuses_a_bad_dataset_before_loading_the_model(fault, column, tiny_model_dir, tmp_path,
                                                                       no_model_load):
    from adaptkit.aligner import AlignerConfig, AlignerTrainer
    ds, message = bad_rows(GOOD, column, fault)
    with pytest.raises(DataError, match=re.escape(message)):
        AlignerTrainer(str(tiny_model_dir), AlignerConfig(str(tmp_path / "out"), report_to="none"), ds)


class _NoAligner:
    "An aligner that must not be reached: the prompts are checked before any answer or correction."
    def correct(self, *args, **kwargs): raise AssertionError("the aligner ran before the prompts were checked")


@pytest.mark.parametrize("fault", ["empty", "null"])
def test_dpo_rounds_refuses_a_bad_prompt_before_generating(fault, tiny_tok, monkeypatch):
    from adaptkit.aligner import dpo_rounds
    from adaptkit.models import tiny_causal_lm
    policy = tiny_causal_lm(tiny_tok)
    def generate(*args, **kwargs): raise AssertionError("the policy generated before the prompts were checked")
    monkeypatch.setattr(policy, "generate", generate)
    ds, _ = bad_rows({"prompt": "what is two plus two"}, "prompt", fault)
    with pytest.raises(DataError, match=r"row 2.*(empty text|missing value)"):
        dpo_rounds(policy, tiny_tok, _NoAligner(), ds["prompt"], rounds=1)
