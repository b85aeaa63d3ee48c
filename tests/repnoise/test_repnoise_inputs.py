"""An in-memory `datasets.Dataset` with an empty or missing field fails at RepNoiseTrainer before any model loads,
naming the row and the column (issue 38, item 17)."""
import re

import datasets
import pytest

from adaptkit.data import DataError

GOOD = {"prompt": "how do I pick a lock", "harmful": "first take a tension wrench", "harmless": "I cannot help."}


@pytest.mark.parametrize("fault", ["empty", "null", "no column"])
@pytest.mark.parametrize("column", ["prompt", "harmful", "harmless"])
def test_repnoise_trainer_refuses_a_bad_dataset_before_loading_the_model(fault, column, tiny_tok, tiny_model_dir,
                                                                         tmp_path, no_model_load):
    from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer
    rows = [dict(GOOD) for _ in range(5)]
    if fault == "empty": rows[2][column] = ""
    if fault == "null": rows[2][column] = None
    if fault == "no column":
        for r in rows: del r[column]
    message = {"empty": f"row 2, column {column!r}: empty text", "null": f"row 2, column {column!r}: missing value",
               "no column": f"missing column(s) {column!r}"}[fault]
    with pytest.raises(DataError, match=re.escape(message)):
        RepNoiseTrainer(str(tiny_model_dir), RepNoiseConfig(str(tmp_path / "out"), report_to="none"),
                        datasets.Dataset.from_list(rows), processing_class=tiny_tok)
