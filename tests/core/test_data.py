"""adaptkit.data.load_rows on every kind of bad file (issue 14 item 1): one DataError naming file, line, row and column;
valid files with a BOM, raw U+2028/U+2029 or quoted newlines come through unchanged; a missing path asks no Hub."""
import json
import re

import datasets
import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

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

ROWS = [{"question": "2+2?", "answer": "5", "correction": "4"}, {"question": "1+1?", "answer": "2", "correction": "2"}]
ROW = ROWS[0]


def write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def jsonl(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# --- valid files come through unchanged ------------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [
    ("bom.jsonl", "\ufeff" + jsonl(ROWS)),
    ("bom.json", "\ufeff" + json.dumps(ROWS)),
    ("bom.csv", "\ufeffquestion,answer,correction\n2+2?,5,4\n1+1?,2,2\n"),
    ("crlf.csv", "question,answer,correction\r\n2+2?,5,4\r\n1+1?,2,2\r\n"),
    ("crlf.jsonl", jsonl(ROWS).replace("\n", "\r\n")),
])
def test_bom_and_line_endings_are_accepted(tmp_path, name, text):
    ds = load_rows(write(tmp_path / name, text), QAC)
    assert ds.column_names == ["question", "answer", "correction"]  # no '\ufeffquestion'
    assert ds.to_list() == ROWS


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])  # raw in JSON strings; str.splitlines splits on them
def test_characters_that_splitlines_splits_on_stay_inside_json_strings(tmp_path, sep):
    rows = [{"question": f"one{sep}two", "answer": "a", "correction": f"c{sep}"}, ROWS[0]]
    assert load_rows(write(tmp_path / "x.jsonl", jsonl(rows)), QAC).to_list() == rows
    assert load_rows(write(tmp_path / "x.json", json.dumps(rows, ensure_ascii=False)), QAC).to_list() == rows


def test_quoted_newlines_in_csv_are_kept(tmp_path):
    text = ('question,answer,correction\n"line one\nline two",a,c\n"a\r\nb","x, y","say ""hi"""\n'
            '"trailing\n",b,d\n')
    ds = load_rows(write(tmp_path / "q.csv", text), QAC)
    assert ds.to_list() == [{"question": "line one\nline two", "answer": "a", "correction": "c"},
                            {"question": "a\r\nb", "answer": "x, y", "correction": 'say "hi"'},
                            {"question": "trailing\n", "answer": "b", "correction": "d"}]


def test_a_row_after_a_quoted_newline_is_named_by_its_own_line(tmp_path):
    text = 'question,answer,correction\n"two\nlines",a,c\n"three\nmore\nlines",a,c\nq,,c\n'
    with pytest.raises(DataError, match=re.escape("q.csv: rows do not fit question/answer/correction:\n"
                                                  "  line 7: row 2, column 'answer': empty text")):
        load_rows(write(tmp_path / "q.csv", text), QAC)


def test_extra_columns_are_kept_and_never_renamed(tmp_path):
    rows = [dict(ROWS[0], source="a"), dict(ROWS[1], note="only here")]
    ds = load_rows(write(tmp_path / "x.jsonl", jsonl(rows)), QAC)
    assert ds.column_names == ["question", "answer", "correction", "source", "note"]
    assert ds["note"] == [None, "only here"] and ds["source"] == ["a", None]
    assert load_rows(rows, QAC).column_names == ds.column_names
    with pytest.raises(
        DataError,
        match=re.escape(
            "missing column(s) 'question' for question/answer/correction; found "
            "'Question ', 'answer', 'correction' ('Question ': names must match exactly)"
        ),
    ):
        load_rows(write(tmp_path / "h.csv", "Question ,answer,correction\nq,a,c\n"), QAC)


