"""The artifact contract, as a user meets it: every method's artifact goes save -> push -> pull -> use through the same
verbs against a LocalHub, its card is adaptkit's, every trainer's `push_to_hub()` (TRL's habit, through HF_ENDPOINT)
uploads adaptkit's card, and every adapter refuses a base it was not made on."""
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi

import adaptkit
from adaptkit.artifacts import Artifact
from adaptkit.hub import push_folder
from adaptkit.models import BaseMismatchError, tiny_causal_lm

PAPER = {
    "pissa": "2404.02948",
    "aligner": "2402.02416",
    "repnoise": "2405.14577",
    "translora": "2405.17258",
    "emr": "2405.17461",
}


VERBS = ("save_pretrained", "from_pretrained", "push_to_hub")
RECORD_KEYS = {"artifact", "source", "settings", "results", "datasets", "files"}


def artifact_classes() -> list[type]:
    "Every artifact class adaptkit defines: the subclasses of `Artifact`, every module imported first."
    import importlib
    import pkgutil
    for m in pkgutil.walk_packages(adaptkit.__path__, "adaptkit."): importlib.import_module(m.name)
    return _subclasses(Artifact)


def _subclasses(cls: type) -> list[type]:
    "Every subclass of `cls` that adaptkit defines, at any depth."
    found, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("adaptkit.") and sub not in found: found.append(sub); todo.append(sub)
    return found


def _shape(fn) -> list[tuple]:
    """A verb's parameters as (name, kind, default): what a caller relies on (annotations may be strings or types).
    An extra keyword-only option with a default (as transformers' `save_pretrained(..., max_shard_size=)`) is left out:
    every call the contract allows still works."""
    optional = lambda p: p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values() if not optional(p)]


def verb_differences(classes) -> list[str]:
    "Each verb of `classes` whose parameters differ from `Artifact`'s (the contract), named with both shapes."
    return [f"{cls.__name__}.{verb}: {_shape(getattr(cls, verb))} != {_shape(getattr(Artifact, verb))}"
            for cls in classes for verb in VERBS if _shape(getattr(cls, verb)) != _shape(getattr(Artifact, verb))]


def test_every_artifact_has_the_contracts_verbs_with_one_signature():
    "Every artifact class, EMRBundle and the merged models included, is an `Artifact` whose verbs take what it takes."
    classes = artifact_classes()
    names = {c.__name__ for c in classes}
    assert {"PiSSAAdapter", "Aligner", "AlignedPolicy", "ImmunisedModel", "Discriminator", "TransferredAdapter",
            "EMRBundle", "MergedModel"} <= names, names
    assert not verb_differences(classes), verb_differences(classes)


def test_a_verb_with_another_signature_is_named():
    class Odd(Artifact):
        def save_pretrained(self, save_directory, results=None): ...
    class Sharded(Artifact):  # an extra keyword-only option keeps every call the contract allows
        def save_pretrained(self, save_directory, *, max_shard_size="5GB"): ...
    class Required(Artifact):  # a keyword-only parameter without a default breaks them
        def save_pretrained(self, save_directory, *, shards): ...
    assert not verb_differences([Sharded]) and "'shards'" in verb_differences([Required])[0]
    assert verb_differences([Odd]) == [
        f"Odd.save_pretrained: {_shape(Odd.save_pretrained)} != {_shape(Artifact.save_pretrained)}"]
    assert "'results'" in verb_differences([Odd])[0]


def test_every_trainer_takes_model_args_rows_then_the_base_by_keyword():
    "The trainers are called alike: (model, args, train_dataset), then base_model/base_revision/hub_endpoint/hub_token."
    from adaptkit.artifacts import ArtifactTrainerMixin
    artifact_classes()  # every module imported
    # the public trainers: a class built inside a function (translora's GKD trainer, made on first logit-level use with
    # GKD's own signature) is internal, and exists here only when a test that ran earlier in this process made it
    trainers = [c for c in _subclasses(ArtifactTrainerMixin) if "<locals>" not in c.__qualname__]
    assert {"PiSSATrainer", "AlignerTrainer", "RepNoiseTrainer", "TransLoRATrainer"} <= {c.__name__ for c in trainers}
    for cls in trainers:
        params = inspect.signature(cls.__init__).parameters
        positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert positional[:4] == ["self", "model", "args", "train_dataset"], (cls.__name__, positional)
        keyword = {n for n, p in params.items() if p.kind == p.KEYWORD_ONLY}
        assert {"base_model", "base_revision", "hub_endpoint", "hub_token"} <= keyword, (cls.__name__, keyword)


