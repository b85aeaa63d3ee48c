"""The project's own promises: README in step with index.ipynb, the runtime package free of dev tools, offline tests."""
import functools
import json
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_matches_index():
    render = runpy.run_path(str(ROOT / "docs" / "make_readme.py"))["render"]
    assert (ROOT / "README.md").read_text(encoding="utf-8") == render(), "README.md is stale: run `make readme`"


def test_readme_check_fails_on_drift(tmp_path):
    mod = runpy.run_path(str(ROOT / "docs" / "make_readme.py"))
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text())
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["a new paragraph"]})
    (tmp_path / "index.ipynb").write_text(json.dumps(nb))
    assert mod["render"](tmp_path / "index.ipynb") != (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_shows_every_parameter_of_the_contracts_verbs_with_its_default():
    "The README's lines for the three verbs name every parameter of `Artifact`'s (`create_pr` too), with its default."
    import inspect
    import re

    from adaptkit.artifacts import Artifact
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for owner, verb in (("artifact", "save_pretrained"), ("Cls", "from_pretrained"), ("artifact", "push_to_hub")):
        shown = re.search(rf"^{owner}\.{verb}\(([^)]*)\)", text, re.M)
        assert shown, f"the README shows no {owner}.{verb}(...) line"
        words = re.split(r"[\s,]+", shown[1].replace("*", " ").strip())
        for p in inspect.signature(getattr(Artifact, verb)).parameters.values():
            if p.name in ("self", "cls"): continue
            want = p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            assert want in words, f"README's {owner}.{verb}: {want} not shown ({shown[0]!r})"


def test_readme_has_exactly_two_setup_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [l.split("#")[0].strip() for l in text.splitlines() if l.startswith("make ")] == ["make demo", "make test"]


def test_runtime_package_needs_no_dev_tools():
    "Importing every module must not pull in nbdev or execnb (dev-only); fastcore is a runtime dependency (`@patch`)."
    code = ("import sys, importlib, pkgutil, adaptkit\n"
            "for m in pkgutil.walk_packages(adaptkit.__path__, 'adaptkit.'): importlib.import_module(m.name)\n"
            "bad = [m for m in ('nbdev', 'execnb') if m in sys.modules]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_setup_reads_settings_ini():
    out = subprocess.run(
        [sys.executable, "setup.py", "--name", "--version"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["adaptkit", __import__("adaptkit").__version__]


def test_network_is_blocked():
    with pytest.raises(OSError, match="tests stay on 127.0.0.1"):
        socket.create_connection(("8.8.8.8", 443), timeout=1)


def _modules():
    return sorted(p for p in (ROOT / "adaptkit").rglob("*.py") if p.name != "_modidx.py")


def test_every_module_is_exported_from_a_notebook():
    "Each file of the package names the notebook it is exported from, and that notebook exists (no stale module)."
    stale = []
    for p in _modules():
        head = p.read_text().split("\n# %%", 1)[0]
        src = next(
            (line.split("File to edit: ", 1)[1].rstrip(".") for line in head.splitlines() if "File to edit: " in line),
            None,
        )
        if src is None or not (p.parent / src).resolve().exists(): stale.append(f"{p.relative_to(ROOT)} (from {src})")
    assert not stale, f"modules no notebook exports (delete them): {stale}"


def test_every_module_line_is_within_120_characters():
    """Ruff checks the notebooks' cells, not the modules made from them (nbdev wraps `__all__` 10 characters wider):
    the lines no cell holds, such as the module docstring nbdev writes from a title cell, are checked here."""
    import ast
    long = []
    for p in _modules():
        text = p.read_text()
        wrapped = {i for node in ast.parse(text).body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                   for i in range(node.lineno, node.end_lineno + 1)}
        long += [f"{p.relative_to(ROOT)}:{i} ({len(line)} characters)" for i, line in enumerate(text.splitlines(), 1)
                 if len(line) > 120 and i not in wrapped]
    assert not long, long


METHODS = ("pissa", "aligner", "repnoise", "translora", "emr")
CORE = ("artifacts", "config", "data", "models", "tensorfiles", "tasks")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT / "adaptkit") -> dict[str, set[str]]:
    "{module: the adaptkit modules it imports}, at module level or inside functions, relative imports resolved."
    import ast
    modules = {_module_name(p, root): p for p in sorted(root.rglob("*.py")) if p.name != "_modidx.py"}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name.split(".")[0] == "adaptkit"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if base.split(".")[0] != "adaptkit": continue
                # `from package import submodule` imports the submodule
                graph[name] |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] -= {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    "Every import cycle found by depth-first search, each as the list of modules around it."
    found, state = [], {}
    def visit(node, stack):
        state[node] = "open"; stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open": found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state: visit(nxt, stack)
        stack.pop(); state[node] = "done"
    for node in sorted(graph):
        if node not in state: visit(node, [])
    return found


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    "Imports against the layers: a method importing another, the core importing up, the client importing the server."
    top = lambda m: m.split(".")[1] if "." in m else ""
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            s, d = top(src), top(dst)
            if s in METHODS and d in METHODS and s != d: bad.append(f"{src} -> {dst}: methods never import each other")
            if s in (*CORE, "hub") and d in (*METHODS, "cli", "demo"):
                bad.append(f"{src} -> {dst}: the core imports up")
            if s not in ("localhub", "cli", "demo") and d == "localhub":
                bad.append(f"{src} -> {dst}: the client imports the server")
            if s == "hub" and d in CORE: bad.append(f"{src} -> {dst}: the Hub client sits below the core")
    return sorted(bad)


def test_the_import_graph_has_no_cycle_and_points_down():
    graph = import_graph()
    assert {"adaptkit.emr.artifact", "adaptkit.localhub.storage", "adaptkit.hub.cards"} <= set(graph)
    assert not cycles(graph), cycles(graph)
    assert not layer_violations(graph), layer_violations(graph)


def test_the_import_graph_checks_catch_a_cycle_and_a_method_importing_another(tmp_path):
    pkg = tmp_path / "adaptkit"
    for rel, text in {
        "__init__.py": "",
        "models.py": "from .emr import x\n",
        "emr/__init__.py": "from .merge import *\n",
        "emr/merge.py": "def f():\n    from ..models import y\n    from adaptkit.pissa import z\n",
        "pissa/__init__.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True); (pkg / rel).write_text(text)
    graph = import_graph(pkg)
    assert graph["adaptkit.emr.merge"] == {"adaptkit.models", "adaptkit.pissa"}
    assert cycles(graph) == [["adaptkit.emr", "adaptkit.emr.merge", "adaptkit.models", "adaptkit.emr"]]
    assert layer_violations(graph) == ["adaptkit.emr.merge -> adaptkit.pissa: methods never import each other",
                                       "adaptkit.models -> adaptkit.emr: the core imports up"]


def test_every_public_parameter_is_documented():
    "Every parameter of every public function and class (its __init__) has a docment: API pages and --help show it."
    import importlib
    import inspect

    from fastcore.docments import docments
    missing = []
    for p in _modules():
        mod = importlib.import_module(_module_name(p, ROOT / "adaptkit"))
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
                # described by their function
                if kind is not None and kind.kind in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD): continue
                if not doc: missing.append(f"{mod.__name__}.{name}({param})")
    assert not missing, f"{len(missing)} undocumented parameters: {missing}"


def dataclasses_fields(cls):
    import dataclasses
    return dataclasses.is_dataclass(cls)


# --- every package adaptkit imports is declared in settings.ini -------------------------------------------------------

def _requirement_names(key: str) -> set[str]:
    "The normalised distribution names in settings.ini's `key`."
    import configparser
    import re
    cfg = configparser.ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    names = (re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in cfg["DEFAULT"].get(key, "").split())
    return {n.lower().replace("_", "-") for n in names}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    "(top-level module, line, imported at module level) for each absolute import in `path`."
    import ast
    tree, found = ast.parse(path.read_text(encoding="utf-8")), []
    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module.split(".")[0], child.lineno, top))
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Try))
            visit(child, top and not nested)  # inside a function or a try: imported on use, or optional
    visit(tree, True)
    return found


