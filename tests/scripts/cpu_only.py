"""Fail loudly unless this Python's torch is the CPU build and no CUDA package (nvidia-*) is installed.

    .venv/bin/python tests/scripts/cpu_only.py --torch   # the Makefile, after a venv's install: torch must be there
    .venv-olah/bin/python tests/scripts/cpu_only.py      # a venv without torch: no nvidia-* package either

pip installs torch from the CPU build on local disk; uv, which installs the rest from PyPI, would take a CUDA build
(gigabytes of nvidia-* wheels) there if a pin or a flag let it replace that one. This check makes that an error
naming the packages, not a slow setup and tests that still pass. It reads the installed metadata (the version
`torch.__version__` reports) rather than importing torch, which takes seconds."""
import sys
from importlib import metadata


def problems(installed: dict[str, str], need_torch: bool) -> list[str]:
    "What is wrong with `installed` ({normalised name: version}) for a CPU-only venv."
    torch = installed.get("torch")
    bad = [f"torch {torch} is not the CPU build (no +cpu)"] if torch and "+cpu" not in torch else []
    if need_torch and torch is None: bad.append("torch is not installed")
    return bad + [f"{n}=={v} is a CUDA package" for n, v in sorted(installed.items()) if n.startswith("nvidia-")]


def installed() -> dict[str, str]:
    "{normalised distribution name: version} of this Python's environment."
    return {d.metadata["Name"].lower().replace("_", "-").replace(".", "-"): d.version for d in metadata.distributions()}


if __name__ == "__main__":
    bad = problems(installed(), need_torch="--torch" in sys.argv[1:])
    if bad: sys.exit(f"{sys.prefix} is not CPU-only: " + "; ".join(bad) + ". Rebuild it: make clean-venv && make setup")