def check_record(folder, kind: str | None) -> dict:
    "The artifact record in `folder`'s adaptkit.json: its kind, source, settings, results and every file's sha256."
    from adaptkit.hub.client import sha256_file
    folder = Path(folder)
    record = json.loads((folder / "adaptkit.json").read_text())
    assert RECORD_KEYS <= set(record) and record["artifact"] == (kind or record["artifact"]), (kind, sorted(record))
    assert {"base_model", "base_revision", "fingerprint"} <= set(record["source"]), record["source"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
               and not any(part.startswith((".", "_")) for part in p.relative_to(folder).parts)}
    assert set(record["files"]) == on_disk - {"adaptkit.json", "README.md"}, (sorted(record["files"]), sorted(on_disk))
    assert all(record["files"][f] == sha256_file(folder / f) for f in record["files"])
    return record


def _pushed_record(hub, repo_id: str, kind: str | None, revision: str | None = None) -> dict:
    "The record of a pushed artifact, checked in a fresh snapshot of the repo."
    from huggingface_hub import snapshot_download
    return check_record(snapshot_download(repo_id, revision=revision, endpoint=hub.endpoint), kind)


@pytest.fixture
def base_repo(hub, tiny_model_copy):
    "The tiny base pushed to the LocalHub (a private copy: a push records itself in the folder): (repo id, commit)."
    return "me/tiny-base", push_folder(tiny_model_copy, "me/tiny-base", endpoint=hub.endpoint)


def _check_card(hub, repo_id: str, method: str, base: str, library: str):
    "The pushed card is adaptkit's for `method` on `base`, and the pushed record is whole."
    _pushed_record(hub, repo_id, None)
    data = HfApi(endpoint=hub.endpoint).model_info(repo_id).card_data
    assert data.library_name == library, data
    assert {"adaptkit", method, f"arxiv:{PAPER[method]}"} <= set(data.tags), data.tags
    assert data.base_model == base


def _pissa_adapter(base_model, tok):
    import tempfile

    from adaptkit.models import fingerprint
    from adaptkit.pissa import PiSSAAdapter, init_pissa, pissa_config
    model = tiny_causal_lm(tok)
    fp = fingerprint(model)
    init = tempfile.mkdtemp()
    pm = init_pissa(model, pissa_config(4, niter=None), init_dir=f"{init}/init")
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n: p.add_(0.05)  # stands in for training: the adapter moved away from its init
    art = PiSSAAdapter(pm, tok, init_dir=f"{init}/init")
    art.base_model, art.base_fingerprint, art.settings = base_model, fp, {"pissa_rank": 4, "lora_rank": 8}
    return art