# --- bad JSON shapes ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("[1, 2, 3]", "x.json, line 1 (row 0): expected a JSON object (one row), got a number 1"),
    ('[\n  {"question": "q", "answer": "a", "correction": "c"},\n  ["q", "a", "c"]\n]',
     'x.json, line 3 (row 1): expected a JSON object (one row), got an array ["q", "a", "c"]'),
    ("[null]", "x.json, line 1 (row 0): expected a JSON object (one row), got null"),
    ('{"question": ["q1", "q2"], "answer": ["a", "b"]}',
     "x.json: expected a JSON array of row objects (or one object per line), got an object"),
    ("42", "x.json: expected a JSON array of row objects (or one object per line), got a number 42"),
    ('"text"', 'got a string "text"'),
    ('[{"question": "q"},\n]', "x.json, line 2, column 1: invalid JSON (Expecting value)"),
    ('[{"question": "q"} {"question": "r"}]', "x.json, line 1: invalid JSON (expected ',' or ']' after row 0)"),
    ('[{"question": "q"}]\n[]', "x.json, line 2: invalid JSON (extra data after the array)"),
    ('[{"question": "q"', "x.json, line 1, column 18: invalid JSON"),
])
def test_wrong_json_shapes_are_named(tmp_path, text, message):
    with pytest.raises(DataError, match=re.escape(message)):
        load_rows(write(tmp_path / "x.json", text), QAC)


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "x.jsonl, line 3 (row 1): expected a JSON object (one row), got an array [1, 2]"),
    ("null", "x.jsonl, line 3 (row 1): expected a JSON object (one row), got null"),
    ('"q"', 'got a string "q"'),
    ('{"question": "q", ', "x.jsonl, line 3, column 19: invalid JSON (Expecting property name"),
])
def test_non_object_jsonl_lines_are_named(tmp_path, line, message):
    text = json.dumps(ROWS[0]) + "\n\n" + line + "\n"
    with pytest.raises(DataError, match=re.escape(message)):
        load_rows(write(tmp_path / "x.jsonl", text), QAC)


def test_row_problems_name_file_line_row_and_column(tmp_path):
    rows = [ROWS[0], dict(ROWS[1], answer=""), dict(ROWS[1], correction=3)]
    with pytest.raises(DataError) as e:
        load_rows(write(tmp_path / "p.json", json.dumps(rows, indent=1)), QAC)
    assert str(e.value).splitlines() == [f"{tmp_path / 'p.json'}: rows do not fit question/answer/correction:",
                                         "  line 7: row 1, column 'answer': empty text",
                                         "  line 12: row 2, column 'correction': expected str, got int '3'"]


def test_a_column_mixing_kinds_is_named(tmp_path):
    rows = [{"text": "a", "label": 1}, {"text": "b", "label": "two"}]
    with pytest.raises(DataError, match=re.escape("m.jsonl: column 'label' holds number (line 1: row 0) and text "
                                                  "(line 2: row 1); expected one kind of value per column")):
        load_rows(write(tmp_path / "m.jsonl", jsonl(rows)), CLASSIFICATION)
    mixed = [{"prompt": "p", "completion": "c"}, {"prompt": [{"role": "user", "content": "p"}], "completion": "c"}]
    with pytest.raises(DataError, match=re.escape("column 'prompt' holds text (row 0) and list (row 1)")):
        load_rows(mixed, PROMPT_COMPLETION)


# --- ragged and malformed CSV ------------------------------------------------------------------------------------

@pytest.mark.parametrize("row, message", [
    ("q,a,c,extra", "r.csv, line 3 (row 1): 4 cells, expected 3 ('question', 'answer', 'correction'); "
                    "cell 4 ('extra') is past the last column"),
    ("q,a", "r.csv, line 3 (row 1): 2 cells, expected 3; no cell for column(s) 'correction'"),
    ("q", "r.csv, line 3 (row 1): 1 cells, expected 3; no cell for column(s) 'answer', 'correction'"),
    ('"open,a,c', "r.csv, line 3: malformed CSV (unexpected end of data)"),
    ('"q"x,a,c', "r.csv, line 3: malformed CSV (',' expected after '\"')"),
])
def test_ragged_and_malformed_csv_rows_are_named(tmp_path, row, message):
    text = "question,answer,correction\nq,a,c\n" + row + "\n"
    with pytest.raises(DataError, match=re.escape(message)):
        load_rows(write(tmp_path / "r.csv", text), QAC)


@pytest.mark.parametrize("header, message", [
    ("question,answer,answer,correction", "h.csv, line 1: column 'answer' appears twice in the header"),
    ("question,answer,,correction", "h.csv, line 1: the header's cell 3 is empty"),
])
def test_csv_headers_that_would_lose_a_column_are_refused(tmp_path, header, message):
    with pytest.raises(DataError, match=re.escape(message)):
        load_rows(write(tmp_path / "h.csv", header + "\nq,a,b,c\n"), QAC)


