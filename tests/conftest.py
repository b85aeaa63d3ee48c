"""Shared fixtures: an offline, telemetry-free environment with its own HF cache, and tiny models built offline."""
import ipaddress
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
from pathlib import Path

import pytest

# Read by huggingface_hub at import time, so set before any test imports it.
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# Each test process has an HF cache and an adaptkit cache of its own unless the caller set them. An xdist worker
# (`pytest -n 2`) inherits the environment of the controller, where this file ran first: the caches made there (the
# controller's pid in ADAPTKIT_TEST_CACHE_OF) are replaced, so two workers never share a cache one writes or lists.
if os.environ.get("ADAPTKIT_TEST_CACHE_OF", str(os.getpid())) != str(os.getpid()):
    for _name in os.environ.pop("ADAPTKIT_TEST_CACHE_MADE", "").split(): os.environ.pop(_name, None)
_made = [n for n in ("HF_HOME", "ADAPTKIT_CACHE") if n not in os.environ]
if "HF_HOME" not in os.environ: os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="adaptkit-test-hf-")
os.environ.setdefault("ADAPTKIT_CACHE", os.path.join(os.environ["HF_HOME"], "adaptkit"))
if _made: os.environ.update(ADAPTKIT_TEST_CACHE_OF=str(os.getpid()), ADAPTKIT_TEST_CACHE_MADE=" ".join(_made))
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# Under `pytest -n 2` (the Makefile's) two workers share the 2 cores: each computes with one torch thread, and so do the
# processes its tests start (read by torch at import); a second thread each would only make them wait on each other.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1: os.environ.setdefault("OMP_NUM_THREADS", "1")

_real_connect = socket.socket.connect


def _is_loopback(host) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    "Tests may talk to servers on this machine's loopback only: any other connection fails at once."
    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise OSError(f"test tried to reach {address[0]}: tests stay on 127.0.0.1")
        return _real_connect(sock, address)
    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture(autouse=True)
def one_torch_thread_per_worker():
    """Under `pytest -n 2` each test starts with the worker's one torch thread: a test module that sets its own count
    at import (for the serial run) sets it for the whole worker, since every worker imports every module."""
    torch = sys.modules.get("torch")
    threads = int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit() else 1
    if WORKERS > 1 and torch is not None and torch.get_num_threads() != threads: torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_tok():
    from adaptkit.models import tiny_tokenizer
    return tiny_tokenizer()


_TINY = {}  # the session's tiny model folder, once made: its path, a pristine copy and the signature of its files


def _signature(folder: Path) -> dict:
    "Every file and folder under `folder` by relative path: (size, mtime in ns); a write shows even at equal size."
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _tiny_model_dir_changes() -> list[str]:
    "What differs in the session's tiny model folder from how it was made (after a restore: nothing)."
    now, then = _signature(_TINY["folder"]), _TINY["signature"]
    return ([f"added {p}" for p in now.keys() - then.keys()] + [f"removed {p}" for p in then.keys() - now.keys()]
            + [f"rewrote {p}" for p in now.keys() & then.keys() if now[p] != then[p]])


def _restore_tiny_model_dir() -> None:
    "Put the session's tiny model folder back as it was made, in place (tests hold its path)."
    folder = _TINY["folder"]
    for p in folder.iterdir(): shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    shutil.copytree(_TINY["pristine"], folder, dirs_exist_ok=True)
    _TINY["signature"] = _signature(folder)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_tok, tmp_path_factory):
    """A folder with a tiny Llama-style model and its tokenizer, saved with save_pretrained; shared by the session, so
    read-only: a test that writes into it (a push records itself in the folder's adaptkit.json) fails, naming itself
    (`tiny_model_dir_unchanged`). Write into `tiny_model_copy` instead."""
    from adaptkit.models import tiny_causal_lm
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_causal_lm(tiny_tok).save_pretrained(folder)
    tiny_tok.save_pretrained(folder)
    pristine = tmp_path_factory.mktemp("tiny-llama-pristine")
    shutil.copytree(folder, pristine, dirs_exist_ok=True)  # copy2: sizes and mtimes as in `folder`
    _TINY.update(folder=folder, pristine=pristine, signature=_signature(folder))
    yield folder
    if (changes := _tiny_model_dir_changes()):  # a module or session fixture's teardown wrote into it
        raise AssertionError(f"the session fixture tiny_model_dir was changed by a fixture's teardown after its last "
                             f"test ({', '.join(sorted(changes))}): write into a private copy (tiny_model_copy)")


@pytest.fixture(autouse=True)
def tiny_model_dir_unchanged(request):
    """After each test: when it changed the session's `tiny_model_dir`, the folder is put back (later tests read it as
    made) and the test fails at teardown, named, with what it changed. A stat of 7 files per test."""
    yield
    if not _TINY or not (changes := _tiny_model_dir_changes()): return
    _restore_tiny_model_dir()
    pytest.fail(f"{request.node.nodeid} changed the session fixture tiny_model_dir ({', '.join(sorted(changes))}), "
                "which every later test reads as made: it is put back; write or push a private copy instead "
                "(the tiny_model_copy fixture)", pytrace=False)


