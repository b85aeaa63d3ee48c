"""benchmarks/_bench.py's record of the code a result measured: the commit, whether adaptkit/ or benchmarks/ differed
from it (the results earlier runs wrote aside), taken as the benchmark starts and checked again as it writes; and of
the machine: the share of its CPU the hypervisor took while the benchmark ran."""
import importlib
import json
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    "benchmarks/_bench.py as a module (a benchmark imports it from its own folder)."
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("_bench")


def _git(root, *args) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    "A committed tree shaped like the project's: adaptkit/, benchmarks/ and benchmarks/results/."
    for path, text in (("adaptkit/core.py", "x = 1\n"), ("benchmarks/speed.py", "pass\n"),
                       ("benchmarks/results/speed.json", "{}\n"), ("README.md", "adaptkit\n")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "tree")
    return tmp_path


def test_a_clean_checkout_records_its_head(bench, checkout):
    assert bench.code_commit(checkout) == {"commit": _git(checkout, "rev-parse", "HEAD"),
                                           "uncommitted_changes": False, "uncommitted_paths": []}


def test_results_written_since_the_commit_leave_the_code_unchanged(bench, checkout):
    "One benchmark after another: the first one's new result must not mark the second's code changed."
    (checkout / "benchmarks/results/speed.json").write_text('{"seconds": 1}\n')
    (checkout / "benchmarks/results/other.json").write_text("{}\n")
    (checkout / "README.md").write_text("changed, but not code a benchmark runs\n")
    assert bench.code_commit(checkout)["uncommitted_changes"] is False


def test_a_changed_or_new_file_under_the_code_is_named(bench, checkout):
    (checkout / "adaptkit/core.py").write_text("x = 2\n")
    (checkout / "benchmarks/new_bench.py").write_text("pass\n")
    record = bench.code_commit(checkout)
    assert record["uncommitted_changes"] is True
    assert sorted(record["uncommitted_paths"]) == ["adaptkit/core.py", "benchmarks/new_bench.py"]


def test_without_git_the_commit_comes_from_the_environment(bench, tmp_path, monkeypatch):
    "A copy of the tree (a lent GPU machine) has no .git: ADAPTKIT_COMMIT names the commit, the rest is unknown."
    monkeypatch.setenv("ADAPTKIT_COMMIT", "0123abc")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path either
    assert bench.code_commit(tmp_path) == {"commit": "0123abc", "uncommitted_changes": None,
                                           "uncommitted_paths": None}


def test_the_start_record_holds_the_commit_and_the_result_keeps_it(bench, monkeypatch):
    monkeypatch.setenv("ADAPTKIT_BENCH_ALLOW_LOADED", "1")
    start = bench.quiet_start(wait_s=0)
    assert start["commit"] == bench.code_commit()["commit"]
    at_start = {"commit": "a" * 40, "uncommitted_changes": False, "uncommitted_paths": []}
    monkeypatch.setattr(bench, "code_commit", lambda: dict(at_start))
    assert bench.commit_record(dict(at_start)) == at_start  # unchanged while it ran: the start's, nothing else


def test_code_changed_while_a_benchmark_ran_is_recorded_beside_the_start(bench, monkeypatch):
    at_start = {"commit": "a" * 40, "uncommitted_changes": False, "uncommitted_paths": []}
    at_end = {"commit": "b" * 40, "uncommitted_changes": True, "uncommitted_paths": ["adaptkit/core.py"]}
    monkeypatch.setattr(bench, "code_commit", lambda: dict(at_end))
    assert bench.commit_record({**at_start, "loaded": False}) == {**at_start, "code_at_end": at_end}
    assert bench.commit_record({"loaded": False}) == at_end  # a start record without one (none taken): the end's


def test_the_result_records_the_hypervisors_share_of_the_cpu_since_the_start(bench, tmp_path, monkeypatch):
    "quiet_start reads /proc/stat's CPU times, write_result the steal share since then; the raw reading is not written."
    import adaptkit.models
    monkeypatch.setenv("ADAPTKIT_BENCH_ALLOW_LOADED", "1")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(adaptkit.models, "cpu_times", lambda: {"total": 100.0, "steal": 1.0})
    start = bench.quiet_start(wait_s=0)
    assert start["cpu_times_at_start"] == {"total": 100.0, "steal": 1.0}
    monkeypatch.setattr(adaptkit.models, "cpu_times", lambda: {"total": 300.0, "steal": 31.0})  # 30 s of 200 stolen
    record = json.loads(bench.write_result("steal", {"seconds": 1.0}, start).read_text())
    assert record["cpu_steal_share"] == 0.15 and record["seconds"] == 1.0 and "cpu_times_at_start" not in record
    assert record["load_average_at_start"] == start["load_average_at_start"]
    # a start record a benchmark built itself, without the reading: the share is unknown, not 0
    assert json.loads(bench.write_result("steal", {}, {"loaded": False}).read_text())["cpu_steal_share"] is None
