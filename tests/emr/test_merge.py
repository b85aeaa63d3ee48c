"""EMR-Merging across modules: a bundle pushed to and pulled from a LocalHub with its base referenced by commit, sharded
folders, real transformers models (Llama classifiers, GPT-2 with fan_in_fan_out LoRA), bf16, exactness against the
official dense code, each input tensor read once, bounded memory, and a merge killed halfway."""
import json
import math
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from huggingface_hub import HfApi
from transformers import AutoConfig, GPT2LMHeadModel, LlamaForSequenceClassification
from transformers.utils import logging as hf_logging

import adaptkit.emr.elect as elect
import adaptkit.emr.stream as stream
from adaptkit.emr import EMRBundle, MergedModel, emr_merge, pack_mask, task_arithmetic, ties_merge, unpack_mask
from adaptkit.hub import push_folder
from adaptkit.tensorfiles import SafetensorsHeaderError, TensorFiles

hf_logging.disable_progress_bar()


@pytest.fixture
def finetune(classifier):
    """`finetune(base, num_labels, seed, sparsity=0.0)`: a 'fine-tuned' copy of `base`, perturbed weights (a `sparsity`
    fraction of them untouched) and its own head."""
    def tuned(base, num_labels, seed, sparsity=0.0):
        m = classifier(num_labels, seed=seed, dtype=next(base.parameters()).dtype)
        g = torch.Generator().manual_seed(seed)
        sd = {}
        for k, v in base.state_dict().items():
            if k == "score.weight": continue
            d = torch.randn(v.shape, generator=g) * 0.01 * (torch.rand(v.shape, generator=g) >= sparsity)
            sd[k] = (v.float() + d).to(v.dtype)
        m.load_state_dict(sd, strict=False)
        return m
    return tuned


def official(pre: dict, fts: list[dict], names: list[str]):
    "The official 8-task EMR code, dense: unified vectors, masks and rescalers from whole state dicts."
    tvs = [{n: ft[n].float() - pre[n].float() for n in names} for ft in fts]
    uni, masks, scales, new_scales = {}, {}, torch.zeros(len(fts)), torch.zeros(len(fts))
    for n in names:
        flag = (torch.stack([tv[n] for tv in tvs]).mean(0) > 0) * 2 - 1
        param_max, masks[n] = torch.zeros_like(tvs[0][n]), []
        for m in range(len(tvs)):
            mask = (tvs[m][n] * flag) > 0
            masks[n].append(mask)
            param_abs = torch.abs(mask * tvs[m][n])
            param_max = torch.where(param_abs > param_max, param_abs, param_max)
            scales[m] += torch.mean(torch.abs(tvs[m][n]))
        uni[n] = param_max * flag
    for m in range(len(tvs)):
        for n in names: new_scales[m] += torch.mean(torch.abs(uni[n] * masks[n][m]))
    return uni, masks, scales / new_scales


def test_push_pull_through_localhub_with_base_by_commit(hub, classifier, finetune, tmp_path):
    base = classifier()
    base.save_pretrained(tmp_path / "base")
    base_commit = push_folder(tmp_path / "base", "team/base", endpoint=hub.endpoint)
    commits = {}
    for i, n in enumerate([2, 3, 4]):
        finetune(base, n, seed=i + 1).save_pretrained(tmp_path / f"ft{i}")
        commits[f"t{i}"] = push_folder(tmp_path / f"ft{i}", f"team/ft-{i}", endpoint=hub.endpoint)
    bundle = emr_merge("team/base", {f"t{i}": f"team/ft-{i}" for i in range(3)}, endpoint=hub.endpoint,
                       out_dir=tmp_path / "bundle", progress=False)
    meta = json.loads((tmp_path / "bundle" / "emr.json").read_text())
    assert meta["base"] == {"repo_id": "team/base", "revision": base_commit}
    assert not (tmp_path / "bundle" / "base").exists()  # referenced, not copied
    assert meta["sources"]["t1"] == {"kind": "full", "repo_id": "team/ft-1", "revision": commits["t1"]}

    bundle.results = [{"task": "text-classification", "dataset": "toy", "metric": "accuracy", "value": 0.75}]
    commit = bundle.push_to_hub("team/emr", endpoint=hub.endpoint)
    data = HfApi(endpoint=hub.endpoint).model_info("team/emr").card_data
    assert (data.base_model, data.library_name, data.pipeline_tag) == (
        "team/base",
        "transformers",
        "text-classification",
    )
    assert {"adaptkit", "emr", "arxiv:2405.17461"} <= set(data.tags) and data.eval_results[0].metric_value == 0.75

    pulled = EMRBundle.from_pretrained("team/emr", revision=commit, endpoint=hub.endpoint)
    assert (pulled.tasks, pulled.rescalers, pulled.results) == (bundle.tasks, bundle.rescalers, bundle.results)
    card = (pulled.folder / "README.md").read_text()
    assert base_commit in card and commits["t2"] in card and "team/ft-2" in card
    ids = torch.tensor([[1, 5, 9, 3]])
    for task, labels in zip(pulled.tasks, [2, 3, 4]):
        model = pulled.load_task_model(task)
        assert model.config.num_labels == labels
        assert torch.equal(model(ids).logits, bundle.load_task_model(task)(ids).logits)


def test_sharded_folders_equal_state_dicts_and_official_code(tmp_path, classifier, finetune):
    base = classifier()
    fts = [finetune(base, 2, seed=s, sparsity=0.3) for s in (1, 2, 3, 4)]
    base.save_pretrained(tmp_path / "base", max_shard_size="8KB")
    for i, m in enumerate(fts): m.save_pretrained(tmp_path / f"ft{i}", max_shard_size="8KB")
    assert (tmp_path / "ft0" / "model.safetensors.index.json").exists()
    from_folders = emr_merge(tmp_path / "base", {f"t{i}": tmp_path / f"ft{i}" for i in range(4)}, exclude=["score.*"],
                             out_dir=tmp_path / "a", max_shard_size="10KB", progress=False)
    from_memory = emr_merge(base, {f"t{i}": m for i, m in enumerate(fts)}, exclude="score.*", progress=False)
    assert (tmp_path / "a" / "unified" / "model.safetensors.index.json").exists()
    # the bundle names local sources by folder name only: no absolute path of this machine goes into a pushed repo
    assert str(tmp_path) not in (tmp_path / "a" / "emr.json").read_text()
    assert from_folders.meta["sources"]["t0"] == {"kind": "full", "path": "ft0"}
    # float32 sums in another tensor order (files list tensors sorted, a state dict in module order):
    # last-bit differences
    assert from_folders.rescalers == pytest.approx(from_memory.rescalers, rel=1e-6)

    pre = base.state_dict()
    names = [n for n in from_folders.meta["tensors"]]
    assert "score.weight" not in names and len(names) == len(pre) - 1
    uni, masks, lam = official(pre, [m.state_dict() for m in fts], names)
    assert list(from_folders.rescalers.values()) == lam.tolist()
    for i, task in enumerate(from_folders.tasks):
        sd, sd2 = from_folders.task_state_dict(task), from_memory.task_state_dict(task)
        assert torch.equal(sd["score.weight"], fts[i].score.weight.detach())
        for n in names:
            assert torch.equal(sd[n], pre[n] + uni[n] * masks[n][i] * lam[i]), n
            torch.testing.assert_close(sd2[n], sd[n], rtol=1e-6, atol=1e-7)


