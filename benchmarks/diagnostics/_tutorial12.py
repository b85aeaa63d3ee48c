"""Tutorial 12's setup cells (imports and settings, the data, the disjoint splits), run into one namespace, for the
RepNoise pilots that chose its design: they measure on exactly the tutorial's data and splits."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "nbs/tutorials/12_repro_repnoise.ipynb"
SETUP_CELLS = ("f32d0a21", "15b25ad0", "6208c588")  # imports/settings, data, splits (cell ids, stable under edits)


def tutorial_setup() -> dict:
    "The namespace tutorial 12's setup cells leave (`S` the splits, `tok`, `TRAIN_REFUSALS`, `defence`, `folder`, ...)."
    cells = {c.get("id"): c for c in json.loads(TUTORIAL.read_text())["cells"]}
    missing = [i for i in SETUP_CELLS if i not in cells]
    if missing: raise KeyError(f"{TUTORIAL}: no cell with id {missing}: update SETUP_CELLS in {__file__}")
    namespace = {}
    for i in SETUP_CELLS: exec("".join(cells[i]["source"]).replace("#| slow", ""), namespace)
    return namespace
