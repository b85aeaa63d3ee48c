"""Every input check of data, hub, LocalHub (store, wire, HTTP), tasks, artifacts and cli, fed the input it refuses:
each test asserts the error type and the file, row, column, repo or field the message names."""
import base64
import hashlib
import http.client
import json
import logging
import os
import re
import socket

import datasets
import pytest
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HfHubHTTPError

from adaptkit.data import (CLASSIFICATION, PREFERENCE, QAC, DataError, Schema, load_rows, validate_rows)
from adaptkit.hub import pull, push_folder, write_folder
from adaptkit.localhub import LocalHub, read_token_file

TOKEN = "hf_guards_token_0123"
ROW = {"question": "2+2?", "answer": "5", "correction": "4"}
DEAD = "http://127.0.0.1:9"  # a closed port: a request would fail with a connection error, not the errors asserted


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# --- data: row checks ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, message", [
    ([], "rows: no rows (question/answer/correction expected)"),
    ([ROW, ["q", "a", "c"]], "rows, row 1: expected a row of named columns (a dict), got list \"['q', 'a', 'c']\""),
    ([ROW, "q,a,c"], "rows, row 1: expected a row of named columns (a dict), got str 'q,a,c'"),
    ([{"question": "q", "answer": "a"}], "rows: missing column(s) 'correction' for question/answer/correction; "
                                         "found 'question', 'answer'"),
    ([{"Answer": "a", "question": "q", "correction": "c"}], "missing column(s) 'answer' for question/answer/correction; "
                                                            "found 'Answer', 'question', 'correction' ('Answer': names "
                                                            "must match exactly)"),
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
    with pytest.raises(DataError, match=re.escape("f.csv: rows do not fit question/answer/correction:\n  line 9: row 1, "
                                                  "column 'answer': empty text")):
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
    with pytest.raises(DataError, match=re.escape("split 'train': rows do not fit question/answer/correction:\n  row 0, "
                                                  "column 'question': empty text")):
        load_rows(bad, QAC)


def test_load_rows_validates_lists_and_tuples_then_makes_one_table():
    assert load_rows((ROW,), QAC).to_list() == [ROW]
    with pytest.raises(DataError, match=re.escape("rows: rows do not fit question/answer/correction:\n  row 0, column "
                                                  "'question': empty text")):
        load_rows([dict(ROW, question="")], QAC)
    rows = [dict(ROW, meta=[{"a": 1}]), dict(ROW, meta=[[1, 2]])]  # both lists, but Arrow cannot type them as one column
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
    with pytest.raises(DataError, match=re.escape("train-2.jsonl: rows do not fit question/answer/correction:\n  line 2: "
                                                  "row 1, column 'answer': empty text")):
        load_rows(tmp_path, QAC)


def test_an_uppercase_suffix_is_read_and_an_unknown_one_named(tmp_path):
    assert load_rows(write(tmp_path / "R.JSONL", json.dumps(ROW) + "\n"), QAC).to_list() == [ROW]
    with pytest.raises(DataError, match=re.escape("rows.tsv: unsupported file type (use .jsonl, .json, .csv, .parquet)")):
        load_rows(write(tmp_path / "rows.tsv", "question\tanswer\n"), QAC)


# --- hub: names, paths, folders ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a b", "a--b", "-x", "x.git", "a..b"])
def test_a_name_that_is_neither_path_nor_repo_id_asks_no_hub(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{name!r} is neither an existing local path nor a Hub repo id "
                                                          "('namespace/name' or 'name')")):
        pull(name, endpoint=DEAD)


