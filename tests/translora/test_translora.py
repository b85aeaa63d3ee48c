"""Trans-LoRA across modules: a source LoRA on a Llama-style base moves to a Gemma-style base with another tokenizer,
every input pulled by repo id from a LocalHub, the discriminator and the transferred adapter pushed with their cards
and pulled back by repo id (and refused on another base); a trained discriminator keeps real rows and drops synthetic
ones; the distilled count matches a hand count; the vLLM path runs with a stand-in `vllm` module; bad inputs (too few
seeds, an adapter on the wrong base, empty generations) fail early and clearly."""
import re
import shutil
import sys
import types

import pytest
import torch
from huggingface_hub import HfApi
from peft import LoraConfig, PeftModel, get_peft_model

import adaptkit.translora.synthesis as synthesis
import adaptkit.translora.trainer as trainer
import adaptkit.translora.transfer as transfer
from adaptkit.data import DataError
from adaptkit.hub import pull, push_folder, read_metadata, write_metadata
from adaptkit.models import BaseMismatchError, load_causal_lm, load_tokenizer, tiny_causal_lm, tiny_tokenizer
from adaptkit.translora import (
    AdapterMismatchError,
    Discriminator,
    DiscriminatorConfig,
    DistillationConfig,
    EmptyGenerationError,
    SynthesisConfig,
    TransferredAdapter,
    filter_prompts,
    synthesize_prompts,
    teacher_completions,
    train_discriminator,
    transfer_lora,
)

SEEDS = [
    {"prompt": f"Question: what is {a} plus {b}?\nAnswer:", "completion": f" {a + b}"}
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)]
]
FAST = {"use_cpu": True, "disable_tqdm": True}



def _generate_with(monkeypatch, generate):
    "Replace the generation both Trans-LoRA stages call: synthesis (target writes prompts) and the teacher's answers."
    for module in (synthesis, transfer): monkeypatch.setattr(module, "generate_texts", generate)

def _synthesis(**kw):
    "Tiny synthesis settings; every teacher answer distilled (`teacher_keep=1.0`) so counts can be checked by hand."
    base = dict(num_synthetic=5, prompt_max_new_tokens=8, completion_max_new_tokens=5, generation_batch_size=5,
                teacher_keep=1.0)
    return SynthesisConfig(**{**base, **kw})


