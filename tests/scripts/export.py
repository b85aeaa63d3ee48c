"""`nbdev_export`, then nbdev's `__all__` lines wrapped within 120 characters: `python tests/scripts/export.py`.

nbdev wraps the names of `__all__` at 120 characters and then writes `__all__ = ` (10 more) before the first line, so
a module with many public names gets a line of up to 130. This step re-wraps each generated `__all__` block with the
prefix counted (same names, same order, one per line as nbdev's wrap puts them), in place; `make check-nbs` runs it
after the export, so the check and a manual run agree."""
import ast
import re
import subprocess
import sys
from pathlib import Path
from textwrap import TextWrapper

WIDTH = 120
_ALL = re.compile(r"^(# %% auto #0\n)__all__ = (\[.*?\])$", re.MULTILINE | re.DOTALL)


def wrap_all(text: str, width: int = WIDTH) -> str:
    "`text` (a module nbdev wrote) with its generated `__all__` block wrapped within `width` characters."
    def rewrap(m):
        names = ast.literal_eval(m.group(2))
        tw = TextWrapper(width=width, initial_indent="__all__ = ", subsequent_indent=" " * 11, break_long_words=False)
        return m.group(1) + "\n".join(tw.wrap(str(names)))
    return _ALL.sub(rewrap, text, count=1)


def wrap_package(root: Path) -> list[Path]:
    "Re-wrap the `__all__` of every module under `root`; the files changed."
    changed = []
    for p in sorted(root.rglob("*.py")):
        text = p.read_text(encoding="utf-8")
        if (new := wrap_all(text)) != text: p.write_text(new, encoding="utf-8"); changed.append(p)
    return changed


if __name__ == "__main__":
    subprocess.run([str(Path(sys.executable).parent / "nbdev_export"), *sys.argv[1:]], check=True)
    from nbdev.config import get_config
    wrap_package(Path(get_config().lib_path))
