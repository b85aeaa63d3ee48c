"""An in-memory `datasets.Dataset` with an empty or missing field fails at Trans-LoRA's entry points (transfer_lora's
seeds, TransLoRATrainer's teacher rows) before any model loads, naming the row and the column (issue 38, item 17)."""
import re

import datasets
import pytest

from adaptkit.data import DataError


def bad_rows(column: str, fault: str) -> tuple[datasets.Dataset, str]:
    "Six prompt/completion rows in memory, row 2's `column` empty or null (or the column gone); the message expected."
    rows = [{"prompt": f"question {i}: what is {i} plus {i}?", "completion": f" {2 * i}"} for i in range(6)]
    if fault == "no column":
        for r in rows: del r[column]
    else: rows[2][column] = "" if fault == "empty" else None
    message = {"empty": f"row 2, column {column!r}: empty text", "null": f"row 2, column {column!r}: missing value",
               "no column": f"missing column(s) {column!r}"}[fault]
    return datasets.Dataset.from_list(rows), message


@pytest.mark.parametrize("fault", ["empty", "null", "no column"])
@pytest.mark.parametrize("column", ["prompt", "completion"])
def test_transfer_lora_refuses_bad_seeds_before_loading_a_model(fault, column, tiny_model_dir, tmp_path,
                                                                no_model_load):
    from adaptkit.translora import transfer_lora
    ds, message = bad_rows(column, fault)
    with pytest.raises(DataError, match=re.escape(message)):
        transfer_lora(tiny_model_dir, tmp_path / "no-adapter-needed", tiny_model_dir, ds)


@pytest.mark.parametrize("fault", ["empty", "null", "no column"])
@pytest.mark.parametrize("column", ["prompt", "completion"])
def test_translora_trainer_refuses_bad_rows_before_loading_the_model(fault, column, tiny_model_dir, tmp_path,
                                                                     no_model_load):
    from adaptkit.translora import DistillationConfig, TransLoRATrainer
    ds, message = bad_rows(column, fault)
    with pytest.raises(DataError, match=re.escape(message)):
        TransLoRATrainer(str(tiny_model_dir), DistillationConfig(str(tmp_path / "out"), report_to="none"), ds)


@pytest.mark.parametrize("fault", ["empty", "null", "no column"])
@pytest.mark.parametrize("column", ["prompt", "completion"])
def test_the_logit_level_trainer_refuses_bad_rows_before_loading_the_model(fault, column, tiny_model_dir, tiny_tok,
                                                                         tmp_path, no_model_load):
    from adaptkit.models import tiny_causal_lm
    from adaptkit.translora import DistillationConfig
    from adaptkit.translora.trainer import TransLoRAGKDTrainer
    ds, message = bad_rows(column, fault)
    config = DistillationConfig(str(tmp_path / "out"), distillation="logit", report_to="none")
    with pytest.raises(DataError, match=re.escape(message)):
        TransLoRAGKDTrainer(str(tiny_model_dir), tiny_causal_lm(tiny_tok), config, ds, processing_class=tiny_tok)
