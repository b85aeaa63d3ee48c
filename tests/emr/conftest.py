"""What the EMR tests share: `classifier`, the tiny random Llama sequence classifier their tasks are fine-tuned from,
and `no_tensor_may_be_read`, the guard that a refusal comes from the headers alone."""
import pytest
import torch


def _classifier(
    num_labels: int = 2,  # the task's classes: its own head (`score.weight`)
    seed: int = 0,  # torch's seed for the random weights
    *,
    hidden: int = 16,  # hidden size
    vocab_size: int = 64,  # embeddings (a tokenizer's vocabulary where one tokenises real text)
    pad_token_id: int = 0,  # the pad id the head reads the last real token by
    dtype: torch.dtype = torch.float32,  # the weights' dtype
):
    "A tiny random `LlamaForSequenceClassification` (2 layers, MLP 32, 2 heads): the same weights for the same seed."
    from transformers import AutoConfig, LlamaForSequenceClassification
    cfg = AutoConfig.for_model("llama", vocab_size=vocab_size, hidden_size=hidden, intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               num_labels=num_labels, pad_token_id=pad_token_id,
                               architectures=["LlamaForSequenceClassification"])
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(cfg).to(dtype)


@pytest.fixture
def classifier():
    """`classifier(num_labels=2, seed=0, *, hidden=16, vocab_size=64, pad_token_id=0, dtype=torch.float32)`: a tiny
    random Llama sequence classifier, a base or a task model of the EMR tests."""
    return _classifier


def _no_tensor_may_be_read(monkeypatch):
    "Every read of tensor data from a file fails the test: a refusal must come from the headers alone."
    from adaptkit.tensorfiles import TensorFiles
    def read(*args, **kwargs): pytest.fail("a tensor was read before the refusal")
    monkeypatch.setattr(TensorFiles, "read", read)
    monkeypatch.setattr(TensorFiles, "read_into", read)


@pytest.fixture
def no_tensor_may_be_read():
    """`no_tensor_may_be_read(monkeypatch)`: from then on (within `monkeypatch` or its context) every read of tensor
    data from a file fails the test."""
    return _no_tensor_may_be_read
