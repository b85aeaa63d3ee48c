"""The session's shared fixtures guard themselves (issue 38): a test that writes into `tiny_model_dir` (a push
records itself in the folder's adaptkit.json) fails at its teardown, named; the folder is put back for later tests."""
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).parents[1] / "conftest.py"

INNER = '''
import json

import pytest


def test_reads(tiny_model_dir):
    assert (tiny_model_dir / "config.json").is_file()


def test_writes_a_record(tiny_model_dir):
    (tiny_model_dir / "adaptkit.json").write_text(json.dumps({"hub": {"repo_id": "team/tiny", "commit": "c" * 40}}))


def test_after_it_the_folder_is_as_made(tiny_model_dir):
    assert not (tiny_model_dir / "adaptkit.json").exists()
    assert json.loads((tiny_model_dir / "config.json").read_text())["model_type"] == "llama"


def test_rewrites_a_file_with_the_same_size(tiny_model_dir):
    (tiny_model_dir / "config.json").write_bytes((tiny_model_dir / "config.json").read_bytes())


def test_a_private_copy_may_be_written(tiny_model_copy, tiny_model_dir):
    (tiny_model_copy / "adaptkit.json").write_text("{}")
    assert tiny_model_copy != tiny_model_dir and not (tiny_model_dir / "adaptkit.json").exists()
'''


def test_a_test_that_writes_into_tiny_model_dir_fails_named_and_the_folder_is_put_back(pytester):
    "The project's conftest, run on a few tests in process (importlib mode: its module is not the running conftest)."
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib")
    result.assert_outcomes(passed=5, errors=2)
    out = result.stdout.str()
    assert ("test_inner.py::test_writes_a_record changed the session fixture tiny_model_dir (added adaptkit.json), "
            "which every later test reads as made: it is put back") in out, out
    assert ("test_inner.py::test_rewrites_a_file_with_the_same_size changed the session fixture tiny_model_dir "
            "(rewrote config.json)") in out, out
    assert "ERROR at teardown of test_writes_a_record" in out and "ERROR at teardown of test_reads" not in out
