"""Render README.md from nbs/index.ipynb without Quarto: markdown cells verbatim, code cells and their text outputs
as fenced blocks, cells flagged `#| hide` left out. `--check` exits 1 when README.md is not what index.ipynb renders."""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = "<!-- Generated from nbs/index.ipynb by `make readme`: edit the notebook, not this file. -->\n\n"
_directive = re.compile(r"^\s*#\s*\|\s*(.*)$")


def _text(src):
    return "".join(src) if isinstance(src, list) else src


def _split_directives(source):
    "The cell's nbdev directives (`#| hide`, `#| echo: false`...) and its remaining lines."
    lines, directives = source.splitlines(), []
    while lines and _directive.match(lines[0]):
        directives.append(_directive.match(lines.pop(0)).group(1).strip())
    return directives, "\n".join(lines).strip("\n")


def _outputs(cell):
    for out in cell.get("outputs", []):
        text = out.get("text") if out.get("output_type") == "stream" else out.get("data", {}).get("text/plain")
        if text and out.get("name") != "stderr":
            yield _text(text).rstrip("\n")


def render(nb_path=ROOT / "nbs" / "index.ipynb"):
    "The README text that `nb_path` renders to."
    parts = []
    for cell in json.loads(Path(nb_path).read_text(encoding="utf-8"))["cells"]:
        directives, body = _split_directives(_text(cell["source"]))
        if "hide" in directives or not body.strip():
            continue
        if cell["cell_type"] == "markdown":
            parts.append(body)
        elif cell["cell_type"] == "code":
            if "echo: false" not in directives:
                parts.append(f"```python\n{body}\n```")
            parts += [f"```\n{o}\n```" for o in _outputs(cell)]
    return HEADER + "\n\n".join(parts) + "\n"


def main(argv=sys.argv[1:]):
    readme, text = ROOT / "README.md", render()
    if "--check" in argv:
        if not readme.exists() or readme.read_text(encoding="utf-8") != text:
            print("README.md is not what nbs/index.ipynb renders: run `make readme`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(text, encoding="utf-8")
    print(f"wrote {readme.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
