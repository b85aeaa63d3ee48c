"""adaptkit.data behaviours that mutation testing (`make mutation`, tests/mutation.json) found untested: the exact
messages of row problems, the JSON Lines saved as .json fallback, CSV line numbers and old Mac line endings, the
split-folder fallbacks, and that load_rows passes revision and token on to the Hub."""
import re

import datasets
import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import RepositoryNotFoundError

from adaptkit.data import (
    CLASSIFICATION,
    PREFERENCE,
    PROMPT_COMPLETION,
    QAC,
    DataError,
    Schema,
    load_rows,
    validate_rows,
)
from adaptkit.localhub.server import LocalHub

ROW = {"question": "2+2?", "answer": "5", "correction": "4"}


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


# --- validate_rows: defaults and messages -------------------------------------------------------------------------

def test_default_source_is_rows_and_at_most_ten_problems_are_listed():
    bad = [{**ROW, "answer": ""} for _ in range(12)]
    with pytest.raises(DataError) as e:
        validate_rows(bad, QAC)
    lines = str(e.value).split("\n")
    assert lines[0] == "rows: rows do not fit question/answer/correction:"
    assert lines[1:] == [f"  row {i}, column 'answer': empty text" for i in range(10)]


def test_max_problems_stops_the_listing_and_still_raises():
    bad = [{**ROW, "question": None} for _ in range(3)]
    with pytest.raises(DataError, match=r"row 1, column 'question': missing value \(null\)$"):
        validate_rows(bad, QAC, "mine", max_problems=2)


def test_a_row_that_is_not_a_dict_is_named_with_its_line():
    long = "x" * 60
    with pytest.raises(DataError, match=re.escape(f"rows, row 1: expected a row of named columns (a dict), got str "
                                                  f"{long[:40]!r}")):
        validate_rows([ROW, long], QAC)
    with pytest.raises(DataError, match=re.escape("f.jsonl, line 7: row 1: expected a row of named columns (a dict), "
                                                  "got list '[1, 2]'")):
        validate_rows([ROW, [1, 2]], QAC, "f.jsonl", lines=[3, 7])


def test_missing_columns_are_listed_and_none_found_is_said():
    with pytest.raises(DataError, match=re.escape("rows: missing column(s) 'answer', 'correction' for "
                                                  "question/answer/correction; found 'question'")):
        validate_rows([{"question": "q"}], QAC)
    with pytest.raises(DataError, match=re.escape("rows: missing column(s) 'question', 'answer', 'correction' for "
                                                  "question/answer/correction; found none")):
        validate_rows([{}], QAC)


def test_type_errors_name_every_allowed_type_and_cut_the_value_at_40_characters():
    with pytest.raises(DataError, match=re.escape("row 0, column 'prompt': expected str or list, got int '5'")):
        validate_rows([{"prompt": 5, "completion": "c"}], PROMPT_COMPLETION)
    value = [7] * 30  # str(value) is 90 characters
    with pytest.raises(DataError, match=re.escape(f"row 0, column 'label': expected int or str, got list "
                                                  f"{str(value)[:40]!r}\n")):
        validate_rows([{"text": "t", "label": value}, {"text": "t", "label": True}], CLASSIFICATION)


# --- _row_problems: identical columns and duplicate ids -------------------------------------------------------------

def test_identical_columns_are_named_and_different_ones_pass():
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a", "rejected": "a"}]
    assert validate_rows(rows[:1], PREFERENCE) == rows[:1]
    with pytest.raises(DataError, match=re.escape("rows: rows do not fit preference pairs:\n"
                                                  "  row 1: columns 'chosen' and 'rejected' are identical")):
        validate_rows(rows, PREFERENCE)
    with pytest.raises(DataError, match=re.escape("  line 9: row 1: columns 'chosen' and 'rejected' are identical")):
        validate_rows(rows, PREFERENCE, "p.jsonl", lines=[4, 9])


def test_duplicate_ids_name_the_first_row_with_that_id():
    schema = Schema("ided", {"text": str})
    rows = [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"}, {"text": "no id"}]
    assert validate_rows(rows[:2] + rows[3:], schema) == rows[:2] + rows[3:]
    with pytest.raises(DataError, match=re.escape("  row 2, column 'id': duplicate id 'a' (first in row 0)")):
        validate_rows(rows, schema)
    with pytest.raises(DataError, match=re.escape("  line 5: row 2, column 'id': duplicate id 'a' (first in row 0)")):
        validate_rows(rows, schema, "i.jsonl", lines=[1, 3, 5, 6])
    with pytest.raises(DataError, match=re.escape("  row 1, column 'key': duplicate id 1 (first in row 0)")):
        validate_rows(
            [{"key": 1, "text": "x"}, {"key": 1, "text": "y"}], Schema("keyed", {"text": str}, id_column="key")
        )


# --- files: JSON Lines, .json fallback, CSV line numbers ------------------------------------------------------------

def test_json_lines_saved_as_json_are_read_as_json_lines(tmp_path):
    other = {"question": "1+1?", "answer": "2", "correction": "2"}
    text = ('{"question": "2+2?", "answer": "5", "correction": "4"}\n'
            '{"question": "1+1?", "answer": "", "correction": "2"}\n')
    with pytest.raises(DataError, match=re.escape("x.json: rows do not fit question/answer/correction:\n"
                                                  "  line 2: row 1, column 'answer': empty text")):
        load_rows(write(tmp_path / "x.json", text), QAC)
    good = text.replace('"answer": ""', '"answer": "2"')
    assert load_rows(write(tmp_path / "y.json", good), QAC).to_list() == [ROW, other]


def test_invalid_json_is_named_by_line_and_column(tmp_path):
    path = write(tmp_path / "bad.json", '{"question": "q",\n "answer": }')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2, column 12: invalid JSON (Expecting value)")):
        load_rows(path, QAC)


@pytest.mark.parametrize("line", ["\x0c", "X", "\u2028"])  # not JSON whitespace: not a blank line either
def test_a_jsonl_line_of_non_json_whitespace_is_invalid_json(tmp_path, line):
    path = write(tmp_path / "w.jsonl", f'{{"question": "q", "answer": "a", "correction": "c"}}\n{line}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2, column 1: invalid JSON (Expecting value); "
                                                  "expected one JSON object per line")):
        load_rows(path, QAC)


