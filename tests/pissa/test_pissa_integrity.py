"""No silent wrong model (issue 38, items 1, 2, 15 and 16): every path that puts a PiSSA adapter on a base checks that
base (and the adapter's files) in the core's one check; every artifact built by its constructor records its base and
keeps what its own files recorded; every PiSSA path that writes an adapter writes adaptkit's card; the record, the
card and the adapter's config agree on rank and alpha, and stock peft reproduces the trained model."""
import json
import re
import warnings

import datasets
import pytest
import torch
from huggingface_hub import ModelCard
from peft import LoraConfig, PeftModel, get_peft_model

from adaptkit.artifacts import ModelArtifact
from adaptkit.hub import pull, push_folder, read_metadata, write_metadata
from adaptkit.models import BaseMismatchError, fingerprint, load_causal_lm, load_tokenizer, tiny_causal_lm
from adaptkit.pissa import (
    PiSSAAdapter,
    PiSSAConfig,
    PiSSATrainer,
    init_pissa,
    load_pissa_adapter,
    pissa_config,
    qpissa_error,
    qpissa_round_errors,
    quantization_error,
    save_pissa_as_lora,
    save_pissa_residual,
)


def _named(tok, name="team/base", seed=0):
    "A tiny model that names itself `name`, as one loaded from the Hub does."
    model = tiny_causal_lm(tok, seed=seed)
    model.config._name_or_path = name
    return model


def _trained(tok, init_dir, steps=3, **kw):
    "A PiSSA model of `_named(tok)` after a few AdamW steps (its change B A - B0 A0 is not zero)."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = init_pissa(_named(tok), pissa_config(4), init_dir=init_dir, **kw)
    ids = tok(["one plus two equals three", "two plus two equals four"], return_tensors="pt", padding=True)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        pm(**ids, labels=ids["input_ids"]).loss.backward(); opt.step(); opt.zero_grad()
    return pm.eval()


def _logits(model, tok):
    with torch.no_grad(): return model(**tok(["one plus two"], return_tensors="pt")).logits


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # the last tensor's values (the header stays valid)
    path.write_bytes(bytes(data))


# --- item 1: load_pissa_adapter checks the base, in the core's one check ------------------------------------------

def test_load_pissa_adapter_refuses_a_wrong_base_and_the_initial_adapter_on_the_untouched_base(tiny_tok, tmp_path):
    pm = _trained(tiny_tok, tmp_path / "init")
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    wrong = tiny_causal_lm(tiny_tok, seed=7)  # the same shapes, other weights
    with pytest.raises(BaseMismatchError, match=r"lora' was made on the base team/base, .* differs in"):
        load_pissa_adapter(wrong, lora)
    with pytest.raises(BaseMismatchError, match=r"init is PiSSA's initial adapter: it goes on the residual model"):
        load_pissa_adapter(tiny_causal_lm(tiny_tok), tmp_path / "init")
    loaded = load_pissa_adapter(tiny_causal_lm(tiny_tok), lora)  # its own base: the trained model's outputs
    assert torch.allclose(_logits(loaded, tiny_tok), _logits(pm, tiny_tok), atol=1e-5)
    with pytest.warns(UserWarning, match="differs in"):  # told to, it loads anyway, with a warning
        load_pissa_adapter(tiny_causal_lm(tiny_tok, seed=7), lora, ignore_base_mismatch=True)


def test_load_pissa_adapter_checks_the_files_of_every_pissa_folder(tiny_tok, tmp_path):
    "The plain LoRA, the official layout's adapter and the initial adapter record their files' sha256s; a flip fails."
    pm = _trained(tiny_tok, tmp_path / "init")
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init")
    official = save_pissa_residual(pm, tmp_path / "official")
    residual = load_causal_lm(official / "residual_model")
    load_pissa_adapter(residual, official / "pissa_adapter")  # on its residual model: accepted
    with pytest.raises(BaseMismatchError, match=r"trained on a residual model .* this base is not that residual"):
        load_pissa_adapter(tiny_causal_lm(tiny_tok), official / "pissa_adapter")
    for folder in (lora, official / "pissa_adapter"):
        _flip_a_byte(folder / "adapter_model.safetensors")
        with pytest.raises(ValueError, match=r"adapter_model.safetensors: sha256 .* the file was altered or damaged"):
            load_pissa_adapter(tiny_causal_lm(tiny_tok), folder, ignore_base_mismatch=True)
    _flip_a_byte(tmp_path / "init" / "adapter_model.safetensors")  # the conversion reads it: refused before writing
    with pytest.raises(ValueError, match=r"init.adapter_model.safetensors: sha256 .* altered or damaged"):
        save_pissa_as_lora(pm, tmp_path / "again", init_dir=tmp_path / "init")
    assert not (tmp_path / "again").exists()


