"""The fused per-layer read-out of RepNoise (`readout_ce`) against the plain computation (full logits at every position,
`F.cross_entropy` per layer, mean over layers): the same value and the same gradients to 1e-5, for padded batches,
`layers=[k]` subsets, uneven chunks, tied heads, heads with a bias and adapter-wrapped heads; and no tensor of
`layers x tokens x vocab` elements is ever kept for backward."""
import pytest
import torch
import torch.nn.functional as F

from adaptkit.models import tiny_causal_lm
from adaptkit.repnoise import LayerCapture, RepNoiseCollator, readout, readout_ce, repnoise_dataset, repnoise_loss

torch.set_num_threads(2)
# answers of different lengths, so the batch is padded on the right
ROWS = [
    {"prompt": f"how do I do task {i}", "harmful": "here is how to do it " * (i + 1), "harmless": "no"}
    for i in range(3)
]


def _batch(tok):
    ds = repnoise_dataset(ROWS, tok, max_length=64)
    batch = RepNoiseCollator(tok)([ds[i] for i in range(len(ds))])
    assert (batch["harmful_attention_mask"] == 0).any()
    return batch


def _hidden(model, batch, layers):
    with LayerCapture(model, layers) as cap:
        model(input_ids=batch["harmful_input_ids"], attention_mask=batch["harmful_attention_mask"])
    return [cap.hidden[i] for i in cap.layers]


def _plain(hiddens, labels, norm, head):
    "Full logits at every position of every layer, then the masked next-token CE per layer, then the mean."
    return torch.stack([F.cross_entropy(head(norm(h))[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten())
                        for h in hiddens]).mean()


def _value_and_grads(model, batch, layers, fused, **kw):
    model.zero_grad(set_to_none=True)
    norm, head = readout(model)
    hs = _hidden(model, batch, layers)
    ce = (
        readout_ce(hs, batch["harmful_labels"], norm, head, **kw)
        if fused
        else _plain(hs, batch["harmful_labels"], norm, head)
    )
    ce.backward()
    return ce.detach(), {
        n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()
    }


def _assert_same(model, batch, layers, **kw):
    (a, ga), (b, gb) = (_value_and_grads(model, batch, layers, fused, **kw) for fused in (False, True))
    assert torch.allclose(a, b, atol=1e-5, rtol=0), (a.item(), b.item())
    for n in ga: assert torch.allclose(ga[n], gb[n], atol=1e-5, rtol=0), n
    return ga


@pytest.mark.parametrize("layers", [None, [0], [1], [-1], [2, 0]])
@pytest.mark.parametrize("chunk_rows", [1, 7, 10**6])
def test_fused_readout_equals_plain_value_and_gradient(tiny_tok, layers, chunk_rows):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3), _batch(tiny_tok)
    grads = _assert_same(model, batch, layers, chunk_elements=chunk_rows * len(tiny_tok))
    assert grads["lm_head.weight"].abs().sum() > 0 and grads["model.embed_tokens.weight"].abs().sum() > 0
    if layers == [0]:  # reading layer 0 out sends nothing back into layers 1 and 2
        assert all(g.abs().sum() == 0 for n, g in grads.items() if n.startswith(("model.layers.1.", "model.layers.2.")))


def test_tied_head_and_head_with_bias(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=2), _batch(tiny_tok)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as in SmolLM2
    _assert_same(model, batch, None, chunk_elements=5 * len(tiny_tok))
    model = tiny_causal_lm(tiny_tok, num_layers=2)
    head = torch.nn.Linear(model.config.hidden_size, len(tiny_tok), bias=True)
    with torch.no_grad(): head.weight.copy_(model.lm_head.weight); head.bias.normal_()
    model.lm_head = head
    grads = _assert_same(model, batch, [1], chunk_elements=3 * len(tiny_tok))
    assert grads["lm_head.bias"].abs().sum() > 0


def test_adapter_on_the_head_takes_the_recomputing_path(tiny_tok):
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(tiny_causal_lm(tiny_tok, num_layers=2), LoraConfig(r=2, target_modules=["lm_head", "q_proj"],
                                                                             init_lora_weights=False))
    _, head = readout(model)
    assert type(head) is not torch.nn.Linear
    _assert_same(model, _batch(tiny_tok), None, chunk_elements=4 * len(tiny_tok))


def test_no_grad_gives_the_same_value(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3), _batch(tiny_tok)
    norm, head = readout(model)
    with torch.no_grad():
        hs = _hidden(model, batch, None)
        assert torch.allclose(readout_ce(hs, batch["harmful_labels"], norm, head, chunk_elements=len(tiny_tok)),
                              _plain(hs, batch["harmful_labels"], norm, head), atol=1e-5, rtol=0)


def test_bf16_autocast_is_close_to_float32_and_finite(tiny_tok):
    model, batch = tiny_causal_lm(tiny_tok, num_layers=2), _batch(tiny_tok)
    norm, head = readout(model)
    hs = _hidden(model, batch, None)
    exact = _plain(hs, batch["harmful_labels"], norm, head)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ce = readout_ce(hs, batch["harmful_labels"], norm, head)
    assert ce.dtype == torch.float32 and abs(ce.item() - exact.item()) < 0.05
    assert ce.item() != exact.item()  # the head's matmul ran in bf16, as autocast asks
    ce.backward()
    assert head.weight.grad.dtype == torch.float32 and torch.isfinite(head.weight.grad).all()


def test_no_layers_by_tokens_by_vocab_tensor_is_kept(tiny_tok):
    "Every tensor autograd saves during the RepNoise loss is far smaller than one layer's logits at the answer tokens."
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3), _batch(tiny_tok)
    answer_tokens = int((batch["harmful_labels"][:, 1:] != -100).sum())
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        repnoise_loss(model, batch, layers=None)
    harmless_logits = batch["harmless_input_ids"].numel() * len(tiny_tok)  # the harmless forward's own logits
    readout = [s for s in sizes if s != harmless_logits]
    assert max(readout) < answer_tokens * len(tiny_tok)


def test_one_layers_readout_at_the_last_layer_is_the_models_own_loss(tiny_tok):
    "`layer_ce` on the last layer's output, read through the final norm and head, is the model's next-token loss."
    from adaptkit.repnoise.loss import layer_ce
    model, batch = tiny_causal_lm(tiny_tok, num_layers=3), _batch(tiny_tok)
    labels, norm, head = batch["harmful_labels"], *readout(model)
    with torch.no_grad():
        own = model(input_ids=batch["harmful_input_ids"], attention_mask=batch["harmful_attention_mask"], labels=labels)
        last = _hidden(model, batch, [-1])[0]
        assert torch.allclose(layer_ce(last, labels, norm, head), own.loss, atol=1e-5)
        assert torch.allclose(layer_ce(last, labels, norm, head), _plain([last], labels, norm, head), atol=1e-5)
        first = _hidden(model, batch, [0])[0]
        assert not torch.allclose(layer_ce(first, labels, norm, head), own.loss, atol=1e-3)  # another layer reads else
