"""`base_provenance`: the one rule for what an artifact records about its base (repo id, commit, local folder),
checked against what a trainer stamps (`ArtifactTrainerMixin._load_base`) for folders, LocalHub repos, objects."""
import pytest

from adaptkit.artifacts import ArtifactTrainerMixin, _named_base
from adaptkit.hub import base_provenance, on_hub, pull, push_folder, source_of
from adaptkit.hub.client import _on_hub
from adaptkit.models import load_base, load_causal_lm, tiny_causal_lm


def _trainer_stamp(base, endpoint=None, base_model=None, base_revision=None) -> dict:
    "What a trainer records for `base` (`_load_base`)."
    trainer = ArtifactTrainerMixin()
    trainer._load_base(base, base_model, base_revision, endpoint)
    return {"base_model": trainer.base_model, "base_revision": trainer.base_revision, "base_path": trainer.base_path}


def _rule(base, endpoint=None, base_model=None, base_revision=None) -> dict:
    "What `base_provenance` records for `base`, read as a trainer reads it."
    model, source = load_base(base, revision=base_revision, endpoint=endpoint)
    return base_provenance(source, endpoint, base_model, base_revision, folder=_named_base(model).get("base_path"))


@pytest.fixture
def pushed(hub, tiny_model_copy):
    "A model folder pushed to a LocalHub (its push record names that Hub): (folder, commit)."
    return tiny_model_copy, push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)


def test_base_provenance_is_what_a_trainer_records_for_every_kind_of_base(hub, pushed, tiny_model_dir, tiny_tok):
    folder, commit = pushed
    snapshot = pull("team/base", endpoint=hub.endpoint)
    cases = [
        (str(tiny_model_dir), None, None, None),  # a plain local folder
        (str(tiny_model_dir), None, "org/named", None),  # ... named by the caller
        (str(folder), None, None, None),  # a folder pushed to another Hub than the one worked with
        (str(folder), hub.endpoint, None, None),  # ... the Hub worked with
        ("team/base", hub.endpoint, None, None),  # a repo id read on a LocalHub
        ("team/base", hub.endpoint, "org/other", None),  # ... named as another repo: no commit of it is known
        ("team/base", hub.endpoint, None, commit),  # ... at the commit asked for
        (str(snapshot), None, None, None),  # a pulled snapshot given as a folder
        (load_causal_lm(folder), None, None, None),  # a model object loaded from the pushed folder: its folder
        (tiny_causal_lm(tiny_tok), None, "org/named", None),  # an object with no folder, named by the caller
    ]
    for base, endpoint, base_model, base_revision in cases:
        assert _rule(base, endpoint, base_model, base_revision) == _trainer_stamp(base, endpoint, base_model,
                                                                                  base_revision), (base, endpoint)


def test_a_repo_is_named_only_on_the_hub_it_was_read_on(hub, pushed):
    folder, commit = pushed
    source = source_of(folder)
    assert source == {"repo_id": "team/base", "revision": commit, "endpoint": hub.endpoint}
    assert base_provenance(source, folder=folder.resolve()) == {
        "base_model": None, "base_revision": None, "base_path": str(folder.resolve())}
    assert base_provenance(source, hub.endpoint) == {"base_model": "team/base", "base_revision": commit,
                                                     "base_path": None}
    read_there = source_of(pull("team/base", endpoint=hub.endpoint))  # a snapshot: its repo at its commit
    assert base_provenance(read_there, hub.endpoint) == {"base_model": "team/base", "base_revision": commit,
                                                         "base_path": None}


def test_on_hub_is_public_and_the_private_name_stays():
    assert _on_hub is on_hub
    assert on_hub({"repo_id": "a/b"}) and not on_hub({"repo_id": "a/b", "endpoint": "http://127.0.0.1:1"})