# --- bytes that are not UTF-8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, data, message", [
    ("latin1.csv", "question,answer,correction\nq,caf\xe9,c\n".encode("latin-1"),
     r"latin1.csv, line 2, column 6 (byte 32): byte b'\xe9' is not valid in encoding utf-8; expected UTF-8 text"),
    ("latin1.jsonl", (json.dumps(ROWS[0]) + '\n{"question": "\xfc"}\n').encode("latin-1"),
     r"latin1.jsonl, line 2, column 15 (byte 69): byte b'\xfc' is not valid in encoding utf-8"),
    ("utf16.json", json.dumps(ROWS).encode("utf-16"),
     r"utf16.json, line 1, column 1 (byte 0): byte b'\xff' is not valid in encoding utf-8 (it starts with a UTF-16 "
     "byte order mark)"),
    ("utf16le.jsonl", jsonl(ROWS).encode("utf-16-le"),
     "utf16le.jsonl, line 1, column 2 (byte 1): a NUL character; expected UTF-8 text (is the file UTF-16 or binary?)"),
])
def test_undecodable_bytes_are_named_with_the_encoding_tried(tmp_path, name, data, message):
    with pytest.raises(DataError, match=re.escape(message)):
        load_rows(write(tmp_path / name, data), QAC)


# --- parquet -----------------------------------------------------------------------------------------------------

def test_corrupt_parquet_is_named(tmp_path):
    good = tmp_path / "good.parquet"
    datasets.Dataset.from_list(ROWS * 50).to_parquet(str(good))
    raw = good.read_bytes()
    assert load_rows(good, QAC).to_list() == ROWS * 50
    flipped = bytearray(raw)
    for i in range(8, 200): flipped[i] ^= 0xFF  # column data, with the footer intact
    for name, data in [("garbage.parquet", b"not a parquet file"), ("truncated.parquet", raw[: len(raw) // 2]),
                       ("flipped.parquet", bytes(flipped))]:
        with pytest.raises(DataError, match=rf"{re.escape(str(tmp_path / name))}: not a readable parquet file \(\w+"):
            load_rows(write(tmp_path / name, data), QAC)


def test_bad_rows_of_a_parquet_file_are_named(tmp_path):
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list([ROWS[0], dict(ROWS[1], correction="")]).to_parquet(str(path))
    with pytest.raises(DataError, match=re.escape("bad.parquet: rows do not fit question/answer/correction:\n"
                                                  "  row 1, column 'correction': empty text")):
        load_rows(path, QAC)


# --- Dataset objects are validated too ---------------------------------------------------------------------------

def test_a_bad_row_of_a_dataset_fails(tmp_path):
    bad = datasets.Dataset.from_list([ROWS[0], dict(ROWS[1], answer="   "), dict(ROWS[1], question=None)])
    with pytest.raises(DataError, match=re.escape("dataset: rows do not fit question/answer/correction:\n"
                                                  "  row 1, column 'answer': empty text\n"
                                                  "  row 2, column 'question': missing value (null)")):
        load_rows(bad, QAC)
    with pytest.raises(DataError, match=re.escape("split 'test': rows do not fit")):
        load_rows(datasets.DatasetDict(test=bad), QAC, split="test")
    with pytest.raises(DataError, match="missing column\\(s\\) 'correction'"):
        load_rows(bad.remove_columns("correction"), QAC)
    assert load_rows(datasets.Dataset.from_list(ROWS), QAC).to_list() == ROWS
    with pytest.raises(DataError, match="expected str, got int"):
        validate_rows(datasets.Dataset.from_list([{"question": 1, "answer": "a", "correction": "c"}]), QAC)


def test_other_sources_are_refused_by_type():
    with pytest.raises(TypeError, match="load_rows takes rows, a Dataset, a path or a repo id, not int"):
        load_rows(3, QAC)


def test_unsupported_and_empty_files(tmp_path):
    with pytest.raises(DataError, match=r"notes.txt: unsupported file type \(use .jsonl, .json, .csv, .parquet\)"):
        load_rows(write(tmp_path / "notes.txt", "x"), QAC)
    for name in ["empty.jsonl", "empty.json", "empty.csv"]:
        with pytest.raises(DataError, match=rf"{name}: no rows \(question/answer/correction expected\)"):
            load_rows(write(tmp_path / name, ""), QAC)
    with pytest.raises(DataError, match=r"header.csv: no rows"):
        load_rows(write(tmp_path / "header.csv", "question,answer,correction\n"), QAC)


# --- a missing local file is never looked up on a Hub (issue 14 item 2) ------------------------------------------

@pytest.mark.parametrize("name", ["data/train.jsonl", "train.csv", "rows.json", "shard.parquet", "./data",
                                  "~/nope.jsonl"])
def test_a_missing_file_asks_no_hub(request_log, tmp_path, monkeypatch, name):
    endpoint, log = request_log
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{name!r}: no such local file or folder")):
        load_rows(name, QAC, endpoint=endpoint)
    assert log == []
    with pytest.raises(
        HfHubHTTPError, match=re.escape("404 Not Found' for url '" + endpoint + "/api/datasets/team/data")
    ) as e:
        load_rows("team/data", QAC, endpoint=endpoint)  # the control: a repo id does reach the server
    assert e.value.response.status_code == 404
    assert log and log[0].startswith("GET /api/datasets/team/data")


# --- data: row checks ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, message", [
    ([], "rows: no rows (question/answer/correction expected)"),
    ([ROW, ["q", "a", "c"]], "rows, row 1: expected a row of named columns (a dict), got list \"['q', 'a', 'c']\""),
    ([ROW, "q,a,c"], "rows, row 1: expected a row of named columns (a dict), got str 'q,a,c'"),
    ([{"question": "q", "answer": "a"}], "rows: missing column(s) 'correction' for question/answer/correction; "
                                         "found 'question', 'answer'"),
    ([{"Answer": "a", "question": "q", "correction": "c"}],
     "missing column(s) 'answer' for question/answer/correction; found 'Answer', 'question', 'correction' ('Answer': "
     "names must match exactly)"),
    ([ROW, dict(ROW, answer=None)], "row 1, column 'answer': missing value (null)"),
    ([dict(ROW, question=["q"])], "row 0, column 'question': expected str, got list \"['q']\""),
    ([dict(ROW, correction=" \n\t")], "row 0, column 'correction': empty text"),
])
def test_validate_rows_names_row_and_column(rows, message):
    with pytest.raises(DataError, match=re.escape(message)):
        validate_rows(rows, QAC)