@functools.cache
def _providers() -> dict[str, list[str]]:
    from importlib.metadata import packages_distributions
    return packages_distributions()


def _distributions(module: str) -> set[str]:
    "The normalised names of the installed distributions providing `module` (by name when none is installed)."
    return {d.lower().replace("_", "-") for d in _providers().get(module, [module.replace("_", "-")])}


def undeclared_imports(paths, required: set[str], optional: set[str]) -> list[str]:
    "`file:line module` for each import of a package outside the stdlib that settings.ini does not declare."
    bad = []
    for p in paths:
        for module, line, top in _imports(p):
            if module in sys.stdlib_module_names or module in ("adaptkit", "__future__"): continue
            allowed = required if top else required | optional
            if not _distributions(module) & allowed: bad.append(f"{p.name}:{line} {module}")
    return bad


def test_every_imported_package_is_declared():
    "Module-level imports need `requirements`; imports on use may also be dev tools, optional backends or assets."
    extras = ("dev_requirements", "optional_requirements", "asset_requirements")
    optional = set().union(*map(_requirement_names, extras))
    paths = sorted(p for p in (ROOT / "adaptkit").rglob("*.py") if p.name != "_modidx.py")
    assert not undeclared_imports(paths, _requirement_names("requirements"), optional)


def test_an_undeclared_import_is_named(tmp_path):
    (tmp_path / "m.py").write_text("import os\nimport torch\nimport httpx2\ndef f():\n    import reasoning_gym\n")
    mod = tmp_path / "m.py"
    bad = undeclared_imports([mod], {"torch"}, {"reasoning-gym"})
    assert [b.split(" ", 1)[1] for b in bad] == ["httpx2"] and bad[0].endswith(":3 httpx2")
    assert [b.split(" ")[1] for b in undeclared_imports([mod], {"torch", "httpx2"}, set())] == ["reasoning_gym"]


