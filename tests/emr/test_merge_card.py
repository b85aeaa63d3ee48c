"""A merged model's card (issue 48, item 2), as mergekit writes a merge's: the tags `merge` and `mergekit`, every Hub
input a `base_model`, every input named with its revision, and the configuration as YAML. The YAML taken out of the
card and run again (`adaptkit merge`, the command the card gives; `merge_from_config`) makes every tensor again bit for
bit, from local folders and from Hub repos pinned to the commits merged; mergekit runs it too (where its venv is)."""
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import HfApi, ModelCard
from safetensors.torch import load_file

from adaptkit.cli import main
from adaptkit.emr import MergedModel, merge_from_config, merge_models
from adaptkit.hub import push_folder
from adaptkit.models import tiny_causal_lm, tiny_tokenizer

MERGEKIT = Path(__file__).resolve().parents[2] / ".venv-mergekit" / "bin" / "python"
RUN_MERGEKIT = """
import sys, yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions
for config, out in zip(sys.argv[1::2], sys.argv[2::2]):
    run_merge(MergeConfiguration.model_validate(yaml.safe_load(open(config))), out,
              MergeOptions(copy_tokenizer=False, write_model_card=False, quiet=True))
"""  # mergekit-yaml's card asks the Hub whether each local folder is also a repo: offline, not written


def finetuned(base, seed: int):
    "A copy of `base` with every weight moved a little (seeded)."
    g, m = torch.Generator().manual_seed(seed), tiny_causal_lm(num_layers=1)
    m.load_state_dict({k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in base.state_dict().items()})
    return m


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    "A tiny Llama base with its tokenizer and two fine-tuned copies, as folders `base`, `ft0`, `ft1`."
    root, base = tmp_path_factory.mktemp("card"), tiny_causal_lm(num_layers=1)
    base.save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    for i in range(2): finetuned(base, i + 1).save_pretrained(root / f"ft{i}")
    return root


def card_of(folder: Path) -> str: return (folder / "README.md").read_text()


def card_yaml(folder: Path) -> dict:
    "The configuration the card of the merged model in `folder` carries, as YAML."
    blocks = re.findall(r"```yaml\n(.*?)```", card_of(folder), re.S)
    assert len(blocks) == 1, card_of(folder)
    return yaml.safe_load(blocks[0])


def card_command(folder: Path) -> list:
    "The `adaptkit merge` command the card gives, as arguments after `adaptkit`."
    cmd, = re.findall(r"`(adaptkit merge merge\.yaml[^`]*)`", card_of(folder))
    return shlex.split(cmd)[1:]


def tensors(folder: Path) -> dict:
    "Every tensor of every safetensors file in `folder` (the root's shards and each task's own), by file and name."
    return {f"{p.relative_to(folder)}:{k}": v for p in sorted(folder.rglob("*.safetensors")) for k, v in
            load_file(p).items()}


def assert_bitwise_equal(a: Path, b: Path):
    got, want = tensors(b), tensors(a)
    assert want and got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k