def test_blank_jsonl_lines_of_json_whitespace_are_skipped(tmp_path):
    path = write(tmp_path / "b.jsonl", ' \t\r\n{"question": "2+2?", "answer": "5", "correction": "4"}\n\t\n')
    assert load_rows(path, QAC).to_list() == [ROW]


def test_the_first_csv_row_is_line_2(tmp_path):
    path = write(tmp_path / "f.csv", "question,answer,correction\nq,,c\n")
    with pytest.raises(DataError, match=re.escape("  line 2: row 0, column 'answer': empty text")):
        load_rows(path, QAC)
    path = write(tmp_path / "g.csv", 'question,answer,correction\n"q\nq",a\n')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2 (row 0): 2 cells, expected 3")):
        load_rows(path, QAC)


def test_csv_with_carriage_return_line_endings_is_read(tmp_path):
    path = write(tmp_path / "mac.csv", "question,answer,correction\r2+2?,5,4\r")
    assert load_rows(path, QAC).to_list() == [ROW]


# --- folders: split patterns, shards, the single-file fallback --------------------------------------------------------

def test_shards_of_a_split_are_concatenated_in_order(tmp_path):
    for i, q in enumerate(["a", "b"]):
        write(tmp_path / "data" / f"train-0000{i}-of-00002.jsonl",
              f'{{"question": "{q}", "answer": "x", "correction": "y"}}\n')
    assert load_rows(tmp_path, QAC)["question"] == ["a", "b"]


def test_a_folder_with_one_data_file_of_another_name_is_read(tmp_path):
    write(tmp_path / "sub" / "mine.jsonl", '{"question": "2+2?", "answer": "5", "correction": "4"}\n')
    write(tmp_path / "README.md", "# not data\n")
    write(tmp_path / ".cache" / "old.jsonl", "not json\n")  # the HF cache's files are never rows
    assert load_rows(tmp_path, QAC).to_list() == [ROW]


def test_a_folder_with_two_unrelated_data_files_is_refused(tmp_path):
    for name in ["a.jsonl", "b.jsonl"]: write(tmp_path / name, '{"question": "q", "answer": "a", "correction": "c"}\n')
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}: no file for split 'train' (looked for "
                                                  "train.jsonl/.json/.csv/.parquet and data/train-*)")):
        load_rows(tmp_path, QAC)


def test_a_missing_split_of_a_datasetdict_lists_the_others():
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list([ROW]), "validation": datasets.Dataset.from_list([ROW])}
    )
    with pytest.raises(DataError, match=re.escape("no split 'test'; available: train, validation")):
        load_rows(dd, QAC, split="test")


def test_a_list_mixing_kinds_in_a_column_is_named_as_rows():
    rows = [{**ROW, "score": 1}, {**ROW, "score": "high"}]
    with pytest.raises(DataError, match=re.escape("rows: column 'score' holds number (row 0) and text (row 1); "
                                                  "expected one kind of value per column")):
        load_rows(rows, QAC)


# --- the Hub: revision and token reach pull -----------------------------------------------------------------------

def test_load_rows_passes_revision_and_token_to_the_hub(tmp_path):
    token = "hf_mutants_data_token"
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/rows", repo_type="dataset", private=True)
        api.upload_file(path_or_fileobj=b'{"question": "old", "answer": "a", "correction": "c"}\n',
                        path_in_repo="train.jsonl", repo_id="team/rows", repo_type="dataset")
        api.create_branch("team/rows", branch="v1", repo_type="dataset")
        api.upload_file(path_or_fileobj=b'{"question": "new", "answer": "a", "correction": "c"}\n',
                        path_in_repo="train.jsonl", repo_id="team/rows", repo_type="dataset")
        load = lambda **kw: load_rows("team/rows", QAC, endpoint=hub.endpoint, **kw)["question"]
        assert load(token=token) == ["new"]
        assert load(token=token, revision="v1") == ["old"]
        with pytest.raises(RepositoryNotFoundError, match="team/rows"):  # private: hidden without the token
            load()
