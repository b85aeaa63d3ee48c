"""Whole models an artifact writes (`ModelArtifact`: an aligner, an immunised model, a policy after DPO) are sharded
when large, with transformers' names and format, the shards in the record's checksums; a tiny model and a tiny
`max_shard_size` stand in for a 7B model and "5GB"."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from adaptkit.artifacts import ModelArtifact
from adaptkit.hub import read_metadata
from adaptkit.models import tiny_causal_lm


def sharded(artifact, folder, max_shard_size):
    "Save `artifact` in shards of at most `max_shard_size`; the shard file names, checked against the index."
    artifact.save_pretrained(folder, max_shard_size=max_shard_size)
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    n = len(shards)
    assert n >= 2 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], shards
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards) and not (folder / "model.safetensors").exists()
    files = read_metadata(folder)["files"]
    assert {*shards, "model.safetensors.index.json", "config.json"} <= set(files)  # every shard checksummed
    return shards


class Model(ModelArtifact):
    kind = "test-model"


def test_a_model_artifact_is_written_in_shards_that_transformers_and_from_pretrained_read(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    largest = max(t.nbytes for t in model.state_dict().values())
    shards = sharded(Model(model, tiny_tok), tmp_path / "m", max_shard_size=largest)
    assert len(shards) > 3
    ids = tiny_tok(["2 + 2 ="], return_tensors="pt")
    want = model(**ids).logits
    assert torch.allclose(Model.from_pretrained(tmp_path / "m").model(**ids).logits, want, atol=1e-6)
    assert torch.allclose(AutoModelForCausalLM.from_pretrained(tmp_path / "m")(**ids).logits, want, atol=1e-6)
    assert Model(model, tiny_tok).max_shard_size == "5GB"  # the default: one file for a small model
    Model(model, tiny_tok).save_pretrained(tmp_path / "one")
    assert (tmp_path / "one" / "model.safetensors").is_file() and not list((tmp_path / "one").glob("model-*"))


def test_a_tampered_shard_is_refused_naming_the_file(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    shards = sharded(Model(model, tiny_tok), tmp_path / "m", max_shard_size=max(t.nbytes for t in model.parameters()))
    path = tmp_path / "m" / shards[1]
    data = bytearray(path.read_bytes()); data[-1] ^= 0xFF; path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{shards[1]}: sha256 .* differs"):
        Model.from_pretrained(tmp_path / "m")


def test_a_shard_size_below_the_largest_tensor_writes_what_save_pretrained_writes(tiny_tok, tmp_path):
    """Below the largest tensor (issue 48): each tensor over the limit in a shard of its own, the files and index of
    transformers' `save_pretrained` at that size; "1KiB", which transformers' own parser refuses, is 1,024 bytes."""
    model = tiny_causal_lm(tiny_tok)
    big = max(t.nbytes for t in model.state_dict().values())
    for size, limit in [(big - 1, big - 1), ("1KiB", 1024)]:
        shards = sharded(Model(model, tiny_tok), tmp_path / "m", max_shard_size=size)
        model.save_pretrained(tmp_path / "stock", max_shard_size=limit)
        assert shards == sorted(p.name for p in (tmp_path / "stock").glob("model-*.safetensors"))
        index = "model.safetensors.index.json"
        assert (tmp_path / "m" / index).read_text() == (tmp_path / "stock" / index).read_text()
    with pytest.raises(ValueError, match="IB"):  # what the artifact spares its user
        model.save_pretrained(tmp_path / "refused", max_shard_size="1KiB")


def test_an_invalid_shard_size_is_refused_before_writing(tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    for size in ("big", "-1GB", 0):
        with pytest.raises(ValueError, match=f"max_shard_size {size!r} is invalid"):
            Model(model, tiny_tok).save_pretrained(tmp_path / "m", max_shard_size=size)
    assert not list(tmp_path.iterdir())  # no folder, no temporary folder


def test_push_to_hub_uploads_the_shards_at_the_artifacts_max_shard_size(hub, tiny_tok, tmp_path):
    model = tiny_causal_lm(tiny_tok)
    art = Model(model, tiny_tok)
    art.max_shard_size = max(t.nbytes for t in model.parameters())  # the class attribute, for every save and push
    commit = art.push_to_hub("me/sharded", endpoint=hub.endpoint)
    pulled = Model.from_pretrained("me/sharded", endpoint=hub.endpoint, revision=commit)
    assert all(torch.equal(a, b) for a, b in zip(pulled.model.state_dict().values(), model.state_dict().values()))
    assert any(f.startswith("model-00001-of-") for f in read_metadata(pulled_folder(hub, commit))["files"])


def pulled_folder(hub, commit):
    from adaptkit.hub import pull
    return pull("me/sharded", endpoint=hub.endpoint, revision=commit)
