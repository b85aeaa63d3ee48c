"""Push and pull of a 256 MiB folder through a LocalHub (inline upload at the client's default settings, and the LFS
path with Xet disabled) against a plain file copy of the same bytes, in the same run.
Writes benchmarks/results/hub.json. Run: .venv/bin/python benchmarks/hub_roundtrip.py"""
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
from huggingface_hub import constants  # noqa: E402

from adaptkit.hub import pull, push_folder  # noqa: E402
from adaptkit.localhub import LocalHub  # noqa: E402

MIB, FILES, REPEATS = 1 << 20, 4, 3
OUT = Path(__file__).parent / "results" / "hub.json"


def make_folder(root: Path) -> Path:
    "256 MiB: four 64 MiB random weight shards plus a small config."
    folder = root / "artifact"
    folder.mkdir()
    for i in range(FILES):
        (folder / f"model-{i:05d}-of-{FILES:05d}.safetensors").write_bytes(os.urandom(64 * MIB))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def same_bytes(a: Path, b: Path) -> bool:
    "The pulled weights and config equal the pushed ones (push_folder also records the commit in a's adaptkit.json)."
    return all((a / f.name).read_bytes() == (b / f.name).read_bytes() for f in a.iterdir() if f.suffix == ".safetensors" or f.name == "config.json")


def run_mode(folder: Path, root: Path, lfs: bool) -> dict:
    "Medians of push and pull through a fresh LocalHub in one mode."
    pushes, pulls, ok = [], [], True
    constants.HF_HUB_DISABLE_XET = lfs  # the LFS path is what clients with Xet disabled use
    with LocalHub(root / f"hub-lfs{lfs}", lfs=lfs) as hub:
        for i in range(REPEATS):
            repo = f"bench/artifact-{i}"
            pushes.append(timed(lambda: push_folder(folder, repo, endpoint=hub.endpoint)))
            got = {}
            pulls.append(timed(lambda: got.setdefault("p", pull(repo, endpoint=hub.endpoint, allow_patterns=["*.safetensors", "config.json"]))))
            ok &= same_bytes(folder, got["p"])
    constants.HF_HUB_DISABLE_XET = False
    return {"push_s": pushes, "pull_s": pulls, "push_median_s": statistics.median(pushes), "pull_median_s": statistics.median(pulls),
            "identical_bytes": ok}


def main():
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        os.environ["HF_HOME"] = str(root / "hf")
        constants.HF_HUB_CACHE = str(root / "hf" / "hub")
        folder = make_folder(root)
        size = sum(f.stat().st_size for f in folder.iterdir())
        copies = [timed(lambda i=i: shutil.copytree(folder, root / f"copy-{i}")) for i in range(REPEATS)]
        copy_s = statistics.median(copies)
        result = {"bytes": size, "repeats": REPEATS, "machine": platform.processor() or platform.machine(),
                  "copy_s": copies, "copy_median_s": copy_s, "copy_mib_per_s": size / MIB / copy_s, "modes": {}}
        for name, lfs in [("inline (client defaults, Xet on)", False), ("lfs (Xet disabled)", True)]:
            m = run_mode(folder, root, lfs)
            m.update(push_mib_per_s=size / MIB / m["push_median_s"], pull_mib_per_s=size / MIB / m["pull_median_s"],
                     push_vs_copy=m["push_median_s"] / copy_s, pull_vs_copy=m["pull_median_s"] / copy_s)
            result["modes"][name] = m
            print(f"{name}: push {m['push_mib_per_s']:.0f} MiB/s ({m['push_vs_copy']:.1f}x copy), "
                  f"pull {m['pull_mib_per_s']:.0f} MiB/s ({m['pull_vs_copy']:.1f}x copy), identical: {m['identical_bytes']}")
        print(f"plain copy: {result['copy_mib_per_s']:.0f} MiB/s")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