def test_lora_gpt2_fan_in_fan_out_matches_peft(tmp_path):
    from peft import LoraConfig, get_peft_model
    cfg = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32)
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "base")
    merged = []
    for i, target in enumerate(["c_attn", "c_fc"]):  # disjoint targets: every rescaler is exactly 1
        torch.manual_seed(i + 1)
        pm = get_peft_model(GPT2LMHeadModel.from_pretrained(tmp_path / "base"),
                            LoraConfig(r=4, lora_alpha=16, target_modules=[target], fan_in_fan_out=True))
        for n, p in pm.named_parameters():
            if "lora_B" in n: torch.nn.init.normal_(p, std=0.05)
        pm.save_pretrained(tmp_path / f"lora{i}")
        merged.append(pm.merge_and_unload())
    bundle = emr_merge(tmp_path / "base", {"attn": tmp_path / "lora0", "mlp": tmp_path / "lora1"}, progress=False)
    assert bundle.rescalers == {"attn": 1.0, "mlp": 1.0}
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    for task, ref in zip(bundle.tasks, merged):
        model = bundle.load_task_model(task)
        assert type(model).__name__ == "GPT2LMHeadModel"
        sd, want = bundle.task_state_dict(task), ref.state_dict()
        for n in sd: torch.testing.assert_close(sd[n], want[n], rtol=0, atol=1e-6)
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=1e-5)


def test_bf16_models_compute_in_float32_store_bf16(tmp_path, classifier, finetune):
    base = classifier(dtype=torch.bfloat16)
    fts = [finetune(base, 2, seed=s) for s in (1, 2, 3)]
    bundle = emr_merge(
        base, {f"t{i}": m for i, m in enumerate(fts)}, exclude="score.weight", out_dir=tmp_path / "b", progress=False
    )
    assert {s["dtype"] for s in bundle.meta["tensors"].values()} == {"BF16"}
    pre = base.state_dict()
    names = list(bundle.meta["tensors"])
    uni, masks, lam = official(pre, [m.state_dict() for m in fts], names)
    assert list(bundle.rescalers.values()) == lam.tolist()  # the rescalers see the float32 task vectors
    sd = bundle.task_state_dict("t1")
    for n in names:
        want = (pre[n].float() + uni[n].bfloat16().float() * masks[n][1] * lam[1]).bfloat16()
        assert sd[n].dtype == torch.bfloat16 and torch.equal(sd[n], want), n
    assert bundle.load_task_model("t0").dtype == torch.bfloat16


def test_each_input_tensor_is_read_once(tmp_path, classifier, finetune, monkeypatch):
    base = classifier()
    base.save_pretrained(tmp_path / "base")
    for i in range(3): finetune(base, 2 + i, seed=i + 1).save_pretrained(tmp_path / f"ft{i}", max_shard_size="8KB")
    reads = []
    read, read_into = TensorFiles.read, TensorFiles.read_into
    monkeypatch.setattr(
        TensorFiles,
        "read",
        lambda self, name, rows=None: reads.append((self.file[name], name, rows)) or read(self, name, rows),
    )
    monkeypatch.setattr(
        TensorFiles,
        "read_into",
        lambda self, name, rows, buf: reads.append((self.file[name], name, rows)) or read_into(self, name, rows, buf),
    )
    emr_merge(
        tmp_path / "base", {f"t{i}": tmp_path / f"ft{i}" for i in range(3)}, out_dir=tmp_path / "b", progress=False
    )
    assert len(reads) == len(set(reads))  # nothing read twice
    assert {f.parent.name for f, *_ in reads} == {"base", "ft0", "ft1", "ft2"}
    assert sum(f.parent.name == "ft1" for f, *_ in reads) == len(base.state_dict())  # every tensor of a task, once
    # not its head: no task shares it
    assert sum(f.parent.name == "base" for f, *_ in reads) == len(base.state_dict()) - 1


def test_baselines_take_repo_ids_and_folders(hub, classifier, finetune, tmp_path):
    base = classifier()
    base.save_pretrained(tmp_path / "base")
    push_folder(tmp_path / "base", "team/base", endpoint=hub.endpoint)
    for i in range(2): finetune(base, 2, seed=i + 1).save_pretrained(tmp_path / f"ft{i}")
    tasks = {"a": tmp_path / "ft0", "b": tmp_path / "ft1"}
    ta = task_arithmetic("team/base", tasks, scaling=1.0, exclude="score.*", endpoint=hub.endpoint, progress=False)
    pre = base.state_dict()
    ft_sds = [finetune(base, 2, seed=i + 1).state_dict() for i in range(2)]
    n = "model.layers.0.mlp.up_proj.weight"
    torch.testing.assert_close(ta.state_dict[n], ft_sds[0][n] + ft_sds[1][n] - pre[n], rtol=0, atol=1e-6)
    ties = ties_merge(tmp_path / "base", tasks, density=0.5, exclude="score.*", progress=False)
    assert torch.equal(ties.task_state_dict("b")["score.weight"], ft_sds[1]["score.weight"])
    assert ties.load_task_model("a").config.num_labels == 2


def test_errors_name_the_problem(tmp_path, classifier, finetune):
    base = classifier()
    base.save_pretrained(tmp_path / "llama")
    finetune(base, 2, seed=1).save_pretrained(tmp_path / "ft")
    cfg = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="different architectures cannot be merged: config model_type is 'llama' "
                                         "for the base, 'llama' for task 'a', 'gpt2' for task 'b'"):
        emr_merge(tmp_path / "llama", {"a": tmp_path / "ft", "b": tmp_path / "gpt2"}, progress=False)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="task .b.: .*no model.safetensors .*pytorch_model.bin is not read"):
        emr_merge(tmp_path / "llama", {"a": tmp_path / "ft", "b": tmp_path / "bin"}, progress=False)
    from peft import LoraConfig, get_peft_model
    get_peft_model(classifier(), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)).save_pretrained(
        tmp_path / "dora"
    )
    with pytest.raises(ValueError, match="only plain LoRA adapters can be merged .*unsupported: use_dora"):
        emr_merge(tmp_path / "llama", {"a": tmp_path / "ft", "b": tmp_path / "dora"}, progress=False)
    with pytest.raises(ValueError, match="the base model: .*it is a LoRA adapter"):
        emr_merge(tmp_path / "dora", {"a": tmp_path / "ft", "b": tmp_path / "ft"}, progress=False)
    finetune(base, 2, seed=2).save_pretrained(tmp_path / "cut")
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # an interrupted download: caught from the header, before any work
    with pytest.raises(
        SafetensorsHeaderError,
        match="task 'b': .*cut/model.safetensors: tensor '.*': truncated: tensor '.*' ends past the file's",
    ):
        emr_merge(
            tmp_path / "llama",
            {"a": tmp_path / "ft", "b": tmp_path / "cut"},
            out_dir=tmp_path / "never",
            progress=False,
        )
    assert not (tmp_path / "never").exists()


CHILD = """
import sys, time, torch
import adaptkit.emr.merge as emr
real, n = emr.elect_in_place, [0]
def slow(*args):
    n[0] += 1
    if n[0] == 3: print("halfway", flush=True); time.sleep(60)
    return real(*args)
emr.elect_in_place = slow
root = sys.argv[1]
emr.emr_merge(root + "/base", {"a": root + "/ft0", "b": root + "/ft1"}, out_dir=root + "/bundle", progress=False)
"""


