"""EMR-Merging integrity (issue 14 item 3) and the artifact contract: inputs checked before any work (safetensors
headers, tensor sets, architecture sizes), the referenced base checked by dtype and shape, a save killed between its
two renames, results recorded in the bundle through a LocalHub round trip, pushes to a branch."""
import json
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
from huggingface_hub import HfApi
from transformers import AutoConfig, LlamaForSequenceClassification
from transformers.utils import logging as hf_logging

from adaptkit.emr import BundleError, EMRBundle, emr_merge
from adaptkit.emr_inputs import _ARCHITECTURE_KEYS
from adaptkit.hub import push_folder
from adaptkit.tensorfiles import SafetensorsHeaderError

hf_logging.disable_progress_bar()
RESULT = {"task": "text-classification", "dataset": "toy", "metric": "accuracy", "value": 0.75}


def classifier(num_labels=2, seed=0, hidden=16, dtype=torch.float32):
    cfg = AutoConfig.for_model("llama", vocab_size=64, hidden_size=hidden, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, num_labels=num_labels, pad_token_id=0,
                               architectures=["LlamaForSequenceClassification"])
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(cfg).to(dtype)


def models(tmp_path, n=2):
    "A base and `n` perturbed copies with their own heads, saved as folders; returns the task -> folder map."
    base = classifier()
    base.save_pretrained(tmp_path / "base")
    for i in range(n):
        m = classifier(2 + i, seed=i + 1)
        m.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in base.state_dict().items() if k != "score.weight"}, strict=False)
        m.save_pretrained(tmp_path / f"ft{i}")
    return {f"t{i}": tmp_path / f"ft{i}" for i in range(n)}


def rewrite_header(path, edit):
    "Rewrite the JSON header of a safetensors file in place through `edit(header)`, keeping the data."
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_a_task_model_missing_a_tensor_fails_at_merge_time(tmp_path):
    tasks = models(tmp_path, 3)
    gone = "model.layers.1.mlp.up_proj.weight"
    sd = LlamaForSequenceClassification.from_pretrained(tasks["t1"]).state_dict()
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items() if k != gone}, tasks["t1"] / "model.safetensors")
    with pytest.raises(ValueError, match=f"task 't1' \\({tasks['t1']}\\) has no tensor '{gone}', which the base and task 't0' have"):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    assert not (tmp_path / "bundle").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("edit, message", [
    (lambda h, k: h[k].update(data_offsets=[-4, h[k]["data_offsets"][1]]), "data_offsets must be two non-negative integers"),
    (lambda h, k: h[k].update(data_offsets=[h[k]["data_offsets"][0], h[k]["data_offsets"][0] + 40]), "hold 40 bytes, shape"),
    (lambda h, k: h[k].update(shape=[h[k]["shape"][0] * 2, *h[k]["shape"][1:]]), "needs"),
])
def test_a_damaged_header_is_named_before_any_work(tmp_path, edit, message):
    tasks = models(tmp_path)
    name = "model.layers.0.self_attn.q_proj.weight"
    rewrite_header(tasks["t1"] / "model.safetensors", lambda h: edit(h, name))
    with pytest.raises(SafetensorsHeaderError, match=f"task 't1': .*ft1/model.safetensors: tensor '{name}': .*{message}"):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("key", _ARCHITECTURE_KEYS)
def test_each_architecture_key_of_the_compatibility_check(tmp_path, key):
    tasks = models(tmp_path)
    cfg = json.loads((tasks["t1"] / "config.json").read_text())
    old = cfg[key]
    cfg[key] = "mistral" if key == "model_type" else old * 2
    (tasks["t1"] / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"different architectures cannot be merged: config {key} is {old!r} for the base, "
                                         f"{old!r} for task 't0', {cfg[key]!r} for task 't1'"):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)


@pytest.mark.parametrize("change, shown", [
    (lambda sd, n: sd | {n: sd[n].bfloat16()}, "('BF16', (32, 16)), ('F32', (32, 16))"),
    (lambda sd, n: sd | {n: sd[n][:16].contiguous()}, "('F32', (16, 16)), ('F32', (32, 16))"),
    (lambda sd, n: {k: v for k, v in sd.items() if k != n}, "None, ('F32', (32, 16))"),
])
def test_the_referenced_base_is_checked_by_dtype_and_shape(hub, tmp_path, change, shown):
    tasks = models(tmp_path)
    push_folder(tmp_path / "base", "team/base", endpoint=hub.endpoint)
    bundle = emr_merge("team/base", tasks, out_dir=tmp_path / "bundle", endpoint=hub.endpoint, progress=False)
    name = "model.layers.0.mlp.up_proj.weight"
    sd = LlamaForSequenceClassification.from_pretrained(tmp_path / "base").state_dict()
    from safetensors.torch import save_file
    (tmp_path / "base2").mkdir()
    save_file({k: v.contiguous() for k, v in change(sd, name).items()}, tmp_path / "base2" / "model.safetensors")
    other = push_folder(tmp_path / "base2", "team/base", endpoint=hub.endpoint)  # another commit of the same repo
    meta = json.loads((bundle.folder / "emr.json").read_text())
    meta["base"]["revision"] = other  # emr.json now points at a base the bundle was not made from
    (bundle.folder / "emr.json").write_text(json.dumps(meta))
    moved = EMRBundle(bundle.folder, endpoint=hub.endpoint)
    with pytest.raises(BundleError, match=f"base team/base@{other}: tensors missing or of another dtype/shape: "
                                          f"\\[\\('{name}', {shown.replace('(', '[(]').replace(')', '[)]')}\\)\\]"):
        moved.task_state_dict("t0")