@pytest.mark.filterwarnings("ignore:init_pissa replaced")
def test_pissa_adapter_round_trip_and_wrong_base(hub, base_repo, tiny_tok, tmp_path):
    art = _pissa_adapter(base_repo[0], tiny_tok)
    ids = tiny_tok(["2 + 2 ="], return_tensors="pt")
    want = art.model(**ids).logits
    art.save_pretrained(tmp_path / "local")
    commit = art.push_to_hub("me/pissa", endpoint=hub.endpoint, revision="v1", commit_message="first")
    assert HfApi(endpoint=hub.endpoint).list_repo_commits("me/pissa", revision="v1")[0].commit_id == commit
    pulled = adaptkit.PiSSAAdapter.from_pretrained("me/pissa", revision="v1", endpoint=hub.endpoint)
    assert torch.allclose(pulled.model(**ids).logits, want, atol=1e-4)  # on the recorded base, pulled by repo id
    local = adaptkit.PiSSAAdapter.from_pretrained(tmp_path / "local", base=tiny_causal_lm(tiny_tok))
    assert torch.allclose(local.model(**ids).logits, want, atol=1e-4)
    art.push_to_hub("me/pissa", endpoint=hub.endpoint)
    _check_card(hub, "me/pissa", "pissa", base_repo[0], "peft")
    with pytest.raises(BaseMismatchError, match=r"made on the base me/tiny-base"):
        adaptkit.PiSSAAdapter.from_pretrained(
            "me/pissa", endpoint=hub.endpoint, revision="v1", base=tiny_causal_lm(tiny_tok, seed=5)
        )
    with pytest.raises(BaseMismatchError, match=r"made on the base me/tiny-base"):  # adaptkit's plain loader checks too
        adaptkit.load_adapter(tiny_causal_lm(tiny_tok, seed=5), "me/pissa", endpoint=hub.endpoint)


def test_aligner_round_trip(hub, base_repo, tiny_tok, tmp_path):
    aligner = adaptkit.Aligner(tiny_causal_lm(tiny_tok), tiny_tok, "Q: {question} A: {answer} Better:")
    aligner.base_model, aligner.settings = base_repo[0], {"identity_warmup_ratio": 0.2}
    want = aligner.correct(["2+2?"], ["5"], max_new_tokens=4)
    commit = aligner.push_to_hub("me/aligner", endpoint=hub.endpoint)
    pulled = adaptkit.Aligner.from_pretrained("me/aligner", endpoint=hub.endpoint, revision=commit)
    assert pulled.template == aligner.template and pulled.correct(["2+2?"], ["5"], max_new_tokens=4) == want
    _check_card(hub, "me/aligner", "aligner", base_repo[0], "transformers")
    aligner.template = "Q: {question} A: {answer} Fixed:"  # a change proposed as a pull request: main keeps its own
    pr = aligner.push_to_hub("me/aligner", endpoint=hub.endpoint, create_pr=True, commit_message="a new template")
    assert pr == "refs/pr/1" and HfApi(endpoint=hub.endpoint).model_info("me/aligner").sha == commit
    proposed = adaptkit.Aligner.from_pretrained("me/aligner", endpoint=hub.endpoint, revision=pr)
    assert proposed.template == aligner.template
    assert adaptkit.Aligner.from_pretrained("me/aligner", endpoint=hub.endpoint).template.endswith("Better:")
    assert HfApi(endpoint=hub.endpoint).get_discussion_details("me/aligner", 1).title == "a new template"
    with pytest.raises(ValueError, match="not a Aligner|not an Aligner|records artifact 'pissa-lora'"):
        _pissa_adapter(base_repo[0], tiny_tok).push_to_hub("me/not-aligner", endpoint=hub.endpoint)
        adaptkit.Aligner.from_pretrained("me/not-aligner", endpoint=hub.endpoint)


# One process trains every trainer in turn (a fresh interpreter's imports cost most of a run): each a function of its
# output folder, its outcome a JSON line (its repo id, or the traceback that its own test then shows).
TRAINER_SCRIPT = """
import json, sys, traceback, datasets
from adaptkit.models import load_tokenizer
{setups}
for method in sys.argv[2:]:
    try:
        trainer = globals()[method](f"{{sys.argv[1]}}/{{method}}-run")
        trainer.train()
        trainer.push_to_hub()
        print(json.dumps({{"method": method, "repo_id": trainer.hub_model_id}}), flush=True)
    except Exception:
        print(json.dumps({{"method": method, "error": traceback.format_exc()}}), flush=True)
"""