def test_validate_rows_returns_good_rows_unchanged():
    rows = [ROW, dict(ROW, question="1+1?")]
    assert validate_rows(rows, QAC) is rows


def test_a_boolean_is_not_a_label():
    "bool is an int in Python; a label of True is a mistake (a JSON `true`), not class 1."
    with pytest.raises(DataError, match=re.escape("row 1, column 'label': expected int or str, got bool 'True'")):
        validate_rows([{"text": "a", "label": 0}, {"text": "b", "label": True}], CLASSIFICATION)
    assert validate_rows([{"text": "a", "label": 0}, {"text": "b", "label": "pos"}], CLASSIFICATION)


def test_identical_pair_columns_are_refused():
    rows = [{"prompt": "p", "chosen": "yes", "rejected": "no"}, {"prompt": "p", "chosen": "same", "rejected": "same"}]
    with pytest.raises(DataError, match=re.escape("preference pairs:\n  row 1: columns 'chosen' and 'rejected' are "
                                                  "identical")):
        validate_rows(rows, PREFERENCE)
    ds = datasets.Dataset.from_list(rows)
    with pytest.raises(DataError, match=re.escape("dataset: rows do not fit preference pairs:\n  row 1: columns "
                                                  "'chosen' and 'rejected' are identical")):
        load_rows(ds, PREFERENCE)
    assert load_rows(ds.select([0]), PREFERENCE).to_list() == rows[:1]