def _distillation(tmp_path, **kw):
    return DistillationConfig(**{**dict(output_dir=str(tmp_path / "work"), max_steps=2, per_device_train_batch_size=2,
                                        learning_rate=1e-3, **FAST), **kw})


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    "Source (Llama-style, tokenizer A) with a LoRA, target (Gemma-style, tokenizer B), and a wider base, as folders."
    root = tmp_path_factory.mktemp("translora")
    tok_a, tok_b = tiny_tokenizer(), tiny_tokenizer(320)
    assert tok_a.get_vocab() != tok_b.get_vocab()
    made = {
        "src-base": (tiny_causal_lm(tok_a, seed=2), tok_a),
        "tgt-base": (tiny_causal_lm(tok_b, model_type="gemma", seed=4), tok_b),
        "wide-base": (tiny_causal_lm(tok_a, hidden_size=64), tok_a),
        "same-vocab-base": (tiny_causal_lm(tok_a, model_type="qwen3", seed=6), tok_a),
        "other-tgt-base": (tiny_causal_lm(tok_b, model_type="gemma", seed=5), tok_b),
    }
    for name, (model, tok) in made.items():
        model.save_pretrained(root / name); tok.save_pretrained(root / name)
    lora = get_peft_model(
        tiny_causal_lm(tok_a, seed=2),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    lora.save_pretrained(root / "src-lora")
    return root


def test_transfer_through_localhub(bases, tmp_path, hub):
    # copies are pushed: a push records the repo in the folder, which other tests' folders must not have
    ep = hub.endpoint
    commits = {name: push_folder(shutil.copytree(bases / name, tmp_path / "pushed" / name), f"team/{name}", endpoint=ep)
               for name in ("src-base", "src-lora", "tgt-base")}
    tok = load_tokenizer(bases / "src-base")
    fake = synthesize_prompts(load_causal_lm(bases / "src-base"), tok, SEEDS, _synthesis(), progress=False)
    disc = train_discriminator(
        "team/src-base",
        tok,
        [r["prompt"] for r in SEEDS],
        fake,
        DiscriminatorConfig(output_dir=str(tmp_path / "d"), threshold=0.0, max_steps=2, **FAST),
        endpoint=ep,
    )
    assert (disc.base_model, disc.base_revision) == ("team/src-base", commits["src-base"])
    disc.push_to_hub("team/disc", endpoint=ep)
    adapter = transfer_lora(
        "team/src-base",
        "team/src-lora",
        "team/tgt-base",
        SEEDS,
        output_dir=tmp_path / "out",
        discriminator="team/disc",
        synthesis=_synthesis(),
        distillation=_distillation(tmp_path),
        endpoint=ep,
        evaluate=lambda m, t: [{"task": "text-generation", "dataset": "tiny-sums", "metric": "accuracy", "value": 0.0}],
    )
    commit = adapter.push_to_hub("team/tgt-lora", endpoint=ep)
    api = HfApi(endpoint=ep)
    data, disc_data = api.model_info("team/tgt-lora").card_data, api.model_info("team/disc").card_data
    readme = (pull("team/tgt-lora", endpoint=ep, revision=commit) / "README.md").read_text()
    pulled_disc = Discriminator.from_pretrained("team/disc", endpoint=ep)
    # on its recorded base, pulled
    pulled = TransferredAdapter.from_pretrained("team/tgt-lora", endpoint=ep, revision=commit)
    assert (adapter.counts["seeds"], adapter.counts["synthetic"], adapter.counts["kept"]) == (5, 5, 5)
    assert (data.base_model, data.library_name) == ("team/tgt-base", "peft") and {"adaptkit", "translora"} <= set(
        data.tags
    )
    assert (disc_data.base_model, disc_data.library_name) == ("team/src-base", "peft") and {
        "adaptkit",
        "translora",
        "discriminator",
    } <= set(disc_data.tags)
    assert data.eval_results[0].metric_value == 0.0
    for name in ("src-lora", "src-base", "disc"):
        assert f"team/{name}" in readme
    assert commits["src-lora"] in readme and commits["src-base"] in readme and "kept 5 (100%)" in readme
    record = read_metadata(tmp_path / "out")
    assert record["translora"]["provenance"]["source_adapter"] == {
        "repo_id": "team/src-lora",
        "revision": commits["src-lora"],
    }
    assert (
        record["source"]["base_model"] == "team/tgt-base" and record["source"]["base_revision"] == commits["tgt-base"]
    )
    assert record["translora"]["counts"] == adapter.counts and set(record["translora"]["timings"]) >= {
        "synthesize + filter",
        "teacher",
        "distill",
    }
    assert pulled.counts == adapter.counts and pulled.kept_fraction == 1.0 and pulled.base_model == "team/tgt-base"
    texts = [r["prompt"] for r in SEEDS] + fake
    assert pulled_disc.score(texts) == pytest.approx(disc.score(texts), abs=1e-5)
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        assert torch.allclose(pulled.model(input_ids=ids).logits, adapter.model.eval()(input_ids=ids).logits, atol=1e-5)
    with pytest.raises(BaseMismatchError, match=r"made on the base team/tgt-base@.*other-tgt-base"):
        TransferredAdapter.from_pretrained("team/tgt-lora", endpoint=ep, base=bases / "other-tgt-base")
    with pytest.raises(BaseMismatchError, match="made on the base team/src-base"):
        Discriminator.from_pretrained("team/disc", endpoint=ep, base=bases / "wide-base")


def test_saved_adapter_round_trip_and_stock_peft(bases, tmp_path):
    adapter = transfer_lora(bases / "src-base", bases / "src-lora", bases / "tgt-base", SEEDS, synthesis=_synthesis(),
                            distillation=_distillation(tmp_path))
    assert adapter.output_dir is None and not (tmp_path / "saved").exists()  # nothing saved unless asked
    adapter.save_pretrained(tmp_path / "saved")
    again = TransferredAdapter.from_pretrained(tmp_path / "saved", base=bases / "tgt-base")
    stock = PeftModel.from_pretrained(load_causal_lm(bases / "tgt-base"), str(tmp_path / "saved"))
    ids = torch.tensor([[3, 7, 11]])
    with torch.no_grad():
        want = adapter.model.eval()(input_ids=ids).logits
        assert torch.allclose(again.model(input_ids=ids).logits, want, atol=1e-5)
        assert torch.allclose(stock(input_ids=ids).logits, want, atol=1e-5)
    assert (again.counts, again.provenance) == (adapter.counts, adapter.provenance) and set(adapter.provenance) == {
        "source_base",
        "source_adapter",
        "target_base",
    }
    with pytest.raises(BaseMismatchError, match="other-tgt-base"):
        TransferredAdapter.from_pretrained(tmp_path / "saved", base=bases / "other-tgt-base")
    source = read_metadata(tmp_path / "saved")["source"]  # a local target base: its folder, no repo id
    assert (source["base_model"], source["base_path"]) == (None, str((bases / "tgt-base").resolve()))
    local = TransferredAdapter.from_pretrained(tmp_path / "saved")  # no base given: the recorded folder, checked
    with torch.no_grad(): assert torch.allclose(local.model(input_ids=ids).logits, want, atol=1e-5)
    write_metadata(tmp_path / "saved", source={**source, "base_path": str(tmp_path / "gone-base")})  # moved away
    with pytest.raises(FileNotFoundError, match=f"the local base {tmp_path / 'gone-base'}, which no longer exists: "
                                                "pass base="):
        TransferredAdapter.from_pretrained(tmp_path / "saved")


REAL = [f"apple tree number {i} is green" for i in range(12)]  # what a trained discriminator keeps
SYNTHETIC = [f"zero zero {i} minus minus" for i in range(12)]  # and what it drops


def _trained_discriminator(tmp_path):
    "`(tokenizer, discriminator)`: a discriminator on a tiny base, trained on the first 8 of `REAL` and `SYNTHETIC`."
    tok = tiny_tokenizer()
    base = tiny_causal_lm(tok, seed=3)
    with torch.no_grad(): base.lm_head.weight.mul_(10)  # a random tiny model's logits barely move in a few steps
    cfg = DiscriminatorConfig(output_dir=str(tmp_path / "d"), learning_rate=1e-2, num_train_epochs=4,
                              discriminator_template="{text}", threshold=0.5, **FAST)
    return tok, train_discriminator(base, tok, REAL[:8], SYNTHETIC[:8], cfg)


def test_trained_discriminator_keeps_real_and_drops_synthetic(tmp_path):
    tok, disc = _trained_discriminator(tmp_path)
    real, synthetic = REAL, SYNTHETIC
    held_out = [synthetic[8], real[8], synthetic[9], real[9], real[10], synthetic[10], real[11], synthetic[11]]
    result = filter_prompts(disc, held_out)
    assert result.kept == [real[8], real[9], real[10], real[11]] and result.kept_fraction == 0.5
    assert disc.evaluate(real[8:], synthetic[8:]) == {"accuracy": 1.0, "real_kept": 1.0, "synthetic_kept": 0.0}


def test_distilled_count_matches_a_hand_count(bases, tmp_path, monkeypatch):
    real_generate, answered = synthesis.generate_texts, []
    def generate(model, tok, prompts, **kw):
        if kw.get("desc") != "teacher completions": return real_generate(model, tok, prompts, **kw)
        answers = ["  \n" if i % 3 == 0 else f" {i}" for i in range(len(prompts))]  # every third answer is empty
        answered.append(answers)
        return answers
    _generate_with(monkeypatch, generate)
    adapter = transfer_lora(
        bases / "src-base",
        bases / "src-lora",
        bases / "tgt-base",
        SEEDS,
        synthesis=_synthesis(num_synthetic=7),
        distillation=_distillation(tmp_path),
    )
    hand_count = sum(1 for a in answered[0] if a.strip())
    assert len(answered[0]) == adapter.counts["kept"] == 7 and hand_count == 4
    assert adapter.counts["distilled"] == hand_count


def test_teacher_keep_distils_the_half_of_the_answers_the_teacher_is_surest_of(bases, tmp_path, monkeypatch):
    "`teacher_keep=0.5`: of 6 answered prompts, the 3 the teacher is surest of are distilled (the default keeps all)."
    import adaptkit.translora.transfer as transfer
    real_generate, cut = synthesis.generate_texts, []
    def generate(model, tok, prompts, **kw):
        if kw.get("desc") != "teacher completions": return real_generate(model, tok, prompts, **kw)
        return [f" {i}" for i in range(len(prompts))]  # every prompt answered
    _generate_with(monkeypatch, generate)
    real_confident = transfer.confident_answers
    def confident(rows, logprobs, keep):
        cut.append((list(rows["prompt"]), list(logprobs), keep)); return real_confident(rows, logprobs, keep)
    monkeypatch.setattr(transfer, "confident_answers", confident)
    assert SynthesisConfig().teacher_keep == 1.0  # off by default: the paper's method
    adapter = transfer_lora(bases / "src-base", bases / "src-lora", bases / "tgt-base", SEEDS,
                            synthesis=_synthesis(num_synthetic=6, teacher_keep=0.5),
                            distillation=_distillation(tmp_path))
    (prompts, logprobs, keep), = cut
    surest = sorted(sorted(range(6), key=lambda i: -logprobs[i])[:3])
    assert keep == 0.5 and len(prompts) == 6 and adapter.counts["kept"] == 6 and adapter.counts["distilled"] == 3
    assert adapter.answers["rows"] == 3 and adapter.settings["teacher_keep"] == 0.5
    assert sorted(a for a, _ in adapter.answers["most_common"]) == sorted(str(i) for i in surest)


class _StandInLLM:
    "Looks like a `vllm.LLM` to `generate_texts`: its class lives in a module named `vllm...`."
    __module__ = "vllm.entrypoints.llm"
    built, calls = [], []

    def __init__(self, model, **kwargs):
        self.built.append(model)

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params))
        start = sum(n for n, _ in self.calls[:-1])
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=f" input number {start + i}\n\n### Input")])
                for i in range(len(prompts))]


