"""Mutation testing of adaptkit's core functions with mutmut 3; `make mutation` runs it (it is not part of `make test`).

    python tests/scripts/mutation.py [MODULE ...] [--until HH:MM] [--module-timeout S]
    # default: every [mutation:MODULE] section of setup.cfg, in order, from a clean mutants/

Each `[mutation:MODULE]` section of setup.cfg names the files to mutate, the fast pytest files that test them and the
core functions whose mutants are run (`module:function` or `module:Class.method`), with a sentence saying why those.
One module at a time, mutmut (its `[mutmut]` section in setup.cfg, patched with the module's files and tests) copies
the project into mutants/ and runs, for each mutant, the selected tests that call the mutated function.
The counts per module and every survivor (its function and mutated line) are written to tests/mutation.json; a
survivor's `why` (equivalent, harmless, or "not yet killed: needs X") is written by hand there and kept across runs
while the same function has the same mutation. A module whose clean test run fails is recorded with its error.
"""
import configparser
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG, OUTPUT, LOGS = ROOT / "setup.cfg", ROOT / "tests" / "mutation.json", ROOT / "mutants" / "logs"
UNREVIEWED = "UNREVIEWED: say why this survivor is equivalent or harmless, or 'not yet killed: needs X'"


def read_modules(path: Path = CONFIG) -> dict[str, dict]:
    "The `[mutation:NAME]` sections of `path`: {name: {files, tests, functions, why}}."
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(path, encoding="utf-8")
    modules = {}
    for section in cfg.sections():
        if not section.startswith("mutation:"): continue
        s = cfg[section]
        modules[section.partition(":")[2]] = {k: s.get(k, "").split() for k in ("files", "tests", "functions")} | {
            "why": " ".join(s.get("why", "").split()), "max_children": s.getint("max_children", 2)}
    return modules


def mutant_glob(function: str) -> str:
    "mutmut's name pattern for the mutants of `module:function` or `module:Class.method` (dotted)"
    module, _, name = function.partition(":")
    cls, _, method = name.rpartition(".")
    return f"adaptkit.{module}." + (f"x\u01c1{cls}\u01c1{method}" if cls else f"x_{name}") + "__mutmut_*"


