"""An in-memory `datasets.Dataset` with an empty or missing field at PiSSATrainer: refused before the model loads (and
before PiSSA's SVD init), naming the row and the column (issue 38, item 17)."""
import re

import datasets
import pytest

from adaptkit.data import DataError


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="PiSSATrainer gives SFTTrainer its rows unchecked, after the base loads and its SVD init")
@pytest.mark.parametrize("fault", ["empty", "null"])
@pytest.mark.parametrize("column", ["prompt", "completion"])
def test_pissa_trainer_refuses_a_bad_dataset_before_loading_the_model(fault, column, tiny_model_dir, tmp_path,
                                                                      no_model_load):
    from adaptkit.pissa import PiSSAConfig, PiSSATrainer
    rows = [{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(5)]
    rows[2][column] = "" if fault == "empty" else None
    message = f"row 2, column {column!r}: " + ("empty text" if fault == "empty" else "missing value")
    with pytest.raises(DataError, match=re.escape(message)):
        PiSSATrainer(str(tiny_model_dir), PiSSAConfig(str(tmp_path / "out"), report_to="none"),
                     train_dataset=datasets.Dataset.from_list(rows))
