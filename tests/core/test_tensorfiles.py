"""adaptkit.tensorfiles: the one shard-size parser every writer of shards asks (merges, model artifacts, trainers'
`save_max_shard_size`), and the one plan of shards, cut as transformers' `save_pretrained` cuts them: a tensor larger
than the limit gets a shard of its own."""
import re

import pytest
import torch
from huggingface_hub import split_torch_state_dict_into_shards

from adaptkit.tensorfiles import DTYPE_NAMES, ShardWriter, shard_split, size_in_bytes


@pytest.mark.parametrize("size, want", [
    ("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2KB", 2000), ("2GiB", 2 * 2**30), ("2gib", 2 * 2**30),
    ("3MiB", 3 * 2**20), ("3KiB", 3 * 2**10), ("8Gb", 10**9), ("8Mb", 10**6), ("8kb", 1000), (" 3MB", 3 * 10**6),
    (32768, 32768), ("32768", 32768)])  # digits alone: bytes, as `--max_shard_size 32768` gives them
def test_shard_sizes_in_bytes_by_transformers_rule(size, want):
    "Binary units are bytes whatever the case of their b; only the decimal units written with a lowercase b are bits."
    assert size_in_bytes(size) == want


def test_a_binary_unit_is_never_read_as_bits():
    "'2GiB' is 2·2³⁰ bytes however it is written; only a decimal unit with a lowercase b ('2Gb') counts bits."
    assert size_in_bytes("2GiB") == size_in_bytes("2Gib") == size_in_bytes("2gib") == 2 * 2**30
    assert size_in_bytes("2Gb") == 2 * 10**9 // 8 and size_in_bytes("2GB") == 2 * 10**9


@pytest.mark.parametrize("size", ["-1GB", "-5GB", "0", "0GB", "", "abc", "5 gigs", "3TB", "3.5GB", "+3MB", "1_000MB",
                                  "MB", -5, 0, True, 3.0, None])
def test_an_invalid_shard_size_is_refused_as_invalid(size):
    with pytest.raises(ValueError, match=rf"max_shard_size {re.escape(repr(size))} is invalid: expected a positive "
                                         r"number of bytes"):
        size_in_bytes(size)


def specs_of(sd: dict) -> dict:
    return {k: (DTYPE_NAMES[v.dtype], tuple(v.shape)) for k, v in sd.items()}


@pytest.mark.parametrize("limit", [1, 100, 2048, 4096, 4097, 6000, 10_000, "4KB", "4KiB", 10**9])
def test_shards_are_cut_as_huggingface_hub_cuts_a_state_dict_for_save_pretrained(limit):
    """The same file names, tensors in each file and total size as `split_torch_state_dict_into_shards` (what
    transformers' `save_pretrained` calls) for the same state dict and limit: below every tensor, below the largest
    (a shard of its own), between, above the total (one `model.safetensors`)."""
    g = torch.Generator().manual_seed(0)
    sd = {"embed": torch.randn(128, 8, generator=g), "a.weight": torch.randn(8, 8, generator=g),
          "a.bias": torch.zeros(8, dtype=torch.bfloat16), "big": torch.randn(40, 32, generator=g),
          "ids": torch.arange(5), "b.weight": torch.randn(30, 8, generator=g)}
    want = split_torch_state_dict_into_shards(sd, filename_pattern="model{suffix}.safetensors",
                                              max_shard_size=size_in_bytes(limit))
    got = shard_split(specs_of(sd), limit)
    assert (got.filename_to_tensors, got.tensor_to_filename, got.metadata, got.is_sharded) == (
        want.filename_to_tensors, want.tensor_to_filename, want.metadata, want.is_sharded)


def test_the_writer_writes_the_files_and_index_save_pretrained_writes(tmp_path):
    """A model's state dict written by `ShardWriter` below its largest tensor: transformers' file names, each file's
    tensors, and its index byte for byte (`total_parameters`, `total_size`, the map, keys sorted)."""
    from adaptkit.models import tiny_causal_lm, tiny_tokenizer
    model = tiny_causal_lm(tiny_tokenizer(), num_layers=1)
    sd, limit = model.state_dict(), 20_000  # the embeddings and the head, 65,536 bytes each: a shard each
    assert max(t.nbytes for t in sd.values()) > limit
    model.save_pretrained(tmp_path / "stock", max_shard_size=limit)
    writer = ShardWriter(tmp_path / "ours", specs_of(sd), limit)
    for k, v in sd.items(): writer.write(k, v)
    writer.close()
    from safetensors import safe_open
    stock = sorted(p.name for p in (tmp_path / "stock").glob("model*.safetensors*"))
    assert len(stock) > 3 and stock == sorted(p.name for p in (tmp_path / "ours").iterdir())
    for f in stock[:-1]:
        with safe_open(tmp_path / "stock" / f, "pt") as a, safe_open(tmp_path / "ours" / f, "pt") as b:
            assert sorted(a.keys()) == sorted(b.keys()) and all(torch.equal(a.get_tensor(k), b.get_tensor(k))
                                                                for k in a.keys())
    index = "model.safetensors.index.json"
    assert (tmp_path / "ours" / index).read_text() == (tmp_path / "stock" / index).read_text()