@pytest.mark.parametrize("method, kw", [
    ("ties", {"density": 0.5, "scaling": 0.9, "dtype": "bfloat16"}),
    ("dare_linear", {"density": 0.6, "seed": 3, "weight": {"ft0": 0.3, "ft1": 0.7}}),
    ("breadcrumbs", {"weight": [{"filter": "mlp", "value": 0.5}, {"value": 1.0}], "density": 0.8, "gamma": 0.05}),
    ("linear", {"weight": {"ft0": 0.25, "ft1": 0.75}, "exclude": ["lm_head.*"]}),
])
def test_the_cards_yaml_and_command_make_the_merge_again_bit_for_bit(models, tmp_path, monkeypatch, capsys, method,
                                                                     kw):
    merge_models(models / "base", {t: models / t for t in ("ft0", "ft1")}, method=method, out_dir=tmp_path / "first",
                 progress=False, **kw)
    cfg, argv = card_yaml(tmp_path / "first"), card_command(tmp_path / "first")
    assert cfg["merge_method"] == method and cfg["base_model"] == "base"  # a local folder by its name: no path
    assert [m["model"] for m in cfg["models"]] == ["ft0", "ft1"] and str(models) not in card_of(tmp_path / "first")
    assert ("--seed" in argv) == ("seed" in kw) and ("--exclude" in argv) == ("exclude" in kw)
    (tmp_path / "merge.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(models)  # where the folders are, as the card says
    assert main([argv[0], str(tmp_path / "merge.yaml"), *argv[2:], "--output_dir", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    assert_bitwise_equal(tmp_path / "first", tmp_path / "again")
    assert (tmp_path / "first" / "config.json").read_text() == (tmp_path / "again" / "config.json").read_text()
    assert card_yaml(tmp_path / "again") == cfg  # and the re-run's card carries the same configuration


def test_a_merge_from_a_hub_is_pinned_to_the_commits_merged(models, hub, tmp_path):
    "After an input repo moves on, the card's YAML still makes the same merge; the unpinned configuration does not."
    shutil.copytree(models, tmp_path / "models")  # a pushed folder records its repo: not the shared ones
    commits = {n: push_folder(tmp_path / "models" / f, f"team/{n}", endpoint=hub.endpoint)
               for n, f in [("base", "base"), ("ft-0", "ft0"), ("ft-1", "ft1")]}
    given = {"merge_method": "ties", "base_model": "team/base", "parameters": {"density": 0.5},
             "models": [{"model": f"team/ft-{i}", "parameters": {"weight": 1.0}} for i in range(2)]}
    merged = merge_from_config(given, tmp_path / "first", endpoint=hub.endpoint, progress=False)
    cfg = card_yaml(tmp_path / "first")
    assert cfg["base_model"] == f"team/base@{commits['base']}"
    assert [m["model"] for m in cfg["models"]] == [f"team/ft-{i}@{commits[f'ft-{i}']}" for i in range(2)]
    card = card_of(tmp_path / "first")
    assert f"- task `ft-1`: `team/ft-1` at revision `{commits['ft-1']}`" in card
    finetuned(tiny_causal_lm(num_layers=1), 9).save_pretrained(tmp_path / "moved")
    push_folder(tmp_path / "moved", "team/ft-1", endpoint=hub.endpoint)  # the repo moves on
    merge_from_config(cfg, tmp_path / "again", endpoint=hub.endpoint, progress=False)
    assert_bitwise_equal(tmp_path / "first", tmp_path / "again")
    unpinned = merge_from_config(given, endpoint=hub.endpoint, progress=False)
    assert any(not torch.equal(unpinned.state_dict[n], t) for n, t in merged.state_dict.items())

    merged.push_to_hub("team/merged", endpoint=hub.endpoint)
    pushed = HfApi(endpoint=hub.endpoint).model_info("team/merged").card_data
    local = ModelCard.load(tmp_path / "first" / "README.md").data
    for data in (pushed, local):  # huggingface_hub reads it back
        assert {"adaptkit", "merge", "mergekit"} <= set(data.tags)
        assert data.base_model == ["team/base", "team/ft-0", "team/ft-1"] and data.base_model_relation == "merge"


def test_a_merge_of_tensors_in_memory_says_no_configuration_runs_it_again(models, tmp_path):
    from safetensors.torch import load_file as state
    sds = {t: state(models / t / "model.safetensors") for t in ("base", "ft0", "ft1")}
    merge_models(sds["base"], {"a": sds["ft0"], "b": sds["ft1"]}, method="magnitude_prune", density=0.5,
                 out_dir=tmp_path / "m", progress=False)
    card, data = card_of(tmp_path / "m"), ModelCard.load(tmp_path / "m" / "README.md").data
    assert "no configuration can run this merge again" in card and "```yaml" not in card
    assert "merge" in data.tags and "mergekit" not in data.tags  # mergekit has no magnitude_prune
    assert data.base_model is None


def test_task_names_other_than_the_models_are_said(models, tmp_path):
    "DARE draws each task's masks from its name: a configuration that names the tasks otherwise says so."
    merge_models(models / "base", {"x": models / "ft0", "y": models / "ft1"}, method="dare_ties", density=0.5,
                 out_dir=tmp_path / "m", progress=False)
    assert ("It names the tasks after their models (ft0, ft1), where this merge named them x, y; DARE draws each "
            "task's masks from its name, so its masks differ.") in card_of(tmp_path / "m")


MERGEKIT_CASES = {"ties": {"density": 0.5, "weight": {"ft0": 0.4, "ft1": 0.6}},
                  "linear": {"weight": {"ft0": 0.25, "ft1": 0.75}}}


@pytest.fixture(scope="module")
def mergekit_runs(models, tmp_path_factory):
    "Each case merged by adaptkit, then its card's YAML run by mergekit (one process for all: its import is slow)."
    if not MERGEKIT.exists(): pytest.skip(f"mergekit is not installed at {MERGEKIT}")
    work, args = tmp_path_factory.mktemp("mergekit"), []
    for method, kw in MERGEKIT_CASES.items():
        merge_models(models / "base", {t: models / t for t in ("ft0", "ft1")}, method=method,
                     out_dir=work / f"{method}-ours", progress=False, **kw)
        cfg = card_yaml(work / f"{method}-ours")
        if method == "linear":  # as the card says: mergekit's linear averages every model it is given
            assert "For mergekit, remove `base_model`" in card_of(work / f"{method}-ours")
            del cfg["base_model"]
        (work / f"{method}.yaml").write_text(yaml.safe_dump(cfg))
        args += [str(work / f"{method}.yaml"), str(work / f"{method}-theirs")]
    run = subprocess.run([str(MERGEKIT), "-c", RUN_MERGEKIT, *args], cwd=models, capture_output=True, text=True,
                         timeout=1200, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return work


@pytest.mark.parametrize("method", list(MERGEKIT_CASES))
def test_mergekit_runs_the_cards_yaml_to_the_same_merge(mergekit_runs, method):
    ours = MergedModel.from_pretrained(mergekit_runs / f"{method}-ours").state_dict
    theirs = {k.split(":", 1)[1]: v for k, v in tensors(mergekit_runs / f"{method}-theirs").items()}
    assert set(theirs) == set(ours)
    for k, v in theirs.items(): torch.testing.assert_close(ours[k], v, rtol=1e-5, atol=1e-6)
