"""Functions a reader holds in mind (issue 46, item 3): no function in the library is longer than 60 lines, counted
from its `def` line to its last line, inclusive (decorators not counted; a nested function and a method count on
their own, and inside the function that holds them). A longer one is split by phase into named steps, as TRL's
`_prepare_dataset` is, not packed under the limit. ruff's pylint rules (PLR0913, PLR0915, PLR0912 in pyproject.toml)
guard its arguments, statements and branches.

Re-measure: `python tests/project/test_function_length.py [path/to/adaptkit] [-n N]` (the N longest, default 10)."""
import ast
import sys
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "adaptkit"
MAX_LINES = 60


def function_lengths(lib: Path = LIB) -> list:
    "`(lines, file, qualified name)` of every function and method in the library, longest first."
    out = []
    def visit(node, path: Path, prefix: str):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((child.end_lineno - child.lineno + 1, path, name))
                name += "."
            visit(child, path, name)
    for p in sorted(lib.rglob("*.py")):
        if p.name != "_modidx.py": visit(ast.parse(p.read_text()), p, "")
    return sorted(out, key=lambda r: (-r[0], str(r[1]), r[2]))


def _where(lines: int, path: Path, name: str, lib: Path = LIB) -> str:
    return f"{path.relative_to(lib.parent)}:{name}:{lines}"


def test_no_function_in_the_library_is_longer_than_60_lines():
    long = [_where(*r) for r in function_lengths() if r[0] > MAX_LINES]
    assert not long, (f"longer than {MAX_LINES} lines, {len(long)} (file:function:lines); split each by phase into "
                      "named steps:\n" + "\n".join(f"  {w}" for w in long))


def test_the_measure_counts_from_def_to_the_last_line(tmp_path):
    "A planted package: decorators left out, methods and nested functions named by their path, blank lines counted."
    lib = tmp_path / LIB.name
    (lib / "sub").mkdir(parents=True)
    (lib / "_modidx.py").write_text("def ignored():\n" + "    x = 1\n" * 80)
    (lib / "a.py").write_text("@decorator\n@another\ndef short():\n    return 1\n\n\n"
                              "def outer():\n    def inner():\n\n        return 2\n    return inner\n")
    (lib / "sub" / "b.py").write_text("class C:\n    async def method(self):\n" + "        x = 1\n" * 59
                                      + "\n    class D:\n        def deep(self): pass\n")
    found = [_where(*r, lib=lib) for r in function_lengths(lib)]
    name = LIB.name
    assert found == [f"{name}/sub/b.py:C.method:60", f"{name}/a.py:outer:5", f"{name}/a.py:outer.inner:3",
                     f"{name}/a.py:short:2", f"{name}/sub/b.py:C.D.deep:1"]
    (lib / "sub" / "b.py").write_text("class C:\n    async def method(self):\n" + "        x = 1\n" * 60)
    assert [r[0] for r in function_lengths(lib) if r[0] > MAX_LINES] == [61]  # one line more is over the limit


if __name__ == "__main__":
    args = sys.argv[1:]
    top = int(args[args.index("-n") + 1]) if "-n" in args else 10
    lib = next((Path(a).resolve() for a in args if a != "-n" and not a.isdigit()), LIB)
    found = function_lengths(lib)
    for r in found[:top]: print(f"{r[0]:4d}  {_where(*r, lib=lib)}")
    over = sum(r[0] > MAX_LINES for r in found)
    print(f"{len(found):,} functions; the longest {found[0][0]} lines; {over} over {MAX_LINES}")