def test_merge_killed_halfway_leaves_no_bundle_and_reruns(tmp_path, classifier, finetune):
    base = classifier()
    base.save_pretrained(tmp_path / "base")
    for i in range(2): finetune(base, 3, seed=i + 1).save_pretrained(tmp_path / f"ft{i}")
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "halfway"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert not (tmp_path / "bundle").exists()  # only a hidden temporary folder remains
    assert [p.name.startswith(".bundle.tmp-") for p in tmp_path.iterdir() if p.name.startswith(".")] == [True]
    bundle = emr_merge(
        tmp_path / "base", {"a": tmp_path / "ft0", "b": tmp_path / "ft1"}, out_dir=tmp_path / "bundle", progress=False
    )
    assert bundle.load_task_model("b").config.num_labels == 3
    # the killed run's folder was cleaned by this save
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


PEAK = """
import sys, torch
import adaptkit.emr.elect as elect
import adaptkit.emr.merge as emr
import adaptkit.emr.stream as stream
# this process's peak RSS since exec (getrusage's ru_maxrss would include the parent's peak, carried over exec)
def hwm():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
# 2 threads on a busy 2-core machine make small ops 10x slower; memory is what is measured here
torch.set_num_threads(1)
elect.emr_elect(torch.randn(4, 1 << 16))  # warm torch up before the baseline
stream._CHUNK = 1 << 16  # chunks of 256 KiB: the tensors (4 MiB) stream in 16 chunks each
root = sys.argv[1]
before = hwm()
emr.emr_merge(root + "/base", {f"t{i}": root + f"/ft{i}" for i in range(4)}, out_dir=root + "/bundle", progress=False)
print(hwm() - before, before)
"""


def test_peak_memory_is_set_by_chunks_not_by_models(tmp_path):
    from safetensors.torch import save_file
    shapes = {f"layer{i}.weight": (1024, 1024) for i in range(16)}  # 16M float32 parameters: 64 MiB a model
    g = torch.Generator().manual_seed(0)
    for name in ["base", *[f"ft{i}" for i in range(4)]]:
        (tmp_path / name).mkdir()
        save_file({k: torch.randn(s, generator=g) for k, s in shapes.items()}, tmp_path / name / "model.safetensors")
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    grown, model_bytes = int(out.split()[-2]), 16 * 2**20 * 4
    # one step holds a chunk of every input (and of the next step, read ahead), 4 task vectors, masks, the unified chunk
    assert grown < model_bytes / 2, f"peak RSS grew by {grown / 2**20:.0f} MiB during a merge of 64 MiB models"
    assert EMRBundle(tmp_path / "bundle").tasks == ["t0", "t1", "t2", "t3"]


def test_bare_encoder_base_is_read_under_the_tasks_prefix(hub, classifier, finetune, tmp_path):
    """A base without the tasks' `base_model_prefix` (a bare LlamaModel for LlamaForSequenceClassification fine-tunes,
    like a sentence-transformers BertModel for BERT classifiers): merged as if it had it, locally and by repo id at a
    commit."""
    base = classifier()
    base.model.save_pretrained(tmp_path / "bare")  # names without "model."
    base.save_pretrained(tmp_path / "full")
    tasks = {f"t{i}": finetune(base, 2 + i, seed=i + 1) for i in range(3)}
    for t, m in tasks.items(): m.save_pretrained(tmp_path / t)
    folders = {t: tmp_path / t for t in tasks}
    want = emr_merge(tmp_path / "full", folders, out_dir=tmp_path / "want", progress=False)
    local = emr_merge(tmp_path / "bare", folders, out_dir=tmp_path / "local", progress=False)
    assert local.rescalers == want.rescalers and set(local.meta["tensors"]) == set(want.meta["tensors"])
    push_folder(tmp_path / "bare", "team/bare", endpoint=hub.endpoint)
    by_id = emr_merge("team/bare", folders, out_dir=tmp_path / "by_id", endpoint=hub.endpoint, progress=False)
    assert by_id.meta["base"]["prefix"] == "model." and not (by_id.folder / "base").exists()
    assert "base tensors read as" in (by_id.folder / "README.md").read_text()
    commit = by_id.push_to_hub("team/emr-bare", endpoint=hub.endpoint)
    pulled = EMRBundle.from_pretrained("team/emr-bare", revision=commit, endpoint=hub.endpoint)
    for t in tasks:
        expect = want.task_state_dict(t)
        for got in (local.task_state_dict(t), pulled.task_state_dict(t)):
            assert got.keys() == expect.keys() and all(torch.equal(got[k], expect[k]) for k in expect), t
    assert pulled.load_task_model("t2").config.num_labels == 4
    ta = task_arithmetic(tmp_path / "bare", folders, progress=False)  # the baselines open their inputs the same way
    assert torch.equal(ta.task_state_dict("t1")["score.weight"], tasks["t1"].state_dict()["score.weight"])


def test_foreign_base_error_does_not_suggest_excluding_everything(tmp_path, classifier, finetune):
    base = classifier()
    renamed = {"encoder." + k: v for k, v in base.state_dict().items()}  # another architecture's names
    tasks = {f"t{i}": finetune(base, 2, seed=i + 1).state_dict() for i in range(2)}
    with pytest.raises(ValueError, match="Most shared tensors are missing from the base") as e:
        emr_merge(renamed, tasks, out_dir=tmp_path / "b", progress=False)
    assert "exclude=" not in str(e.value)
    assert str(e.value).endswith("Is the base the model they were fine-tuned from? Most shared tensors are missing "
                                 "from the base: is it another architecture, or are its tensors named differently?")


# ---- known answers: a merge computed by hand ----

TAUS = [torch.tensor([2.0, -1.0, 0.0, 3.0]), torch.tensor([-1.0, -3.0, 0.0, 1.0]), torch.tensor([1.0, 2.0, 0.0, -5.0])]
BASE_W = torch.tensor([10.0, 20.0, 30.0, 40.0])


def hand_merge(rescale="tensor_mean", with_v=False):
    "Three tasks over w (4 parameters; sums 2, -2, 0, -1) and, `with_v`, v (2 parameters, only task a moves it by 4)."
    pre = {"w": BASE_W.clone()} | ({"v": torch.zeros(2)} if with_v else {})
    taus = [
        {"w": t} | ({"v": torch.tensor([4.0 if i == 0 else 0.0, 0.0])} if with_v else {}) for i, t in enumerate(TAUS)
    ]
    ft = {name: {k: pre[k] + tau[k] for k in pre} for name, tau in zip("abc", taus)}
    return emr_merge(pre, ft, rescale=rescale, progress=False)