def run_module(name: str, spec: dict, max_children: int, timeout: float | None = None) -> dict:
    "Run mutmut on one module's core functions in a fresh process (stopped after `timeout` s); its exit code, seconds."
    for f in spec["files"]:  # fresh mutants and results for this module's files
        for suffix in ("", ".meta", ".spans"): (ROOT / "mutants" / f"{f}{suffix}").unlink(missing_ok=True)
    (ROOT / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(LOGS / f"{name}.log", "w") as log:
        child = subprocess.Popen([sys.executable, __file__, "--one", name, str(max_children)], cwd=ROOT, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try: rc = child.wait(timeout)
        except subprocess.TimeoutExpired:  # stop mutmut and its workers; the mutants it did not reach stay unchecked
            os.killpg(child.pid, signal.SIGTERM); time.sleep(3); os.killpg(child.pid, signal.SIGKILL)
            rc = child.wait()
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL); raise
    return {"rc": rc, "seconds": round(time.monotonic() - start, 1)}


def _docstring_only(key: str, file: str) -> bool:
    "Whether mutant `key` changes only its function's docstring, which nothing in adaptkit reads at run time."
    import ast

    import libcst as cst
    from mutmut.mutation.diff_apply import read_functions_from_index
    functions = read_functions_from_index(key, file)
    if functions is None: return False
    def body(fn) -> tuple:
        tree = ast.parse(cst.Module([fn]).code.strip()).body[0]
        doc = ast.get_docstring(tree, clean=False)
        if doc is not None: tree.body = tree.body[1:]
        return doc, ast.dump(tree)
    (doc, rest), (mutant_doc, mutant_rest) = map(body, functions)
    return doc != mutant_doc and rest == mutant_rest


def _fastest_tests_first():
    "Hand each mutant its tests fastest first: with pytest -x, a killed mutant then stops after its cheapest failure."
    from mutmut.state import state
    from mutmut.workers import isolation
    submit = isolation.ForkRunner.submit
    def ordered(self, mutant_name, tests, cpu_time_limit, estimated_time):
        seconds = state().duration_by_test
        return submit(self, mutant_name, sorted(tests, key=lambda t: (seconds.get(t, 0.0), t)), cpu_time_limit,
                      estimated_time)
    isolation.ForkRunner.submit = ordered


def _run_one(name: str, max_children: int):
    "In the child process: patch mutmut's config with the module's files and tests, make mutants, run the core ones."
    # mutmut forks a worker per mutant from this process after it has run the tests once. torch's OpenMP thread pool
    # does not survive a fork: a worker that reaches a parallel region waits on a futex until its timeout, which made
    # PiSSA's pass ~4 s a mutant with half of them "timeouts". One thread everywhere keeps every worker fork-safe.
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    import torch
    torch.set_num_threads(1)
    torch.set_num_threads = lambda n: None  # test modules ask for 2 threads; under forked workers they keep 1
    from fnmatch import fnmatch

    import mutmut.__main__ as mm
    from mutmut.configuration import config
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
    spec = read_modules()[name]
    cfg = config()
    cfg.only_mutate, cfg.pytest_add_cli_args_test_selection = spec["files"], spec["tests"]
    set_mutant_under_test("mutant_generation")
    (ROOT / "mutants").mkdir(exist_ok=True)
    copy_src_dir(); copy_also_copy_files(); setup_source_paths()
    mm.create_mutants(max_children)  # `mutmut run` below finds them made and reuses them
    globs, run, docstrings = list(map(mutant_glob, spec["functions"])), [], []
    for file in spec["files"]:
        data = SourceFileMutationData(path=file)
        data.load()
        for key in data.exit_code_by_key:
            if any(fnmatch(key, g) for g in globs): (docstrings if _docstring_only(key, file) else run).append(key)
    (LOGS / f"{name}.docstrings.json").write_text(json.dumps(docstrings))
    print(f"{len(run)} mutants to run, {len(docstrings)} docstring-only mutants skipped", flush=True)
    if not run: raise SystemExit(f"no mutants match {globs}: check the functions of [mutation:{name}]")
    _fastest_tests_first()
    mm.cli(["run", "--max-children", str(max_children), *run])


def _changed_lines(diff: str) -> str:
    "The mutated line(s) of a unified diff: '- old' and '+ new', without the file headers."
    lines = [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("---", "+++"))]
    return " | ".join(f"{ln[0]} {ln[1:].strip()}" for ln in lines)


def collect(name: str, spec: dict, previous: dict) -> dict:
    "The counts and survivors of one module, from mutmut's .meta files; `why` kept from `previous` when unchanged."
    from fnmatch import fnmatch

    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    globs = {f: mutant_glob(f) for f in spec["functions"]}
    counts, survivors, per_function = {}, [], {}
    docstrings = LOGS / f"{name}.docstrings.json"
    docstrings = set(json.loads(docstrings.read_text())) if docstrings.exists() else set()
    for file in spec["files"]:
        meta = ROOT / "mutants" / f"{file}.meta"
        if not meta.exists(): continue
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            function = next((f for f, g in globs.items() if fnmatch(key, g)), None)
            if function is None or key in docstrings: continue
            status = status_by_exit_code[code]
            counts[status] = counts.get(status, 0) + 1
            fc = per_function.setdefault(function, {"mutants": 0, "killed": 0})
            fc["mutants"] += status != "not checked"; fc["killed"] += status in ("killed", "timeout")
            if status in ("killed", "timeout", "not checked"): continue
            mutation = _changed_lines(get_diff_for_mutant(key, path=file))
            why = previous.get((function, mutation), UNREVIEWED)
            survivors.append({"mutant": key, "function": function, "status": status, "mutation": mutation, "why": why})
    total = sum(counts.values())
    killed, checked = counts.get("killed", 0) + counts.get("timeout", 0), total - counts.get("not checked", 0)
    return {"files": spec["files"], "tests": spec["tests"], "functions": spec["functions"], "why_these": spec["why"],
            "mutants": total, "killed": counts.get("killed", 0), "timeout": counts.get("timeout", 0),
            "survived": counts.get("survived", 0), "no_tests": counts.get("no tests", 0),
            "not_checked": counts.get("not checked", 0), "docstring_mutants_skipped": len(docstrings),
            "other": {k: v for k, v in counts.items() if k not in ("killed", "timeout", "survived", "no tests",
                                                                   "not checked")},
            "kill_rate": round(killed / checked, 4) if checked else None, "per_function": per_function,
            "survivors": sorted(survivors, key=lambda s: (s["function"], int(s["mutant"].rpartition("_")[2])))}