# --- setup.cfg's mutation sections name functions mutmut can mutate -----------------------------------------------

def _mutatable(tree, name: str) -> bool:
    """Whether `name` (`function` or `Class.method`) is defined in `tree` as mutmut 3 mutates it: a top-level function
    without decorators, or a method of a top-level class without decorators but `staticmethod`/`classmethod`."""
    import ast
    cls, _, fn = name.rpartition(".")
    allowed = [[], ["staticmethod"], ["classmethod"]] if cls else [[]]
    body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), []) if cls else tree.body
    decorators = lambda f: [d.id if isinstance(d, ast.Name) else ast.dump(d) for d in f.decorator_list]
    return any(isinstance(n, ast.FunctionDef) and n.name == fn and decorators(n) in allowed for n in body)


def mutation_config_problems(config: Path, root: Path = ROOT) -> list[str]:
    """What `make mutation` (tests/scripts/mutation.py reading `config`) would not find: a section's missing file or
    test file, a function not defined (undecorated) in one of the section's files."""
    import ast
    read_modules = runpy.run_path(str(ROOT / "tests" / "scripts" / "mutation.py"))["read_modules"]
    problems, trees = [], {}
    for section, spec in read_modules(config).items():
        missing = [f for f in spec["files"] + spec["tests"] if not (root / f).is_file()]
        problems += [f"[mutation:{section}] {f}: no such file" for f in missing]
        if not spec["functions"]: problems.append(f"[mutation:{section}]: no functions")
        for function in spec["functions"]:
            module, _, name = function.partition(":")
            file = "adaptkit/" + module.replace(".", "/") + ".py"
            if file not in spec["files"]:
                problems.append(f"[mutation:{section}] {function}: its file {file} is not among the section's files")
            elif (root / file).is_file():
                tree = trees.get(file) or trees.setdefault(file, ast.parse((root / file).read_text(encoding="utf-8")))
                if not _mutatable(tree, name):
                    problems.append(f"[mutation:{section}] {function}: no undecorated {name} in {file}")
    return problems


def test_every_mutation_function_is_where_setup_cfg_says():
    "Each [mutation:NAME] function is defined where its module path says, in a mutated file, as mutmut mutates it."
    assert not mutation_config_problems(ROOT / "setup.cfg")


