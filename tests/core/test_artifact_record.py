"""The core's artifact record (issue 38, items 2 and 12): a folder filled again loses its old record; an adapter built
by its constructor records the base it is on (fingerprint and name, `source.base_path` for a local folder); a trainer on
a local folder records that folder; a wrong-base refusal names a pulled adapter and its base by repo@revision, never a
snapshot hash."""
import re

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import TrainingArguments

from adaptkit.artifacts import AdapterArtifact, ArtifactTrainerMixin
from adaptkit.hub import push_folder, read_metadata, write_metadata
from adaptkit.models import BaseMismatchError, fingerprint, load_causal_lm, load_tokenizer, tiny_causal_lm


def _lora(base):
    "`base` with a LoRA whose B is not zero."
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n: p.normal_(0, 0.1)
    return model


class StandIn(ArtifactTrainerMixin):
    "A trainer's stand-in: the mixin needs `args`, `model`, `is_world_process_zero` and `_artifact`."
    _name, _paper = "stand-in", None
    def __init__(self, out, model, tok):
        self.args = TrainingArguments(str(out), use_cpu=True, report_to="none")
        self.model, self.tok = self._load_base(model), tok
    def is_world_process_zero(self): return True
    def _artifact(self): return self._stamped(AdapterArtifact(_lora(self.model), self.tok))


def test_a_folder_filled_again_loses_its_old_record(tiny_tok, tmp_path):
    "A trainer's final save fills its output folder in place: an earlier run's record must not merge into the new one."
    out = tmp_path / "out"
    out.mkdir()
    stale = {"base_model": "team/stale", "base_revision": "f" * 40, "fingerprint": fingerprint(tiny_causal_lm(
        tiny_tok, seed=7))}
    write_metadata(out, artifact="translora-adapter", source=stale, settings={"old_run": 1}, translora={"counts": {}})
    StandIn(out, tiny_causal_lm(tiny_tok), tiny_tok)._save(str(out))
    record = read_metadata(out)
    assert "translora" not in record and "old_run" not in record["settings"], record
    assert record["source"] == {"base_model": None, "base_revision": None, "base_path": None,
                                "fingerprint": fingerprint(tiny_causal_lm(tiny_tok))}
    AdapterArtifact.from_pretrained(out, base=tiny_causal_lm(tiny_tok))  # its own base: accepted


def test_an_adapter_built_by_its_constructor_records_the_folder_of_its_base(tiny_tok, tiny_model_dir, tmp_path):
    "No base stamped: the base's fingerprint and `source.base_path`, which a refusal names."
    art = AdapterArtifact(_lora(load_causal_lm(tiny_model_dir)), tiny_tok)
    source = read_metadata(art.save_pretrained(tmp_path / "lora"))["source"]
    assert source == {"base_model": None, "base_revision": None, "base_path": str(tiny_model_dir.resolve()),
                      "fingerprint": fingerprint(load_causal_lm(tiny_model_dir))}
    with pytest.raises(BaseMismatchError, match=rf"made on the base {re.escape(str(tiny_model_dir.resolve()))}, but"):
        AdapterArtifact.from_pretrained(tmp_path / "lora", base=tiny_causal_lm(tiny_tok, seed=7))
    loaded = AdapterArtifact.from_pretrained(tmp_path / "lora", base=tiny_model_dir)  # a folder: loaded, checked
    assert read_metadata(loaded.save_pretrained(tmp_path / "again"))["source"] == source  # kept as recorded


def test_a_trainer_on_a_local_folder_records_that_folder(tiny_tok, tiny_model_dir, tmp_path):
    "`source.base_path` is written where the record is made: the trainer's base, read from a folder with no repo id."
    trainer = StandIn(tmp_path / "out", str(tiny_model_dir), tiny_tok)
    assert (trainer.base_model, trainer.base_path) == (None, str(tiny_model_dir.resolve()))
    trainer._save(str(tmp_path / "out"))
    assert read_metadata(tmp_path / "out")["source"]["base_path"] == str(tiny_model_dir.resolve())
    with pytest.raises(BaseMismatchError, match=rf"made on the base {re.escape(str(tiny_model_dir.resolve()))}, but"):
        AdapterArtifact.from_pretrained(tmp_path / "out", base=tiny_causal_lm(tiny_tok, seed=7))
    named = StandIn(tmp_path / "named", tiny_causal_lm(tiny_tok), tiny_tok)  # an unnamed model object: no folder
    assert named.base_path is None