KILL = """
import os, sys
from pathlib import Path
from adaptkit.emr import emr_merge
root = Path(sys.argv[1])
real = os.rename
def rename(src, dst):  # the process dies between moving the old bundle away and renaming the new one in
    if ".tmp-" in Path(src).name and Path(dst) == root / "bundle": os._exit(9)
    return real(src, dst)
os.rename = rename
emr_merge(root / "base", {"a": root / "ft0", "b": root / "ft1", "c": root / "ft2"}, out_dir=root / "bundle", progress=False)
"""


def test_a_save_killed_between_the_two_renames_leaves_a_recoverable_bundle(tmp_path):
    tasks = models(tmp_path, 3)
    first = emr_merge(tmp_path / "base", {"a": tasks["t0"], "b": tasks["t1"]}, out_dir=tmp_path / "bundle", progress=False)
    rescalers = first.rescalers
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(KILL), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert not (tmp_path / "bundle").exists()
    old = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.old-")]
    new = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.tmp-")]
    assert len(old) == 1 and len(new) == 1
    assert EMRBundle(old[0]).rescalers == rescalers and EMRBundle(new[0]).tasks == ["a", "b", "c"]  # both complete, verified
    with pytest.raises(FileNotFoundError, match=f"an interrupted save left the previous bundle in .*{old[0].name}"):
        EMRBundle.from_pretrained(tmp_path / "bundle")
    again = emr_merge(tmp_path / "base", {"a": tasks["t0"], "c": tasks["t2"]}, out_dir=tmp_path / "bundle", progress=False)
    assert again.tasks == ["a", "c"] and EMRBundle(tmp_path / "bundle").tasks == ["a", "c"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # restored, replaced, leftovers removed


def test_results_travel_with_the_bundle_and_pushes_go_to_a_branch(hub, tmp_path):
    tasks = models(tmp_path)
    push_folder(tmp_path / "base", "team/base", endpoint=hub.endpoint)
    bundle = emr_merge("team/base", tasks, out_dir=tmp_path / "bundle", endpoint=hub.endpoint, progress=False)
    bundle.results = [RESULT]
    commit = bundle.push_to_hub("team/emr", revision="v1", commit_message="first bundle")
    api = HfApi(endpoint=hub.endpoint)
    assert {r.name for r in api.list_repo_refs("team/emr").branches} >= {"main", "v1"}
    assert api.list_repo_commits("team/emr", revision="v1")[0].title == "first bundle"
    pulled = EMRBundle.from_pretrained("team/emr", revision=commit, endpoint=hub.endpoint)
    assert pulled.results == [RESULT] and "0.75" in (pulled.folder / "README.md").read_text()
    assert json.loads((tmp_path / "bundle" / "emr.json").read_text())["results"] == [RESULT]  # recorded in the bundle too
    # a pulled bundle belongs to the HF cache: new results go into a linked copy, the cache's files stay as they were
    cached = (pulled.folder / "emr.json").read_bytes()
    pulled.results = [RESULT | {"value": 0.5}]
    with pytest.warns(FutureWarning, match="deprecated"):
        again = pulled.push_to_hub("team/emr-copy", results=[RESULT | {"value": 0.25}])
    assert (pulled.folder / "emr.json").read_bytes() == cached
    data = api.model_info("team/emr-copy", revision=again).card_data
    assert data.eval_results[0].metric_value == 0.25 and data.base_model == "team/base"
    assert EMRBundle.from_pretrained("team/emr-copy", endpoint=hub.endpoint).results[0]["value"] == 0.25


def test_a_flipped_byte_in_a_pulled_bundle_is_named(hub, tmp_path):
    tasks = models(tmp_path)
    bundle = emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    bundle.push_to_hub("team/emr", endpoint=hub.endpoint)
    pulled = EMRBundle.from_pretrained("team/emr", endpoint=hub.endpoint)
    target = (pulled.folder / "tasks" / "t1" / "own.safetensors").resolve()  # the cache's blob
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0x10
    target.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="tasks/t1/own.safetensors: sha256 .* differs from emr.json's"):
        EMRBundle.from_pretrained("team/emr", endpoint=hub.endpoint)