TRAINERS = {  # method: (the card's library, the body of `def <method>(out)`, which returns the trainer)
    "pissa": ("peft", """
from adaptkit.pissa import PiSSAConfig, PiSSATrainer
tok = load_tokenizer("me/tiny-base")
rows = datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(8)])
args = PiSSAConfig(out, pissa_r=2, max_steps=1, per_device_train_batch_size=4, use_cpu=True, save_strategy="no",
                   disable_tqdm=True)
return PiSSATrainer("me/tiny-base", args, train_dataset=rows, processing_class=tok)
"""),
    "aligner": ("transformers", """
from adaptkit.aligner import AlignerConfig, AlignerTrainer
tok = load_tokenizer("me/tiny-base")
rows = [{"question": f"what is {i} plus {i}?", "answer": f"{i}", "correction": f"{2 * i}"} for i in range(8)]
args = AlignerConfig(out, max_steps=1, per_device_train_batch_size=4, use_cpu=True, save_strategy="no",
                     disable_tqdm=True)
return AlignerTrainer("me/tiny-base", args, rows, processing_class=tok)
"""),
    "repnoise": ("transformers", """
from adaptkit.repnoise import RepNoiseConfig, RepNoiseTrainer
tok = load_tokenizer("me/tiny-base")
rows = [{"prompt": f"how do I do bad thing {i}?", "harmful": f"step {i}: do it", "harmless": "I can't help with that."}
        for i in range(4)]
args = RepNoiseConfig(out, max_steps=1, per_device_train_batch_size=2, max_length=32, use_cpu=True,
                      save_strategy="no", disable_tqdm=True)
return RepNoiseTrainer("me/tiny-base", args, rows, processing_class=tok)
"""),
}


@pytest.fixture(scope="module")
def trainer_pushes(tiny_model_dir, tmp_path_factory):
    """Each of `TRAINERS` trained a step and pushed by `trainer.push_to_hub()` in one process whose HF_ENDPOINT is a
    LocalHub holding the tiny base as me/tiny-base: (the hub, the base's (repo id, commit), each method's outcome,
    the finished process)."""
    import shutil

    from adaptkit.localhub.server import LocalHub
    root = tmp_path_factory.mktemp("trainer-push")
    with LocalHub(root / "hub") as hub:
        base = shutil.copytree(tiny_model_dir, root / "base")  # a copy: a push records itself in the folder
        base_repo = "me/tiny-base", push_folder(base, "me/tiny-base", endpoint=hub.endpoint)
        script = root / "train.py"
        script.write_text(TRAINER_SCRIPT.format(setups="".join(
            f"\ndef {method}(out):\n{textwrap.indent(textwrap.dedent(setup).strip(), '    ')}\n"
            for method, (_, setup) in TRAINERS.items())))
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
        run = subprocess.run([sys.executable, str(script), str(root), *sorted(TRAINERS)], env=env, capture_output=True,
                             text=True, timeout=600)
        said = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"method": ')]
        yield hub, base_repo, {r["method"]: r for r in said}, run


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_trainer_push_to_hub_writes_adaptkit_card(method, trainer_pushes):
    "TRL's habit: `trainer.push_to_hub()` with HF_ENDPOINT at the LocalHub uploads the artifact with adaptkit's card."
    hub, base_repo, outcomes, run = trainer_pushes
    library, outcome = TRAINERS[method][0], outcomes.get(method, {})
    assert "repo_id" in outcome, outcome.get("error") or f"exit status {run.returncode}: {run.stderr[-3000:]}"
    repo_id = outcome["repo_id"]
    _check_card(hub, repo_id, method, base_repo[0], library)
    files = set(HfApi(endpoint=hub.endpoint).list_repo_files(repo_id))
    assert "adaptkit.json" in files and not any(f.startswith(("_", "checkpoint-")) for f in files), files
    readme = open(HfApi(endpoint=hub.endpoint).hf_hub_download(repo_id, "README.md"), encoding="utf-8").read()
    # the base, pinned by commit
    assert f"at revision `{base_repo[1]}`" in readme, readme[:600]