def test_election_masks_and_rescalers_by_hand():
    bundle = hand_merge()
    unified = TensorFiles.of_folder(bundle.folder / "unified").read("w")
    # sign of the sum (+, -, 0 -> -1, -), magnitude: the largest |τ_t| whose sign agrees
    assert unified.tolist() == [2.0, -3.0, 0.0, -5.0] and torch.signbit(unified).tolist() == [False, True, True, True]
    masks = {t: unpack_mask(TensorFiles([bundle.folder / "tasks" / t / "mask.safetensors"]).read("w"), (4,)).tolist()
             for t in bundle.tasks}
    assert masks == {"a": [True, True, False, False], "b": [False, True, False, False], "c": [True, False, False, True]}
    # λ_t = mean|τ_t| / mean|M_t ⊙ τ_uni|: a 6/5, b 5/3, c 8/7
    assert bundle.rescalers == pytest.approx({"a": 6 / 5, "b": 5 / 3, "c": 8 / 7}, rel=1e-6)
    sd = {t: bundle.task_state_dict(t)["w"].tolist() for t in bundle.tasks}
    assert sd["a"] == pytest.approx([10 + 1.2 * 2, 20 - 1.2 * 3, 30, 40], rel=1e-6)
    assert sd["b"] == pytest.approx([10, 20 - 5 / 3 * 3, 30, 40], rel=1e-6)
    assert sd["c"] == pytest.approx([10 + 8 / 7 * 2, 20, 30, 40 - 8 / 7 * 5], rel=1e-6)


def test_elect_by_hand():
    unified, masks = elect.emr_elect(torch.stack(TAUS))
    assert unified.tolist() == [2.0, -3.0, 0.0, -5.0]
    assert masks.tolist() == [[True, True, False, False], [False, True, False, False], [True, False, False, True]]


def test_a_task_that_changed_nothing_gets_rescaler_one():
    pre = {"w": BASE_W.clone()}
    ft = {"a": {"w": BASE_W + TAUS[0]}, "b": {"w": BASE_W + TAUS[1]}, "still": {"w": BASE_W.clone()}}
    for rescale in ("tensor_mean", "global"):
        bundle = emr_merge(pre, ft, rescale=rescale, progress=False)
        assert bundle.rescalers["still"] == 1.0 and bundle.task_state_dict("still")["w"].tolist() == BASE_W.tolist()


def test_tensor_mean_and_global_rescalers_by_hand():
    # tensor_mean sums per-tensor means: a (6/4 + 4/2) / (5/4 + 4/2) = 14/13;
    # global sums parameters: a (6 + 4) / (5 + 4)
    assert hand_merge("tensor_mean", with_v=True).rescalers == pytest.approx(
        {"a": 14 / 13, "b": 5 / 3, "c": 8 / 7}, rel=1e-6
    )
    assert hand_merge("global", with_v=True).rescalers == pytest.approx({"a": 10 / 9, "b": 5 / 3, "c": 8 / 7}, rel=1e-6)


def test_task_arithmetic_and_ties_by_hand():
    pre = {"w": BASE_W.clone()}
    ft = {name: {"w": BASE_W + t} for name, t in zip("abc", TAUS)}
    ta = task_arithmetic(pre, ft, scaling=0.5, progress=False)
    assert ta.state_dict["w"].tolist() == [11.0, 19.0, 30.0, 39.5]  # base + 0.5 · (2, -2, 0, -1)
    # TIES without trimming: the mean of the entries agreeing with the sign of the sum: (2+1)/2, (-1-3)/2, 0, -5
    assert ties_merge(pre, ft, density=1.0, progress=False).state_dict["w"].tolist() == [11.5, 18.0, 30.0, 35.0]


# ---- every check on the inputs of a merge: the failing input, the error and the name it reports ----

@pytest.fixture
def tiny_inputs(classifier, finetune):
    "`tiny_inputs(tmp_path, n=2)`: a base folder and `n` fine-tuned folders (their own 2-label heads); task -> folder."
    def make(tmp_path, n=2):
        base = classifier()
        base.save_pretrained(tmp_path / "base")
        for i in range(n): finetune(base, 2, seed=i + 1).save_pretrained(tmp_path / f"ft{i}")
        return {f"t{i}": tmp_path / f"ft{i}" for i in range(n)}
    return make


def lora_adapter(tmp_path, name="lora"):
    "A LoRA adapter of q_proj and v_proj over the base at tmp_path / 'base'."
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(LlamaForSequenceClassification.from_pretrained(tmp_path / "base"),
                        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))
    pm.save_pretrained(tmp_path / name)
    return tmp_path / name


def rewrite_adapter(folder, edit):
    from safetensors.torch import load_file, save_file
    sd = load_file(folder / "adapter_model.safetensors")
    save_file({k: v.contiguous() for k, v in edit(sd).items()}, folder / "adapter_model.safetensors")


def rewrite_config(folder, **changes):
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.mark.parametrize("edit, message", [
    (lambda f: rewrite_config(f, peft_type="IA3"),
     r"lora: only plain LoRA adapters can be merged \(peft_type 'IA3'\)"),
    (lambda f: rewrite_config(f, lora_bias=True),
     r"lora: only plain LoRA adapters can be merged \(peft_type 'LORA', unsupported: lora_bias\)"),
    (lambda f: (f / "adapter_model.safetensors").unlink(),
     r"lora: no adapter_model.safetensors \(weights only as safetensors\)"),
    (lambda f: rewrite_adapter(f, lambda sd: sd | {"stray.weight": torch.zeros(2)}),
     r"lora: unexpected tensor 'stray.weight' in a LoRA adapter"),
    (lambda f: rewrite_adapter(f, lambda sd: {k: v for k, v in sd.items() if k != Q_B}),
     r"lora: adapter weights without a matching base weight or A/B pair: "
     r"\['model.layers.0.self_attn.q_proj.weight'\] \(wrong base\?\)"),
    (lambda f: rewrite_adapter(f, lambda sd: sd | {Q_A.replace("q_proj", "zz_proj"): sd[Q_A].clone(),
                                                   Q_B.replace("q_proj", "zz_proj"): sd[Q_B].clone()}),
     r"adapter weights without a matching base weight or A/B pair: \['model.layers.0.self_attn.zz_proj.weight'\]"),
    (lambda f: rewrite_adapter(f, lambda sd: sd | {Q_A: torch.zeros(4, 15)}),
     r"lora: the LoRA delta of model.layers.0.self_attn.q_proj.weight would have shape \[16, 15\], "
     r"the base weight has \[16, 16\]"),
    (lambda f: rewrite_adapter(f, lambda sd: sd | {k: torch.zeros(4, 15) for k in sd if "lora_A" in k}),
     r"lora: the LoRA delta of model.layers.0.self_attn.q_proj.weight would have shape \[16, 15\], the base weight "
     r"has \[16, 16\] \(and 3 more: \['model.layers.0.self_attn.v_proj.weight', "
     r"'model.layers.1.self_attn.q_proj.weight', 'model.layers.1.self_attn.v_proj.weight'\]\)$"),
])
def test_each_check_on_a_lora_adapter_names_it(tmp_path, tiny_inputs, edit, message):
    tasks = tiny_inputs(tmp_path)
    adapter = lora_adapter(tmp_path)
    edit(adapter)
    # a missing weights file is a FileNotFoundError naming the folder; anything else in it a ValueError
    with pytest.raises((ValueError, FileNotFoundError), match=f"task 'l': (cannot read '{adapter}': )?.*{message}"):
        emr_merge(tmp_path / "base", {**tasks, "l": adapter}, out_dir=tmp_path / "bundle", progress=False)
    assert not (tmp_path / "bundle").exists()


