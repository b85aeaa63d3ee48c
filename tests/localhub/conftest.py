"""What every LocalHub test shares: no telemetry, a Hub cache and an hf_xet cache of the test's own (so no download is
served from another test's files), and a hub and a client that use the test module's `TOKEN` when it has one."""
import pytest
from huggingface_hub import HfApi, constants

from adaptkit.localhub.server import LocalHub


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))  # hf_xet's cache and logs: the test's own


@pytest.fixture
def hub(tmp_path, request):
    "A LocalHub in the test's temp folder, guarded by the module's `TOKEN` (none if the module has no TOKEN)."
    with LocalHub(tmp_path / "hub", token=getattr(request.module, "TOKEN", None)) as h:
        yield h


@pytest.fixture
def api(hub, request):
    "The stock client on `hub`, with the module's `TOKEN`."
    return HfApi(endpoint=hub.endpoint, token=getattr(request.module, "TOKEN", None))
