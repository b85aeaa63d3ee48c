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
from transformers import LlamaForSequenceClassification
from transformers.utils import logging as hf_logging

from adaptkit.emr import BundleError, EMRBundle, emr_merge
from adaptkit.emr.inputs import _ARCHITECTURE_KEYS  # the keys the compatibility check compares, each tested below
from adaptkit.hub import push_folder
from adaptkit.tensorfiles import SafetensorsHeaderError

hf_logging.disable_progress_bar()
RESULT = {"task": "text-classification", "dataset": "toy", "metric": "accuracy", "value": 0.75}


@pytest.fixture
def models(classifier):
    """`models(tmp_path, n=2)`: a base and `n` perturbed copies with their own heads, saved as folders; returns the
    task -> folder map."""
    def make(tmp_path, n=2):
        base = classifier()
        base.save_pretrained(tmp_path / "base")
        for i in range(n):
            m = classifier(2 + i, seed=i + 1)
            m.load_state_dict(
                {k: v + 0.01 * torch.randn_like(v) for k, v in base.state_dict().items() if k != "score.weight"},
                strict=False,
            )
            m.save_pretrained(tmp_path / f"ft{i}")
        return {f"t{i}": tmp_path / f"ft{i}" for i in range(n)}
    return make


def rewrite_header(path, edit):
    "Rewrite the JSON header of a safetensors file in place through `edit(header)`, keeping the data."
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_a_task_model_missing_a_tensor_fails_at_merge_time(tmp_path, models):
    tasks = models(tmp_path, 3)
    gone = "model.layers.1.mlp.up_proj.weight"
    sd = LlamaForSequenceClassification.from_pretrained(tasks["t1"]).state_dict()
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items() if k != gone}, tasks["t1"] / "model.safetensors")
    with pytest.raises(
        ValueError, match=f"task 't1' \\({tasks['t1']}\\) has no tensor '{gone}', which the base and task 't0' have"
    ):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    assert not (tmp_path / "bundle").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("edit, message", [
    (lambda h, k: h[k].update(data_offsets=[-4, h[k]["data_offsets"][1]]),
     "data_offsets must be two non-negative integers"),
    (lambda h, k: h[k].update(data_offsets=[h[k]["data_offsets"][0], h[k]["data_offsets"][0] + 40]),
     "hold 40 bytes, shape"),
    (lambda h, k: h[k].update(shape=[h[k]["shape"][0] * 2, *h[k]["shape"][1:]]), "needs"),
])
def test_a_damaged_header_is_named_before_any_work(tmp_path, models, edit, message):
    tasks = models(tmp_path)
    name = "model.layers.0.self_attn.q_proj.weight"
    rewrite_header(tasks["t1"] / "model.safetensors", lambda h: edit(h, name))
    with pytest.raises(
        SafetensorsHeaderError, match=f"task 't1': .*ft1/model.safetensors: tensor '{name}': .*{message}"
    ):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    assert not (tmp_path / "bundle").exists()


ARCHITECTURE_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"]


def test_the_compatibility_check_covers_the_architecture_keys():
    # the list below, written out: a key dropped there fails
    assert sorted(_ARCHITECTURE_KEYS) == sorted(ARCHITECTURE_KEYS)


@pytest.mark.parametrize("key", ARCHITECTURE_KEYS)
def test_each_architecture_key_of_the_compatibility_check(tmp_path, models, key):
    tasks = models(tmp_path)
    cfg = json.loads((tasks["t1"] / "config.json").read_text())
    old = cfg[key]
    cfg[key] = "mistral" if key == "model_type" else old * 2
    (tasks["t1"] / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError,
        match=f"different architectures cannot be merged: config {key} is {old!r} for the base, "
        f"{old!r} for task 't0', {cfg[key]!r} for task 't1'",
    ):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)


