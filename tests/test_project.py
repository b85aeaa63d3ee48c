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
    "Importing every module must not pull in nbdev or fastcore (dev-only dependencies)."
    code = ("import sys, importlib, pkgutil, adaptkit\n"
            "for m in pkgutil.iter_modules(adaptkit.__path__): importlib.import_module('adaptkit.' + m.name)\n"
            "bad = [m for m in ('nbdev', 'fastcore', 'execnb') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_setup_reads_settings_ini():
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["adaptkit", __import__("adaptkit").__version__]


def test_network_is_blocked():
    with pytest.raises(OSError, match="tests stay on 127.0.0.1"):
        socket.create_connection(("8.8.8.8", 443), timeout=1)