def test_vllm_path_with_a_stand_in(bases, tmp_path, monkeypatch):
    stand_in = types.ModuleType("vllm")
    stand_in.LLM, stand_in.SamplingParams = _StandInLLM, lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", stand_in)
    _StandInLLM.built, _StandInLLM.calls = [], []
    adapter = transfer_lora(
        bases / "src-base",
        bases / "src-lora",
        bases / "tgt-base",
        SEEDS,
        synthesis=_synthesis(backend="vllm", num_synthetic=4, temperature=0.7),
        distillation=_distillation(tmp_path),
    )
    assert _StandInLLM.built == [str(bases / "tgt-base")] and adapter.counts["synthetic"] == 4
    n, params = _StandInLLM.calls[0]
    assert params == {"max_tokens": 8, "temperature": 0.7, "top_p": 0.95, "stop": ["###"]}
    greedy = synthesis.generate_texts(_StandInLLM("x"), None, ["a"], max_new_tokens=3)
    assert (
        greedy[0].startswith("input number ")
        and greedy[0].endswith("### Input")
        and _StandInLLM.calls[-1][1]["temperature"] == 0.0
    )
    assert adapter.settings["backend"] == "vllm"


def test_logit_level_needs_one_vocabulary(bases, tmp_path):
    logit = _distillation(tmp_path, distillation="logit")
    with pytest.raises(ValueError, match="share one vocabulary"):
        transfer_lora(bases / "src-base", bases / "src-lora", bases / "tgt-base", SEEDS, output_dir=tmp_path / "x",
                      synthesis=_synthesis(), distillation=logit)
    res = transfer_lora(
        bases / "src-base",
        bases / "src-lora",
        bases / "same-vocab-base",
        SEEDS,
        output_dir=tmp_path / "y",
        synthesis=_synthesis(),
        distillation=logit,
    )
    readme = (tmp_path / "y" / "README.md").read_text()
    assert "synthesize + filter" not in res.timings and "synthesize" in res.timings
    assert "no discriminator was used" in readme and "logit-level distillation" in readme
    assert "library_name: peft" in readme and read_metadata(tmp_path / "y")["artifact"] == "translora-adapter"