@pytest.mark.parametrize("change, shown", [
    (lambda sd, n: sd | {n: sd[n].bfloat16()}, "('BF16', (32, 16)), ('F32', (32, 16))"),
    (lambda sd, n: sd | {n: sd[n][:16].contiguous()}, "('F32', (16, 16)), ('F32', (32, 16))"),
    (lambda sd, n: {k: v for k, v in sd.items() if k != n}, "None, ('F32', (32, 16))"),
])
def test_the_referenced_base_is_checked_by_dtype_and_shape(hub, models, tmp_path, change, shown):
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
from adaptkit.emr.merge import emr_merge
root = Path(sys.argv[1])
real = os.rename
def rename(src, dst):  # the process dies between moving the old bundle away and renaming the new one in
    if ".tmp-" in Path(src).name and Path(dst) == root / "bundle": os._exit(9)
    return real(src, dst)
os.rename = rename
emr_merge(root / "base", {"a": root / "ft0", "b": root / "ft1", "c": root / "ft2"}, out_dir=root / "bundle",
          progress=False)
"""


def test_a_save_killed_between_the_two_renames_leaves_a_recoverable_bundle(tmp_path, models):
    tasks = models(tmp_path, 3)
    first = emr_merge(
        tmp_path / "base", {"a": tasks["t0"], "b": tasks["t1"]}, out_dir=tmp_path / "bundle", progress=False
    )
    rescalers = first.rescalers
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(KILL), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert not (tmp_path / "bundle").exists()
    old = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.old-")]
    new = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.tmp-")]
    assert len(old) == 1 and len(new) == 1
    # both complete, verified
    assert EMRBundle(old[0]).rescalers == rescalers and EMRBundle(new[0]).tasks == ["a", "b", "c"]
    with pytest.raises(FileNotFoundError, match=f"an interrupted save left the previous EMRBundle in .*{old[0].name}"):
        EMRBundle.from_pretrained(tmp_path / "bundle")
    again = emr_merge(
        tmp_path / "base", {"a": tasks["t0"], "c": tasks["t2"]}, out_dir=tmp_path / "bundle", progress=False
    )
    assert again.tasks == ["a", "c"] and EMRBundle(tmp_path / "bundle").tasks == ["a", "c"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # restored, replaced, leftovers removed


def test_results_travel_with_the_bundle_and_pushes_go_to_a_branch(hub, models, tmp_path):
    tasks = models(tmp_path)
    push_folder(tmp_path / "base", "team/base", endpoint=hub.endpoint)
    bundle = emr_merge("team/base", tasks, out_dir=tmp_path / "bundle", endpoint=hub.endpoint, progress=False)
    bundle.results = [RESULT]
    commit = bundle.push_to_hub("team/emr", endpoint=hub.endpoint, revision="v1", commit_message="first bundle")
    api = HfApi(endpoint=hub.endpoint)
    assert {r.name for r in api.list_repo_refs("team/emr").branches} >= {"main", "v1"}
    assert api.list_repo_commits("team/emr", revision="v1")[0].title == "first bundle"
    pulled = EMRBundle.from_pretrained("team/emr", revision=commit, endpoint=hub.endpoint)
    assert pulled.results == [RESULT] and "0.75" in (pulled.folder / "README.md").read_text()
    # recorded in the pushed bundle's emr.json too, not in the local bundle (a push does not change the folder)
    assert json.loads((pulled.folder / "emr.json").read_text())["results"] == [RESULT]
    assert json.loads((tmp_path / "bundle" / "emr.json").read_text())["results"] == []
    # a pulled bundle belongs to the HF cache: new results go into a linked copy, the cache's files stay as they were
    cached = (pulled.folder / "emr.json").read_bytes()
    pulled.results = [RESULT | {"value": 0.25}]
    again = pulled.push_to_hub("team/emr-copy", endpoint=hub.endpoint)
    assert (pulled.folder / "emr.json").read_bytes() == cached
    data = api.model_info("team/emr-copy", revision=again).card_data
    assert data.eval_results[0].metric_value == 0.25 and data.base_model == "team/base"
    assert EMRBundle.from_pretrained("team/emr-copy", endpoint=hub.endpoint).results[0]["value"] == 0.25


def test_a_flipped_byte_in_a_pulled_bundle_is_named(hub, models, tmp_path):
    tasks = models(tmp_path)
    bundle = emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    bundle.push_to_hub("team/emr", endpoint=hub.endpoint)
    pulled = EMRBundle.from_pretrained("team/emr", endpoint=hub.endpoint)
    target = (pulled.folder / "tasks" / "t1" / "own.safetensors").resolve()  # the cache's blob
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0x10
    target.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="tasks/t1/own.safetensors: sha256 .* differs from adaptkit.json's"):
        EMRBundle.from_pretrained("team/emr", endpoint=hub.endpoint)


def whole_tensor_formula(bundle, task):
    "A task's weights by the whole-tensor formula `task_state_dict` used before it streamed: base + λ · mask · unified."
    from adaptkit.emr import unpack_mask
    from adaptkit.tensorfiles import DTYPES, TensorFiles
    base, unified = TensorFiles.of_folder(bundle.folder / "base"), TensorFiles.of_folder(bundle.folder / "unified")
    masks, own = (TensorFiles([bundle.folder / "tasks" / task / f"{f}.safetensors"]) for f in ("mask", "own"))
    out = {
        n: torch.addcmul(
            base.read(n).float(),
            unified.read(n).float(),
            unpack_mask(masks.read(n), s["shape"]).float(),
            value=bundle.rescalers[task],
        ).to(DTYPES[s["dtype"]])
        for n, s in bundle.meta["tensors"].items()
    }
    return out | {n: own.read(n) for n in own.specs}


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                                                    b.contiguous().view(-1).view(torch.uint8))


@pytest.mark.parametrize("shape, dtype", [((3, 70001), torch.float32), ((129,), torch.bfloat16),
                                          ((5, 3), torch.float16), ((7,), torch.float64), ((), torch.float32),
                                          ((1,), torch.float32), ((73,), torch.float32), ((0, 4), torch.float32)])
def test_expand_equals_the_whole_tensor_formula_bit_for_bit(monkeypatch, shape, dtype):
    import adaptkit.emr.artifact as emr_artifact
    from adaptkit.emr import pack_mask
    g = torch.Generator().manual_seed(1)
    b, u = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    keep = torch.rand(shape, generator=g) > 0.5
    whole = torch.addcmul(b.float(), u.float(), keep.float(), value=0.37).to(dtype)  # float32, then the tensor's dtype
    for chunk in (72, 1 << 16):
        monkeypatch.setattr(emr_artifact, "_EXPAND_CHUNK", chunk)
        assert same_bits(emr_artifact._expand(b, u, pack_mask(keep), 0.37), whole), chunk
    known = emr_artifact._expand(
        torch.tensor([1.0, 2.0, 3.0]),
        torch.tensor([10.0, -10.0, 4.0]),
        pack_mask(torch.tensor([True, False, True])),
        0.5,
    )
    assert known.tolist() == [6.0, 2.0, 5.0]  # 1 + 0.5·10, 2 (masked out), 3 + 0.5·4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lazily_loaded_task_model_equals_the_whole_tensor_formula_bit_for_bit(tmp_path, classifier, monkeypatch,
                                                                                 dtype):
    import adaptkit.emr.artifact as emr_artifact
    monkeypatch.setattr(emr_artifact, "_EXPAND_CHUNK", 72)  # many steps per tensor, the last ones partial
    base = classifier(dtype=dtype)
    tasks = {}
    for i in range(3):
        m = classifier(2 + i, seed=i + 1, dtype=dtype)
        m.load_state_dict({k: (v.float() + 0.01 * torch.randn(v.shape)).to(dtype) for k, v in base.state_dict().items()
                           if k != "score.weight"}, strict=False)
        tasks[f"t{i}"] = m
    bundle = emr_merge(base, tasks, out_dir=tmp_path / "bundle", progress=False)
    for task in bundle.tasks:
        want = whole_tensor_formula(bundle, task)
        model, eager = bundle.load_task_model(task), bundle.task_state_dict(task)
        got = model.state_dict()
        assert set(got) == set(want) == set(eager) and model.dtype == dtype
        assert [n for n in want if not (same_bits(got[n], want[n]) and same_bits(eager[n], want[n]))] == []
        assert not same_bits(got["model.norm.weight"], base.state_dict()["model.norm.weight"])  # the merge changed it


def test_a_tensor_that_fails_while_loading_is_named(tmp_path, classifier, monkeypatch):
    import adaptkit.emr.artifact as emr_artifact
    bundle = emr_merge(
        classifier(),
        {f"t{i}": classifier(2, seed=i + 1) for i in range(2)},
        out_dir=tmp_path / "bundle",
        progress=False,
    )
    def broken(*a): raise OSError("disk gone")
    monkeypatch.setattr(emr_artifact, "_expand", broken)
    for load in (bundle.load_task_model, bundle.task_state_dict):
        with pytest.raises(OSError, match="disk gone") as e:
            load("t1")
        assert "while computing tensor 'model.embed_tokens.weight' of task 't1'" in e.value.__notes__


# ---- every check EMRBundle makes on a bundle it opens: the failing input, the error and the name it reports ----

def small_bundle(tmp_path):
    "A bundle of two tasks merged from state dicts: tensors w (6, 5) and b (5,) merged, head.weight each task's own."
    g = torch.Generator().manual_seed(0)
    pre = {
        "w": torch.randn(6, 5, generator=g),
        "b": torch.randn(5, generator=g),
        "head.weight": torch.randn(2, 5, generator=g),
    }
    ft = {f"t{i}": {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in pre.items() if k != "head.weight"}
          | {"head.weight": torch.randn(2 + i, 5, generator=g)} for i in range(2)}
    return emr_merge(pre, ft, out_dir=tmp_path / "b", progress=False)


def edit_meta(folder, edit):
    meta = json.loads((folder / "emr.json").read_text())
    edit(meta)
    (folder / "emr.json").write_text(json.dumps(meta))


def replace_weights(folder, rel, tensors):
    "Write `tensors` as the bundle's file `rel` and record its new sha256 (the headers, not the hashes, must catch it)."
    from safetensors.torch import save_file

    from adaptkit.hub import sha256_file
    save_file(tensors, folder / rel)
    edit_meta(folder, lambda m: m["files"].update({rel: sha256_file(folder / rel)}))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("rescale"), r"b/emr.json: field 'rescale' is missing"),
    (lambda m: m.pop("files"), r"b/emr.json: field 'files' is missing"),  # only version 1 may lack files
    (lambda m: m.pop("results"), r"b/emr.json: field 'results' is missing"),
    (lambda m: m.update(own=[]), r"b/emr.json: field 'own' must be a JSON object, got \[\]"),
    (lambda m: m.update(rescale=3), r"b/emr.json: field 'rescale' must be a JSON string, got 3"),
    (lambda m: m.update(version=3), r"format 'adaptkit-emr' version 3, expected 'adaptkit-emr' version 1 or 2"),
    (lambda m: m.update(version="2"), r"format 'adaptkit-emr' version '2', expected"),
    (lambda m: m["tensors"].update(w={"dtype": "Q7", "shape": [6, 5]}),
     r"field 'tensors.w' must be \{'dtype': a safetensors dtype"),
    (lambda m: m["tensors"].update(w={"dtype": "F32", "shape": [6, 5.0]}), r"field 'tensors.w' must be \{'dtype'"),
    (lambda m: m["tensors"].update(w={"dtype": "F32"}), r"field 'tensors.w' must be \{'dtype'"),
    (lambda m: m["own"]["t1"].update({"head.weight": {"dtype": "F32", "shape": "3x5"}}),
     r"field 'own.t1.head.weight' must be"),
    (lambda m: m.update(tasks=["t0", "t1", "t0"]),
     r"field 'rescalers' names tasks \['t0', 't1'\], field 'tasks' \['t0', 't1', 't0'\]"),
    (lambda m: m.update(rescalers={"t0": 1.0, "zz": 1.0}),
     r"field 'rescalers' names tasks \['t0', 'zz'\], field 'tasks' \['t0', 't1'\]"),
    (lambda m: m.update(own={"t0": {}}), r"field 'own' names tasks \['t0'\], field 'tasks' \['t0', 't1'\]"),
    (lambda m: m["sources"].pop("t1"), r"field 'sources' names tasks \['t0'\], field 'tasks' \['t0', 't1'\]"),
    (lambda m: m["rescalers"].update(t1=float("inf")), r"field 'rescalers.t1' must be a finite number, got Infinity"),
    (lambda m: m["rescalers"].update(t1=True), r"field 'rescalers.t1' must be a finite number, got true"),
    (lambda m: m.update(base={"repo_id": "team/base", "revision": "main"}),
     r"field 'base' must be \{'path': 'base'\} or a repo id with a 40-hex revision"),
    (lambda m: m.update(base={"repo_id": "team/base/x", "revision": "a" * 40}), r"field 'base' must be .*team/base/x"),
    (lambda m: m.update(base={"repo_id": "team/base", "revision": "a" * 40, "prefix": "bert"}),
     r"field 'base' must be .*\"prefix\": \"bert\""),
    (lambda m: m["files"].update({"tasks/zz/mask.safetensors": "0" * 64}),
     r"field 'files' names 'tasks/zz/mask.safetensors', not a file of"),
    (lambda m: m["files"].update({"README.md": "0" * 64}), r"field 'files' names 'README.md', not a file of"),
    (lambda m: m["files"].update({"tasks/../emr.json": "0" * 64}),
     r"field 'files' names 'tasks/\.\./emr.json', not a file of"),
    (lambda m: m["files"].update({"unified/model..safetensors": "0" * 64}),  # no '..' anywhere, as in task names
     r"field 'files' names 'unified/model\.\.safetensors', not a file of"),
    (lambda m: m.update(tasks=["t0", "../t1"]),
     r"b/emr.json: field 'tasks\[1\]': invalid task name '\.\./t1': use 1-64 letters"),
    (lambda m: m["files"].update({"unified/model.safetensors": "xyz"}),
     r"field 'files.unified/model.safetensors' must be a hex sha256, got \"xyz\""),
    (lambda m: m.update(results=[{"task": "x"}]),
     r"b/emr.json: field 'results': results\[0\] must be a dict with task, dataset, metric and value"),
    (lambda m: m["tensors"].update(w={"dtype": "I32", "shape": [6, 5]}), r"b/emr.json: merged tensors must be float"),
    (lambda m: m["tensors"].update(w={"dtype": "F32", "shape": [5, 6]}),
     r"b/unified/ does not match emr.json: \[\('w', \('F32', \(6, 5\)\), \('F32', \(5, 6\)\)\)\] \(got, expected\)"),
    (lambda m: m["own"]["t1"].update({"head.weight": {"dtype": "F32", "shape": [9, 5]}}),
     r"b/tasks/t1/own.safetensors does not match emr.json: "
     r"\[\('head.weight', \('F32', \(3, 5\)\), \('F32', \(9, 5\)\)\)\]"),
])
def test_each_field_of_emr_json_is_checked(tmp_path, edit, message):
    folder = small_bundle(tmp_path).folder
    edit_meta(folder, edit)
    with pytest.raises(BundleError, match=message):
        EMRBundle(folder)


@pytest.mark.parametrize("raw, message", [
    (b"\xff\xfe{}", r"b/emr.json: not UTF-8 text \(invalid start byte at byte 0\)"),
    (b"[1, 2]", r"b/emr.json: expected a JSON object, got list"),
    (b'{"format": "adaptkit-emr",', r"b/emr.json: not valid JSON \(.* at line 1, column 27\): truncated or damaged\?"),
])
def test_an_emr_json_that_is_not_a_json_object_is_named(tmp_path, raw, message):
    folder = small_bundle(tmp_path).folder
    (folder / "emr.json").write_bytes(raw)
    with pytest.raises(BundleError, match=message):
        EMRBundle(folder)


@pytest.mark.parametrize("rel, tensors, shown", [
    ("unified/model.safetensors", {"w": torch.zeros(6, 5, dtype=torch.float64), "b": torch.zeros(5)},
     r"b/unified/ does not match emr.json: \[\('w', \('F64', \(6, 5\)\), \('F32', \(6, 5\)\)\)\]"),
    ("base/model.safetensors", {"w": torch.zeros(6, 5), "b": torch.zeros(4)},
     r"b/base/ does not match emr.json: \[\('b', \('F32', \(4,\)\), \('F32', \(5,\)\)\)\]"),
    ("base/model.safetensors", {"w": torch.zeros(6, 5)},
     r"b/base/ does not match emr.json: \[\('b', None, \('F32', \(5,\)\)\)\]"),
    ("tasks/t0/mask.safetensors", {"w": torch.zeros(3, dtype=torch.uint8), "b": torch.zeros(1, dtype=torch.uint8)},
     r"b/tasks/t0/mask.safetensors does not match emr.json: \[\('w', \('U8', \(3,\)\), \('U8', \(4,\)\)\)\]"),
    ("tasks/t1/own.safetensors", {"head.weight": torch.zeros(3, 5), "extra": torch.zeros(1)},
     r"b/tasks/t1/own.safetensors does not match emr.json: \[\('extra', \('F32', \(1,\)\), None\)\]"),
])
def test_each_weight_file_header_is_checked_against_emr_json(tmp_path, rel, tensors, shown):
    folder = small_bundle(tmp_path).folder
    replace_weights(folder, rel, tensors)
    with pytest.raises(BundleError, match=shown):
        EMRBundle(folder)


def test_a_version_1_bundle_opens_with_a_warning_and_gets_checksums_when_saved(tmp_path):
    folder = small_bundle(tmp_path).folder
    want = EMRBundle(folder).task_state_dict("t1")
    edit_meta(folder, lambda m: (m.update(version=1), m.pop("files"), m.pop("results")))
    with pytest.warns(
        UserWarning, match="b: a version 1 EMR bundle records no checksums: its files cannot be verified"
    ):
        old = EMRBundle(folder)
    saved = EMRBundle.from_pretrained(old.save_pretrained(tmp_path / "saved"))
    assert saved.meta["version"] == 2 and sorted(saved.meta["files"]) == sorted(
        ["base/model.safetensors", "unified/model.safetensors"]
        + [f"tasks/t{i}/{f}.safetensors" for i in (0, 1) for f in ("mask", "own")]
    )
    got = saved.task_state_dict("t1")
    assert [n for n in want if not same_bits(got[n], want[n])] == []


def test_results_must_be_a_list_of_result_dicts(tmp_path):
    bundle = small_bundle(tmp_path)
    bundle.results = {"task": "x"}
    with pytest.raises(BundleError, match="EMRBundle.results: results must be a list of dicts, got dict"):
        bundle.model_card()
    bundle.results = [RESULT, {"task": "x", "value": 1}]
    with pytest.raises(
        BundleError,
        match=r"EMRBundle.results: results\[1\] must be a dict with task, dataset, metric and value",
    ):
        bundle.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


def test_a_task_model_needs_a_config_naming_an_architecture(tmp_path):
    bundle = small_bundle(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"task 't0': no config.json naming a transformers architecture \(got None\); use task_state_dict",
    ):
        bundle.load_task_model("t0")
    with pytest.raises(KeyError, match=r"no task 'T0' in this bundle; its tasks: t0, t1"):
        bundle.task_state_dict("T0")


def test_a_task_model_written_once_loads_as_a_plain_checkpoint_and_is_reused(tmp_path, models, monkeypatch):
    import adaptkit.emr.artifact as emr_artifact
    tasks = models(tmp_path, 3)
    bundle = emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "bundle", progress=False)
    want = whole_tensor_formula(bundle, "t1")
    saved = bundle.save_task_model("t1", tmp_path / "t1", max_shard_size="20KB")
    assert len(list(saved.glob("model-*.safetensors"))) > 1 and (saved / "model.safetensors.index.json").is_file()
    plain = LlamaForSequenceClassification.from_pretrained(saved)  # no adaptkit needed to load it
    assert (
        plain.config.num_labels == 3 and [n for n, v in plain.state_dict().items() if not same_bits(v, want[n])] == []
    )
    cached = bundle.load_task_model("t1", cache_dir=tmp_path / "cache")
    [folder] = list((tmp_path / "cache").iterdir())
    assert (
        folder.name == f"t1-{bundle._fingerprint()}"
        and json.loads((folder / "adaptkit.json").read_text())["emr_task"]["task"] == "t1"
    )
    assert [n for n, v in cached.state_dict().items() if not same_bits(v, want[n])] == []
    monkeypatch.setattr(emr_artifact, "_expand", lambda *a: pytest.fail("a cached task model was computed again"))
    again = bundle.load_task_model("t1", cache_dir=tmp_path / "cache")
    assert [n for n, v in again.state_dict().items() if not same_bits(v, want[n])] == []
    monkeypatch.undo()
    edit_meta(bundle.folder, lambda m: m["rescalers"].update(t1=m["rescalers"]["t1"] * 2))  # another bundle, same place
    changed = EMRBundle(bundle.folder)
    changed.load_task_model("t1", cache_dir=tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        [folder.name, f"t1-{changed._fingerprint()}"]
    )
    assert changed._fingerprint() != bundle._fingerprint()


def test_a_task_model_save_that_fails_leaves_nothing(tmp_path, monkeypatch):
    import adaptkit.emr.artifact as emr_artifact
    bundle = small_bundle(tmp_path)
    calls = []
    real = emr_artifact._expand
    def fail_second(*a):
        calls.append(1)
        if len(calls) == 2: raise OSError("disk gone")
        return real(*a)
    monkeypatch.setattr(emr_artifact, "_expand", fail_second)
    with pytest.raises(OSError, match="disk gone") as e:
        bundle.save_task_model("t0", tmp_path / "t0")
    assert e.value.__notes__ == ["while computing tensor 'b' of task 't0'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no folder, no hidden temporary one
    (tmp_path / "mine").mkdir(); (tmp_path / "mine" / "notes.txt").write_text("keep")
    monkeypatch.undo()
    with pytest.raises(FileExistsError, match="mine exists and was not written by adaptkit"):
        bundle.save_task_model("t0", tmp_path / "mine")


def test_hashing_can_be_skipped_but_headers_are_always_checked_and_hidden_files_are_ignored(tmp_path):
    folder = small_bundle(tmp_path).folder
    # hidden files are not part of the bundle (a push skips them too)
    (folder / "unified" / ".DS_Store").write_text("x")
    assert EMRBundle(folder).tasks == ["t0", "t1"]
    raw = bytearray((folder / "tasks" / "t0" / "own.safetensors").read_bytes())
    raw[-1] ^= 1
    (folder / "tasks" / "t0" / "own.safetensors").write_bytes(bytes(raw))
    with pytest.raises(BundleError, match=r"b/tasks/t0/own.safetensors: sha256 .* differs from emr.json's"):
        EMRBundle(folder)
    assert EMRBundle(folder, verify=False).tasks == ["t0", "t1"]  # an expert may skip the hashing
    edit_meta(folder, lambda m: m["tensors"].update(b="F32"))
    with pytest.raises(BundleError, match=r"field 'tensors.b' must be \{'dtype'.*got \"F32\""):
        EMRBundle(folder, verify=False)


def test_a_single_safetensors_file_is_a_model_too(tmp_path):
    from safetensors.torch import save_file
    pre = {"w": torch.zeros(4), "b": torch.ones(2)}
    save_file(pre, tmp_path / "base.safetensors")
    ft = {t: {"w": torch.full((4,), float(i + 1)), "b": torch.ones(2)} for i, t in enumerate("xy")}
    save_file(ft["y"], tmp_path / "y.safetensors")
    bundle = emr_merge(tmp_path / "base.safetensors", {"x": ft["x"], "y": tmp_path / "y.safetensors"}, progress=False)
    assert bundle.meta["sources"]["y"] == {"kind": "full", "path": "y.safetensors"}
    assert bundle.task_state_dict("y")["w"].tolist() == [2.0] * 4  # λ = 2/2: its own weights back


def test_a_tensor_in_another_shape_though_the_configs_agree_is_refused_unless_excluded(tmp_path, models):
    tasks = models(tmp_path)
    name = "model.layers.0.mlp.up_proj.weight"  # [32, 16] in the base
    from safetensors.torch import load_file, save_file
    sd = load_file(tasks["t0"] / "model.safetensors")
    save_file(sd | {name: sd[name].T.contiguous()}, tasks["t0"] / "model.safetensors")
    with pytest.raises(ValueError, match=rf"task 't0': tensor '{name}' has shape \[16, 32\] in .*ft0.*, the base "
                                         rf"\[32, 16\] in .*base.*though their configs agree on every size"):
        emr_merge(tmp_path / "base", tasks, out_dir=tmp_path / "refused", progress=False)
    bundle = emr_merge(tmp_path / "base", tasks, exclude=[name], out_dir=tmp_path / "bundle", progress=False)
    assert load_file(bundle.folder / "tasks" / "t0" / "own.safetensors")[name].shape == (16, 32)  # kept as it is
    assert name not in load_file(bundle.folder / "unified" / "model.safetensors")