def test_state_dict_entries_must_be_tensors_of_a_safetensors_dtype():
    pre = {"w": torch.zeros(3), "b": torch.zeros(2)}
    ft = {"a": {"w": torch.ones(3), "b": torch.ones(2)}, "b": {"w": torch.ones(3), "b": [1.0, 2.0]}}
    with pytest.raises(TypeError, match=r"state dict entries that are not tensors of a safetensors dtype: \['b'\]"):
        emr_merge(pre, ft, progress=False)
    with pytest.raises(TypeError, match=r"not tensors of a safetensors dtype: \['c'\]"):
        emr_merge(
            pre | {"c": torch.zeros(2, dtype=torch.complex64)},
            {t: {"w": torch.ones(3), "b": torch.ones(2)} for t in "ab"},
        )


def test_tensors_every_task_has_but_the_base_lacks_get_the_new_head_hint():
    pre = {"w": torch.zeros(3), "b": torch.zeros(2), "v": torch.zeros(2)}
    ft = {t: {"w": torch.ones(3), "b": torch.ones(2), "v": torch.ones(2), "head": torch.ones(2)} for t in "ab"}
    with pytest.raises(
        ValueError,
        match=r"1 tensors in every fine-tuned model but not in the base: \['head'\]\. Is the base the model "
        r"they were fine-tuned from\? If these are new heads, keep them per task with exclude=\['head'\]",
    ):
        emr_merge(pre, ft, progress=False)
    assert emr_merge(pre, ft, exclude=["head"], progress=False).meta["own"]["a"] == {
        "head": {"dtype": "F32", "shape": [2]}
    }


def test_as_many_new_tensors_as_merged_ones_still_get_the_new_head_hint():
    "One tensor merged, one in every task but not the base: a new head, not another architecture."
    pre = {"w": torch.zeros(3)}
    ft = {t: {"w": torch.ones(3), "head": torch.ones(2)} for t in "ab"}
    with pytest.raises(ValueError) as e:
        emr_merge(pre, ft, progress=False)
    assert str(e.value).endswith("If these are new heads, keep them per task with exclude=['head']")


def _hinted_exclude(error) -> list:
    "The `exclude=[...]` an error's message suggests, as the list a user would pass."
    import ast
    return ast.literal_eval(re.search(r"exclude=(\[.*?\])", str(error)).group(1))


def test_the_new_head_hint_names_five_tensors_and_excludes_them_all():
    """Six new tensors with no dotted prefix in common: the message counts them all and names the first five; its
    exclude= hint names all six."""
    pre = {f"w{i}": torch.zeros(3) for i in range(8)}
    ft = {t: {k: torch.ones(3) for k in pre} | {f"h{i}": torch.ones(2) for i in range(6)} for t in "ab"}
    with pytest.raises(ValueError) as e:
        emr_merge(pre, ft, progress=False)
    five, six = "['h0', 'h1', 'h2', 'h3', 'h4']", "['h0', 'h1', 'h2', 'h3', 'h4', 'h5']"
    assert str(e.value) == (f"6 tensors in every fine-tuned model but not in the base: {five}. Is the base the "
                            f"model they were fine-tuned from? If these are new heads, keep them per task with "
                            f"exclude={six}")
    assert sorted(emr_merge(pre, ft, exclude=_hinted_exclude(e.value), progress=False).meta["own"]["a"]) == [
        f"h{i}" for i in range(6)]


def test_following_the_new_head_hint_for_seven_tensors_merges():
    """Seven new-head tensors: the exclude= hint covers every one, by prefix where no other tensor shares it
    (`classifier.*`, `pooler.*`; not `model.*`, which the merged tensors have), and passed as given the merge runs."""
    heads = ["classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight",
             "classifier.out_proj.bias", "pooler.dense.weight", "pooler.dense.bias", "model.score.weight"]
    pre = {f"model.layers.{i}.w": torch.zeros(3) for i in range(8)}
    ft = {t: {k: torch.ones(3) for k in pre} | {h: torch.ones(2) for h in heads} for t in "ab"}
    with pytest.raises(ValueError, match=r"^7 tensors in every fine-tuned model but not in the base") as e:
        emr_merge(pre, ft, progress=False)
    listed = str(e.value).split(" exclude=")[0]
    assert "pooler.dense.weight" in listed and "pooler.dense.bias" not in listed  # the message names five
    hinted = _hinted_exclude(e.value)
    assert hinted == ["classifier.*", "pooler.*", "model.score.weight"], hinted
    bundle = emr_merge(pre, ft, exclude=hinted, progress=False)
    assert sorted(bundle.meta["own"]["a"]) == sorted(heads) and sorted(bundle.meta["tensors"]) == sorted(pre)


def test_tensors_not_every_task_has_stay_the_own_of_those_that_have_them():
    "A tensor the base lacks and one task has is that task's own; one the base has, when excluded, too."
    pre = {"w": torch.zeros(3), "extra": torch.zeros(2)}
    ft = {"a": {"w": torch.ones(3), "extra": torch.ones(2), "mine": torch.ones(4)}, "b": {"w": 2 * torch.ones(3)}}
    with pytest.raises(ValueError, match=r"task 'b' \(an in-memory state dict\) has no tensor 'extra', which the base "
                                         r"and task 'a' have: an incomplete checkpoint\? \(exclude=\['extra'\] keeps"):
        emr_merge(pre, ft, progress=False)
    for exclude in ("extra", ["nothing", "extra"], re.compile("^ext")):
        bundle = emr_merge(pre, ft, exclude=exclude, progress=False)
        assert list(bundle.meta["tensors"]) == ["w"]
        assert bundle.meta["own"] == {"a": {"extra": {"dtype": "F32", "shape": [2]},
                                            "mine": {"dtype": "F32", "shape": [4]}}, "b": {}}
    assert torch.equal(bundle.task_state_dict("a")["mine"], torch.ones(4)) and "mine" not in bundle.task_state_dict("b")



def saved_inputs(tmp_path, finetuned: dict) -> dict:
    "Each state dict of `finetuned` (task -> tensors) saved as a folder's model.safetensors: task -> that folder."
    from safetensors.torch import save_file
    for t, sd in finetuned.items():
        (tmp_path / t).mkdir()
        save_file(sd, tmp_path / t / "model.safetensors")
    return {t: tmp_path / t for t in finetuned}


PRE = {"u": torch.zeros(2), "v": torch.zeros(2), "w": torch.zeros(3), "x": torch.zeros(3)}  # a file's order: sorted


def test_every_task_model_lacking_tensors_is_named_in_one_error(tmp_path, monkeypatch, no_tensor_may_be_read):
    "Two task models each lacking other tensors: one error names both, before any tensor is read; its hint merges."
    full = {k: v + 1 for k, v in PRE.items()}
    folders = saved_inputs(tmp_path, {"base": PRE, "a": full, "b": {k: full[k] for k in "xwu"},
                                      "c": {k: full[k] for k in "xv"}})
    tasks = {t: folders[t] for t in "abc"}
    with monkeypatch.context() as m:
        no_tensor_may_be_read(m)
        with pytest.raises(ValueError) as e:
            emr_merge(folders["base"], tasks, out_dir=tmp_path / "bundle", progress=False)
    assert str(e.value) == (
        f"task 'b' ({tasks['b']}) has no tensor 'v', which the base and task 'a' have; task 'c' ({tasks['c']}) has no "
        f"tensor 'u', which the base and task 'a' have (and 1 more: ['w']): incomplete checkpoints? "
        f"(exclude=['v', 'u', 'w'] keeps them per task)")
    assert not (tmp_path / "bundle").exists()
    bundle = emr_merge(folders["base"], tasks, exclude=_hinted_exclude(e.value), progress=False)
    assert list(bundle.meta["tensors"]) == ["x"] and sorted(bundle.meta["own"]["a"]) == ["u", "v", "w"]


