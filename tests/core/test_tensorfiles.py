"""adaptkit.tensorfiles: the one shard-size rule every writer of shards asks (a model artifact's state dict, a merge's
specs of tensors not computed yet)."""
import re

import pytest
import torch

from adaptkit.tensorfiles import check_shard_size


def test_a_shard_size_below_the_largest_tensor_is_refused_from_tensors_or_specs():
    "Tensors and specs give one answer: the limit in bytes, or an error naming the tensor, its bytes and the limit."
    tensors = {"small": torch.zeros(4, 4), "embed": torch.zeros(512, 32, dtype=torch.bfloat16), "ids": torch.arange(3)}
    specs = {"small": ("F32", (4, 4)), "embed": ("BF16", (512, 32)), "ids": ("I64", (3,))}
    for given in (tensors, specs):
        assert check_shard_size(given, 32768) == 32768  # the largest fits exactly
        assert check_shard_size(given, "1MB") == 10**6
        with pytest.raises(ValueError, match=re.escape("max_shard_size '32KB' (32,000 bytes) is below tensor 'embed' "
                                                       "(32,768 bytes, BF16 [512, 32]): a tensor is never split across "
                                                       "shards; give at least '1MB'")):
            check_shard_size(given, "32KB")
    assert check_shard_size({}, 1) == 1  # nothing to write: any limit
    with pytest.raises(ValueError, match="max_shard_size 'big': expected bytes"):
        check_shard_size(tensors, "big")