def test_emr_bundle_round_trip_through_the_contract(hub, tmp_path):
    "An EMR bundle is saved, pushed and pulled with the contract's verbs, its record in adaptkit.json as any other."
    from adaptkit.emr import EMRBundle, emr_merge
    torch.manual_seed(0)
    base = {"w": torch.randn(4, 6), "b": torch.randn(6)}
    tasks = {t: {k: v + 0.1 * torch.randn_like(v) for k, v in base.items()} for t in ("a", "b")}
    bundle = emr_merge(base, tasks, out_dir=tmp_path / "bundle", progress=False)
    check_record(tmp_path / "bundle", "emr-bundle")
    bundle.results = [{"task": "text-classification", "dataset": "toy", "metric": "accuracy", "value": 0.5}]
    saved = bundle.save_pretrained(tmp_path / "copy")
    assert check_record(saved, "emr-bundle")["results"] == bundle.results
    commit = bundle.push_to_hub("me/bundle", endpoint=hub.endpoint, revision="v1")
    pulled = EMRBundle.from_pretrained("me/bundle", endpoint=hub.endpoint, revision="v1")
    assert pulled.tasks == ["a", "b"] and pulled.results == bundle.results
    assert torch.equal(pulled.task_state_dict("a")["w"], bundle.task_state_dict("a")["w"])
    assert _pushed_record(hub, "me/bundle", "emr-bundle", revision="v1")["results"] == bundle.results
    assert HfApi(endpoint=hub.endpoint).model_info("me/bundle", revision="v1").sha == commit
    bundle.results = [{**bundle.results[0], "value": 0.75}]  # proposed as a pull request against v1
    pr = bundle.push_to_hub("me/bundle", endpoint=hub.endpoint, revision="v1", create_pr=True)
    assert pr == "refs/pr/1" and HfApi(endpoint=hub.endpoint).model_info("me/bundle", revision="v1").sha == commit
    assert EMRBundle.from_pretrained("me/bundle", endpoint=hub.endpoint, revision=pr).results[0]["value"] == 0.75
    with pytest.raises(ValueError, match="not a EMRBundle|not an EMR bundle"):
        EMRBundle.from_pretrained(_not_a_bundle(tmp_path))


def _not_a_bundle(tmp_path):
    "A folder holding another artifact kind's record."
    folder = tmp_path / "other"; folder.mkdir()
    (folder / "adaptkit.json").write_text(json.dumps({"artifact": "pissa-adapter"}))
    return folder


def test_a_damaged_file_of_any_artifact_is_named_on_load(hub, base_repo, tiny_tok, tmp_path):
    "Every artifact's record lists each file's sha256: a file changed after saving is named before it is used."
    art = _pissa_adapter(base_repo[0], tiny_tok)
    folder = art.save_pretrained(tmp_path / "pissa")
    weights = folder / "adapter_model.safetensors"
    raw = bytearray(weights.read_bytes()); raw[-1] ^= 1; weights.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=f"{weights}: sha256 .* differs from adaptkit.json's"):
        adaptkit.PiSSAAdapter.from_pretrained(folder, base=tiny_causal_lm(tiny_tok))


def test_an_unknown_method_or_a_missing_base_is_named(tmp_path):
    from adaptkit.artifacts import _load_base_for
    from adaptkit.hub import render_card
    with pytest.raises(TypeError, match=re.escape("method must be a Method (a method package's METHOD, e.g. "
                                                  "adaptkit.pissa.METHOD) or None, got 'lora'")):
        render_card("lora", model_name="x")
    with pytest.raises(ValueError, match=re.escape("my adapter records no base (no repo id, no local folder): pass "
                                                   "base=")):
        _load_base_for({"source": {"fingerprint": "abc"}}, None, "my adapter")


