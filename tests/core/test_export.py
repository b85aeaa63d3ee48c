"""nbdev's output within the house rules: no notebook's title cell holds a list that nbdev would read as front
matter. (adaptkit/ is exactly what plain `nbdev_export` writes; `make check-nbs` checks that.)"""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

def _front_matter_lists(nb: dict) -> list[str]:
    "The list items nbdev reads as YAML front matter: `- key: value` lines of the first markdown cell with a title."
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown": continue
        text = "".join(cell["source"])
        if not re.search(r"^#\s+(\S.*?)\s*$", text, flags=re.MULTILINE): continue
        return re.findall(r"^-\s+(\S.*:.*\S)\s*$", text, flags=re.MULTILINE)  # nbdev's frontmatter._md2dict
    return []


def test_no_method_or_hub_notebook_has_a_list_nbdev_reads_as_front_matter():
    "nbdev warns 'Failed to create YAML dict' on a title cell with `- ...: ...` lines: put such lists in another cell."
    dirs = ("pissa", "aligner", "repnoise", "translora", "emr", "hub")
    owned = [p for d in dirs for p in (ROOT / "nbs" / d).glob("*.ipynb")]
    owned += [ROOT / "nbs" / n for n in ("06_artifacts.ipynb", "07_toplevel.ipynb", "08_config.ipynb")]
    bad = {p.relative_to(ROOT).as_posix(): items for p in owned
           if (items := _front_matter_lists(json.loads(p.read_text(encoding="utf-8"))))}
    assert not bad, bad


def test_a_title_cell_with_a_colon_list_is_found():
    nb = {"cells": [{"cell_type": "markdown", "source": ["# Title\n", "\n", "> about\n", "\n", "- **A**: one thing\n"]},
                    {"cell_type": "markdown", "source": ["- later: fine\n"]}]}
    assert _front_matter_lists(nb) == ["**A**: one thing"]