def test_saved_beside_its_trainer_folder_then_pushed(bases, tmp_path, hub):  # pushes a new folder, not the bases
    res = transfer_lora(bases / "src-base", bases / "src-lora", bases / "tgt-base", SEEDS, output_dir=tmp_path / "out",
                        synthesis=_synthesis(num_synthetic=4, completion_max_new_tokens=4, generation_batch_size=4))
    assert res.output_dir == tmp_path / "out"
    assert (tmp_path / ".out.trainer").is_dir()  # the default distillation works beside the output
    commit = res.push_to_hub("team/pushed", endpoint=hub.endpoint)
    assert HfApi(endpoint=hub.endpoint).model_info("team/pushed").sha == commit


def test_too_few_seeds_fail_before_anything_is_pulled(tmp_path):
    with pytest.raises(DataError, match=re.escape("at least 5 distinct seed examples, got 4")):
        transfer_lora(
            "team/nowhere",
            "team/nothing",
            "team/none",
            SEEDS[:4],
            output_dir=tmp_path / "x",
            endpoint="http://127.0.0.1:9",
        )
    with pytest.raises(DataError, match="got 1 \\(5 with duplicates\\)"):
        transfer_lora("team/nowhere", "team/nothing", "team/none", SEEDS[:1] * 5, output_dir=tmp_path / "x")