def test_an_adapter_of_a_local_base_loads_on_its_recorded_folder(tiny_tok, tiny_model_copy, tmp_path):
    """A PiSSA conversion of a local base records no repo id, only `base_path`: `from_pretrained` without `base=` loads
    that folder (as PEFT loads a local `base_model_name_or_path`) and checks it; a folder that has gone is named."""
    from adaptkit.hub import read_metadata
    from adaptkit.models import fingerprint, load_causal_lm
    from adaptkit.pissa import PiSSAAdapter, init_pissa, pissa_config
    pm = init_pissa(load_causal_lm(tiny_model_copy), pissa_config(4, niter=None), init_dir=tmp_path / "init")
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n: p.add_(0.05)  # stands in for training
    folder = PiSSAAdapter(pm, tiny_tok, init_dir=tmp_path / "init").save_pretrained(tmp_path / "lora")
    source = read_metadata(folder)["source"]
    assert (source["base_model"], source["base_path"]) == (None, str(tiny_model_copy.resolve()))
    loaded = PiSSAAdapter.from_pretrained(folder)  # no base given: the recorded folder
    assert fingerprint(loaded.model) == source["fingerprint"]
    ids = torch.tensor([[3, 7, 11, 2]])
    with torch.no_grad(): assert torch.allclose(loaded.model(input_ids=ids).logits, pm(input_ids=ids).logits, atol=1e-5)
    tiny_model_copy.rename(tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=re.escape(f"the adapter {str(folder)!r} was made on the local base "
                                                          f"{tiny_model_copy.resolve()}, which no longer exists: "
                                                          "pass base=")):
        PiSSAAdapter.from_pretrained(folder)
    assert PiSSAAdapter.from_pretrained(folder, base=tmp_path / "moved").model is not None  # given: loaded, checked


def test_the_trainer_base_is_stamped_with_the_repo_and_commit_it_was_pulled_at(hub, tiny_tok, tiny_model_dir,
                                                                               tiny_model_copy):
    "`_load_base` stamps the repo id, the commit pulled (only for that repo) and the fingerprint before training."
    from adaptkit.artifacts import AdapterArtifact, ArtifactTrainerMixin, ModelArtifact
    from adaptkit.models import fingerprint, load_causal_lm
    first = push_folder(tiny_model_copy, "me/base", endpoint=hub.endpoint)
    other = tiny_causal_lm(tiny_tok, seed=3)
    other.save_pretrained(tiny_model_copy.parent / "other-weights")
    tiny_tok.save_pretrained(tiny_model_copy.parent / "other-weights")
    push_folder(tiny_model_copy.parent / "other-weights", "me/base", endpoint=hub.endpoint)  # main moves on
    t = ArtifactTrainerMixin()
    model = t._load_base("me/base", base_revision=first, endpoint=hub.endpoint)
    assert (t.base_model, t.base_revision) == ("me/base", first)
    assert t.base_fingerprint == fingerprint(load_causal_lm(tiny_model_dir)) == fingerprint(model)
    t._load_base("me/base", endpoint=hub.endpoint)  # no revision given: the commit main had when pulled
    assert t.base_revision == HfApi(endpoint=hub.endpoint).model_info("me/base").sha != first
    t._load_base("me/base", base_model="team/named", endpoint=hub.endpoint)  # named by hand: no commit of another repo
    assert (t.base_model, t.base_revision) == ("team/named", None)
    t._load_base(other)  # a model object: nothing pulled
    assert (t.base_model, t.base_revision, t.base_fingerprint) == (None, None, fingerprint(other))
    adapter, full = t._stamped(AdapterArtifact(None)), t._stamped(ModelArtifact(None, None))
    assert adapter.base_fingerprint == fingerprint(other) and full.base_fingerprint is None  # full models are changed


def test_an_adapter_goes_on_its_recorded_base_at_its_recorded_commit(hub, tiny_tok, tiny_model_dir, tiny_model_copy,
                                                                     tmp_path):
    "`_load_base_for`: with no `base=`, the recorded repo at the recorded commit; with one, that base as given."
    from adaptkit.artifacts import _load_base_for
    from adaptkit.models import fingerprint, load_causal_lm
    first = push_folder(tiny_model_copy, "me/base", endpoint=hub.endpoint)
    moved = tmp_path / "moved"
    tiny_causal_lm(tiny_tok, seed=5).save_pretrained(moved); tiny_tok.save_pretrained(moved)
    latest = push_folder(moved, "me/base", endpoint=hub.endpoint)
    record = {"source": {"base_model": "me/base", "base_revision": first}}
    assert fingerprint(_load_base_for(record, None, "x", endpoint=hub.endpoint)) == fingerprint(
        load_causal_lm(tiny_model_dir)
    )
    given = _load_base_for(record, "me/base", "x", endpoint=hub.endpoint)  # a base given by hand: its own main
    assert fingerprint(given) == fingerprint(load_causal_lm(moved)) and latest != first


