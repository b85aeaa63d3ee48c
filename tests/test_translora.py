"""Trans-LoRA across modules: a source LoRA on a Llama-style base moves to a Gemma-style base with another tokenizer,
every input pulled by repo id from a LocalHub, the discriminator and the target adapter pushed with their cards and
pulled back; bad inputs (too few seeds, an adapter on the wrong base, empty generations) fail early and clearly."""
import re

import pytest
import torch
from huggingface_hub import HfApi
from peft import LoraConfig, get_peft_model

from adaptkit import translora
from adaptkit.data import DataError
from adaptkit.hub import push_folder, read_metadata
from adaptkit.localhub import LocalHub
from adaptkit.models import load_adapter, load_causal_lm, tiny_causal_lm, tiny_tokenizer
from adaptkit.translora import (AdapterMismatchError, Discriminator, EmptyGenerationError, TransLoRAConfig, filter_prompts,
                                synthesize_prompts, teacher_completions, train_discriminator, transfer_lora)

SEEDS = [{"prompt": f"Question: what is {a} plus {b}?\nAnswer:", "completion": f" {a + b}"} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)]]
FAST = {"use_cpu": True, "disable_tqdm": True}


def _config(**kw):
    return TransLoRAConfig(**{**dict(num_synthetic=5, prompt_max_new_tokens=8, completion_max_new_tokens=5, generation_batch_size=5,
                                     max_steps=2, train_batch_size=2, learning_rate=1e-3, threshold=0.0, discriminator_epochs=1,
                                     training_kwargs=FAST), **kw})


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    "Source (Llama-style, tokenizer A) with a LoRA, target (Gemma-style, tokenizer B), and a wider base, as folders."
    root = tmp_path_factory.mktemp("translora")
    tok_a, tok_b = tiny_tokenizer(), tiny_tokenizer(320)
    assert tok_a.get_vocab() != tok_b.get_vocab()
    made = {"src-base": (tiny_causal_lm(tok_a, seed=2), tok_a), "tgt-base": (tiny_causal_lm(tok_b, model_type="gemma", seed=4), tok_b),
            "wide-base": (tiny_causal_lm(tok_a, hidden_size=64), tok_a), "same-vocab-base": (tiny_causal_lm(tok_a, model_type="qwen3", seed=6), tok_a)}
    for name, (model, tok) in made.items():
        model.save_pretrained(root / name); tok.save_pretrained(root / name)
    lora = get_peft_model(tiny_causal_lm(tok_a, seed=2), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(root / "src-lora")
    return root


def test_transfer_through_localhub(bases, tmp_path):
    cfg = _config()
    with LocalHub(tmp_path / "hub") as hub:
        ep = hub.endpoint
        commits = {name: push_folder(bases / name, f"team/{name}", endpoint=ep) for name in ("src-base", "src-lora", "tgt-base")}
        tok = translora.load_tokenizer(bases / "src-base")
        fake = synthesize_prompts(load_causal_lm(bases / "src-base"), tok, SEEDS, cfg, progress=False)
        disc = train_discriminator("team/src-base", tok, [r["prompt"] for r in SEEDS], fake, cfg, output_dir=tmp_path / "d", endpoint=ep)
        assert (disc.base_model, disc.base_revision) == ("team/src-base", commits["src-base"])
        disc.push_to_hub("team/disc", endpoint=ep)
        res = transfer_lora("team/src-base", "team/src-lora", "team/tgt-base", SEEDS, output_dir=tmp_path / "out", discriminator="team/disc",
                            config=cfg, push_to="team/tgt-lora", endpoint=ep,
                            evaluate=lambda m, t: [{"task": "text-generation", "dataset": "tiny-sums", "metric": "accuracy", "value": 0.0}])
        api = HfApi(endpoint=ep)
        data = api.model_info("team/tgt-lora").card_data
        readme = (tmp_path / "out" / "README.md").read_text()
        pulled_disc = Discriminator.from_pretrained("team/disc", endpoint=ep)
        pulled = load_adapter(load_causal_lm("team/tgt-base", endpoint=ep), "team/tgt-lora", endpoint=ep, revision=res.commit)
        assert api.model_info("team/disc").card_data.base_model == "team/src-base"
    assert res.commit and res.counts["seeds"] == 5 and res.counts["synthetic"] == 5 and res.counts["kept"] == 5
    assert (data.base_model, data.library_name) == ("team/tgt-base", "peft") and "translora" in data.tags
    assert data.eval_results[0].metric_value == 0.0
    for name in ("src-lora", "src-base", "disc"):
        assert f"team/{name}" in readme
    assert commits["src-lora"] in readme and commits["src-base"] in readme and "kept 5 (100%)" in readme
    meta = read_metadata(tmp_path / "out")["translora"]
    assert meta["source_adapter"] == {"repo_id": "team/src-lora", "revision": commits["src-lora"]}
    assert meta["counts"] == res.counts and set(meta["timings"]) >= {"synthesize", "filter", "teacher", "distill"}
    texts = [r["prompt"] for r in SEEDS] + fake
    assert pulled_disc.score(texts) == pytest.approx(disc.score(texts), abs=1e-5)
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        assert torch.allclose(pulled(input_ids=ids).logits, res.model.eval()(input_ids=ids).logits, atol=1e-5)


def test_logit_level_needs_one_vocabulary(bases, tmp_path):
    cfg = _config(distillation="logit")
    with pytest.raises(ValueError, match="share one vocabulary"):
        transfer_lora(bases / "src-base", bases / "src-lora", bases / "tgt-base", SEEDS, output_dir=tmp_path / "x", config=cfg)
    res = transfer_lora(bases / "src-base", bases / "src-lora", bases / "same-vocab-base", SEEDS, output_dir=tmp_path / "y", config=cfg)
    assert "filter" not in res.timings and "no discriminator was used" in (tmp_path / "y" / "README.md").read_text()
    assert "logit-level distillation" in (tmp_path / "y" / "README.md").read_text()


def test_too_few_seeds_fail_before_anything_is_pulled(tmp_path):
    with pytest.raises(DataError, match=re.escape("at least 5 distinct seed examples, got 4")):
        transfer_lora("team/nowhere", "team/nothing", "team/none", SEEDS[:4], output_dir=tmp_path / "x", endpoint="http://127.0.0.1:9")
    with pytest.raises(DataError, match="got 1 \\(5 with duplicates\\)"):
        transfer_lora("team/nowhere", "team/nothing", "team/none", SEEDS[:1] * 5, output_dir=tmp_path / "x")


def test_adapter_on_the_wrong_base_is_refused(bases, tmp_path):
    with pytest.raises(AdapterMismatchError, match=r"has shape \(4, 32\) but the base's 'model.layers.0.self_attn.q_proj' has in size 64"):
        transfer_lora(bases / "wide-base", bases / "src-lora", bases / "tgt-base", SEEDS, output_dir=tmp_path / "x")
    with pytest.raises(AdapterMismatchError, match="not a PEFT adapter folder"):
        transfer_lora(bases / "src-base", bases / "tgt-base", bases / "tgt-base", SEEDS, output_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_empty_generations_are_refused(bases, monkeypatch):
    tok = translora.load_tokenizer(bases / "src-base")
    model = load_causal_lm(bases / "src-base")
    monkeypatch.setattr(translora, "generate_texts", lambda m, t, prompts, **kw: ["" for _ in prompts])
    with pytest.raises(EmptyGenerationError, match="wrote no usable prompt in 15 generations"):
        synthesize_prompts(model, tok, SEEDS, _config(), progress=False)
    with pytest.raises(EmptyGenerationError, match="answered none of 2 prompts"):
        teacher_completions(model, tok, ["a", "b"], _config(), progress=False)
    monkeypatch.setattr(translora, "generate_texts", lambda m, t, prompts, **kw: ["### only a separator" for _ in prompts])
    with pytest.raises(EmptyGenerationError, match="no usable prompt"):
        synthesize_prompts(model, tok, SEEDS, _config(), progress=False)


def test_filter_reports_kept_fraction_and_refuses_nothing_kept(bases, caplog):
    class Half(Discriminator):
        def score(self, texts, batch_size=16): return [0.9 if i % 2 == 0 else 0.1 for i in range(len(texts))]
    disc = Half(None, None)
    with caplog.at_level("INFO", logger="adaptkit.translora"):
        res = filter_prompts(disc, ["a", "b", "c", "d"])
    assert (res.kept, res.kept_fraction) == (["a", "c"], 0.5) and "kept 2 of 4" in caplog.text
    with pytest.raises(EmptyGenerationError, match="kept none of 4 prompts at threshold 0.95"):
        filter_prompts(disc, ["a", "b", "c", "d"], 0.95)
    assert filter_prompts(disc, ["a"], 0.95, allow_empty=True).kept == []