def test_every_tensor_of_a_dtype_that_cannot_merge_is_named_in_one_error(tmp_path, monkeypatch, no_tensor_may_be_read):
    "Integer and float8 tensors in two task models: one error names each model, its tensors and the dtypes it can."
    full = {k: v + 1 for k, v in PRE.items()}
    ints = full | {"w": torch.zeros(3, dtype=torch.int32), "u": torch.zeros(2, dtype=torch.int8)}
    f8 = full | {"v": torch.zeros(2, dtype=torch.float8_e4m3fn)}
    folders = saved_inputs(tmp_path, {"base": PRE, "a": full, "b": ints, "c": f8})
    tasks = {t: folders[t] for t in "abc"}
    with monkeypatch.context() as m:
        no_tensor_may_be_read(m)
        with pytest.raises(ValueError) as e:
            emr_merge(folders["base"], tasks, exclude=["x"], out_dir=tmp_path / "bundle", progress=False)
    assert str(e.value) == (
        f"task 'b' ({tasks['b']}) holds 'u' as I8, the base as F32 (and 1 more: ['w']); task 'c' ({tasks['c']}) holds "
        f"'v' as F8_E4M3, the base as F32: they cannot be merged. Convert those checkpoints to float, or keep the "
        f"tensors per task with exclude=['u', 'w', 'v']")
    assert not (tmp_path / "bundle").exists()
    bundle = emr_merge(folders["base"], tasks, exclude=_hinted_exclude(e.value), progress=False)
    assert bundle.task_state_dict("b")["w"].dtype == torch.int32 and list(bundle.meta["tensors"]) == ["x"]


def test_a_model_lacking_a_tensor_and_another_holding_ints_are_named_in_one_error(tmp_path, monkeypatch,
                                                                                 no_tensor_may_be_read):
    "Two task models bad in two ways: one error carries both checks' messages, each as it would be alone."
    full = {k: v + 1 for k, v in PRE.items()}
    folders = saved_inputs(tmp_path, {"base": PRE, "a": full, "b": {k: full[k] for k in "xwu"},
                                      "c": full | {"w": torch.zeros(3, dtype=torch.int32)}})
    tasks = {t: folders[t] for t in "abc"}
    with monkeypatch.context() as m:
        no_tensor_may_be_read(m)
        with pytest.raises(ValueError) as e:
            emr_merge(folders["base"], tasks, out_dir=tmp_path / "bundle", progress=False)
    assert str(e.value).split("\n") == [
        "2 checks refuse these inputs:",
        f"task 'b' ({tasks['b']}) has no tensor 'v', which the base and task 'a' have: an incomplete checkpoint? "
        f"(exclude=['v'] keeps it per task)",
        f"task 'c' ({tasks['c']}) holds 'w' as I32, the base as F32: it cannot be merged. Convert that checkpoint to "
        f"float, or keep the tensor per task with exclude=['w']"]
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("bad, problem", [
    (lambda full: {k: full[k] for k in "xwu"}, "has no tensor 'v', which the base and task 'a' have"),
    (lambda full: full | {"v": torch.zeros(2, dtype=torch.int64)}, "holds 'v' as I64, the base as F32"),
])
def test_past_five_task_models_the_error_counts_and_names_the_rest(bad, problem):
    "Eight bad task models: the first five described one by one, the other three counted and named."
    full = {k: v + 1 for k, v in PRE.items()}
    ft = {"a": full} | {f"t{i}": bad(full) for i in range(8)}
    with pytest.raises(ValueError) as e:
        emr_merge(PRE, ft, progress=False)
    message = str(e.value)
    assert [int(i) for i in re.findall(r"task 't(\d)' \(an in-memory state dict\) " + re.escape(problem), message)] == [
        0, 1, 2, 3, 4]
    assert f"task 't4' (an in-memory state dict) {problem}; and 3 more task models: ['t5', 't6', 't7']: " in message
    assert "exclude=['v']" in message


def test_every_task_model_holding_a_tensor_of_another_size_is_named(tmp_path, classifier):
    "Two fine-tunes with resized vocabularies: one error, a line for each, with its sizes and its own remedy."
    base = classifier()
    tasks = {"b": classifier(vocab_size=72, seed=1), "c": classifier(vocab_size=80, seed=2)}
    with pytest.raises(ValueError) as e:
        emr_merge(base, tasks, out_dir=tmp_path / "bundle", progress=False)
    lines = str(e.value).split("\n")
    assert lines[0] == "2 task models hold tensors of the base in other shapes:" and len(lines) == 3
    for line, (t, rows) in zip(lines[1:], [("b", 72), ("c", 80)]):
        assert line.startswith(f"- task {t!r}: tensor 'model.embed_tokens.weight' has shape [{rows}, 16] in an "
                               "in-memory state dict, the base [64, 16]"), line
        assert f"vocab_size {rows} (the base: 64)" in line and f"resize_token_embeddings({rows})" in line, line
    assert not (tmp_path / "bundle").exists()


def test_values_whose_sums_overflow_float32_are_refused_naming_the_tensor():
    pre = {"a": torch.zeros(1), "b": torch.zeros(1)}
    # finite, but the sum over a and b is not
    ft = {t: {"a": torch.full((1,), 3e38), "b": torch.full((1,), 3e38)} for t in "xy"}
    with pytest.raises(ValueError, match=r"tensor 'b': values too large for float32 sums"):
        emr_merge(pre, ft, progress=False)


@pytest.mark.parametrize("where, message", [
    ("base", r"tensor 'w' of the base has NaN or Inf values: nothing was written"),
    ("task", r"tensor 'w' of task 'y' has NaN or Inf values: nothing was written"),
    ("own", r"tensor 'head' of task 'y' has NaN or Inf values: nothing was written"),
])
def test_nan_or_inf_is_named_by_tensor_and_model(tmp_path, where, message):
    pre = {"w": torch.zeros(3)}
    ft = {t: {"w": torch.ones(3), "head": torch.ones(2)} for t in "xy"}
    if where == "base": pre["w"][1] = float("inf")
    if where == "task": ft["y"]["w"][2] = float("nan")
    if where == "own": ft["y"]["head"][0] = float("nan")
    with pytest.raises(ValueError, match=message):
        emr_merge(pre, ft, exclude="head", out_dir=tmp_path / "bundle", progress=False)
    assert not (tmp_path / "bundle").exists()
    if where != "own":
        with pytest.raises(ValueError, match=message):
            task_arithmetic(pre, ft, exclude="head", progress=False)


