"""Every command that takes rows refuses a `datasets.Dataset` with an empty or missing field before any model loads:
one line naming the file, the row and the column, exit 2, nothing written (issue 38, item 17). The Dataset is saved
as parquet (what `Dataset.to_parquet` and the Hub's dataset viewer write), so it reaches `load_rows` as a Dataset."""
import datasets
import pytest

from adaptkit.cli import main

QAC = {"question": "what is two plus two", "answer": "five", "correction": "four"}
PAIRS = {"prompt": "how do I pick a lock", "harmful": "first take a tension wrench", "harmless": "I cannot help."}
PC = {"prompt": "what is 2 plus 2?", "completion": " 4"}
COMMANDS = {  # command: (a good row, the option that takes the rows, the rest of its arguments)
    "pissa": (PC, "--dataset_name", ["--model_name_or_path", "{model}", "--output_dir", "{out}"]),
    "aligner": (QAC, "--dataset_name", ["--model_name_or_path", "{model}", "--output_dir", "{out}"]),
    "repnoise": (PAIRS, "--dataset_name", ["--model_name_or_path", "{model}", "--output_dir", "{out}"]),
    "translora": (PC, "--seeds", ["--source_base", "{model}", "--source_adapter", "{tmp}/lora", "--target_base",
                                  "{model}", "--output_dir", "{out}", "--adapter_dir", "{out}/adapter"]),
}


@pytest.mark.parametrize("fault", ["empty", "null"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_refuses_a_bad_dataset_before_loading_a_model(command, fault, tiny_model_dir, tmp_path, capsys,
                                                                no_model_load):
    good, option, rest = COMMANDS[command]
    column = list(good)[-1]
    rows = [dict(good) for _ in range(6)]
    rows[2][column] = "" if fault == "empty" else None
    data = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(data))
    capsys.readouterr()  # the test's own progress bars
    fill = dict(model=tiny_model_dir, out=tmp_path / "out", tmp=tmp_path)
    code = main([command, option, str(data), *(a.format(**fill) for a in rest)])
    err = capsys.readouterr().err
    errors = [line for line in err.replace("\r", "\n").splitlines() if line.startswith(f"adaptkit {command}: ")]
    why = "empty text" if fault == "empty" else "missing value (null)"
    assert code == 2 and len(errors) == 1 and "Traceback" not in err and "a model was loaded" not in err, err
    assert f"{data}: rows do not fit" in errors[0] and f"row 2, column {column!r}: {why}" in errors[0], errors
    assert not (tmp_path / "out").exists()