# --- a method is declared once, in its package; every config stands on one base ---

def test_every_method_declares_itself_once_and_its_artifacts_and_trainers_use_it():
    "Each package's METHOD names its paper; its artifacts carry it and its trainers give it to TRL; the hub names none."
    import importlib

    from adaptkit.artifacts import ArtifactTrainerMixin
    from adaptkit.hub import Method, cards
    assert not hasattr(cards, "PAPERS")
    for name, arxiv in PAPER.items():
        method = importlib.import_module(f"adaptkit.{name}").METHOD
        assert isinstance(method, Method) and (method.tag, method.paper["id"]) == (name, arxiv)
        assert method.template.is_file(), method.template
    owner = lambda cls: importlib.import_module(".".join(cls.__module__.split(".")[:2])).METHOD
    with_method = [cls for cls in artifact_classes() if cls.method is not None]
    assert {cls.__name__ for cls in with_method} >= {"PiSSAAdapter", "Aligner", "AlignedPolicy", "ImmunisedModel",
                                                     "Discriminator", "TransferredAdapter", "EMRBundle"}
    assert all(cls.method is owner(cls) for cls in with_method), [c for c in with_method if c.method is not owner(c)]
    from adaptkit.translora.trainer import TransLoRAGKDTrainer  # built on first use
    trainers = _subclasses(ArtifactTrainerMixin)
    assert {t.__name__ for t in trainers} >= {"PiSSATrainer", "AlignerTrainer", "RepNoiseTrainer", "TransLoRATrainer",
                                              TransLoRAGKDTrainer.__name__}
    for t in trainers:
        assert (t._name, t._paper) == (owner(t).name, owner(t).paper) and owner(t).tag in t._tag_names, t


def test_every_method_config_resolves_bf16_and_report_to_on_the_one_base(monkeypatch):
    """Every TrainingArguments adaptkit defines stands on `MethodConfig` (before any TRL or transformers base), which
    asks `default_bf16` once per config; every `SFTConfig` on `SFTMethodConfig` (its `compact_lm_head`)."""
    from transformers import TrainingArguments
    from trl import SFTConfig

    import adaptkit.config
    from adaptkit.config import MethodConfig, SFTMethodConfig
    artifact_classes()  # every module imported
    seen, todo = set(), [TrainingArguments]  # through TRL's configs too
    while todo: todo += [sub for sub in todo.pop().__subclasses__() if sub not in seen and not seen.add(sub)]
    configs = [c for c in seen if c.__module__.startswith("adaptkit.")]
    assert {c.__name__ for c in configs} >= {"PiSSAConfig", "AlignerConfig", "RepNoiseConfig", "DiscriminatorConfig",
                                             "DistillationConfig"}
    calls = []
    monkeypatch.setattr(adaptkit.config, "default_bf16", lambda: calls.append(1) or True)  # as on a GPU with bf16
    for cls in configs:
        mro = cls.__mro__
        assert issubclass(cls, MethodConfig) and all(c.__module__.startswith("adaptkit.")
                                                     for c in mro[:mro.index(MethodConfig)]), cls
        assert issubclass(cls, SFTMethodConfig) == issubclass(cls, SFTConfig), cls
        cfg = cls("x", use_cpu=True)
        assert (cfg.bf16, cfg.report_to) == (False, []), cls  # never bf16 with use_cpu; no tracker unless asked
        assert cls("x", use_cpu=True, report_to="tensorboard").report_to == ["tensorboard"]
    assert len(calls) == 2 * len(configs)