def test_the_residual_adapter_of_an_older_record_is_still_checked(tiny_tok, tmp_path):
    "A residual adapter whose record has no `source` (written before it had one) is checked by its PiSSA record."
    pm = _trained(tiny_tok, tmp_path / "init")
    official = save_pissa_residual(pm, tmp_path / "official")
    record = read_metadata(official / "pissa_adapter")
    (official / "pissa_adapter" / "adaptkit.json").write_text(json.dumps({"pissa": record["pissa"]}))
    with pytest.raises(BaseMismatchError, match=r"this base is not that residual"):
        load_pissa_adapter(tiny_causal_lm(tiny_tok), official / "pissa_adapter")
    load_pissa_adapter(load_causal_lm(official / "residual_model"), official / "pissa_adapter")


# --- item 2: a record merges, never overwrites; every artifact's constructor path records its base -----------------

def test_a_pissa_adapter_built_by_its_constructor_records_the_untouched_base_and_refuses_another(tiny_tok, tmp_path):
    pm = _trained(tiny_tok, tmp_path / "init")
    folder = PiSSAAdapter(pm, tiny_tok, init_dir=tmp_path / "init").save_pretrained(tmp_path / "adapter")
    source = read_metadata(folder)["source"]
    assert source["fingerprint"] == fingerprint(tiny_causal_lm(tiny_tok)) and source["base_model"] == "team/base"
    assert ModelCard.load(folder / "README.md").data.base_model == "team/base"
    with pytest.raises(BaseMismatchError, match="differs in"):
        PiSSAAdapter.from_pretrained(folder, base=tiny_causal_lm(tiny_tok, seed=7))
    loaded = PiSSAAdapter.from_pretrained(folder, base=tiny_causal_lm(tiny_tok))
    assert torch.allclose(_logits(loaded.model, tiny_tok), _logits(pm, tiny_tok), atol=1e-5)
    again = loaded.save_pretrained(tmp_path / "again")  # a loaded adapter saved again keeps its base
    assert read_metadata(again)["source"] == source


def test_a_record_merges_what_the_artifact_wrote_with_the_common_record(tiny_tok, tmp_path):
    "What `_write` recorded stays unless the artifact itself knows better (a value of its own, not None)."
    class Noted(ModelArtifact):
        kind = "noted"
        def _write(self, folder):
            super()._write(folder)
            write_metadata(folder, source={"base_model": "team/written", "fingerprint": {"w": 1}, "base_path": "/b"},
                           settings={"written": 1, "both": "written"})

    art = Noted(tiny_causal_lm(tiny_tok), tiny_tok)
    art.base_revision, art.settings = "abc", {"both": "own", "own": 2}
    record = read_metadata(art.save_pretrained(tmp_path / "a"))
    assert record["source"] == {"base_model": "team/written", "base_revision": "abc", "fingerprint": {"w": 1},
                                "base_path": "/b"}
    assert record["settings"] == {"written": 1, "both": "own", "own": 2}
    art.base_model = "team/own"
    assert read_metadata(art.save_pretrained(tmp_path / "b"))["source"]["base_model"] == "team/own"


