"""One statement per line (issue 46, item 5): the library joins statements with `;` at most once per 1,000 lines
(fastcore's own code: 0.7), so a reader finds each step of a function on a line of its own.

A join is a `;` operator token as Python's `tokenize` reads the file, so a `;` inside a string, an f-string or a
comment is not one. Re-run the count: `python tests/project/test_statement_joins.py [path/to/adaptkit]` (every join
as file:line, then the total)."""
import io
import sys
import tokenize
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "adaptkit"
PER_1000_LINES = 1.0  # at most one join per 1,000 lines of the library


def _files(lib: Path = LIB) -> list[Path]:
    "Every hand-read module of the library (nbdev's generated index left out)."
    return [p for p in sorted(lib.rglob("*.py")) if p.name != "_modidx.py"]


def statement_joins(lib: Path = LIB) -> list[str]:
    "`file:line` of every `;` that joins two statements in the library (one entry per `;`)."
    out = []
    for p in _files(lib):
        name = p.relative_to(lib.parent)
        tokens = tokenize.generate_tokens(io.StringIO(p.read_text()).readline)
        out += [f"{name}:{t.start[0]}" for t in tokens if t.type == tokenize.OP and t.string == ";"]
    return out


def library_lines(lib: Path = LIB) -> int:
    return sum(len(p.read_text().splitlines()) for p in _files(lib))


def test_statement_joins_stay_under_one_per_thousand_lines():
    found, lines = statement_joins(), library_lines()
    allowed = int(lines * PER_1000_LINES / 1000)
    assert len(found) <= allowed, (f"{len(found)} ';' joins in {lines:,} lines (at most {allowed}): put each "
                                   "statement on a line of its own (in the notebook, then nbdev_export):\n  "
                                   + "\n  ".join(found))


def test_the_count_sees_joins_and_not_semicolons_in_strings_or_comments(tmp_path):
    lib = tmp_path / "adaptkit"
    (lib / "sub").mkdir(parents=True)
    (lib / "a.py").write_text('x = 1; y = 2\ns = "a; b"\nf = f"{x}; {y}"\n# c; d\ndef g(): x = 1; return x\n')
    (lib / "sub" / "b.py").write_text("import os; import sys\n'''one;\ntwo;'''\n")
    (lib / "_modidx.py").write_text("d = 1; e = 2\n")  # nbdev's index: generated, not read
    assert statement_joins(lib) == ["adaptkit/a.py:1", "adaptkit/a.py:5", "adaptkit/sub/b.py:1"]
    assert library_lines(lib) == 8


if __name__ == "__main__":
    lib = Path(sys.argv[1]) if len(sys.argv) > 1 else LIB
    joins = statement_joins(lib)
    print("\n".join(joins))
    print(f"{len(joins)} joins in {library_lines(lib):,} lines")
