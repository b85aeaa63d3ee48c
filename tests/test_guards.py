"""Input checks of tasks, artifacts and the cli, fed the input each refuses: the error type and what its message names.
The checks of data, hub and LocalHub are tested in tests/test_data.py, tests/test_hub.py and
tests/test_localhub_safety.py (the files the mutation run of each module uses)."""
import re

import pytest

# --- tasks, artifacts, cli ------------------------------------------------------------------------------------------

def test_task_checks():
    from adaptkit.tasks import bootstrap_ci, first_number_hits, text_task
    with pytest.raises(ValueError, match=re.escape("3 answers for 2 rows")):
        first_number_hits(["1", "2", "3"], [{"answer": "1"}, {"answer": "2"}])
    assert first_number_hits(["1", "x2", "-2"], [{"answer": "1"}, {"answer": "3"}, {"answer": "2"}]) == [True, False,
                                                                                                      False]
    with pytest.raises(ValueError, match="each seed needs a flat, non-empty list of item scores"):
        bootstrap_ci([[[1, 0]], [[0, 1]]])
    with pytest.raises(KeyError, match=re.escape("unknown task 'nope'; choose one of news, chat, puzzle, qa_match")):
        text_task("nope")


def test_artifact_checks(tmp_path):
    from adaptkit.artifacts import _load_base_for
    from adaptkit.hub import render_card
    with pytest.raises(ValueError, match=re.escape("unknown method 'lora'; expected one of aligner, pissa, repnoise, "
                                                   "translora, emr")):
        render_card("lora", model_name="x")
    with pytest.raises(ValueError, match=re.escape("my adapter records no base model repo id: pass base=")):
        _load_base_for({"source": {"fingerprint": "abc"}}, None, "my adapter")


@pytest.mark.parametrize("argv, code, stream, part", [
    ([], 0, "out", "usage: adaptkit <command>"),
    (["--help"], 0, "out", "commands:\n  pissa"),
    (["bogus"], 2, "err", "usage: adaptkit <command>"),
    (["hub"], 2, "err", "  hub serve"),
])
def test_cli_usage_for_no_or_an_unknown_command(capsys, argv, code, stream, part):
    from adaptkit.cli import main
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert part in (out if stream == "out" else err) and not (err if stream == "out" else out)


@pytest.mark.parametrize("args, message", [
    (["--finetuned", "a"], "--finetuned 'a': expected task=folder_or_repo_id"),
    (["--finetuned", "=x"], "--finetuned '=x': expected task=folder_or_repo_id"),
    (["--finetuned", "a="], "--finetuned 'a=': expected task=folder_or_repo_id"),
    (["--finetuned", "a=x", "a=y"], "--finetuned: task 'a' given twice"),
    (["--finetuned", "a=x", "--push_to_hub", "true"], "--push_to_hub needs --hub_model_id (namespace/name)"),
])
def test_cli_emr_arguments_are_checked_before_any_work(capsys, tmp_path, args, message):
    from adaptkit.cli import main
    assert main(["emr", "--pretrained", str(tmp_path / "none"), "--output_dir", str(tmp_path / "out"), *args]) == 2
    assert capsys.readouterr().err == f"adaptkit emr: error: {message}\n"
    assert not (tmp_path / "out").exists()
