"""The project's own promises: README in step with index.ipynb, the runtime package free of dev tools, offline tests."""
import json
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_matches_index():
    render = runpy.run_path(str(ROOT / "docs" / "make_readme.py"))["render"]
    assert (ROOT / "README.md").read_text(encoding="utf-8") == render(), "README.md is stale: run `make readme`"


def test_readme_check_fails_on_drift(tmp_path):
    mod = runpy.run_path(str(ROOT / "docs" / "make_readme.py"))
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text())
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["a new paragraph"]})
    (tmp_path / "index.ipynb").write_text(json.dumps(nb))
    assert mod["render"](tmp_path / "index.ipynb") != (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_has_exactly_two_setup_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [l.split("#")[0].strip() for l in text.splitlines() if l.startswith("make ")] == ["make demo", "make test"]


def test_runtime_package_needs_no_dev_tools():
    "Importing every module must not pull in nbdev or execnb (dev-only); fastcore is a runtime dependency (`@patch`)."
    code = ("import sys, importlib, pkgutil, adaptkit\n"
            "for m in pkgutil.iter_modules(adaptkit.__path__): importlib.import_module('adaptkit.' + m.name)\n"
            "bad = [m for m in ('nbdev', 'execnb') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_setup_reads_settings_ini():
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["adaptkit", __import__("adaptkit").__version__]


def test_network_is_blocked():
    with pytest.raises(OSError, match="tests stay on 127.0.0.1"):
        socket.create_connection(("8.8.8.8", 443), timeout=1)


def _modules():
    return sorted(p for p in (ROOT / "adaptkit").glob("*.py") if p.name != "_modidx.py")


def test_no_module_over_500_lines_no_function_over_50():
    "The design's size limits (with a little slack: ~500 and ~50), checked on the exported code."
    import ast
    big = [f"{p.name}: {n} lines" for p in _modules() if (n := len(p.read_text().splitlines())) > 520]
    long = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 55:
                long.append(f"{p.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not big and not long, big + long


def test_every_public_parameter_is_documented():
    "Every parameter of every public function and class (its __init__) has a docment, so API pages and --help explain it."
    import importlib, inspect
    from fastcore.docments import docments
    missing = []
    for p in _modules():
        mod = importlib.import_module(f"adaptkit.{p.stem}")
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if not callable(obj) or getattr(obj, "__module__", None) != mod.__name__: continue
            if inspect.isclass(obj):
                if "__init__" not in vars(obj) or dataclasses_fields(obj): continue
                target = obj.__init__
            else: target = obj
            try: docs = docments(target, full=False)
            except (TypeError, OSError): continue
            for param, doc in docs.items():
                if param in ("return", "self", "cls") or param.startswith("_"): continue
                kind = inspect.signature(target).parameters.get(param)
                if kind is not None and kind.kind in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD): continue  # described by their function
                if not doc: missing.append(f"{p.stem}.{name}({param})")
    assert not missing, f"{len(missing)} undocumented parameters: {missing}"


def dataclasses_fields(cls):
    import dataclasses
    return dataclasses.is_dataclass(cls)
