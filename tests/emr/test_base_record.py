"""What a merged model and an EMR bundle record about their base, by the rule every artifact follows
(`adaptkit.hub.base_provenance`, as a trainer records its base): a repo read on the merge's `endpoint` by its id and
commit; a card never names as `base_model` a repo read on another Hub. Unlike a trainer's, the record of a merge names
no local folder (its `base_path` stays empty: the record is published, see `adaptkit.emr.format`). Bundles written
before keep opening."""
import json

import pytest
import torch
from huggingface_hub import ModelCard

from adaptkit.emr import EMRBundle, MergedModel, emr_merge, merge_models
from adaptkit.hub import push_folder, read_metadata
from adaptkit.models import tiny_causal_lm

NOTHING = (None, None, None)  # no repo id, no commit, no local path


@pytest.fixture
def models(tmp_path, tiny_tok):
    "A tiny causal LM base and two perturbed copies, as folders: (base folder, task -> folder)."
    base = tiny_causal_lm(tiny_tok)
    base.save_pretrained(tmp_path / "base"); tiny_tok.save_pretrained(tmp_path / "base")
    tasks = {}
    for i in range(2):
        torch.manual_seed(i)
        ft = tiny_causal_lm(tiny_tok)
        ft.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in base.state_dict().items()})
        ft.save_pretrained(tmp_path / f"ft{i}")
        tasks[f"t{i}"] = tmp_path / f"ft{i}"
    return tmp_path / "base", tasks


def _base_of(art) -> tuple:
    return art.base_model, art.base_revision, art.base_path


def _recorded(folder) -> tuple:
    "The base a saved artifact's adaptkit.json records, and the `base_model` its card's metadata names."
    source, card = read_metadata(folder)["source"], ModelCard.load(folder / "README.md")
    return (source["base_model"], source["base_revision"], source["base_path"]), card.data.base_model


def test_a_merge_of_a_base_pushed_to_another_hub_names_no_repo(hub, models, tmp_path, trainer_stamp):
    "Before, the folder's push record gave `team/base` as base_model: a huggingface.co repo on the card."
    base, tasks = models
    commit = push_folder(base, "team/base", endpoint=hub.endpoint)
    merged = merge_models(str(base), tasks, method="task_arithmetic", out_dir=tmp_path / "merged", progress=False)
    assert _base_of(merged) == NOTHING and trainer_stamp(str(base))[:2] == (None, None)
    assert _recorded(tmp_path / "merged") == (NOTHING, None)
    assert _base_of(MergedModel.from_pretrained(tmp_path / "merged")) == NOTHING
    assert str(tmp_path) not in (tmp_path / "merged" / "adaptkit.json").read_text()  # no local path published
    there = merge_models(str(base), tasks, method="ties", density=0.5, endpoint=hub.endpoint, progress=False)
    assert _base_of(there) == ("team/base", commit, None)
    assert trainer_stamp(str(base), hub.endpoint)[:2] == ("team/base", commit)


def test_a_merge_of_repos_read_from_a_localhub_records_the_repo_and_commit(hub, models, tmp_path, trainer_stamp):
    base, tasks = models
    commit = push_folder(base, "team/base", endpoint=hub.endpoint)
    repos = {t: f"team/{t}" for t in tasks}
    for t, f in tasks.items(): push_folder(f, repos[t], endpoint=hub.endpoint)
    merged = merge_models("team/base", repos, method="task_arithmetic", endpoint=hub.endpoint,
                          out_dir=tmp_path / "merged", progress=False)
    assert _base_of(merged) == ("team/base", commit, None)
    assert trainer_stamp("team/base", hub.endpoint)[:2] == ("team/base", commit)
    assert _recorded(tmp_path / "merged") == (("team/base", commit, None), ["team/base", "team/t0", "team/t1"])
    bundle = emr_merge("team/base", repos, endpoint=hub.endpoint, out_dir=tmp_path / "bundle", progress=False)
    assert _base_of(bundle) == ("team/base", commit, None)
    assert _recorded(tmp_path / "bundle") == (("team/base", commit, None), "team/base")


def test_a_bundle_of_a_base_pushed_to_another_hub_names_its_repo_only_on_that_hub(hub, models, tmp_path, trainer_stamp):
    base, tasks = models
    commit = push_folder(base, "team/base", endpoint=hub.endpoint)
    bundle = emr_merge(str(base), tasks, out_dir=tmp_path / "bundle", progress=False)
    assert _base_of(bundle) == NOTHING and trainer_stamp(str(base))[:2] == (None, None)
    assert _recorded(tmp_path / "bundle") == (NOTHING, None)
    assert _base_of(EMRBundle(tmp_path / "bundle")) == NOTHING
    assert _base_of(EMRBundle.from_pretrained(tmp_path / "bundle")) == NOTHING
    # the Hub it was pushed to, given: that repo at that commit, as a trainer working with that Hub records it
    there = emr_merge(str(base), tasks, out_dir=tmp_path / "there", endpoint=hub.endpoint, progress=False)
    assert _base_of(there) == ("team/base", commit, None)
    assert trainer_stamp(str(base), hub.endpoint)[:2] == ("team/base", commit)
    assert _recorded(tmp_path / "there") == (("team/base", commit, None), "team/base")
    assert _base_of(EMRBundle(tmp_path / "there", endpoint=hub.endpoint)) == ("team/base", commit, None)
    assert _base_of(EMRBundle(tmp_path / "there")) == NOTHING  # opened without that Hub: no bare repo id


def test_a_bundle_written_before_the_common_record_still_opens(hub, models, tmp_path):
    "A bundle whose adaptkit.json has only its `emr` entry: it opens, and names no repo of another Hub."
    base, tasks = models
    push_folder(base, "team/base", endpoint=hub.endpoint)
    emr_merge(str(base), tasks, out_dir=tmp_path / "bundle", progress=False)
    meta = tmp_path / "bundle" / "adaptkit.json"
    meta.write_text(json.dumps({"emr": read_metadata(tmp_path / "bundle")["emr"]}))
    for opened in (EMRBundle(tmp_path / "bundle"), EMRBundle.from_pretrained(tmp_path / "bundle")):
        assert _base_of(opened) == NOTHING and opened.tasks == ["t0", "t1"]
        assert opened.load_task_model("t0").config.model_type == "llama"
