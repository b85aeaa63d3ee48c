"""`base_provenance`: the one rule for what an artifact records about its base (repo id, commit, local folder),
and what a trainer stamps by it (`ArtifactTrainerMixin._load_base`), for folders, LocalHub repos and model objects."""
from pathlib import Path

import pytest

from adaptkit.artifacts import recorded_base
from adaptkit.hub import base_provenance, on_hub, pull, push_folder, source_of
from adaptkit.models import load_base, load_causal_lm, tiny_causal_lm


def _rule(base, endpoint=None, base_model=None, base_revision=None) -> dict:
    "What `base_provenance` records for `base`, read as a trainer reads it (`recorded_base`)."
    model, source = load_base(base, revision=base_revision, endpoint=endpoint)
    return recorded_base(model, source, endpoint, base_model, base_revision)


@pytest.fixture
def pushed(hub, tiny_model_copy):
    "A model folder pushed to a LocalHub (its push record names that Hub): (folder, commit)."
    return tiny_model_copy, push_folder(tiny_model_copy, "team/base", endpoint=hub.endpoint)


def test_a_trainer_records_each_kind_of_base_by_the_rule(hub, pushed, tiny_model_dir, tiny_tok, trainer_stamp):
    folder, commit = pushed
    snapshot = pull("team/base", endpoint=hub.endpoint)
    local, pushed_there = str(Path(tiny_model_dir).resolve()), str(Path(folder).resolve())
    def rec(model=None, revision=None, path=None): return {"base_model": model, "base_revision": revision,
                                                           "base_path": path}
    cases = [  # (base, endpoint, base_model, base_revision) -> what is recorded
        ((str(tiny_model_dir), None, None, None), rec(path=local)),  # a plain local folder
        ((str(tiny_model_dir), None, "org/named", None), rec("org/named")),  # ... named by the caller
        ((str(folder), None, None, None), rec(path=pushed_there)),  # a folder pushed to another Hub than the one used
        ((str(folder), hub.endpoint, None, None), rec("team/base", commit)),  # ... the Hub worked with
        (("team/base", hub.endpoint, None, None), rec("team/base", commit)),  # a repo id read on a LocalHub
        (("team/base", hub.endpoint, "org/other", None), rec("org/other")),  # named as another repo: no commit of it
        (("team/base", hub.endpoint, None, commit), rec("team/base", commit)),  # ... at the commit asked for
        ((str(snapshot), hub.endpoint, None, None), rec("team/base", commit)),  # a snapshot of that Hub, as a folder
        ((load_causal_lm(folder), None, None, None), rec(path=pushed_there)),  # an object loaded from the folder
        ((load_causal_lm(folder), hub.endpoint, None, None), rec("team/base", commit)),  # ... worked with its Hub
        ((load_causal_lm(tiny_model_dir), None, None, None), rec(path=local)),  # an object from a plain folder
        ((tiny_causal_lm(tiny_tok), None, "org/named", None), rec("org/named")),  # an object with no folder, named
    ]
    for args, want in cases:
        assert _rule(*args) == want, args
        assert dict(zip(want, trainer_stamp(*args))) == want, args


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
    assert on_hub({"repo_id": "a/b"}) and not on_hub({"repo_id": "a/b", "endpoint": "http://127.0.0.1:1"})