def test_a_wrong_base_refusal_names_a_pulled_adapter_and_its_base_by_repo_at_revision(hub, tiny_tok, tiny_model_copy):
    base_commit = push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)
    base = load_causal_lm("team/base", endpoint=hub.endpoint)  # its name_or_path: a snapshot folder
    adapter = AdapterArtifact(_lora(base), tiny_tok)  # no base stamped: the snapshot names its repo and commit
    commit = adapter.push_to_hub("team/lora", endpoint=hub.endpoint)
    wrong = tiny_causal_lm(tiny_tok, seed=7)
    wrong.config._name_or_path = "team/other-base"
    with pytest.raises(BaseMismatchError) as refusal:
        AdapterArtifact.from_pretrained("team/lora", endpoint=hub.endpoint, base=wrong)
    msg = str(refusal.value)
    assert msg.startswith(f"the adapter 'team/lora@{commit[:12]}' was made on the base team/base@{base_commit[:12]}, "
                          "but the model given ('team/other-base') differs in"), msg
    assert "snapshots" not in msg and not re.search(r"[0-9a-f]{40}", msg)
    pulled = AdapterArtifact.from_pretrained("team/lora", endpoint=hub.endpoint)  # the recorded base, at its commit
    assert (pulled.base_model, pulled.base_revision) == ("team/base", base_commit)


def _trainer(method: str, model_dir, out, **settings):
    "An Aligner (a full model) or PiSSA (an adapter) trainer on the tiny model, untrained, with these settings."
    import datasets

    from adaptkit.aligner import AlignerConfig, AlignerTrainer
    from adaptkit.pissa import PiSSAConfig, PiSSATrainer
    common = dict(max_steps=1, save_strategy="no", use_cpu=True, disable_tqdm=True, report_to="none", **settings)
    tok = load_tokenizer(model_dir)
    if method == "aligner":
        rows = [{"question": f"What is {i} times 2?", "answer": f"{i}", "correction": f"{2 * i}."} for i in range(4)]
        return AlignerTrainer(str(model_dir), AlignerConfig(str(out), identity_warmup_ratio=0.0, **common), rows,
                              processing_class=tok)
    rows = datasets.Dataset.from_list([{"prompt": f"{i} times 2?", "completion": f" {2 * i}."} for i in range(4)])
    return PiSSATrainer(str(model_dir), PiSSAConfig(str(out), pissa_r=2, **common), rows, processing_class=tok)


@pytest.mark.parametrize("method", ["aligner", "pissa"])
def test_a_trainers_card_and_record_say_how_it_was_trained(method, tiny_model_dir, tmp_path, monkeypatch):
    """Two processes (each sees `args.world_size` 2), 3 rows per device, 2 steps of accumulation: 12 rows per step, in
    fp32; in the final save's record and card and in the card `push_to_hub` writes (`create_model_card`)."""
    trainer = _trainer(method, tiny_model_dir, tmp_path / "run", per_device_train_batch_size=3,
                       gradient_accumulation_steps=2)
    monkeypatch.setattr(type(trainer.args), "world_size", property(lambda self: 2))
    trainer.save_model(str(tmp_path / "final"))
    made = {"num_processes": 2, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 2,
            "total_train_batch_size": 12, "precision": "fp32"}
    settings = read_metadata(tmp_path / "final")["settings"]
    assert {k: settings.get(k) for k in made} == made, settings
    trainer.create_model_card()
    for card in (tmp_path / "final" / "README.md", tmp_path / "run" / "README.md"):
        text = card.read_text()
        assert "| `num_processes` | `2` |" in text and "| `total_train_batch_size` | `12` |" in text, text
        assert "| `gradient_accumulation_steps` | `2` |" in text and "| `precision` | `fp32` |" in text


def _settings_section(card: str) -> str:
    "A card's `## Settings` section: its table of the artifact's settings and how it was trained."
    return card.split("## Settings", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("method", ["aligner", "pissa"])
def test_an_artifact_pushed_from_trainer_artifact_says_how_it_was_trained(method, hub, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    """`trainer.artifact().push_to_hub(repo)` (the demo's way) uploads the card `trainer.push_to_hub()` does
    (`create_model_card`): its settings section names the processes, the global batch and the precision."""
    from adaptkit.hub import pull
    trainer = _trainer(method, tiny_model_dir, tmp_path / "run", per_device_train_batch_size=3,
                       gradient_accumulation_steps=2)
    monkeypatch.setattr(type(trainer.args), "world_size", property(lambda self: 2))
    trainer.artifact().push_to_hub("team/pushed", endpoint=hub.endpoint)
    folder = pull("team/pushed", endpoint=hub.endpoint)
    pushed = _settings_section((folder / "README.md").read_text())
    assert "| `num_processes` | `2` |" in pushed and "| `total_train_batch_size` | `12` |" in pushed, pushed
    assert "| `precision` | `fp32` |" in pushed, pushed
    assert read_metadata(folder)["settings"]["precision"] == "fp32"
    trainer.create_model_card()  # what `trainer.push_to_hub()` uploads
    assert _settings_section((tmp_path / "run" / "README.md").read_text()) == pushed