def test_adapter_on_the_wrong_base_is_refused(bases, tmp_path):
    with pytest.raises(
        AdapterMismatchError,
        match=r"has shape \(4, 32\) but the base's 'model.layers.0.self_attn.q_proj' has in size 64",
    ):
        transfer_lora(bases / "wide-base", bases / "src-lora", bases / "tgt-base", SEEDS, output_dir=tmp_path / "x")
    with pytest.raises(AdapterMismatchError, match="not a PEFT adapter folder"):
        transfer_lora(bases / "src-base", bases / "tgt-base", bases / "tgt-base", SEEDS, output_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_empty_generations_are_refused(bases, monkeypatch):
    tok = load_tokenizer(bases / "src-base")
    model = load_causal_lm(bases / "src-base")
    _generate_with(monkeypatch, lambda m, t, prompts, **kw: ["" for _ in prompts])
    with pytest.raises(EmptyGenerationError, match="wrote no usable prompt in 15 generations"):
        synthesize_prompts(model, tok, SEEDS, _synthesis(), progress=False)
    with pytest.raises(EmptyGenerationError, match="answered none of 2 prompts"):
        teacher_completions(model, tok, ["a", "b"], _synthesis(), progress=False)
    _generate_with(monkeypatch, lambda m, t, prompts, **kw: ["### only a separator" for _ in prompts])
    with pytest.raises(EmptyGenerationError, match="no usable prompt"):
        synthesize_prompts(model, tok, SEEDS, _synthesis(), progress=False)


def test_filter_reports_kept_fraction_and_refuses_nothing_kept(caplog):
    class Half(Discriminator):
        def score(self, texts, batch_size=16): return [0.9 if i % 2 == 0 else 0.1 for i in range(len(texts))]
    disc = Half(None, None)
    with caplog.at_level("INFO", logger="adaptkit.translora"):
        res = filter_prompts(disc, ["a", "b", "c", "d"])
    assert (res.kept, res.kept_fraction) == (["a", "c"], 0.5) and "kept 2 of 4" in caplog.text
    with pytest.raises(EmptyGenerationError, match="kept none of 4 prompts at threshold 0.95"):
        filter_prompts(disc, ["a", "b", "c", "d"], 0.95)
    assert filter_prompts(disc, ["a"], 0.95, allow_empty=True).kept == []


def test_transfer_filters_with_a_trained_discriminator_at_threshold_half(tmp_path, monkeypatch):
    "transfer_lora's filter with a real trained discriminator at 0.5: real-looking prompts kept, synthetic dropped."
    tok, disc = _trained_discriminator(tmp_path)
    real, synthetic = REAL, SYNTHETIC
    folder = tmp_path / "bases"
    for name, model in {
        "src": tiny_causal_lm(tok, seed=2),
        "tgt": tiny_causal_lm(tok, model_type="qwen3", seed=6),
    }.items():
        model.save_pretrained(folder / name); tok.save_pretrained(folder / name)
    get_peft_model(tiny_causal_lm(tok, seed=2), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(
        folder / "lora"
    )
    written = [synthetic[8], real[8], real[9], synthetic[9], real[10], synthetic[10]]  # what the target "writes"
    real_generate, taught = synthesis.generate_texts, []
    def generate(model, tok_, prompts, **kw):
        if kw.get("desc") == "teacher completions":
            taught.append(list(prompts)); return [" one" for _ in prompts]
        return (
            [written.pop(0) + "\n###" for _ in prompts]
            if kw.get("stop_strings")
            else real_generate(model, tok_, prompts, **kw)
        )
    _generate_with(monkeypatch, generate)
    seeds = [f"apple seed {i} is red" for i in range(5)]
    adapter = transfer_lora(folder / "src", folder / "lora", folder / "tgt", seeds, discriminator=disc,
                            synthesis=_synthesis(num_synthetic=3, generation_batch_size=1, keep_template=False),
                            distillation=_distillation(tmp_path))
    # written until 3 are kept: the 5th prompt written is the 3rd real one, and the 6th is never asked for
    assert adapter.counts == {"seeds": 5, "synthetic": 5, "kept": 3, "distilled": 3} and adapter.kept_fraction == 0.6
    assert taught == [[real[8], real[9], real[10]]] and written == [synthetic[10]]  # only kept prompts are taught
    assert adapter.settings["threshold"] == 0.5  # the discriminator's own threshold, applied and recorded


@pytest.mark.parametrize("make, error, message", [
    (lambda: SynthesisConfig(min_seeds=0), ValueError, "min_seeds must be at least 1, got 0"),
    (lambda: SynthesisConfig(shots=0), ValueError, "shots must be at least 1"),
    (lambda: SynthesisConfig(num_synthetic=0), ValueError, "num_synthetic must be at least 1"),
    (lambda: SynthesisConfig(generation_batch_size=0), ValueError, "generation_batch_size must be at least 1"),
    (lambda: SynthesisConfig(prompt_max_new_tokens=0), ValueError, "prompt_max_new_tokens must be at least 1"),
    (lambda: SynthesisConfig(completion_max_new_tokens=-1), ValueError,
     "completion_max_new_tokens must be at least 1, got -1"),
    (lambda: SynthesisConfig(max_attempts_factor=0.5), ValueError, "max_attempts_factor must be at least 1, got 0.5"),
    (lambda: SynthesisConfig(backend="tgi"), ValueError, "backend must be 'transformers' or 'vllm', got 'tgi'"),
    (lambda: SynthesisConfig(synthesis_template="no field"), ValueError,
     "synthesis_template needs an {examples} field"),
    (lambda: SynthesisConfig(example_template="no field"), ValueError, "example_template needs a {prompt} field"),
    (lambda: SynthesisConfig(stop=""), ValueError, "stop must be a non-empty string"),
    (lambda: DiscriminatorConfig(discriminator_template="x", **FAST), ValueError,
     "discriminator_template needs a {text} field"),
    (lambda: DiscriminatorConfig(real_label=" no", **FAST), ValueError,
     "real_label and synthetic_label must be two different"),
    (lambda: DiscriminatorConfig(real_label="", **FAST), ValueError,
     "real_label and synthetic_label must be two different"),
    (lambda: DiscriminatorConfig(threshold=1.5, **FAST), ValueError, r"threshold must be in \[0, 1\], got 1.5"),
    (lambda: DiscriminatorConfig(discriminator_r=0, **FAST), ValueError, "discriminator_r must be at least 1, got 0"),
    (lambda: DistillationConfig(distillation="token", **FAST), ValueError,
     "distillation must be 'sequence' or 'logit', got 'token'"),
    (lambda: DistillationConfig(gkd_beta=2, **FAST), ValueError, r"gkd_beta must be in \[0, 1\], got 2"),
    (lambda: DistillationConfig(gkd_temperature=0, **FAST), ValueError, "gkd_temperature must be positive, got 0"),
])
def test_stage_configs_refuse_bad_settings_by_name(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_stage_config_refuses_wrong_types():
    from adaptkit.translora.config import stage_config
    with pytest.raises(TypeError, match="not a Trans-LoRA stage config: <class 'int'>"):
        stage_config(None, int)
    with pytest.raises(TypeError, match="expected a DistillationConfig, got a SynthesisConfig"):
        stage_config(SynthesisConfig(), DistillationConfig)
    with pytest.raises(TypeError, match="expected a DistillationConfig, got a SynthesisConfig"):
        transfer_lora("a", "b", "c", SEEDS, distillation=SynthesisConfig())


def test_seed_and_adapter_checks_name_the_row_and_tensor(bases, tmp_path):
    from adaptkit.translora.config import check_adapter, load_seeds
    with pytest.raises(DataError, match="seed 2: empty text"):
        load_seeds(["a", "b", "  ", "c", "d", "e"])
    lora = get_peft_model(tiny_causal_lm(tiny_tokenizer(), seed=2), LoraConfig(r=2, target_modules=["q_proj"]))
    lora.save_pretrained(tmp_path / "lora")
    # same module names but another family: rename a module to make one missing
    gemma = load_causal_lm(bases / "tgt-base")
    gemma.model.layers[0].self_attn.add_module("q_proj_renamed", gemma.model.layers[0].self_attn.q_proj)
    del gemma.model.layers[0].self_attn.q_proj
    with pytest.raises(
        AdapterMismatchError, match=r"targets 'model.layers.0.self_attn.q_proj', which the base model does not have"
    ):
        check_adapter(gemma, tmp_path / "lora")


def test_discriminator_and_filter_inputs_are_checked():
    from adaptkit.translora import discriminator_rows
    with pytest.raises(ValueError, match="needs real and synthetic texts; got 2 real, 0 synthetic"):
        discriminator_rows(["a", "b"], [])
    with pytest.raises(ValueError, match="synthetic text 1: empty or not a string"):
        discriminator_rows(["a", "b"], ["c", " "])
    with pytest.raises(ValueError, match="real text 0: empty or not a string"):
        discriminator_rows([3], ["c"])
    disc = Discriminator(None, None)
    with pytest.raises(ValueError, match="evaluate needs both kinds of texts; got 0 real, 1 synthetic"):
        disc.evaluate([], ["x"])
    with pytest.raises(EmptyGenerationError, match="no synthetic prompts to filter"):
        filter_prompts(disc, [])
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\], got 1.2"):
        filter_prompts(disc, ["a"], 1.2)


def test_distillation_inputs_are_checked(bases, tmp_path):
    import datasets

    from adaptkit.translora import distill_lora
    tok = load_tokenizer(bases / "tgt-base")
    with pytest.raises(EmptyGenerationError, match=r"needs prompt/completion rows; got 0 rows"):
        distill_lora(load_causal_lm(bases / "tgt-base"), tok, datasets.Dataset.from_list([]), _distillation(tmp_path))
    with pytest.raises(EmptyGenerationError, match=r"got 1 rows with columns \['text'\]"):
        distill_lora(
            load_causal_lm(bases / "tgt-base"),
            tok,
            datasets.Dataset.from_list([{"text": "a"}]),
            _distillation(tmp_path),
        )
    rows = datasets.Dataset.from_list([{"prompt": "a", "completion": " b"}])
    with pytest.raises(ValueError, match="logit-level distillation needs teacher= and teacher_tokenizer="):
        distill_lora(load_causal_lm(bases / "tgt-base"), tok, rows, _distillation(tmp_path, distillation="logit"))
    src_tok = load_tokenizer(bases / "src-base")
    with pytest.raises(
        ValueError,
        match=r"needs one vocabulary, but the teacher's tokenizer \(512 tokens\) and the student's \(320 tokens\)",
    ):
        distill_lora(load_causal_lm(bases / "tgt-base"), tok, rows, _distillation(tmp_path, distillation="logit"),
                     teacher=load_causal_lm(bases / "src-base"), teacher_tokenizer=src_tok)
    with pytest.raises(EmptyGenerationError, match="no prompts for the teacher to answer"):
        teacher_completions(None, tok, [], _synthesis())
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchTrainer'"):
        trainer.NoSuchTrainer  # the module's __getattr__ builds only TransLoRAGKDTrainer


def test_vllm_generator_without_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vllm now raises ImportError
    with pytest.raises(ImportError, match=r"backend='vllm' needs vLLM \(`pip install vllm`\)"):
        synthesis.vllm_generator("/nowhere")


def test_model_helpers_refuse_bad_inputs(tmp_path):
    from adaptkit.models import completion_collator, encode_completion, from_gguf, packaged_file
    tok = tiny_tokenizer()
    with pytest.raises(
        ValueError, match="row 7: the prompt takes .* tokens, leaving no room for the answer in max_length=3"
    ):
        encode_completion(tok, "one two three four five six", " seven", 3, row=7)
    no_pad = tiny_tokenizer(); no_pad.pad_token = None
    with pytest.raises(ValueError, match="the tokenizer has no pad token"):
        completion_collator(no_pad)
    (tmp_path / "model.bin").write_text("x")
    with pytest.raises(FileNotFoundError, match="model.bin: not a .gguf file"):
        from_gguf(tmp_path / "model.bin", tmp_path / "out")
    with pytest.raises(ModuleNotFoundError, match="no \\*.gguf from the package 'no-such-asset-package'"):
        packaged_file("no-such-asset-package", "*.gguf")


def test_the_teacher_answers_are_summarised_and_one_dominant_answer_is_warned_of(caplog):
    "`answer_distribution` counts answers with whitespace folded; over half the rows on one answer is logged."
    from adaptkit.translora.transfer import _warn_if_one_answer, answer_distribution
    rows = [{"completion": c} for c in [" business ", "business", "tech\n", "business", "sports"]]
    assert answer_distribution(rows, top=2) == {"rows": 5, "distinct": 3, "top_share": 0.6,
                                                "most_common": [["business", 3], ["tech", 1]]}
    assert len(answer_distribution(rows)["most_common"]) == 3  # ten listed at most
    assert answer_distribution([]) == {"rows": 0, "distinct": 0, "top_share": 0.0, "most_common": []}
    with caplog.at_level("WARNING", logger="adaptkit.translora"):
        assert _warn_if_one_answer(answer_distribution(rows)) is True
    assert "teacher: 60% of the 5 distilled rows have one answer ('business')" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="adaptkit.translora"):
        assert _warn_if_one_answer(answer_distribution([{"completion": c} for c in "abab"])) is False  # 50%: not over
        assert _warn_if_one_answer(answer_distribution([{"completion": "only"}])) is False  # one row: no collapse
    assert caplog.text == ""


def test_a_teacher_that_gives_one_answer_for_every_row_is_warned_of(caplog):
    "The collapse the warning exists for (issue 38, item 19): every row the same answer, whitespace folded."
    from adaptkit.translora.transfer import _warn_if_one_answer, answer_distribution
    rows = [{"completion": c} for c in [" business", "business ", "business\n"]]
    with caplog.at_level("WARNING", logger="adaptkit.translora"):
        assert _warn_if_one_answer(answer_distribution(rows)) is True
    assert "teacher: all 3 distilled rows have one answer ('business'): the teacher collapsed" in caplog.text


def test_the_seeds_shared_prefix_and_suffix_are_cut_at_whitespace():
    "`prompt_affixes`: what every seed shares at each end, cut back to whitespace so no word is split."
    from adaptkit.translora.config import prompt_affixes
    seeds = [f"Question: what is {a} plus {b}?\nAnswer:" for a, b in [(1, 2), (13, 4), (5, 16)]]
    assert prompt_affixes(seeds) == ("Question: what is ", "\nAnswer:")  # the suffix starts at its first whitespace
    assert prompt_affixes(["Review: good film. Label:", "Review: bad food. Label:"]) == ("Review: ", " Label:")
    assert prompt_affixes(["same words", "same words"]) == ("same ", "")  # the last word stays the middle
    assert prompt_affixes(["alpha", "beta"]) == ("", "")


def test_a_stage_config_moves_to_the_folder_it_is_given_and_is_otherwise_kept():
    from adaptkit.translora.config import stage_config
    dist = DistillationConfig("mine", max_steps=3)
    assert stage_config(dist, DistillationConfig) is dist and stage_config(dist, DistillationConfig, "mine") is dist
    moved = stage_config(dist, DistillationConfig, "elsewhere")
    assert (moved.output_dir, moved.max_steps, dist.output_dir) == ("elsewhere", 3, "mine")
    assert stage_config(None, DistillationConfig, "x").output_dir == "x"
    assert stage_config(SynthesisConfig(num_synthetic=7), SynthesisConfig, "ignored").num_synthetic == 7


def test_the_filter_keeps_prompts_at_the_threshold_and_accepts_the_bounds():
    class Fixed(Discriminator):
        def score(self, texts, batch_size=16): return [0.5, 0.25, 1.0][:len(texts)]
    disc = Fixed(None, None)
    assert filter_prompts(disc, ["a", "b", "c"], 0.5).kept == ["a", "c"]  # a score equal to the threshold is kept
    assert filter_prompts(disc, ["a", "b", "c"], 1.0).kept == ["c"] and filter_prompts(disc, ["a"], 0.0).kept == ["a"]
    assert filter_prompts(disc, ["a", "b", "c"], 0.5).threshold == 0.5
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\], got 1.5"):
        filter_prompts(disc, ["a"], 1.5)