def _lora(tok, seed=0):
    "A tiny base with a LoRA whose B is not zero (it changes the outputs)."
    model = get_peft_model(tiny_causal_lm(tok, seed=seed), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n: p.normal_(0, 0.1)
    return model


def _artifacts(tok, tmp_path):
    "name -> a zero-argument factory of that artifact, built by its constructor (no trainer)."
    from adaptkit.aligner import AlignedPolicy, Aligner
    from adaptkit.repnoise import ImmunisedModel
    from adaptkit.translora import Discriminator, TransferredAdapter

    def pissa():
        return PiSSAAdapter(_trained(tok, tmp_path / "pissa-init"), tok, init_dir=tmp_path / "pissa-init", rank=3)

    return {
        "Aligner": lambda: Aligner(tiny_causal_lm(tok), tok),
        "AlignedPolicy": lambda: AlignedPolicy(tiny_causal_lm(tok), tok),
        "ImmunisedModel": lambda: ImmunisedModel(tiny_causal_lm(tok), tok),
        "Discriminator": lambda: Discriminator(_lora(tok), tok),
        "TransferredAdapter": lambda: TransferredAdapter(_lora(tok), tok,
                                                         counts=dict(seeds=2, synthetic=2, kept=2, distilled=2)),
        "PiSSAAdapter": pissa,
    }


ARTIFACTS = ["Aligner", "AlignedPolicy", "ImmunisedModel", "Discriminator", "TransferredAdapter", "PiSSAAdapter"]
ADAPTERS = ["Discriminator", "TransferredAdapter", "PiSSAAdapter"]


@pytest.mark.parametrize("name", ARTIFACTS)
def test_every_artifact_built_by_its_constructor_keeps_what_it_wrote_and_records_its_base(tiny_tok, tmp_path, name):
    art = _artifacts(tiny_tok, tmp_path)[name]()
    art.base_revision, art.settings, art.datasets = "0" * 40, {"seed": 1}, ["tiny-rows"]
    (scratch := tmp_path / "scratch").mkdir()
    art._write(scratch)  # what the artifact's own files record, before the common record joins it
    written = read_metadata(scratch)
    record = read_metadata(art.save_pretrained(tmp_path / "saved"))
    for key, value in written.items():
        if isinstance(value, dict) and key in ("source", "settings"):
            assert {k: v for k, v in value.items() if v is not None}.items() <= record[key].items(), key
        else: assert record[key] == value, key
    assert record["artifact"] == art.kind and record["source"]["base_revision"] == "0" * 40
    assert (record["settings"]["seed"], record["datasets"]) == (1, ["tiny-rows"])
    assert record["files"] and "README.md" not in record["files"]
    if name in ADAPTERS:  # an adapter records the base it goes on, and refuses another on load
        assert record["source"]["fingerprint"] == fingerprint(tiny_causal_lm(tiny_tok))
        with pytest.raises(BaseMismatchError, match="differs in"):
            type(art).from_pretrained(tmp_path / "saved", base=tiny_causal_lm(tiny_tok, seed=7))
        type(art).from_pretrained(tmp_path / "saved", base=tiny_causal_lm(tiny_tok))


def test_a_merged_model_and_an_emr_bundle_keep_their_records(tiny_tok, tmp_path):
    "The EMR artifacts, built from state dicts: the record keeps their own key beside the common one."
    from adaptkit.emr import emr_merge
    base = tiny_causal_lm(tiny_tok)
    tuned = {t: {k: v + 0.01 * torch.randn_like(v) for k, v in base.state_dict().items()} for t in ("a", "b")}
    bundle = emr_merge(base.state_dict(), tuned, out_dir=tmp_path / "bundle", progress=False)
    bundle.base_model, bundle.datasets = "team/base", ["tiny-rows"]
    record = read_metadata(bundle.save_pretrained(tmp_path / "saved"))
    assert record["artifact"] == bundle.kind and record["emr"]["tasks"] == ["a", "b"]
    assert record["source"]["base_model"] == "team/base" and record["datasets"] == ["tiny-rows"]


# --- item 15: every path that writes a PiSSA adapter writes adaptkit's card; QPiSSA's rank is checked -----------------

@pytest.mark.parametrize("rank", ["exact", 3])
def test_save_pissa_as_lora_writes_adaptkits_card_with_its_base_and_error(tiny_tok, tmp_path, rank):
    pm = _trained(tiny_tok, tmp_path / "init")
    lora = save_pissa_as_lora(pm, tmp_path / "lora", init_dir=tmp_path / "init", rank=rank)
    card, record = ModelCard.load(lora / "README.md"), read_metadata(lora)
    assert card.data.base_model == "team/base" and card.data.library_name == "peft"
    assert {"adaptkit", "pissa"} <= set(card.data.tags)
    conversion = record["pissa"]
    if rank == "exact":
        assert "rank 8 and alpha 8" in card.text and "Exact: the trained change" in card.text
    else:
        assert "**rank 3 (alpha 3, scaling 1)**" in card.text
        assert f"**max {conversion['conversion_error_max']:.3g}, mean {conversion['conversion_error_mean']:.3g}**" \
            in card.text and conversion["conversion_error_max"] > 0
    assert "| seed | 0 |" in card.text  # the initialisation table, from the initial adapter's record
    assert set(record["files"]) == {"adapter_config.json", "adapter_model.safetensors"}


@pytest.mark.parametrize("r", [0, -1, 6])
def test_qpissa_refuses_a_rank_of_zero_or_above_the_smaller_side(r):
    w = torch.randn(8, 5)
    message = re.escape(f"r must be between 1 and 5 for a (8, 5) weight, got {r}")
    with pytest.raises(ValueError, match=message):
        qpissa_round_errors(w, r)
    with pytest.raises(ValueError, match=message):
        qpissa_error(w, r)
    assert len(qpissa_round_errors(w, 5, iters=2)) == 2 and qpissa_round_errors(w, 1)[0] > 0  # the bounds: accepted


def test_quantization_error_names_the_layer_a_rank_does_not_fit(tiny_tok):
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj: r must be between 1 and \d+ for a"):
        quantization_error(tiny_causal_lm(tiny_tok), r=10_000)


# --- item 16: the record, the card and the pushed config agree; stock peft reproduces the trained model -------------

def _settings_row(card: str, key: str) -> str:
    return re.search(rf"^\| `{key}` \| `(.*?)` \|$", card, re.M).group(1)  # the card's settings table


@pytest.mark.parametrize("rank, lora_r", [("exact", 8), (3, 3), (8, 8)])
def test_record_card_and_pushed_config_agree_on_rank_and_alpha_and_stock_peft_reproduces_the_model(
    hub, tiny_model_dir, tiny_model_copy, tmp_path, rank, lora_r
):
    commit = push_folder(tiny_model_copy, "team/tiny-base", endpoint=hub.endpoint)  # a push writes its record there
    rows = datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(8)])
    tok = load_tokenizer(tiny_model_dir)
    args = PiSSAConfig(str(tmp_path / "out"), pissa_r=4, pissa_lora_rank=rank, max_steps=2, learning_rate=1e-2,
                       per_device_train_batch_size=4, save_strategy="no", disable_tqdm=True, use_cpu=True,
                       report_to="none")
    trainer = PiSSATrainer("team/tiny-base", args, train_dataset=rows, processing_class=tok, hub_endpoint=hub.endpoint)
    trainer.train()
    trainer.artifact().push_to_hub("team/tiny-pissa", endpoint=hub.endpoint)
    folder = pull("team/tiny-pissa", endpoint=hub.endpoint)
    config, record = json.loads((folder / "adapter_config.json").read_text()), read_metadata(folder)
    card = (folder / "README.md").read_text()
    assert (config["r"], config["lora_alpha"]) == (lora_r, lora_r)  # exact: both doubled; k: scaling 1
    assert (record["pissa"]["lora_rank"], record["pissa"]["lora_alpha"]) == (lora_r, lora_r)
    assert (record["settings"]["lora_rank"], record["settings"]["lora_alpha"]) == (lora_r, lora_r)
    assert (_settings_row(card, "lora_rank"), _settings_row(card, "lora_alpha")) == (str(lora_r), str(lora_r))
    said = re.search(r"\*\*rank (\d+)(?: and alpha |\s*\(alpha )(\d+)", card)
    assert (int(said.group(1)), int(said.group(2))) == (lora_r, lora_r)  # the card's sentence

    base = load_causal_lm("team/tiny-base", endpoint=hub.endpoint, revision=commit)  # untouched, from the hub
    plain = PeftModel.from_pretrained(base, folder).eval()  # stock peft, no adaptkit check
    trained = _logits(trainer.model.eval(), tok)
    if lora_r == 8: assert torch.allclose(_logits(plain, tok), trained, atol=1e-4)  # rank 2r holds the whole change
    else:  # a lower rank approximates it: closer to the trained model than the untouched base is
        with plain.disable_adapter(): far = (_logits(plain, tok) - trained).abs().max()
        assert (_logits(plain, tok) - trained).abs().max() < far