def test_duplicate_ids_name_both_rows():
    rows = [dict(ROW, id="a"), dict(ROW, id="b"), dict(ROW, id="a"), dict(ROW, id="b")]
    with pytest.raises(DataError) as e:
        validate_rows(rows, QAC)
    assert str(e.value).splitlines()[1:] == ["  row 2, column 'id': duplicate id 'a' (first in row 0)",
                                             "  row 3, column 'id': duplicate id 'b' (first in row 1)"]
    own_id = Schema("keyed", {"text": str}, id_column="key")
    with pytest.raises(DataError, match=re.escape("row 1, column 'key': duplicate id 7 (first in row 0)")):
        validate_rows([{"text": "a", "key": 7}, {"text": "b", "key": 7}], own_id)
    assert validate_rows([{"text": "a", "key": 7, "id": 1}, {"text": "b", "key": 8, "id": 1}], own_id)


def test_max_problems_stops_the_list():
    rows = [dict(ROW, answer="") for _ in range(30)]
    with pytest.raises(DataError) as e:
        validate_rows(rows, QAC, "mine", 3)
    lines = str(e.value).splitlines()
    assert lines == ["mine: rows do not fit question/answer/correction:",
                     "  row 0, column 'answer': empty text", "  row 1, column 'answer': empty text",
                     "  row 2, column 'answer': empty text"]
    assert len(str(pytest.raises(DataError, validate_rows, rows, QAC).value).splitlines()) == 11  # default: 10


def test_lines_name_the_file_line_of_a_row():
    with pytest.raises(DataError, match=re.escape("f.csv, line 9: row 1: expected a row of named columns")):
        validate_rows([ROW, 3], QAC, "f.csv", lines=[2, 9])
    with pytest.raises(
        DataError,
        match=re.escape(
            "f.csv: rows do not fit question/answer/correction:\n  line 9: row 1, column 'answer': empty text"
        ),
    ):
        validate_rows([ROW, dict(ROW, answer="")], QAC, "f.csv", lines=[2, 9])


# --- data: rows given as a datasets.Dataset, a DatasetDict or a list ----------------------------------------------

def test_load_rows_validates_a_dataset_before_returning_it():
    good = datasets.Dataset.from_list([ROW, dict(ROW, question="1+1?")])
    assert load_rows(good, QAC) is good  # validated in place, not copied
    with pytest.raises(DataError, match=re.escape("dataset: no rows (question/answer/correction expected)")):
        load_rows(good.select([]), QAC)
    with pytest.raises(DataError, match=re.escape("dataset: missing column(s) 'answer', 'correction' for "
                                                  "question/answer/correction; found 'question'")):
        load_rows(good.select_columns(["question"]), QAC)
    numbers = datasets.Dataset.from_dict({"question": ["q", "r"], "answer": ["a", "b"], "correction": [3, 4]})
    with pytest.raises(DataError) as e:  # Arrow types a column: every row of it is named
        load_rows(numbers, QAC)
    assert str(e.value).splitlines() == ["dataset: rows do not fit question/answer/correction:",
                                         "  row 0, column 'correction': expected str, got int '3'",
                                         "  row 1, column 'correction': expected str, got int '4'"]
    nulls = datasets.Dataset.from_dict({"question": ["q", None], "answer": ["a", "b"], "correction": ["c", "d"]})
    with pytest.raises(DataError, match=re.escape("  row 1, column 'question': missing value (null)")):
        load_rows(nulls, QAC)


def test_load_rows_splits_of_a_dataset_dict():
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list([ROW]), test=datasets.Dataset.from_list([ROW]))
    with pytest.raises(DataError, match=re.escape("no split 'validation'; available: train, test")):
        load_rows(dd, QAC, split="validation")
    assert load_rows(dd, QAC, split="test").to_list() == [ROW]
    bad = datasets.DatasetDict(train=datasets.Dataset.from_list([dict(ROW, question="")]))
    with pytest.raises(
        DataError,
        match=re.escape(
            "split 'train': rows do not fit question/answer/correction:\n  row 0, column 'question': empty text"
        ),
    ):
        load_rows(bad, QAC)


def test_load_rows_validates_lists_and_tuples_then_makes_one_table():
    assert load_rows((ROW,), QAC).to_list() == [ROW]
    with pytest.raises(DataError, match=re.escape("rows: rows do not fit question/answer/correction:\n  row 0, column "
                                                  "'question': empty text")):
        load_rows([dict(ROW, question="")], QAC)
    # both lists, but Arrow cannot type them as one column
    rows = [dict(ROW, meta=[{"a": 1}]), dict(ROW, meta=[[1, 2]])]
    with pytest.raises(DataError, match=re.escape("rows: the rows do not make one table (")):
        load_rows(rows, QAC)


