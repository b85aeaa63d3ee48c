"""adaptkit.data.load_rows on every kind of bad file (issue 14 item 1): one DataError naming file, line, row and column;
valid files with a BOM, raw U+2028/U+2029 or quoted newlines come through unchanged; a missing path asks no Hub."""
import http.server
import json
import re
import threading

import datasets
import pytest
from huggingface_hub.errors import HfHubHTTPError

from adaptkit.data import CLASSIFICATION, PROMPT_COMPLETION, QAC, DataError, load_rows, validate_rows

ROWS = [{"question": "2+2?", "answer": "5", "correction": "4"}, {"question": "1+1?", "answer": "2", "correction": "2"}]


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
    with pytest.raises(DataError, match=re.escape("missing column(s) 'question' for question/answer/correction; found "
                                                  "'Question ', 'answer', 'correction' ('Question ': names must match exactly)")):
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

@pytest.fixture
def request_log():
    "A loopback server that answers 404 to every request and logs it."
    log = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            log.append(f"{self.command} {self.path}")
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
        do_HEAD = do_POST = do_GET
        def log_message(self, *a): pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", log
    server.shutdown(); server.server_close()


@pytest.mark.parametrize("name", ["data/train.jsonl", "train.csv", "rows.json", "shard.parquet", "./data", "~/nope.jsonl"])
def test_a_missing_file_asks_no_hub(request_log, tmp_path, monkeypatch, name):
    endpoint, log = request_log
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{name!r}: no such local file or folder")):
        load_rows(name, QAC, endpoint=endpoint)
    assert log == []
    with pytest.raises(HfHubHTTPError, match=re.escape("404 Not Found' for url '" + endpoint + "/api/datasets/team/data")) as e:
        load_rows("team/data", QAC, endpoint=endpoint)  # the control: a repo id does reach the server
    assert e.value.response.status_code == 404
    assert log and log[0].startswith("GET /api/datasets/team/data")
