"What the project's tests share: a benchmark script imported as a module."
import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def _benchmark_module(name: str):
    "benchmarks/<name>.py as a module, its folder on `sys.path` meanwhile (a benchmark imports `_bench` from there)."
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally: sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="session")
def benchmark_module():
    "`with benchmark_module('hub_roundtrip') as m:` imports benchmarks/hub_roundtrip.py as `m`."
    return _benchmark_module