# --- data: files and folders ----------------------------------------------------------------------------------------

def test_json_that_is_not_an_array_is_named(tmp_path):
    with pytest.raises(DataError, match=re.escape("x.json, line 2, column 1: invalid JSON (Expecting ',' delimiter)")):
        load_rows(write(tmp_path / "x.json", '{"question": "q"\n"answer": "a"}'), QAC)
    lines = json.dumps(ROW) + "\n" + json.dumps(dict(ROW, question="1+1?")) + "\n"  # JSON Lines saved as .json
    assert load_rows(write(tmp_path / "l.json", lines), QAC)["question"] == ["2+2?", "1+1?"]
    with pytest.raises(DataError, match=re.escape("l2.json, line 2 (row 1): expected a JSON object (one row), got an "
                                                  "array [1]")):
        load_rows(write(tmp_path / "l2.json", json.dumps(ROW) + "\n[1]\n"), QAC)


def test_a_folder_without_the_split_is_named(tmp_path):
    (tmp_path / "two").mkdir()
    write(tmp_path / "two" / "a.jsonl", json.dumps(ROW) + "\n")
    write(tmp_path / "two" / "b.jsonl", json.dumps(ROW) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'two'}: no file for split 'train' (looked for "
                                                  "train.jsonl/.json/.csv/.parquet and data/train-*)")):
        load_rows(tmp_path / "two", QAC)
    (tmp_path / "one" / "sub").mkdir(parents=True)
    write(tmp_path / "one" / "sub" / "rows.jsonl", json.dumps(ROW) + "\n")  # a lone data file is the split
    write(tmp_path / "one" / "notes.txt", "not data")
    assert load_rows(tmp_path / "one", QAC, split="anything").to_list() == [ROW]
    (tmp_path / "shards" / "data").mkdir(parents=True)
    for i in range(2):
        datasets.Dataset.from_list([dict(ROW, question=f"{i}?")]).to_parquet(str(tmp_path / "shards" / "data" /
                                                                                   f"train-0000{i}-of-00002.parquet"))
    assert load_rows(tmp_path / "shards", QAC)["question"] == ["0?", "1?"]  # every shard, in order
    with pytest.raises(DataError, match=re.escape("no file for split 'test'")):
        load_rows(tmp_path / "shards", QAC, split="test")


def test_a_bad_row_in_one_shard_names_that_shard(tmp_path):
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "train-1.jsonl", json.dumps(ROW) + "\n")
    write(tmp_path / "data" / "train-2.jsonl", json.dumps(ROW) + "\n" + json.dumps(dict(ROW, answer="")) + "\n")
    with pytest.raises(
        DataError,
        match=re.escape(
            "train-2.jsonl: rows do not fit question/answer/correction:\n  line 2: row 1, column 'answer': empty text"
        ),
    ):
        load_rows(tmp_path, QAC)


def test_an_uppercase_suffix_is_read_and_an_unknown_one_named(tmp_path):
    assert load_rows(write(tmp_path / "R.JSONL", json.dumps(ROW) + "\n"), QAC).to_list() == [ROW]
    with pytest.raises(
        DataError, match=re.escape("rows.tsv: unsupported file type (use .jsonl, .json, .csv, .parquet)")
    ):
        load_rows(write(tmp_path / "rows.tsv", "question\tanswer\n"), QAC)


def test_long_values_are_cut_to_40_characters_in_messages(tmp_path):
    long = "x" * 39 + "yz"
    with pytest.raises(DataError) as e:
        validate_rows([dict(ROW, answer=[long])], QAC)
    assert str(e.value).endswith(f"row 0, column 'answer': expected str, got list \"['{'x' * 38}\"")  # str(value)[:40]
    with pytest.raises(DataError) as e:
        load_rows(write(tmp_path / "s.jsonl", json.dumps(long) + "\n"), QAC)
    assert str(e.value).endswith(f'line 1 (row 0): expected a JSON object (one row), got a string "{"x" * 39}')


