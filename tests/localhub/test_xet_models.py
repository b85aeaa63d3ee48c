"""transformers, peft and an adaptkit artifact pushed to a LocalHub and pulled back with the stock client's default
transfer (Xet, `hf_xet` installed): the weights come back bitwise, and the request log shows that Xet carried them
both ways (a write token, xorbs and one shard per push, no LFS batch; reconstructions and xorb ranges per pull, the
weights never read from `resolve`)."""
import pytest
import torch
from huggingface_hub import HfApi, constants

from adaptkit.models import tiny_causal_lm

hf_xet = pytest.importorskip("hf_xet")
pytestmark = pytest.mark.hub(guarded=True, log=True)  # the `hub` fixture (tests/conftest.py): requires `token`, logs



@pytest.fixture(autouse=True)
def defaults_point_at_the_hub(hub, monkeypatch):
    """huggingface_hub's defaults point at `hub` (what HF_ENDPOINT does before import: transformers and peft take no
    endpoint), the module-level `HfApi` behind their pushes too, and transformers' shared `HfApi` is made again (it
    keeps the endpoint it was first made with)."""
    import huggingface_hub.hf_api
    import transformers.utils.hub
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", hub.endpoint)
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)


def _hits(hub, method, part, status=None) -> int:
    "How many logged requests were `method` with `part` in their target (and this status, if given)."
    rows = [line.split()[3:6] for line in hub.log_path.read_text().splitlines()]
    return sum(m == method and part in t and (status is None or s == str(status)) for m, t, s in rows)


def _pushed_by_xet(hub, repo, weights, pushes=1):
    "The repo's weights file is LFS with a Xet hash, and `pushes` pushes went through Xet: write token, xorbs, shard."
    (info,) = HfApi(endpoint=hub.endpoint, token=hub.token).get_paths_info(repo, [weights])
    assert info.lfs is not None and info.xet_hash is not None, info
    assert _hits(hub, "GET", f"/api/models/{repo}/xet-write-token/", 200) >= pushes
    assert _hits(hub, "POST", "/v1/xorbs/", 200) >= 1 and _hits(hub, "POST", "/v1/shards", 200) >= pushes
    assert hub.counts["lfs-batch"] == 0 and hub.counts["lfs-upload"] == 0  # not the LFS batch API


def _pulled_by_xet(hub, repo, weights):
    "The weights were read through the CAS (a reconstruction, xorb ranges), never as plain bytes from `resolve`."
    assert _hits(hub, "GET", f"/api/models/{repo}/xet-read-token/", 200) >= 1
    assert _hits(hub, "GET", "/reconstructions/", 200) >= 1 and _hits(hub, "GET", "/xorbs/", 206) >= 1
    rows = [line.split()[3:5] for line in hub.log_path.read_text().splitlines()]
    assert not [t for m, t in rows if m == "GET" and t.startswith(f"/{repo}/resolve/") and t.endswith("/" + weights)]


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa: assert torch.equal(sa[k], sb[k]), k


def test_transformers_model_push_to_hub_and_from_pretrained_through_xet(hub, tiny_tok, tmp_path, token):
    from transformers import AutoModelForCausalLM
    model = tiny_causal_lm(tiny_tok, seed=3)
    model.push_to_hub("team/tiny", token=token)
    _pushed_by_xet(hub, "team/tiny", "model.safetensors")
    pulled = AutoModelForCausalLM.from_pretrained("team/tiny", token=token, cache_dir=tmp_path / "c")
    _same_weights(pulled, model)
    _pulled_by_xet(hub, "team/tiny", "model.safetensors")


def test_peft_model_push_to_hub_and_from_pretrained_through_xet(hub, tiny_tok, tmp_path, token):
    from peft import LoraConfig, PeftModel, get_peft_model
    base = tiny_causal_lm(tiny_tok)
    base.push_to_hub("team/base", token=token)
    torch.manual_seed(1)
    lora = get_peft_model(tiny_causal_lm(tiny_tok),
                          LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.push_to_hub("team/lora", token=token)
    _pushed_by_xet(hub, "team/lora", "adapter_model.safetensors", pushes=1)
    pulled = PeftModel.from_pretrained(tiny_causal_lm(tiny_tok), "team/lora", token=token,
                                       cache_dir=str(tmp_path / "c"))
    _same_weights(pulled, lora)
    _pulled_by_xet(hub, "team/lora", "adapter_model.safetensors")
    ids = torch.tensor([[1, 5, 9, 20]])
    with torch.no_grad(): assert not torch.equal(pulled(ids).logits, base(ids).logits)  # the adapter is applied


def test_an_artifact_push_to_hub_and_from_pretrained_through_xet(hub, tiny_tok, token):
    from adaptkit import Aligner
    aligner = Aligner(tiny_causal_lm(tiny_tok, seed=4), tiny_tok, "Q: {question} A: {answer} Better:")
    aligner.base_model = "team/any-base"
    commit = aligner.push_to_hub("team/aligner", endpoint=hub.endpoint, token=token)
    _pushed_by_xet(hub, "team/aligner", "model.safetensors")
    pulled = Aligner.from_pretrained("team/aligner", endpoint=hub.endpoint, token=token, revision=commit)
    _same_weights(pulled.model, aligner.model)
    assert pulled.template == aligner.template
    _pulled_by_xet(hub, "team/aligner", "model.safetensors")