def test_the_fewshot_prompt_and_the_seed_and_answer_limits():
    "The few-shot prompt follows the config's templates; five seeds suffice; ten answers are listed; two can warn."
    from adaptkit.translora.config import load_seeds
    from adaptkit.translora.synthesis import fewshot_prompt
    from adaptkit.translora.transfer import _warn_if_one_answer, answer_distribution
    cfg = SynthesisConfig(synthesis_template="Inputs:\n{examples}END", example_template="<{prompt}>\n")
    assert fewshot_prompt(["x", "y"], cfg) == "Inputs:\n<x>\n<y>\nEND"
    assert fewshot_prompt(["x"]).endswith("### Input\nx\n\n### Input\n")  # the default templates
    assert load_seeds([f"seed {i}" for i in range(5)]) == [f"seed {i}" for i in range(5)]
    assert len(answer_distribution([{"completion": str(i)} for i in range(12)])["most_common"]) == 10
    assert _warn_if_one_answer(answer_distribution([{"completion": c} for c in "aab"])) is True  # 2 distinct, 67%


def test_the_one_answer_warning_at_the_edges_of_its_share(caplog):
    "Over `ANSWER_SHARE_WARNING` of the rows on one answer warns, the rest one other answer or many; at it, not."
    from adaptkit.translora.transfer import ANSWER_SHARE_WARNING, _warn_if_one_answer, answer_distribution
    def warned(completions):
        caplog.clear()
        with caplog.at_level("WARNING", logger="adaptkit.translora"):
            said = _warn_if_one_answer(answer_distribution([{"completion": c} for c in completions]))
        assert said == bool(caplog.text)
        return said
    assert ANSWER_SHARE_WARNING == 0.5
    assert warned(["7"] * 51 + ["-3"] * 49)  # collapsed onto two answers, the larger just over half
    assert "51% of the 100 distilled rows have one answer ('7')" in caplog.text
    assert warned(["7"] * 99 + ["-3"])  # two answers, one nearly everywhere: the share warning, not the all-rows one
    assert "99% of the 100 distilled rows" in caplog.text and "collapsed" not in caplog.text
    assert warned(["7"] * 51 + [str(i) for i in range(100, 149)])  # one answer over half, the rest all distinct
    assert not warned(["7"] * 50 + ["-3"] * 50)  # exactly half: not over
    assert not warned(["7"] * 50 + [str(i) for i in range(100, 150)])
    assert warned(["7", "7"]) and "all 2 distilled rows have one answer ('7'): the teacher collapsed" in caplog.text
    assert not warned(["7"]) and not warned([])  # one row or none: nothing to judge


def test_discriminator_scores_in_eval_mode_and_gives_the_mode_back(tiny_tok):
    "`Discriminator.score` runs its model in eval mode and leaves it in the mode it was, also when a forward fails."
    model = get_peft_model(tiny_causal_lm(tiny_tok), LoraConfig(r=2, target_modules=["q_proj"])).train()
    disc, seen = Discriminator(model, tiny_tok), []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    assert len(disc.score(["a text", "another text"])) == 2 and seen and not any(seen) and model.training
    hook.remove()
    def fail(module, args): raise RuntimeError("the forward failed")
    model.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="the forward failed"): disc.score(["a text"])
    assert model.training