def test_a_merged_model_that_does_not_fit_its_architecture_is_named(tmp_path, tiny_inputs):
    tasks = tiny_inputs(tmp_path)
    ta = task_arithmetic(tmp_path / "base", tasks, exclude="score.*", progress=False)
    assert list(ta.heads["t1"]) == ["score.weight"]
    ta.heads["t1"] = {}
    with pytest.raises(ValueError, match=r"task 't1': the weights do not fit LlamaForSequenceClassification: "
                                         r"\{'missing_keys': \['score.weight'\]\}"):
        ta.load_task_model("t1")
    ta.heads["t1"] = {"score.weight": torch.zeros(2, 16), "extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"task 't1': the weights do not fit .*'unexpected_keys': \['extra.weight'\]"):
        ta.load_task_model("t1")


def test_mask_bits_are_little_endian_bytes():
    mask = torch.tensor([True, False, False, False, False, False, False, False, False, True])
    assert pack_mask(mask).tolist() == [1, 2]  # parameter i is bit i % 8 of byte i // 8
    assert unpack_mask(torch.tensor([1, 2], dtype=torch.uint8), (2, 5)).tolist() == [
        [True, False, False, False, False],
        [False, False, False, False, True],
    ]


def test_exclude_takes_globs_and_regexes_and_refuses_excluding_everything():
    pre = {"w": torch.zeros(3), "b": torch.zeros(2), "head.weight": torch.zeros(2)}
    ft = {t: {k: v + i + 1 for k, v in pre.items()} for i, t in enumerate("xy")}
    for exclude in ("head.*", re.compile(r"^head\."), ["nothing", "head.weight"]):
        bundle = emr_merge(pre, ft, exclude=exclude, progress=False)
        assert list(bundle.meta["tensors"]) == ["w", "b"] and list(bundle.meta["own"]["y"]) == ["head.weight"]
    assert bundle.meta["exclude"] == ["nothing", "head.weight"]
    assert emr_merge(pre, ft, exclude=re.compile("^b$"), progress=False).meta["exclude"] == ["re:^b$"]
    with pytest.raises(
        ValueError, match="^no tensor is in the base and every fine-tuned model with one shape: nothing to merge$"
    ):
        emr_merge(pre, ft, exclude="*", progress=False)


@pytest.mark.parametrize("finetuned, error, message", [
    ({"a": {"w": torch.ones(2)}}, ValueError, r"finetuned must map at least two task names to models"),
    ([{"w": torch.ones(2)}, {"w": torch.ones(2)}], ValueError, r"finetuned must map at least two task names"),
    ({"a/../b": {"w": torch.ones(2)}, "c": {"w": torch.ones(2)}}, ValueError,
     r"invalid task name 'a/../b': use 1-64 letters"),
    ({"..": {"w": torch.ones(2)}, "c": {"w": torch.ones(2)}}, ValueError, r"invalid task name '..'"),
    ({"x" * 65: {"w": torch.ones(2)}, "c": {"w": torch.ones(2)}}, ValueError, r"invalid task name 'x{65}'"),
    ({1: {"w": torch.ones(2)}, "c": {"w": torch.ones(2)}}, ValueError, r"invalid task name 1:"),
])
def test_task_names_and_counts_are_checked_before_any_work(finetuned, error, message):
    with pytest.raises(error, match=message):
        emr_merge({"w": torch.zeros(2)}, finetuned, progress=False)


def test_rescale_mode_and_shard_size_are_checked():
    ft = {t: {"w": torch.ones(2)} for t in "ab"}
    with pytest.raises(ValueError, match=r"rescale must be 'tensor_mean' or 'global', got 'mean'"):
        emr_merge({"w": torch.zeros(2)}, ft, rescale="mean")
    for bad in ("5 parsecs", "-1GB", "0"):
        with pytest.raises(ValueError, match=f"max_shard_size '{bad}' is invalid"):
            emr_merge({"w": torch.zeros(2)}, ft, max_shard_size=bad)


def test_chunked_merge_writes_the_same_bytes_as_a_whole_tensor_merge(monkeypatch):
    g = torch.Generator().manual_seed(3)
    pre = {"big": (torch.randn(43, 5, generator=g) * 8).round() / 8, "s": torch.tensor(0.5)}
    ft = {
        f"t{i}": {k: v + (torch.randn(v.shape, generator=g) * 8).round() / 8 for k, v in pre.items()} for i in range(3)
    }
    whole = emr_merge(pre, ft, progress=False)
    monkeypatch.setattr(stream, "_CHUNK", 16)
    assert stream.row_chunks((43, 5)) == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 43)]
    assert stream.row_chunks((3,)) == [None] and stream.row_chunks(()) == [None]
    chunked = emr_merge(pre, ft, progress=False)
    assert chunked.rescalers == pytest.approx(whole.rescalers, rel=1e-6)
    for sub in ("unified/model.safetensors", "tasks/t1/mask.safetensors", "base/model.safetensors"):
        assert (chunked.folder / sub).read_bytes() == (whole.folder / sub).read_bytes(), sub


def test_lora_deltas_follow_alpha_pattern_rslora_and_embeddings(tmp_path, classifier):
    from peft import LoraConfig, get_peft_model
    base = classifier(3)
    base.save_pretrained(tmp_path / "base")
    merged = {}
    for name, kw in {
        "qv": dict(target_modules=["q_proj", "v_proj"]),
        "rs": dict(
            target_modules=["q_proj", "up_proj"],
            rank_pattern={"up_proj": 2},
            alpha_pattern={"up_proj": 3},
            use_rslora=True,
        ),
        "emb": dict(target_modules=["embed_tokens", "o_proj"]),
    }.items():
        torch.manual_seed(len(name))
        pm = get_peft_model(LlamaForSequenceClassification.from_pretrained(tmp_path / "base"),
                            LoraConfig(r=4, lora_alpha=8, task_type="SEQ_CLS", modules_to_save=["score"], **kw))
        for n, p in pm.named_parameters():
            if "lora_B" in n or "lora_embedding_B" in n or "modules_to_save" in n: torch.nn.init.normal_(p, std=0.02)
        pm.save_pretrained(tmp_path / name)
        merged[name] = pm.merge_and_unload().state_dict()
    ta = task_arithmetic(
        tmp_path / "base", {n: tmp_path / n for n in merged}, scaling=1.0, exclude="score.*", progress=False
    )
    pre = base.state_dict()
    for n in ta.state_dict:
        want = pre[n] + sum(m[n] - pre[n] for m in merged.values())
        torch.testing.assert_close(ta.state_dict[n], want, rtol=0, atol=1e-6)
    assert {t: list(h) for t, h in ta.heads.items()} == {t: ["score.weight"] for t in merged}



# Boundary cases found by mutation testing (`make mutation`): each asserts a behaviour a mutant broke.

C = stream._CHUNK