@pytest.mark.parametrize("layout", [["data/train.jsonl", "data/test.jsonl"], ["train-00000.jsonl", "test-00000.jsonl"],
                                    ["data/train-0.csv", "data/test-0.csv"], [".cache/x.jsonl", "only.jsonl"]])
def test_split_files_are_found_in_every_hub_layout(tmp_path, layout):
    for i, name in enumerate(layout):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        row = dict(ROW, question=f"{i}?")
        write(tmp_path / name, "question,answer,correction\n" + ",".join(row.values()) + "\n" if name.endswith(".csv")
              else json.dumps(row) + "\n")
    want = "1?" if layout[0].startswith(".cache") else "0?"  # a file under .cache (the Hub client's) is not data
    assert load_rows(tmp_path, QAC)["question"] == [want]



# Boundary cases found by mutation testing (`make mutation`): each asserts a behaviour a mutant broke.


def write_exactly(path, text):
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
        load_rows(write_exactly(tmp_path / "x.json", text), QAC)
    good = text.replace('"answer": ""', '"answer": "2"')
    assert load_rows(write_exactly(tmp_path / "y.json", good), QAC).to_list() == [ROW, other]


def test_invalid_json_is_named_by_line_and_column(tmp_path):
    path = write_exactly(tmp_path / "bad.json", '{"question": "q",\n "answer": }')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2, column 12: invalid JSON (Expecting value)")):
        load_rows(path, QAC)


@pytest.mark.parametrize("line", ["\x0c", "X", "\u2028"])  # not JSON whitespace: not a blank line either
def test_a_jsonl_line_of_non_json_whitespace_is_invalid_json(tmp_path, line):
    path = write_exactly(tmp_path / "w.jsonl", f'{{"question": "q", "answer": "a", "correction": "c"}}\n{line}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2, column 1: invalid JSON (Expecting value); "
                                                  "expected one JSON object per line")):
        load_rows(path, QAC)


def test_blank_jsonl_lines_of_json_whitespace_are_skipped(tmp_path):
    path = write_exactly(tmp_path / "b.jsonl", ' \t\r\n{"question": "2+2?", "answer": "5", "correction": "4"}\n\t\n')
    assert load_rows(path, QAC).to_list() == [ROW]


def test_the_first_csv_row_is_line_2(tmp_path):
    path = write_exactly(tmp_path / "f.csv", "question,answer,correction\nq,,c\n")
    with pytest.raises(DataError, match=re.escape("  line 2: row 0, column 'answer': empty text")):
        load_rows(path, QAC)
    path = write_exactly(tmp_path / "g.csv", 'question,answer,correction\n"q\nq",a\n')
    with pytest.raises(DataError, match=re.escape(f"{path}, line 2 (row 0): 2 cells, expected 3")):
        load_rows(path, QAC)


def test_csv_with_carriage_return_line_endings_is_read(tmp_path):
    path = write_exactly(tmp_path / "mac.csv", "question,answer,correction\r2+2?,5,4\r")
    assert load_rows(path, QAC).to_list() == [ROW]


# --- folders: split patterns, shards, the single-file fallback --------------------------------------------------------

def test_shards_of_a_split_are_concatenated_in_order(tmp_path):
    for i, q in enumerate(["a", "b"]):
        write_exactly(tmp_path / "data" / f"train-0000{i}-of-00002.jsonl",
              f'{{"question": "{q}", "answer": "x", "correction": "y"}}\n')
    assert load_rows(tmp_path, QAC)["question"] == ["a", "b"]


def test_a_folder_with_one_data_file_of_another_name_is_read(tmp_path):
    write_exactly(tmp_path / "sub" / "mine.jsonl", '{"question": "2+2?", "answer": "5", "correction": "4"}\n')
    write_exactly(tmp_path / "README.md", "# not data\n")
    write_exactly(tmp_path / ".cache" / "old.jsonl", "not json\n")  # the HF cache's files are never rows
    assert load_rows(tmp_path, QAC).to_list() == [ROW]


def test_a_folder_with_two_unrelated_data_files_is_refused(tmp_path):
    for name in ["a.jsonl", "b.jsonl"]:
        write_exactly(tmp_path / name, '{"question": "q", "answer": "a", "correction": "c"}\n')
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