def test_push_refuses_a_repo_id_without_namespace_and_a_blank_branch(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    for repo_id in ["gpt2", "a/b/c", "", "team/x y"]:
        with pytest.raises(ValueError, match=re.escape(f"{repo_id!r} is not a Hub repo id of the form 'namespace/name'")):
            push_folder(tmp_path, repo_id, endpoint=DEAD)
    for revision in ["", "  ", "0123456789abcdef0123456789abcdef01234567"]:
        with pytest.raises(ValueError, match=re.escape(f"revision={revision!r}: push to a branch name")):
            push_folder(tmp_path, "team/x", endpoint=DEAD, revision=revision)


@pytest.mark.parametrize("text, message", [
    ("{not json", "adaptkit.json: not valid JSON (Expecting property name"),
    ("[1, 2]", "adaptkit.json: expected a JSON object"),
])
def test_push_refuses_a_broken_adaptkit_json_before_any_request(tmp_path, text, message):
    art = tmp_path / "art"
    art.mkdir()
    (art / "w.txt").write_text("w")
    (art / "adaptkit.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        push_folder(art, "team/x", endpoint=DEAD)
    (art / "adaptkit.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=re.escape("adaptkit.json: not valid JSON")):
        push_folder(art, "team/x", endpoint=DEAD)


def test_write_folder_refuses_a_folder_or_file_it_did_not_write(tmp_path):
    def fill(folder):
        (folder / "adaptkit.json").write_text("{}")
        (folder / "w.txt").write_text("new")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match=re.escape(f"{theirs} exists and was not written by adaptkit (no "
                                                        "adaptkit.json): not replacing it")):
        write_folder(theirs, fill)
    assert (theirs / "thesis.tex").read_text() == "years of work" and not list(tmp_path.glob(".theirs.*"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match=re.escape(f"{tmp_path / 'afile'} exists and was not written by adaptkit")):
        write_folder(tmp_path / "afile", fill)
    with pytest.raises(FileExistsError, match=re.escape("(no weights.bin)")):
        write_folder(theirs, fill, marker="weights.bin")
    (tmp_path / "empty").mkdir()
    assert (write_folder(tmp_path / "empty", fill) / "w.txt").read_text() == "new"  # an empty folder may be filled
    (tmp_path / "empty" / "w.txt").write_text("old")
    assert (write_folder(tmp_path / "empty", fill) / "w.txt").read_text() == "new"  # ours: replaced


def test_write_folder_keeps_the_old_folder_when_writing_fails(tmp_path):
    out = tmp_path / "out"
    write_folder(out, lambda f: (f / "adaptkit.json").write_text('{"v": 1}'))
    def broken(folder):
        (folder / "adaptkit.json").write_text('{"v": 2}')
        raise RuntimeError("killed half way")
    with pytest.raises(RuntimeError, match="killed half way"):
        write_folder(out, broken)
    assert (out / "adaptkit.json").read_text() == '{"v": 1}' and not list(tmp_path.glob(".out.*"))


def test_write_folder_restores_what_a_killed_save_moved_aside(tmp_path):
    "A save killed between moving the old folder aside and moving the new one in: the next save puts the old one back."
    out = tmp_path / "out"
    aside = tmp_path / ".out.old-999999999-x"  # no such process: a dead save's folder
    aside.mkdir()
    (aside / "adaptkit.json").write_text('{"v": 1}')
    half = tmp_path / ".out.tmp-999999999-y"
    half.mkdir()
    seen = []
    write_folder(out, lambda f: seen.append((out / "adaptkit.json").read_text()) or (f / "adaptkit.json").write_text("{}"))
    assert seen == ['{"v": 1}'] and not aside.exists() and not half.exists()
    live = tmp_path / f".out.tmp-{os.getpid()}-z"  # this process: a save in progress, left alone
    live.mkdir()
    write_folder(out, lambda f: (f / "adaptkit.json").write_text("{}"))
    assert live.is_dir()


# --- LocalHub: token file, store, wire and HTTP checks ------------------------------------------------------------

@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture
def hub(tmp_path, hf_cache):
    with LocalHub(tmp_path / "hub", token=TOKEN) as h:
        HfApi(endpoint=h.endpoint, token=TOKEN).create_repo("team/g")
        yield h


def test_an_empty_token_file_is_named(tmp_path, caplog):
    for text in ["", "\n\n", "   \n"]:
        path = write(tmp_path / "token", text)
        os.chmod(path, 0o600)
        with pytest.raises(ValueError, match=re.escape(f"the token file {path} is empty")):
            read_token_file(path)
    os.chmod(write(tmp_path / "ok", "  hf_abc  \nsecond line\n"), 0o600)
    with caplog.at_level(logging.WARNING, logger="adaptkit.localhub"):
        assert read_token_file(tmp_path / "ok") == "hf_abc"
    assert "can be read by other users" not in caplog.text
    os.chmod(tmp_path / "ok", 0o644)
    with caplog.at_level(logging.WARNING, logger="adaptkit.localhub"):
        assert read_token_file(tmp_path / "ok") == "hf_abc"
    assert f"the token file {tmp_path / 'ok'} can be read by other users: chmod 600" in caplog.text


def _raw(hub, method, path, body=b"", headers=None):
    "A raw request with the token: (status, JSON or bytes body)."
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {TOKEN}",
                                                   "Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try: return r.status, json.loads(data)
    except ValueError: return r.status, data


def _commit(hub, lines, rev="main", **query):
    body = b"".join(json.dumps(x).encode() + b"\n" for x in [{"key": "header", "value": {"summary": "s"}}, *lines])
    q = "".join(f"?{k}={v}" for k, v in query.items())
    return _raw(hub, "POST", f"/api/models/team/g/commit/{rev}{q}", body, {"Content-Type": "application/x-ndjson"})


def _files(hub):
    return HfApi(endpoint=hub.endpoint, token=TOKEN).list_repo_files("team/g")


@pytest.mark.parametrize("method, path, status, message", [
    ("GET", "/no/such/route/here", 404, "LocalHub does not serve GET /no/such/route/here"),
    ("PUT", "/api/repos/create", 405, "PUT is not allowed here (use POST)"),
    ("GET", "/api/models/team/g/commit/main", 405, "GET is not allowed here (use POST)"),
    ("PUT", "/api/models/team/g/branch/b", 405, "PUT is not allowed here (use DELETE or POST)"),
    ("DELETE", "/api/repos/move", 405, "DELETE is not allowed here (use POST)"),
])
def test_unknown_routes_and_methods_are_named(hub, method, path, status, message):
    got, body = _raw(hub, method, path)
    assert (got, body["error"]) == (status, message)


def test_a_bad_content_length_is_400(hub):
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
    sock.sendall(b"POST /api/repos/create HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: ten\r\n\r\n{}")
    answer = sock.recv(65536).decode(errors="replace")
    sock.close()
    assert answer.startswith("HTTP/1.1 400") and "the request has a bad Content-Length header" in answer


def test_a_bad_chunk_size_closes_the_connection_and_commits_nothing(hub):
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
    sock.sendall(b"POST /api/models/team/g/commit/main HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                 + TOKEN.encode() + b"\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    answer = sock.recv(65536)
    sock.close()
    assert b"200 OK" not in answer and _files(hub) == [".gitattributes"]


def test_paths_info_checks_its_paths(hub):
    status, body = _raw(hub, "POST", "/api/models/team/g/paths-info/main", json.dumps({"paths": ["a", 1]}).encode())
    assert (status, body["error"]) == (400, "field 'paths' must be a list of strings")
    status, body = _raw(hub, "POST", "/api/models/team/g/paths-info/main", b"paths=\xff\xfe",
                        {"Content-Type": "application/x-www-form-urlencoded"})
    assert (status, body["error"]) == (400, "the form body is not UTF-8")
    status, body = _raw(hub, "POST", "/api/models/team/g/paths-info/main", b"paths=.gitattributes",
                        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and [e["path"] for e in body] == [".gitattributes"]


def test_preupload_refuses_a_sample_that_is_not_base64(hub):
    files = {"files": [{"path": "a.bin", "size": 3, "sample": "not base64!"}]}
    status, body = _raw(hub, "POST", "/api/models/team/g/preupload/main", json.dumps(files).encode())
    assert (status, body["error"]) == (400, "field 'sample' of files[0] of the request body is not base64")


def test_commit_refuses_pull_requests_missing_branches_and_unknown_operations(hub):
    file_line = {"key": "file", "value": {"path": "a.txt", "content": base64.b64encode(b"a").decode()}}
    status, body = _commit(hub, [file_line], create_pr="1")
    assert (status, body["error"]) == (400, "LocalHub does not support pull requests (create_pr)")
    status, body = _commit(hub, [file_line], rev="nobranch")
    assert (status, body["error"]) == (404, "Invalid rev id: nobranch is not a branch of team/g")
    status, body = _commit(hub, [{"key": "renamedFile", "value": {"path": "a.txt"}}])
    assert (status, body["error"]) == (400, "commit line 2: unknown operation 'renamedFile' in field 'key'")
    assert _files(hub) == [".gitattributes"]
    assert _commit(hub, [file_line])[0] == 200 and _files(hub) == [".gitattributes", "a.txt"]  # the control


def test_commit_refuses_lfs_objects_that_are_missing_or_of_another_size(tmp_path, hf_cache):
    with LocalHub(tmp_path / "hub", token=TOKEN, lfs=True) as hub:
        HfApi(endpoint=hub.endpoint, token=TOKEN).create_repo("team/g")
        data = b"\0lfs\0" * 100
        oid = hashlib.sha256(data).hexdigest()
        line = {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": oid, "size": len(data)}}
        status, body = _commit(hub, [line])
        assert (status, body["error"]) == (400, f"LFS object {oid} for w.bin was not uploaded (use the LFS batch API "
                                                "first)")
        verify = json.dumps({"oid": oid, "size": len(data)}).encode()
        status, body = _raw(hub, "POST", "/team/g.git/info/lfs/verify", verify)
        assert (status, body["error"]) == (404, f"LFS object {oid} with {len(data)} bytes is not stored")
        status, body = _raw(hub, "PUT", f"/team/g.git/info/lfs/objects/{oid}", data)
        assert (status, body["error"]) == (400, "LFS upload URL without size/sig: ask the batch API for one")
        batch = json.dumps({"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]}).encode()
        href = _raw(hub, "POST", "/team/g.git/info/lfs/objects/batch", batch)[1]["objects"][0]["actions"]["upload"]["href"]
        assert _raw(hub, "PUT", href.split(str(hub.port), 1)[1], data)[0] == 200
        status, body = _commit(hub, [{**line, "value": {**line["value"], "size": len(data) + 1}}])
        assert (status, body["error"]) == (400, f"LFS object {oid} has {len(data)} bytes, not {len(data) + 1}")
        assert _files(hub) == [".gitattributes"]
        assert _commit(hub, [line])[0] == 200 and "w.bin" in _files(hub)  # the control


def test_streamed_inline_content_that_is_cut_or_truncated_is_refused(hub):
    "A line over the 1 MiB line limit streams its base64 `content`: a body ending inside it, or bad padding, is 400."
    content = base64.b64encode(b"x" * (900 << 10)).decode()  # about 1.2 MB of base64
    head = json.dumps({"key": "header", "value": {"summary": "s"}}).encode() + b"\n"
    line = b'{"key": "file", "value": {"path": "big.txt", "content": "' + content.encode()
    ndjson = {"Content-Type": "application/x-ndjson"}
    status, body = _raw(hub, "POST", "/api/models/team/g/commit/main", head + line, ndjson)
    assert (status, body["error"]) == (400, "commit line 2 ends inside field 'content'")
    status, body = _raw(hub, "POST", "/api/models/team/g/commit/main", head + line + b'QQ"}}\n', ndjson)
    assert (status, body["error"]) == (400, "commit line 2: field 'content' is not valid base64 (Incorrect padding)")
    assert _files(hub) == [".gitattributes"] and not list((hub.root / "blobs" / "tmp").iterdir())
    assert _raw(hub, "POST", "/api/models/team/g/commit/main", head + line + b'"}}\n', ndjson)[0] == 200


@pytest.mark.parametrize("name", ["refs/heads/x", "a.lock", "trailing/", "0123456789abcdef0123456789abcdef01234567",
                                  "two..dots", "sp ace"])
def test_invalid_branch_names_are_refused(hub, name):
    with pytest.raises(HfHubHTTPError, match=re.escape("Invalid branch or tag name")) as e:
        HfApi(endpoint=hub.endpoint, token=TOKEN).create_branch("team/g", branch=name)
    assert e.value.response.status_code == 400


def test_a_blob_missing_from_the_store_is_a_500_naming_it(hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    api.upload_file(path_or_fileobj=b"kept", path_in_repo="k.txt", repo_id="team/g")
    sha = hashlib.sha256(b"kept").hexdigest()
    hub.server.store.blobs.path(sha).unlink()
    status, body = _raw(hub, "GET", "/team/g/resolve/main/k.txt")
    assert status == 500 and body["error"] == f"blob {sha} is missing from the LocalHub store at {hub.root / 'blobs'}"


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
    from adaptkit.artifacts import _load_base_for, render_card
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
