"""Private names that cross modules (issue 46, item 2): what one module of the library takes from another is public,
named and documented in its notebook, as PEFT's tuners are (about one private name per 1,000 lines).

A crossing is a `from <module> import _name` (relative or `adaptkit.`-absolute) in one module of `adaptkit/` naming a
private name (one leading underscore, not a dunder) of another module of the library; each (importing module, name)
counts once. Re-run the count: `python tests/project/test_private_imports.py [-v] [path/to/adaptkit]` (a table by
package; `-v` lists every crossing)."""
import ast
import sys
from collections import Counter
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "adaptkit"
PER_1000_LINES = 1.0  # PEFT's tuners' figure


def _modules(lib: Path = LIB) -> dict:
    "Dotted module name -> file, for every hand-read module of the library (nbdev's index left out)."
    out = {}
    for p in sorted(lib.rglob("*.py")):
        if p.name == "_modidx.py": continue
        parts = p.relative_to(lib.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    "The dotted module an `ImportFrom` in `module` reads from, or None when it is outside the library."
    if node.level == 0: return node.module if (node.module or "").split(".")[0] == LIB.name else None
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(lib: Path = LIB) -> list:
    "`(importing module, source module, name)` of every private name one module of the library takes from another."
    out = set()
    for module, path in _modules(lib).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or (source := _target(module, path.name == "__init__.py", node)) \
                    is None or source == module:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"): out.add((module, source, alias.name))
    return sorted(out)


def library_lines(lib: Path = LIB) -> int:
    return sum(len(p.read_text().splitlines()) for p in _modules(lib).values())


def test_private_names_crossing_modules_stay_under_one_per_thousand_lines():
    found, lines = private_imports(), library_lines()
    allowed = int(lines * PER_1000_LINES / 1000)
    assert len(found) <= allowed, (f"{len(found)} private names cross modules in {lines:,} lines (at most {allowed}); "
                                   "make them public (named in the notebook's docs) or join the modules:\n"
                                   + "\n".join(f"  {m} <- {s}.{n}" for m, s, n in found))



def test_pissa_takes_no_private_name_from_another_module():
    "PiSSA's artifact and trainer build on the conversion's public pieces (`write_plain_lora`, `check_init_dir`, ...)."
    assert [f for f in private_imports() if f[0].startswith(f"{LIB.name}.pissa")] == []

def test_the_count_sees_relative_and_absolute_imports(tmp_path):
    "A planted package: each style of crossing counted once, a module's own and a dunder name not at all."
    lib = tmp_path / LIB.name
    (lib / "sub").mkdir(parents=True)
    (lib / "__init__.py").write_text("from .core import _a, public\n")
    (lib / "core.py").write_text("_a = 1\npublic = 2\n__version__ = 3\n")
    (lib / "sub" / "__init__.py").write_text("")
    (lib / "sub" / "x.py").write_text(f"from ..core import _a, __version__\nfrom {LIB.name}.core import _a as b\n"
                                      "from .y import _c\n_d = 1\n")
    (lib / "sub" / "y.py").write_text("from . import x\nfrom .x import _d\n_c = 0\n")
    name = LIB.name
    assert private_imports(lib) == [(name, f"{name}.core", "_a"), (f"{name}.sub.x", f"{name}.core", "_a"),
                                    (f"{name}.sub.x", f"{name}.sub.y", "_c"), (f"{name}.sub.y", f"{name}.sub.x", "_d")]


if __name__ == "__main__":
    lib = next((Path(a).resolve() for a in sys.argv[1:] if a != "-v"), LIB)
    found, lines = private_imports(lib), library_lines(lib)
    by_package = Counter(".".join(m.split(".")[:2]) for m, _, _ in found)
    for package, n in by_package.most_common(): print(f"{n:4d}  {package}")
    print(f"{len(found)} private names cross modules in {lines:,} lines: {1000 * len(found) / lines:.1f} per 1,000 "
          f"(at most {PER_1000_LINES})")
    if "-v" in sys.argv: print("\n".join(f"  {m} <- {s}.{n}" for m, s, n in found))