def test_a_moved_or_decorated_mutation_function_is_named(tmp_path):
    pkg = tmp_path / "adaptkit" / "emr"
    pkg.mkdir(parents=True)
    (pkg / "elect.py").write_text("def emr_elect(): pass\nclass _Sums:\n    @staticmethod\n    def add(): pass\n"
                                  "@patch\ndef fit(self): pass\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    cfg = tmp_path / "setup.cfg"
    cfg.write_text("[mutation:emr]\nfiles = adaptkit/emr/elect.py\ntests = tests/test_x.py tests/gone.py\n"
                   "functions = emr.elect:emr_elect emr.elect:_Sums.add emr.merge:emr_elect emr.elect:_elect\n"
                   "    emr.elect:fit\n")
    assert mutation_config_problems(cfg, tmp_path) == [
        "[mutation:emr] tests/gone.py: no such file",
        "[mutation:emr] emr.merge:emr_elect: its file adaptkit/emr/merge.py is not among the section's files",
        "[mutation:emr] emr.elect:_elect: no undecorated _elect in adaptkit/emr/elect.py",
        "[mutation:emr] emr.elect:fit: no undecorated fit in adaptkit/emr/elect.py",
    ]


# --- benchmarks: each records its start, and what each imports still exists (they are never run by the tests) --------

BENCHMARKS = ROOT / "benchmarks"


def _benchmarks() -> list[Path]:
    "The benchmark scripts: not their shared modules (`_bench.py`, `diagnostics/_tutorial12.py`), which time nothing."
    return sorted(p for p in BENCHMARKS.rglob("*.py") if not p.name.startswith("_"))


def test_every_benchmark_records_the_load_and_torch_threads_at_its_start(monkeypatch):
    """Each benchmark takes its start record from `_bench.quiet_start` and writes through `_bench.write_result`, or (the
    diagnostics) records the load average and torch's thread count itself; the start record holds both."""
    missing = []
    for p in _benchmarks():
        text = p.read_text(encoding="utf-8")
        through_bench = "quiet_start(" in text and "write_result(" in text
        threads = "torch_threads" in text or "threads_at_start(" in text  # _bench.threads_at_start records them
        if not through_bench and not ("load_average_at_start" in text and threads):
            missing.append(str(p.relative_to(ROOT)))
    assert not missing, f"benchmarks that record neither the load nor the threads at their start: {missing}"
    monkeypatch.setenv("ADAPTKIT_BENCH_ALLOW_LOADED", "1")
    torch = sys.modules.get("torch")  # before quiet_start, which imports adaptkit.models (and torch) for its reading
    start = runpy.run_path(str(BENCHMARKS / "_bench.py"))["quiet_start"](wait_s=0)
    assert len(start["load_average_at_start"]) == 3 and start["cpus_allowed"] >= 1
    assert start["torch_threads_at_start"] == (torch.get_num_threads() if torch else None)


def test_every_benchmark_records_the_commit_it_measured():
    """Each benchmark writes through `_bench.write_result` (the commit its start record took, or the checkout's) or
    puts `_bench.code_commit()` in what it writes itself (the diagnostics): a result says which code it measured."""
    missing = [str(p.relative_to(ROOT)) for p in _benchmarks()
               if not any(w in p.read_text(encoding="utf-8") for w in ("write_result(", "code_commit()"))]
    assert not missing, f"benchmarks whose results do not say which commit they measured: {missing}"


def benchmark_import_problems(paths) -> list[str]:
    "`file:line name` for each module or name a script imports (at any depth) that does not import: moved or gone."
    import ast
    import importlib
    problems = []
    def importable(module: str, name: str | None = None) -> bool:
        try: mod = importlib.import_module(module)
        except ImportError: return False
        if name is None or name == "*" or hasattr(mod, name): return True
        try: importlib.import_module(f"{module}.{name}"); return True
        except ImportError: return False
    for p in paths:
        try: tree = ast.parse(p.read_text(encoding="utf-8"), str(p))
        except SyntaxError as e: problems.append(f"{p.name}:{e.lineno} does not compile: {e.msg}"); continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                problems += [f"{p.name}:{node.lineno} {a.name}" for a in node.names if not importable(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                problems += [f"{p.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                             if not importable(node.module, a.name)]
    return problems


def test_every_benchmark_still_imports_what_it_uses(monkeypatch):
    "After files moved (emr.merge's pieces, repnoise.trainer): every name a benchmark imports is still there."
    for folder in (BENCHMARKS, BENCHMARKS / "diagnostics"):  # `_bench`, `_tutorial12`: each script's own folder
        monkeypatch.syspath_prepend(str(folder))
    assert not benchmark_import_problems(sorted(BENCHMARKS.rglob("*.py")))


def test_a_moved_name_in_a_benchmark_is_named(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("import json\nfrom adaptkit.emr import emr_merge\n\ndef main():\n"
                      "    from adaptkit.emr.merge import no_such_function\n    import no_such_module_here\n")
    assert benchmark_import_problems([script]) == ["bench.py:5 adaptkit.emr.merge.no_such_function",
                                                   "bench.py:6 no_such_module_here"]
    (tmp_path / "broken.py").write_text("def f(:\n")
    assert benchmark_import_problems([tmp_path / "broken.py"])[0].startswith("broken.py:1 does not compile")


# --- the Makefile: `make test` sets the venvs up side by side (uv, CPU torch only), then tests one target at a time

VENVS = {".venv": True, ".venv-olah": False, ".venv-mergekit": True}  # {venv: has torch}


def _make_n(*args) -> list[str]:
    "The commands `make -n *args` would run (recipes printed, not run; only `$(MAKE)` lines run, dry too)."
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"make -n {' '.join(args)} failed: {out.stderr[-2000:]}"
    return out.stdout.splitlines()


def test_make_test_sets_up_side_by_side_then_tests_one_target_at_a_time():
    import re
    lines = _make_n("test")
    setup = [i for i, l in enumerate(lines) if re.fullmatch(r"\S*make -j[2-9]\d* --output-sync=target setup", l)]
    tests = [i for i, l in enumerate(lines) if re.fullmatch(r"\S*make -j1 check-nbs lint nbtest pytest", l)]
    assert setup and tests and setup[0] < tests[0], f"`make test` runs no parallel setup before its tests: {lines[:5]}"


def test_setup_installs_torch_and_uv_with_pip_the_rest_with_uv_then_checks_for_cuda():
    lines = _make_n("-B", "setup")
    assert any("apt-get install" in l and "chromium-driver" in l for l in lines), "`make setup` skips Chromium"
    for venv, torch in VENVS.items():
        pip = [i for i, l in enumerate(lines) if l.startswith(f"{venv}/bin/pip ")]
        uv = [i for i, l in enumerate(lines) if l.startswith(f"{venv}/bin/uv pip install ")]
        check = [i for i, l in enumerate(lines) if l.startswith(f"{venv}/bin/python tests/scripts/cpu_only.py")]
        assert len(pip) == 1, f"{venv}: pip installs torch and uv only, uv the rest: {[lines[i] for i in pip]}"
        words = lines[pip[0]].split()  # torch (the CPU build on local disk: pip finds it, uv not) at the lock's pin
        assert words[words.index("requirements-lock.txt") + 1:] == (["torch", "uv"] if torch else ["uv"]), lines[pip[0]]
        assert uv and all(f"--python {venv}/bin/python" in lines[i] for i in uv), f"{venv}: uv must target the venv"
        # bytecode at install: under PYTHONDONTWRITEBYTECODE nothing else writes it, and each process compiles torch
        assert "--no-compile" not in words and all("--compile-bytecode" in lines[i].split() for i in uv), venv
        assert len(check) == 1 and pip[0] < min(uv) and max(uv) < check[0], f"{venv}: no CPU check after the installs"
        assert ("--torch" in lines[check[0]].split()) == torch, lines[check[0]]


def test_cpu_only_names_a_cuda_torch_and_nvidia_packages():
    problems, installed = (runpy.run_path(str(ROOT / "tests" / "scripts" / "cpu_only.py"))[k]
                           for k in ("problems", "installed"))
    assert problems({"torch": "2.13.0+cpu", "numpy": "2.3.0"}, need_torch=True) == []
    assert problems({"torch": "2.13.0", "nvidia-cublas-cu12": "12.8.4.1"}, need_torch=True) == [
        "torch 2.13.0 is not the CPU build (no +cpu)", "nvidia-cublas-cu12==12.8.4.1 is a CUDA package"]
    assert problems({}, need_torch=True) == ["torch is not installed"] and problems({}, need_torch=False) == []
    assert problems(installed(), need_torch=True) == [], "the venv running the tests has a CUDA torch"


def test_the_venv_holds_torchs_bytecode():
    "`make setup` compiles what it installs (pip and uv): else, under PYTHONDONTWRITEBYTECODE, every import compiles."
    import importlib.util
    source = importlib.util.find_spec("torch").origin
    assert Path(importlib.util.cache_from_source(source)).exists(), f"{source} has no bytecode: rebuild the venv"


def test_the_test_files_run_longest_first_as_make_pytest_keeps_them():
    """tests/conftest.py orders the files by tests/durations.json, longest first, each file whole; `make pytest` keeps
    that order (no xdist reorder). A file the table lacks counts as its median."""
    import json
    seconds = json.loads((ROOT / "tests" / "durations.json").read_text())
    short, long = "tests/core/test_data.py", "tests/project/test_docs.py"
    assert seconds[long] > seconds[short]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", short, long,
                          "tests/hub/test_client.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    files = [line.split("::")[0] for line in out.stdout.splitlines() if "::" in line]
    order = list(dict.fromkeys(files))
    assert order == sorted(order, key=lambda f: -seconds[f]) and order[0] == long, order
    assert files == sorted(files, key=order.index), "a file's tests were split apart"
    assert any("--no-loadscope-reorder" in line and "--dist loadfile" in line for line in _make_n("pytest"))