def _tiny_finetunes(root: Path, n: int, num_layers: int = 1, tokenizer: bool = False):
    import torch

    from adaptkit.models import tiny_causal_lm, tiny_tokenizer
    base = tiny_causal_lm(num_layers=num_layers)
    base.save_pretrained(root / "base")
    if tokenizer: tiny_tokenizer().save_pretrained(root / "base")
    for i in range(n):
        g = torch.Generator().manual_seed(i + 1)
        m = tiny_causal_lm(num_layers=num_layers)
        m.load_state_dict({k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in base.state_dict().items()})
        m.save_pretrained(root / f"ft{i}")
    return base


@pytest.fixture(scope="session")
def tiny_finetunes():
    """`tiny_finetunes(root, n, num_layers=1, tokenizer=False)`: a tiny Llama base saved to `root / "base"` (with the
    tiny tokenizer when asked) and `n` fine-tuned copies, every weight perturbed (seeds 1..n), to `root / "ft0"`, ...;
    returns the base model. What a merge test merges."""
    return _tiny_finetunes


@pytest.fixture
def tiny_model_copy(tiny_model_dir, tmp_path):
    "A private copy of `tiny_model_dir` for a test that writes into its model folder (a push records itself there)."
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "tiny-model-copy"))


TOKEN = "hf_adaptkit_test_token_0123"  # the tests' one Hub token (a guarded LocalHub's; never a real one)


@pytest.fixture
def trainer_stamp():
    "What a trainer records for a base (`ArtifactTrainerMixin._load_base`): `(base_model, base_revision, base_path)`."
    from adaptkit.artifacts import ArtifactTrainerMixin
    def stamp(base, endpoint=None, base_model=None, base_revision=None) -> tuple:
        trainer = ArtifactTrainerMixin()
        trainer._load_base(base, base_model, base_revision, endpoint)
        return trainer.base_model, trainer.base_revision, trainer.base_path
    return stamp


# Seconds each test file took on one pytest worker (setup, call and teardown summed; `make test-durations` rewrites it)
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser):
    parser.addoption("--write-durations", action="store_true",
                     help=f"after a run that passed, write each test file's seconds to {DURATIONS}")


def pytest_collection_modifyitems(config, items):
    """The test files longest first (`DURATIONS`; a file it lacks counts as its median), each file's tests in their own
    order. Under the Makefile's `-n 2 --dist loadfile --no-loadscope-reorder` a worker takes a whole file and the next
    in this order when it is free, so the two end close together; xdist's own order (most tests first) left the 103 s
    docs test to run alone at the end, on one worker of two, for 87 s (2026-12-02)."""
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    default = statistics.median(seconds.values()) if seconds else 0.0
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], default))  # stable: files stay whole


_SECONDS = {}  # in the controller: each test file's seconds so far (`--write-durations`)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _SECONDS[path] = _SECONDS.get(path, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    if session.config.getoption("--write-durations") and exitstatus == 0 and not hasattr(session.config, "workerinput"):
        DURATIONS.write_text(json.dumps({f: round(s, 1) for f, s in sorted(_SECONDS.items())}, indent=1) + "\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "hub(guarded=False, repos=None, log=False): how the `hub` fixture starts for a "
                                       "module (`pytestmark`) or a test: guarded by `token`; holding {repo_id: {path: "
                                       "bytes}}; logging its requests to `hub.log_path`")


@pytest.fixture
def token():
    "The tests' one Hub token (`TOKEN`): what a guarded `hub` requires, and a LocalHub a test starts itself."
    return TOKEN


@pytest.fixture
def hub(tmp_path, request, token):
    """A LocalHub on loopback with its data in the test's temp folder (`tmp_path / "hub"`), open unless the test's
    module (or the test) is marked `pytest.mark.hub(guarded=True)`: then guarded by `token` (read it as `hub.token`).
    The mark's `repos={"team/r": {"a.txt": b"hello"}}` are created (public) with their files before the test;
    `log=True`: it logs one line per request to `hub.log_path` (`tmp_path / "requests.log"`)."""
    from adaptkit.localhub.server import LocalHub
    mark = request.node.get_closest_marker("hub")
    settings = mark.kwargs if mark else {}
    log = tmp_path / "requests.log" if settings.get("log") else None
    with LocalHub(tmp_path / "hub", token=token if settings.get("guarded") else None, log=log) as h:
        h.log_path = log
        if settings.get("repos"):
            from huggingface_hub import HfApi
            api = HfApi(endpoint=h.endpoint, token=h.token)
            for repo_id, files in settings["repos"].items():
                api.create_repo(repo_id)
                for path, data in files.items():
                    api.upload_file(path_or_fileobj=data, path_in_repo=path, repo_id=repo_id)
        yield h


@pytest.fixture
def request_log():
    "A loopback server answering 404 to every request, logging each request line: (its URL, the log)."
    import http.server
    import threading
    log = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            log.append(f"{self.command} {self.path}")
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
        do_HEAD = do_POST = do_GET
        def log_message(self, *a): pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", log
    server.shutdown(); server.server_close()


@pytest.fixture
def no_model_load(monkeypatch):
    "Loading any transformers model fails the test: rows must be refused before (the trainers' input checks)."
    import transformers
    def loaded(*args, **kwargs): raise AssertionError("a model was loaded before the rows were checked")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(loaded))
