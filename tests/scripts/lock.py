"""Write the lock files the Makefile installs from, resolving settings.ini's ranges in a throwaway venv.

    python tests/scripts/lock.py newest   # requirements-lock.txt: the newest versions settings.ini allows (`make lock`)
    python tests/scripts/lock.py oldest   # requirements-oldest.txt: the lowest it allows (`make lock-oldest`)

`newest` installs torch (the CPU build on this machine's disk) and `.[dev]` into a new venv with pip, then freezes
it: the dev/CI environment, every package pinned (uv too, a dev requirement: the Makefile installs with it).
`oldest` asks uv (the lock's version, installed into the throwaway venv) for the lowest versions of the direct
requirements (`--resolution lowest-direct`) that resolve together, torch held at the CPU build and the test tools
at their locked versions: `make test-oldest` runs the fast tests there, which is what makes settings.ini's lower
bounds true.
The olah venv (a third-party mirror used by one conformance test) gets its own frozen file. Each file is written
whole or not at all (a temporary file, then a rename)."""
import configparser
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the CPU build on local disk; a newer or unpinned torch pulls a multi-GB CUDA build
OLAH = "olah==0.5.4"


def settings() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    return cfg["DEFAULT"]


def sh(*argv, **kw) -> str:
    "Run `argv`, fail loudly with its output, return its stdout."
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    if out.returncode:
        sys.exit(f"{' '.join(map(str, argv))} failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout


def venv(folder: Path) -> Path:
    "A new venv in `folder`; its pip."
    sh(sys.executable, "-m", "venv", folder)
    return folder / "bin" / "pip"


def write(name: str, how: str, lines: list[str]):
    "Write a lock file atomically with a header saying how it was made."
    head = [f"# {name}: written by `{how}` on {datetime.date.today()} (Python {sys.version.split()[0]}); do not edit.",
            "# Refresh it on purpose, then run `make test` to prove the new set."]
    path, tmp = ROOT / name, ROOT / f".{name}.tmp"
    tmp.write_text("\n".join(head + sorted(lines, key=str.lower)) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    print(f"wrote {path} ({len(lines)} packages)")


def name(requirement: str) -> str:
    "The normalised distribution name of a requirement line."
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def locked() -> list[str]:
    "requirements-lock.txt's pins."
    return [l for l in (ROOT / "requirements-lock.txt").read_text().splitlines() if l and not l.startswith("#")]


def lock_pin(package: str) -> str:
    "requirements-lock.txt's line for `package`."
    pins = [l for l in locked() if name(l) == package]
    if not pins: sys.exit(f"requirements-lock.txt pins no {package}")
    return pins[0]


def frozen(pip: Path) -> list[str]:
    return [l for l in sh(pip, "freeze", "--exclude-editable").splitlines() if l and not l.startswith("#")]


def newest(tmp: Path):
    pip = venv(tmp / "venv")
    sh(pip, "install", "-q", TORCH)
    sh(pip, "install", "-q", "-e", f"{ROOT}[dev]")
    write("requirements-lock.txt", "make lock", frozen(pip))
    pip = venv(tmp / "olah")
    sh(pip, "install", "-q", OLAH)
    write("requirements-olah.txt", "make lock", frozen(pip))


def oldest(tmp: Path):
    pip = venv(tmp / "venv")
    sh(pip, "install", "-q", lock_pin("uv"))
    cfg = settings()
    runtime, dev = cfg["requirements"].split(), cfg["dev_requirements"].split()
    (tmp / "in.txt").write_text("\n".join(runtime + dev) + "\n")
    (tmp / "torch.txt").write_text(TORCH + "\n")
    # the lower bounds under test are the library's; test tools (pytest, nbdev, matplotlib, ...) stay as locked
    tools = {name(r) for r in dev} - {name(r) for r in runtime}
    pinned_tools = [l for l in locked() if name(l) in tools]
    (tmp / "tools.txt").write_text("\n".join(pinned_tools) + "\n")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    sh(pip.parent / "uv", "pip", "compile", "-q", "--resolution", "lowest-direct", "--python-version", py,
       "--override", tmp / "torch.txt", "--constraint", tmp / "tools.txt", "--no-header", "--no-annotate",
       tmp / "in.txt", "-o", tmp / "out.txt")
    lines = [l.strip() for l in (tmp / "out.txt").read_text().splitlines() if l.strip() and not l.startswith("#")]
    write("requirements-oldest.txt", "make lock-oldest", lines)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) == 2 else None
    if what not in ("newest", "oldest"): sys.exit(__doc__)
    with tempfile.TemporaryDirectory(prefix="adaptkit-lock-") as d: {"newest": newest, "oldest": oldest}[what](Path(d))
