"""An in-memory `datasets.Dataset` with an empty or missing field at PiSSATrainer: refused before the model loads (and
before PiSSA's SVD init), naming the row and the column (issue 38, item 17)."""
import re

import datasets
import pytest

from adaptkit.data import DataError


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


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "1 plus 1 is"}, {"prompt": "2 plus 2 is"}], "missing column(s) 'completion' for prompt/completion"),
    ([{"messages": [{"role": "user", "content": "hi"}]}, {"messages": None}], "row 1, column 'messages': missing"),
    ([{"text": "one plus one is two"}, {"text": "  "}], "row 1, column 'text': empty text"),
])
def test_pissa_trainer_checks_every_sft_format_and_its_eval_rows_before_loading_the_model(rows, message, tiny_model_dir,
                                                                                         tmp_path, no_model_load):
    "Chat messages and plain text are checked as prompt/completion is; so are the eval rows."
    from adaptkit.pissa import PiSSAConfig, PiSSATrainer
    args = PiSSAConfig(str(tmp_path / "out"), report_to="none")
    with pytest.raises(DataError, match=re.escape(message)):
        PiSSATrainer(str(tiny_model_dir), args, train_dataset=datasets.Dataset.from_list(rows))
    good = datasets.Dataset.from_list([{"prompt": "1 plus 1 is", "completion": " 2."}])
    with pytest.raises(DataError, match=re.escape(message)):
        PiSSATrainer(str(tiny_model_dir), args, train_dataset=good, eval_dataset=datasets.Dataset.from_list(rows))
