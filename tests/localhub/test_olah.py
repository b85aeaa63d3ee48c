"""Conformance: olah (PyPI), a third-party Hub mirror, proxying LocalHub must hand the stock client the same bytes.

olah's dependencies clash with ours, so it lives in its own venv: `python3 -m venv .venv-olah && .venv-olah/bin/pip
install olah==0.5.4`. Without it this module is skipped."""
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

from adaptkit.localhub.server import LocalHub
from adaptkit.localhub.storage import GITATTRIBUTES

OLAH = Path(__file__).resolve().parents[2] / ".venv-olah" / "bin" / "olah-cli"
pytestmark = pytest.mark.skipif(
    not OLAH.exists(),
    reason=f"olah is not installed at {OLAH} (python3 -m venv .venv-olah && .venv-olah/bin/pip install olah==0.5.4)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def olah(tmp_path, monkeypatch):
    "A LocalHub with a model and a dataset repo, and olah in proxy mode in front of it: (hub, olah endpoint)."
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    with LocalHub(tmp_path / "hub") as hub:
        port, upstream = _free_port(), f"127.0.0.1:{hub.port}"
        cmd = [str(OLAH), "--host", "127.0.0.1", "--port", str(port), "--hf-scheme", "http", "--hf-netloc", upstream,
               "--hf-lfs-netloc", upstream, "--mirror-scheme", "http", "--mirror-netloc", f"127.0.0.1:{port}",
               "--mirror-lfs-netloc", f"127.0.0.1:{port}", "--repos-path", str(tmp_path / "olah-repos")]
        # olah may only reach LocalHub: anything else goes to a proxy that does not exist
        env = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
               "ALL_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost"}
        log = open(tmp_path / "olah.log", "w")
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close(); break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"olah did not start:\n{(tmp_path / 'olah.log').read_text()[-3000:]}")
                    time.sleep(0.1)
            yield hub, f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try: proc.wait(10)
            except subprocess.TimeoutExpired: proc.kill(); proc.wait()
            log.close()


def test_olah_proxies_localhub_byte_for_byte(olah, tmp_path):
    hub, mirror = olah
    art = tmp_path / "art"
    (art / "sub").mkdir(parents=True)
    (art / "model.safetensors").write_bytes(os.urandom(11 << 20))
    (art / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (art / "sub" / "notes.txt").write_text("nested\n")
    api = HfApi(endpoint=hub.endpoint, token="any")
    api.create_repo("team/art")
    commit = api.upload_folder(folder_path=art, repo_id="team/art").oid
    api.create_repo("team/data", repo_type="dataset")
    api.upload_file(path_or_fileobj=b'{"q": 1}\n', path_in_repo="train.jsonl", repo_id="team/data", repo_type="dataset")

    served_before = hub.counts["resolve"]
    snap = Path(snapshot_download("team/art", endpoint=mirror, cache_dir=tmp_path / "c1"))
    want = {p.relative_to(art).as_posix(): p.read_bytes() for p in art.rglob("*") if p.is_file()}
    want[".gitattributes"] = GITATTRIBUTES.encode()  # every repo starts with the Hub's initial commit
    got = {p.relative_to(snap).as_posix(): p.read_bytes() for p in snap.rglob("*") if p.is_file()}
    assert got == want and snap.name == commit
    assert hub.counts["resolve"] > served_before  # the bytes really came from LocalHub, through olah
    one = hf_hub_download("team/art", "model.safetensors", revision=commit, endpoint=mirror, cache_dir=tmp_path / "c2")
    assert Path(one).read_bytes() == want["model.safetensors"]
    ds = snapshot_download("team/data", repo_type="dataset", endpoint=mirror, cache_dir=tmp_path / "c3")
    assert (Path(ds) / "train.jsonl").read_bytes() == b'{"q": 1}\n'
