"""What every LocalHub test shares: no telemetry and no progress bars, a Hub cache and an hf_xet cache of the test's own
(so no download is served from another test's files), a client for the `hub` fixture (tests/conftest.py) with the hub's
token when it is guarded, raw requests (`raw`) and random bytes (`random_bytes`)."""
import urllib.error
import urllib.request

import numpy as np
import pytest
from huggingface_hub import HfApi, constants


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))  # hf_xet's cache and logs: the test's own
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _raw_request(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple:
    "(status, headers, body) of one request sent with the standard library: no client-side checks, errors answered."
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r: return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e: return e.code, e.headers, e.read()


@pytest.fixture
def raw():
    "One raw request: `raw(method, url, body=None, headers=None)` -> (status, headers, body bytes)."
    return _raw_request


@pytest.fixture
def random_bytes():
    "`random_bytes(n, seed=0)`: n bytes drawn from a seeded generator (the same bytes for the same seed)."
    return lambda n, seed=0: np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture
def api(hub):
    "The stock client on `hub`, with the hub's token (None for an open hub)."
    return HfApi(endpoint=hub.endpoint, token=hub.token)