def previous_whys(path: Path = OUTPUT) -> dict:
    "{(function, mutation): why} of the reviewed survivors in the last tests/mutation.json."
    if not path.exists(): return {}
    old = json.loads(path.read_text())
    return {(s["function"], s["mutation"]): s["why"] for m in old.get("modules", {}).values()
            for s in m.get("survivors", []) if s.get("why") and s["why"] != UNREVIEWED}


def main(names: list[str], until: str | None = None, module_timeout: float | None = None) -> int:
    modules = read_modules()
    unknown = [n for n in names if n not in modules]
    if unknown: raise SystemExit(f"no [mutation:{unknown[0]}] section in {CONFIG}; known: {', '.join(modules)}")
    names = names or list(modules)
    if names == list(modules): shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # a full pass starts clean
    old = json.loads(OUTPUT.read_text()) if OUTPUT.exists() else {}
    previous = previous_whys()
    report = {
        "tool": "mutmut " + __import__("importlib.metadata").metadata.version("mutmut"),
        "command": "make mutation  (python tests/scripts/mutation.py)",
        "kill_rate": "(killed + timeout) / checked mutants (mutants - not_checked), over the core functions listed "
        "per module; not_checked > 0 only when a module's run was stopped (see its error)",
        "docstring_mutants": "not run and not counted: they change only a docstring, and nothing in adaptkit "
        "reads __doc__ at run time (equivalent by construction)",
        "modules": old.get("modules", {}) if names != list(modules) else {},
    }
    started, load = datetime.now(timezone.utc), os.getloadavg()
    for name in names:
        if until and datetime.now(timezone.utc).strftime("%H:%M") >= until:
            print(f"== {name}: not started (--until {until} UTC)", flush=True); continue
        print(f"== {name}: {len(modules[name]['functions'])} functions, tests {' '.join(modules[name]['tests'])}",
              flush=True)
        load_1m = round(os.getloadavg()[0], 2)
        run = run_module(name, modules[name], modules[name]["max_children"], module_timeout)
        result = collect(name, modules[name], previous) | {"seconds": run["seconds"], "loadavg_1m_at_start": load_1m}
        if run["rc"] != 0: result["error"] = f"mutmut exited {run['rc']}: see mutants/logs/{name}.log"
        report["modules"][name] = result
        print(f"   {result['mutants']} mutants, {result['killed']} killed, {result['timeout']} timeout, "
              f"{result['survived']} survived, {result['no_tests']} without tests, kill rate {result['kill_rate']}, "
              f"{run['seconds']} s" + (f"  ERROR {result['error']}" if run["rc"] else ""), flush=True)
        _write(report, modules, names, started, load)  # after each module: a stopped pass keeps what it measured
    return _write(report, modules, names, started, load)


def _write(report: dict, modules: dict, names: list, started, load) -> int:
    "Write tests/mutation.json; 1 if a module of this run failed."
    report |= {"finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "last_run": {"modules": names, "started": started.isoformat(timespec="seconds"),
                            "seconds": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
                            "loadavg_at_start": [round(x, 2) for x in load], "cpus": os.cpu_count()}}
    report["modules"] = {n: report["modules"][n] for n in modules if n in report["modules"]}
    report["total_seconds"] = round(sum(m.get("seconds", 0) for m in report["modules"].values()), 1)
    OUTPUT.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    unreviewed = sum(s["why"] == UNREVIEWED for m in report["modules"].values() for s in m.get("survivors", []))
    print(f"wrote {OUTPUT.relative_to(ROOT)}; {unreviewed} survivors need a `why`")
    return 1 if any("error" in report["modules"].get(n, {}) for n in names) else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]: _run_one(sys.argv[2], int(sys.argv[3])); sys.exit()
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "modules", nargs="*", help="[mutation:NAME] sections to run (default: all, from a clean mutants/)"
    )
    parser.add_argument("--until", help="HH:MM (UTC): start no module after this time")
    parser.add_argument("--module-timeout", type=float, help="seconds after which a module's run is stopped")
    a = parser.parse_args()
    sys.exit(main(a.modules, a.until, a.module_timeout))