def test_row_chunks_at_and_past_the_chunk_size():
    assert stream.row_chunks(()) == [None] and stream.row_chunks((C,)) == [None]
    assert stream.row_chunks((C // 8, 8)) == [None]
    assert stream.row_chunks((2 * C + 5,)) == [(0, C), (C, 2 * C), (2 * C, 2 * C + 5)]  # 1-D: rows are parameters
    assert stream.row_chunks((100, 3000)) == [(0, 80), (80, 100)]  # C // 3000 = 87 rows, down to a multiple of 8
    assert stream.row_chunks((20, 2 ** 16)) == [(0, 8), (8, 16), (16, 20)]  # at least 8 rows (whole mask bytes)
    assert stream.row_chunks((3, C)) == [(0, 3)]


def test_row_chunks_honour_an_explicit_chunk():
    "`chunk` sets the parameters per chunk instead of `_CHUNK`: 200 // 10 = 20 rows, or 16 in multiples of 8."
    assert stream.row_chunks((50, 10), 1, chunk=200) == [(0, 20), (20, 40), (40, 50)]
    assert stream.row_chunks((50, 10), chunk=200) == [(0, 16), (16, 32), (32, 48), (48, 50)]
    assert stream.row_chunks((20, 10), chunk=200) == [None]  # 200 parameters fit one chunk of 200


def test_chunk_numel():
    assert stream.chunk_numel((4, 5, 6), None) == 120 and stream.chunk_numel((4, 5, 6), (1, 3)) == 60
    assert stream.chunk_numel((), None) == 1 and stream.chunk_numel((7,), (2, 7)) == 5


def _elect(taus):
    "The `add` inputs for task vectors `taus` (tasks, n), as the merge makes them."
    flat = taus.clone().float()
    mask_values = torch.empty_like(flat)
    _, magnitude = elect.elect_in_place(flat, torch.empty(flat.shape[1]), mask_values)
    return flat, magnitude, mask_values


ELECT_TAUS = torch.tensor([[1.0, -2.0, 3.0, 0.5], [2.0, 1.0, -1.0, 0.0]])
# signs of the mean: +, -, +, +; |τ_uni| = (2, 2, 3, 0.5); masks a (1, 1, 1, 1), b (1, 0, 0, 0)
# Σ|τ_a| = 6.5, Σ|M_a ⊙ τ_uni| = 7.5; Σ|τ_b| = 4, Σ|M_b ⊙ τ_uni| = 2


def test_rescaler_sums_whole_tensor_chunks_and_modes():
    whole = elect.RescalerSums(2, "tensor_mean")
    assert whole.add(*_elect(ELECT_TAUS), numel=4)
    assert whole.abs_task_vectors.dtype == torch.float32 and whole.values() == pytest.approx(
        [6.5 / 7.5, 4 / 2], rel=1e-6
    )
    assert whole.abs_task_vectors.tolist() == [6.5 / 4, 4 / 4] and whole.abs_masked_unified.tolist() == [7.5 / 4, 2 / 4]
    chunked = elect.RescalerSums(2, "tensor_mean")  # the same tensor in two chunks: the same per-tensor means
    assert chunked.add(*_elect(ELECT_TAUS[:, :2]), numel=4) and chunked.add(*_elect(ELECT_TAUS[:, 2:]), numel=4)
    assert chunked.abs_task_vectors.tolist() == [6.5 / 4, 4 / 4] and chunked.abs_masked_unified.tolist() == [
        7.5 / 4,
        0.5,
    ]
    glob = elect.RescalerSums(2, "global")  # global: plain sums, in float64
    assert glob.add(*_elect(ELECT_TAUS), numel=4) and glob.abs_task_vectors.dtype == torch.float64
    assert glob.abs_task_vectors.tolist() == [6.5, 4.0] and glob.abs_masked_unified.tolist() == [7.5, 2.0]
    assert glob.add(*_elect(ELECT_TAUS), numel=4) and glob.abs_task_vectors.tolist() == [13.0, 8.0]  # sums accumulate


def test_rescaler_sums_of_nothing_and_of_non_finite_input():
    sums = elect.RescalerSums(2, "tensor_mean")
    assert sums.add(torch.empty(2, 0), torch.empty(0), torch.empty(2, 0), numel=0)  # an empty tensor changes nothing
    assert sums.abs_task_vectors.tolist() == [0.0, 0.0] and sums.values() == [1.0, 1.0]
    assert not sums.add(*_elect(torch.tensor([[math.inf, 1.0], [1.0, 1.0]])), numel=2)
    only_den = elect.RescalerSums(2, "global")
    assert not only_den.add(
        torch.tensor([[1.0], [1.0]]), torch.tensor([math.nan]), torch.tensor([[1.0], [1.0]]), numel=1
    )


def test_a_task_with_no_masked_unified_mass_gets_rescaler_one_and_others_their_ratio():
    sums = elect.RescalerSums(2, "global")
    sums.abs_task_vectors, sums.abs_masked_unified = torch.tensor([3.0, 5.0], dtype=torch.float64), torch.tensor(
        [0.0, 2.0], dtype=torch.float64)
    assert sums.values() == [1.0, 2.5]


def test_a_float_base_tensor_a_task_holds_as_integers_is_refused_unless_kept_per_task(tmp_path):
    "A task tensor the base holds as float but the task as int32 is named before any work; exclude= keeps it per task."
    base = {"h": torch.randn(2, 3), "w": torch.randn(4, 3)}
    good = {k: v + 0.1 for k, v in base.items()}
    ints = {"h": base["h"] + 0.2, "w": torch.zeros(4, 3, dtype=torch.int32)}
    message = (r"task 'b' \(an in-memory state dict\) holds 'w' as I32, the base as F32: it cannot be merged\. "
               r"Convert that checkpoint to float, or keep the tensor per task with exclude=\['w'\]")
    for exclude in (None, ["h"]):  # excluding another tensor does not hide this one
        with pytest.raises(ValueError, match=message):
            emr_merge(base, {"a": good, "b": ints}, exclude=exclude, out_dir=tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()
    bundle = emr_merge(base, {"a": good, "b": ints}, exclude=["w"], out_dir=tmp_path / "y", progress=False)
    assert bundle.task_state_dict("b")["w"].dtype == torch.int32 and bundle.tasks == ["a", "b"]


def test_task_arithmetic_and_ties_results_are_artifacts_with_their_settings(tmp_path):
    "The baselines' merged models record how they were merged, with the papers' defaults, and load back whole."
    torch.manual_seed(0)
    base = {"w": torch.randn(4, 3)}
    tasks = {t: {"w": base["w"] + torch.randn(4, 3)} for t in ("a", "b")}
    assert task_arithmetic(base, tasks, progress=False).settings == {
        "method": "task_arithmetic", "weight": 1.0, "scaling": 0.3, "normalize": False, "tasks": ["a", "b"]}
    ties = ties_merge(base, tasks, progress=False)
    assert ties.settings == {"method": "ties", "weight": 1.0, "density": 0.2, "scaling": 1.0, "normalize": True,
                             "tasks": ["a", "b"]}
    again = MergedModel.from_pretrained(ties.save_pretrained(tmp_path / "ties"))
    assert (again.settings, again.tasks) == (ties.settings, ["a", "b"])
    assert torch.equal(again.task_state_dict("a")["w"], ties.task_state_dict("a")["w"])


@pytest.mark.parametrize("baseline, method, own", [
    (task_arithmetic, "task_arithmetic", {"scaling": 0.5}),
    (ties_merge, "ties", {"density": 0.4, "scaling": 0.8}),
])
def test_baselines_pass_every_option_on_to_merge_models(monkeypatch, tmp_path, baseline, method, own):
    "The baselines are `merge_models` with one method: the Hub, output, shard and progress options reach it unchanged."
    import adaptkit.emr.baselines as baselines
    calls = []
    monkeypatch.setattr(baselines, "merge_models", lambda *args, **kwargs: calls.append((args, kwargs)))
    options = dict(exclude="score.*", endpoint="http://127.0.0.1:9", token="hf_secret", out_dir=tmp_path / "out",
                   max_shard_size="1MB", progress=False)
    baseline("team/base", {"a": "team/a"}, **own, **options)
    assert calls == [(("team/base", {"a": "team/a"}), {"method": method, **own, **options})]
    baseline("team/base", {"a": "team/a"})
    assert calls[1][1]["progress"] is True and calls[1][1]["out_dir"] is None  # a bar shown, the result in memory
    assert calls[1][1]["max_shard_size"] == "5GB"  # transformers' default; its parser reads "5gb" as 5 gigabits
