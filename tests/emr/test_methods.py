"""The merge methods users know (adaptkit.emr.methods) against independent computations: peft's `merge_utils` per
tensor, hand-worked pruning cases, the engine against peft on saved models, the mergekit-style configuration's
errors, and (where `.venv-mergekit` exists) mergekit's own `run_merge` on the same tiny models and YAML files.

mergekit pins its own dependency set, so it lives in its own venv, as olah does: `make .venv-mergekit/bin/mergekit-yaml`
(torch from the lock first, then `requirements-mergekit.txt`). Without it those tests are skipped."""
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from peft.utils import merge_utils
from safetensors.torch import load_file

from adaptkit.emr import MergedModel, merge_from_config, merge_models, ties_merge
from adaptkit.emr.methods import (
    MERGE_METHODS,
    combine_weighted,
    merge_tensor,
    prune_breadcrumbs,
    prune_magnitude,
    prune_random,
    read_merge_config,
    sign_agreement,
    tensor_generator,
    tensor_parameters,
)

MERGEKIT = Path(__file__).resolve().parents[2] / ".venv-mergekit" / "bin" / "python"


# ---- per tensor, against peft's merge_utils ----

def task_vectors(n=3, shape=(8, 6), seed=0):
    return torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("density", [0.1, 0.25, 0.5, 0.9, 1.0])
def test_ties_and_magnitude_prune_equal_peft(density):
    taus, w = task_vectors(), torch.full((3,), 0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns that density 1 prunes nothing
        want_ties = merge_utils.ties(list(taus), w, density)
        want_prune = merge_utils.magnitude_prune(list(taus), torch.tensor([0.2, 0.5, 0.3]), density)
    # peft elects TIES' signs unweighted and divides by the count, then weights: equal weights w are λ = w here
    got = merge_tensor(torch.zeros(8, 6), taus, "ties", [1, 1, 1], [density] * 3, scaling=0.6)
    torch.testing.assert_close(got, want_ties, rtol=1e-6, atol=1e-7)
    got = merge_tensor(torch.zeros(8, 6), taus, "magnitude_prune", [0.2, 0.5, 0.3], [density] * 3)
    torch.testing.assert_close(got, want_prune, rtol=1e-6, atol=1e-7)


def test_ties_on_float64_task_vectors_equals_peft():
    "Float64 task vectors are pruned at their own thresholds (a radix selection over their 64 bits) and stay float64."
    taus, w = task_vectors().double(), torch.full((3,), 0.6, dtype=torch.float64)
    got = merge_tensor(torch.zeros(8, 6, dtype=torch.float64), taus, "ties", [1, 1, 1], [0.5] * 3, scaling=0.6)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, merge_utils.ties(list(taus), w, 0.5), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_merge_tensor_returns_the_task_vectors_dtype(dtype):
    "A bf16 or fp16 tensor merges to one of its own dtype: the float32 (bf16) or own-dtype (fp16) result, rounded."
    taus, base = task_vectors().to(dtype), torch.randn(8, 6).to(dtype)
    got = merge_tensor(base, taus, "ties", [0.4, 0.6, 0.5], [0.5] * 3)
    assert got.dtype == dtype and got.shape == (8, 6)
    if dtype == torch.bfloat16:  # numpy has no bfloat16: merged from its float32 values
        assert torch.equal(got, merge_tensor(base.float(), taus.float(), "ties", [0.4, 0.6, 0.5], [0.5] * 3).to(dtype))


def test_task_arithmetic_equals_peft_and_adds_the_base():
    taus, base = task_vectors(), torch.randn(8, 6)
    got = merge_tensor(base, taus, "task_arithmetic", [0.2, -0.5, 1.5])
    torch.testing.assert_close(got - base, merge_utils.task_arithmetic(list(taus), torch.tensor([0.2, -0.5, 1.5])))


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_equals_peft_on_the_same_masks(method):
    "peft draws DARE's masks from torch's global generator: redraw them with the same seed, feed ours the same drop."
    taus, density, w = task_vectors(), 0.4, torch.tensor([0.7, 0.7, 0.7])
    torch.manual_seed(5)
    want = getattr(merge_utils, method)(list(taus), w, density)
    torch.manual_seed(5)
    masks = torch.stack([torch.bernoulli(torch.full_like(t, density)) for t in taus])
    dropped = taus * masks / density  # what DARE's drop and rescale made of each task vector
    if method == "dare_linear":
        got = merge_tensor(torch.zeros(8, 6), dropped, "task_arithmetic", [0.7] * 3)
    else:  # peft's dare_ties is the disjoint mean (normalized), with equal weights as λ
        got = merge_tensor(torch.zeros(8, 6), dropped, "ties", [1, 1, 1], scaling=0.7)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_dare_drops_with_probability_one_minus_density_and_keeps_the_expectation():
    tau = torch.linspace(-1, 1, 50_000)
    for density in (0.1, 0.5, 0.9):
        out = prune_random(tau, density, tensor_generator(0, "a", "w"))
        kept = out != 0
        assert abs(kept.float().mean().item() - density) < 0.01
        assert torch.equal(out[kept], tau[kept] / density)  # survivors rescaled by 1 / density, exactly
        peft_kept = merge_utils.random_pruning(tau, density, rescale=True) != 0  # peft's drop rate, same law
        assert abs(peft_kept.float().mean().item() - density) < 0.01
    ones = torch.full((200_000,), 2.0)
    assert abs(prune_random(ones, 0.2, tensor_generator(1, "a", "w")).mean().item() - 2.0) < 0.03


def test_dare_masks_depend_on_seed_task_and_tensor_only():
    tau = torch.randn(64, 32)
    draw = lambda *key: prune_random(tau, 0.5, tensor_generator(*key))
    assert torch.equal(draw(0, "a", "w"), draw(0, "a", "w"))
    assert all(not torch.equal(draw(0, "a", "w"), draw(*k)) for k in [(1, "a", "w"), (0, "b", "w"), (0, "a", "v")])
    torch.manual_seed(0); a = draw(0, "a", "w")
    torch.manual_seed(1); b = draw(0, "a", "w")
    assert torch.equal(a, b)  # torch's global generator plays no part


def test_dare_draws_in_chunks_are_the_draws_of_the_whole_tensor():
    "The merge draws a tensor's mask chunk by chunk from one generator: torch's CPU generator gives the same stream."
    whole = torch.rand(1000, generator=tensor_generator(0, "a", "w"))
    for size in (1, 7, 16, 17, 333):
        g = tensor_generator(0, "a", "w")
        assert torch.equal(torch.cat([torch.rand(min(size, 1000 - a), generator=g) for a in range(0, 1000, size)]),
                           whole), size


# ---- magnitude thresholds over chunks, exactly ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("size", [1, 5, 64, 1000])
def test_rank_selection_over_chunks_keeps_what_a_stable_sort_ranks(dtype, size):
    "Radix selection over chunks: the entries ranked in [lo, hi) by magnitude, ties by position, as argsort(stable)."
    from adaptkit.emr.methods import _keep_ranks, _RankKeep, _RankSelect
    g = torch.Generator().manual_seed(size)
    x = torch.cat([(torch.randn(600, generator=g) * 3).round() / 4, torch.randn(199, generator=g) * 1e-30,
                   torch.tensor([0.0, -0.0, 1e30, -1e30])]).abs().to(dtype)  # ties, zeros, tiny and huge values
    order = torch.sort(x.double(), descending=True, stable=True).indices
    n = len(x)
    for lo, hi in [(0, n // 5), (n // 10, n // 2), (0, 1), (n - 1, n), (0, n), (7, 7), (800, n - 2)]:
        want = torch.zeros(n, dtype=torch.bool)
        want[order[lo:hi]] = True
        spans = [(a, min(a + size, n)) for a in range(0, n, size)]
        select = _RankSelect([lo, hi - 1] if lo else [hi - 1], dtype) if hi > lo else None
        while select is not None:
            for a, b in spans: select.add(x[a:b])
            if not select.next_pass(): break
        keep = _RankKeep(lo, hi, select)
        assert torch.equal(torch.cat([keep(x[a:b]) for a, b in spans]), want), (lo, hi)
        assert torch.equal(_keep_ranks(x, lo, hi), want), (lo, hi)


def test_magnitude_pruning_breaks_ties_by_position():
    tau = torch.tensor([0.5, -1.0, 0.5, -0.5, 2.0, 0.5])
    assert torch.equal(prune_magnitude(tau, 0.5), tau * torch.tensor([1.0, 1, 0, 0, 1, 0]))
    assert torch.equal(prune_magnitude(tau, 0.7), tau * torch.tensor([1.0, 1, 1, 0, 1, 0]))


# ---- hand-worked pruning ----

TAU = torch.tensor([0.1, -0.5, 0.3, -0.2, 0.9, 0.05, -0.7, 0.4, 0.6, -0.8])  # magnitudes all different


def only(*where):
    return TAU * torch.tensor([float(i in where) for i in range(len(TAU))])


@pytest.mark.parametrize("density, gamma, kept", [
    (0.5, 0.2, (1, 2, 6, 7, 8)),  # drop 0.9, -0.8 (top 20%), keep the next five, drop 0.1, -0.2, 0.05
    (0.5, 0.0, (1, 4, 6, 8, 9)),  # gamma 0: magnitude pruning
    (0.3, 0.1, (6, 8, 9)),  # drop 0.9, keep -0.8, -0.7, 0.6
    (0.5, 0.7, (0, 2, 3, 5, 7)),  # only 1 - density = 50% can go from the top: the five smallest stay
    (0.8, 0.3, (0, 1, 2, 3, 5, 6, 7, 8)),  # 1 - density = 20% from the top: 0.9, -0.8
    (0.05, 0.1, ()),  # int(0.05 * 10) = 0 kept
])
def test_breadcrumbs_by_hand(density, gamma, kept):
    assert torch.equal(prune_breadcrumbs(TAU, density, gamma), only(*kept))


def test_breadcrumbs_keep_the_shape_and_density_one_keeps_everything():
    t = TAU.reshape(2, 5)
    assert torch.equal(prune_breadcrumbs(t, 0.5, 0.2), only(1, 2, 6, 7, 8).reshape(2, 5))
    assert prune_breadcrumbs(TAU, 1.0, 0.5) is TAU and prune_magnitude(TAU, 1.0) is TAU
    assert torch.equal(prune_breadcrumbs(torch.tensor(3.0), 0.5, 0.1), torch.tensor(0.0))  # a scalar: int(0.5) = 0
    assert prune_breadcrumbs(torch.zeros(0, 4), 0.5, 0.1).shape == (0, 4)


def test_breadcrumbs_merge_by_hand():
    "Two task vectors, breadcrumbs_ties at density 0.4, gamma 0.2 on a 5-entry tensor: the pruning, then the election."
    a, b = torch.tensor([5.0, -1.0, 2.0, -3.0, 0.5]), torch.tensor([-4.0, 2.5, 1.0, -0.2, 3.0])
    # a keeps ranks 1-2 of |a| (3, 2): (0, 0, 2, -3, 0); b keeps ranks 1-2 of |b| (3, 2.5): (0, 2.5, 0, 0, 3)
    got = merge_tensor(torch.zeros(5), torch.stack([a, b]), "breadcrumbs_ties", [1.0, 2.0], [0.4, 0.4], [0.2, 0.2])
    # weighted: (0, 0, 2, -3, 0), (0, 5, 0, 0, 6); all signs agree; no normalize by default: the sums
    assert got.tolist() == [0.0, 5.0, 2.0, -3.0, 6.0]
    got = merge_tensor(torch.zeros(5), torch.stack([a, b]), "breadcrumbs", [1.0, 2.0], [0.4, 0.4], [0.2, 0.2],
                       normalize=True)
    assert got.tolist() == pytest.approx([0.0, 5 / 3, 2 / 3, -1.0, 2.0])


# ---- the engine on saved models ----

@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_finetunes):
    "A tiny Llama base and three fine-tuned copies (every weight perturbed), saved as folders: (root, names)."
    root = tmp_path_factory.mktemp("merge-methods")
    tiny_finetunes(root, 3)
    return root


def state(folder):
    return load_file(folder / "model.safetensors")


def test_ties_on_saved_models_equals_peft_tensor_by_tensor(models):
    tasks = {f"ft{i}": models / f"ft{i}" for i in range(3)}
    merged = ties_merge(models / "base", tasks, density=0.3, scaling=0.9, progress=False)
    pre, fts = state(models / "base"), [state(p) for p in tasks.values()]
    assert set(merged.state_dict) == set(pre) and merged.heads == {t: {} for t in tasks}
    for name, b in pre.items():
        want = b + merge_utils.ties([ft[name] - b for ft in fts], torch.full((3,), 0.9), 0.3)
        torch.testing.assert_close(merged.state_dict[name], want, rtol=1e-6, atol=1e-7)


def test_dare_merge_is_reproducible_from_files_and_from_state_dicts(models):
    tasks = {f"ft{i}": models / f"ft{i}" for i in range(3)}
    a = merge_models(models / "base", tasks, method="dare_linear", density=0.3, seed=7, progress=False)
    b = merge_models(state(models / "base"), {t: state(p) for t, p in tasks.items()}, method="dare_linear",
                     density=0.3, seed=7, progress=False)
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    c = merge_models(models / "base", tasks, method="dare_linear", density=0.3, seed=8, progress=False)
    assert not torch.equal(a.state_dict["model.layers.0.mlp.up_proj.weight"],
                           c.state_dict["model.layers.0.mlp.up_proj.weight"])


def test_a_parameter_that_does_not_resolve_fails_before_any_tensor_is_read():
    reads = []

    class Counting(dict):
        def __getitem__(self, k):
            reads.append(k)
            return super().__getitem__(k)

    pre = Counting(w=torch.zeros(4), mlp=torch.zeros(3))
    ft = {t: Counting(w=torch.ones(4) * i, mlp=torch.ones(3)) for i, t in enumerate("ab", 1)}
    with pytest.raises(ValueError, match=r"task 'b': no weight applies to tensor 'w' \(its filters: \['mlp'\]\)"):
        merge_models(pre, ft, method="breadcrumbs", gamma=0.1,
                     weight={"a": 0.5, "b": [{"filter": "mlp", "value": 0.5}]}, progress=False)
    with pytest.raises(ValueError, match=r"task 'a', tensor 'mlp': gamma must be a number in \[0, 1\), got 1.5"):
        merge_models(pre, ft, method="breadcrumbs", gamma=[{"filter": "mlp", "value": 1.5}, {"value": 0.1}],
                     progress=False)
    assert reads == []


def test_merge_from_config_saves_a_merged_model_with_its_config(models, tmp_path):
    cfg = {"merge_method": "breadcrumbs_ties", "base_model": str(models / "base"), "dtype": "bfloat16",
           "models": [{"model": str(models / f"ft{i}"), "parameters": {"weight": w, "gamma": 0.05}}
                      for i, w in enumerate([0.5, 1.0, 0.8])],
           "parameters": {"density": [{"filter": "mlp", "value": 0.3}, {"value": 0.6}], "lambda": 0.9}}
    (tmp_path / "merge.yml").write_text(yaml.safe_dump(cfg))
    merged = merge_from_config(tmp_path / "merge.yml", tmp_path / "out", progress=False)
    again = MergedModel.from_pretrained(tmp_path / "out")
    assert again.tasks == ["ft0", "ft1", "ft2"]
    assert "\nbase_model: base\n" in (tmp_path / "out" / "README.md").read_text()  # the card's configuration
    assert str(models) not in (tmp_path / "out" / "adaptkit.json").read_text()  # local paths reduced to names
    assert again.settings["density"] == {t: [{"filter": "mlp", "value": 0.3}, {"filter": None, "value": 0.6}]
                                         for t in again.tasks}
    pre, fts = state(models / "base"), [state(models / f"ft{i}") for i in range(3)]
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"):
        d = 0.3 if "mlp" in name else 0.6
        want = merge_tensor(pre[name], torch.stack([ft[name] - pre[name] for ft in fts]), "breadcrumbs_ties",
                            [0.5, 1.0, 0.8], [d] * 3, [0.05] * 3, scaling=0.9)
        assert again.state_dict[name].dtype == torch.bfloat16
        assert torch.equal(again.state_dict[name], want.bfloat16()) and torch.equal(merged.state_dict[name],
                                                                                  want.bfloat16())
    model = again.load_task_model("ft1")
    assert model(torch.tensor([[1, 2, 3]])).logits.shape[:2] == (1, 3)


# ---- the configuration's errors: each names the field, before any model is opened ----

OK = {"merge_method": "dare_ties", "base_model": "/nowhere/base",
      "models": [{"model": "/nowhere/a", "parameters": {"weight": 0.5, "density": 0.5}},
                 {"model": "/nowhere/b", "parameters": {"weight": 0.5, "density": 0.5}}]}


@pytest.mark.parametrize("change, message", [
    ({"slices": [{"sources": [{"model": "/nowhere/a", "layer_range": [0, 2]}]}]}, "slices: layer slices"),
    ({"modules": {"text": {}}}, "modules: per-module merges are not supported"),
    ({"tokenizer_source": "union"}, "tokenizer_source: 'union': adaptkit does not build tokenizers"),
    ({"tokenizer": {"source": "union"}}, "tokenizer: adaptkit does not build tokenizers"),
    ({"chat_template": "chatml"}, "chat_template: adaptkit does not set chat templates"),
    ({"merge_method": "della"}, "merge_method 'della' is a mergekit method adaptkit does not have; adaptkit has: "
                                "linear, task_arithmetic, ties, magnitude_prune, dare_linear, dare_ties, breadcrumbs, "
                                "breadcrumbs_ties, emr"),
    ({"merge_method": "model_stock"}, "merge_method 'model_stock' is a mergekit method"),
    ({"name": "x"}, "name: unknown field"),
    ({"parameters": {"epsilon": 0.1}}, r"parameters.epsilon: not a parameter of dare_ties \(it reads normalize, "
                                       "lambda, int8_mask, rescale, weight, density\\)"),
    ({"parameters": {"rescale": "l1"}}, "parameters.rescale: must be true or false, got 'l1'"),
    ({"parameters": {"lambda": "big"}}, "parameters.lambda: lambda must be a finite number, got 'big'"),
    ({"parameters": {"weight": [0.1, 0.5, 0.9]}}, "parameters.weight: a list of values is a mergekit gradient"),
    ({"out_dtype": "int4"}, "out_dtype: 'int4' is not a float dtype"),
    ({"models": [{"model": "/nowhere/a", "parameters": {"weight": 0.5, "gamma": 0.1}}, OK["models"][1]]},
     "models\\[0\\].parameters.gamma: not a per-model parameter of dare_ties; it reads weight, density"),
    ({"models": [{"model": {"path": "/nowhere/a"}}, OK["models"][1]]}, "models\\[0\\].model: a model is a repo id"),
    ({"models": [{"model": "org/a+org/lora", "parameters": {"weight": 1}}, OK["models"][1]]}, "the mergekit way"),
    ({"models": [{"model": "/nowhere/a", "parameters": {"density": 0.5}}, OK["models"][1]]},
     r"models\[0\] \(/nowhere/a\): weight is required by dare_ties"),
    ({"models": []}, "models: a list of {model, parameters} is required"),
    ({"base_model": "/nowhere/a"}, "1 model\\(s\\) besides the base; a merge needs at least two"),
])
def test_every_unsupported_field_is_named_before_any_model_is_opened(change, message):
    with pytest.raises(ValueError, match=message):
        merge_from_config(OK | change, progress=False)


def test_a_value_out_of_range_is_named_with_its_model_before_any_model_is_read(models, monkeypatch):
    "Every value of a configuration is checked when it is read (issue 37, item 4: `weight: abc` caught first)."
    import adaptkit.emr.inputs as inputs
    monkeypatch.setattr(inputs, "_open_source", lambda *a, **k: pytest.fail("a model was opened"))
    for params, message in [({"weight": 1, "density": 1.5}, r"density must be a number in \(0, 1\], got 1.5"),
                            ({"weight": "abc"}, "weight must be a finite number, got 'abc'"),
                            ({"weight": 1.0e39}, r"weight must be a finite number, got 1e\+39 \(float32's largest")]:
        cfg = OK | {"base_model": str(models / "base"),
                    "models": [{"model": str(models / "ft0"), "parameters": params},
                               {"model": str(models / "ft1"), "parameters": {"weight": 1, "density": 0.5}}]}
        with pytest.raises(ValueError, match=r"models\[0\].parameters: " + message):
            merge_from_config(cfg, progress=False)
    monkeypatch.undo()  # a filter's value is checked per tensor, once the tensors are known, before any is read
    with pytest.raises(ValueError, match=r"task 'ft0', tensor 'lm_head.weight': density must be a number in"):
        merge_models(models / "base", {"ft0": models / "ft0", "ft1": models / "ft1"}, method="ties",
                     density={"ft0": [{"filter": "lm_head", "value": 1.5}, {"value": 0.5}], "ft1": 0.5},
                     progress=False)


def test_a_yaml_file_that_is_not_a_configuration_is_named(tmp_path):
    (tmp_path / "bad.yml").write_text("merge_method: [ties\n")
    with pytest.raises(ValueError, match="bad.yml: not valid YAML"):
        read_merge_config(tmp_path / "bad.yml")
    (tmp_path / "list.yml").write_text("- ties\n")
    with pytest.raises(ValueError, match="list.yml: a merge configuration is a mapping of fields"):
        read_merge_config(tmp_path / "list.yml")
    with pytest.raises(FileNotFoundError, match="no merge configuration at"):
        read_merge_config(tmp_path / "missing.yml")


def test_the_method_table_matches_mergekits_defaults():
    "mergekit 0.1.5's registry: which methods elect signs, prune how, and normalize by default."
    table = {n: (m.prune, m.consensus, m.normalize) for n, m in MERGE_METHODS.items()}
    assert table == {
        "linear": (None, False, True), "task_arithmetic": (None, False, False),
        "ties": ("magnitude", True, True), "magnitude_prune": ("magnitude", False, False),
        "dare_linear": ("random", False, False), "dare_ties": ("random", True, False),
        "breadcrumbs": ("breadcrumbs", False, False), "breadcrumbs_ties": ("breadcrumbs", True, False),
    }


# ---- mergekit's own output (optional: its own venv) ----

RUN_MERGEKIT = """
import sys, yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions
options = MergeOptions(copy_tokenizer=False, write_model_card=False, quiet=True, random_seed=0)
for config, out in zip(sys.argv[1::2], sys.argv[2::2]):
    run_merge(MergeConfiguration.model_validate(yaml.safe_load(open(config))), out, options)
"""


def mergekit_configs(root: Path) -> dict:
    "Name -> configuration: every method both have, deterministic (DARE at density 1, or compared in law below)."
    model = lambda i, **p: {"model": str(root / f"ft{i}"), "parameters": p}
    base = {"base_model": str(root / "base"), "dtype": "float32"}
    return {
        "linear": {"merge_method": "linear", "dtype": "float32",
                   "models": [model(i, weight=w) for i, w in enumerate([0.2, 0.3, 0.5])]},
        "linear_sum": {"merge_method": "linear", "dtype": "float32", "parameters": {"normalize": False},
                       "models": [model(i, weight=w) for i, w in enumerate([0.2, 0.3, 0.4])]},
        "task_arithmetic": {**base, "merge_method": "task_arithmetic", "parameters": {"lambda": 0.8},
                            "models": [model(i, weight=w) for i, w in enumerate([0.5, 1.0, 0.7])]},
        "ties": {**base, "merge_method": "ties", "parameters": {"lambda": 0.8, "int8_mask": True},
                 "models": [{"model": str(root / "base")},
                            *(model(i, weight=w, density=0.5) for i, w in enumerate([0.2, 0.3, 0.5]))]},
        "ties_filters": {**base, "merge_method": "ties", "parameters": {"normalize": False, "weight": 1.0,
                         "density": [{"filter": "mlp", "value": 0.3}, {"value": 0.7}]},
                         "models": [model(0), model(1, density=0.5), model(2, weight=-0.5)]},
        "breadcrumbs": {**base, "merge_method": "breadcrumbs",
                        "models": [model(i, weight=1.0, density=0.6, gamma=0.1) for i in range(3)]},
        "breadcrumbs_ties": {**base, "merge_method": "breadcrumbs_ties", "parameters": {"normalize": True},
                             "models": [model(i, weight=0.5, density=0.8, gamma=g) for i, g in
                                        enumerate([0.01, 0.05, 0.2])]},
        "dare_ties": {**base, "merge_method": "dare_ties",
                      "models": [model(i, weight=w, density=1.0) for i, w in enumerate([0.3, 0.3, 0.6])]},
        "dare_linear": {**base, "merge_method": "dare_linear", "parameters": {"normalize": True},
                        "models": [model(i, weight=w) for i, w in enumerate([0.3, 0.3, 0.6])]},
        "dare_drop": {**base, "merge_method": "dare_linear",
                      "models": [model(0, weight=1.0, density=0.3), model(1, weight=0.0, density=0.3)]},
    }


@pytest.fixture(scope="module")
def mergekit_outputs(models, tmp_path_factory):
    "mergekit's merged state dict for each configuration, run once in its own venv."
    if not MERGEKIT.exists():
        pytest.skip(f"mergekit is not installed at {MERGEKIT} (make .venv-mergekit/bin/mergekit-yaml)")
    work, args = tmp_path_factory.mktemp("mergekit"), []
    for name, cfg in mergekit_configs(models).items():
        (work / f"{name}.yml").write_text(yaml.safe_dump(cfg))
        args += [str(work / f"{name}.yml"), str(work / name)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(MERGEKIT), "-c", RUN_MERGEKIT, *args], env=env, capture_output=True, text=True,
                         timeout=300)
    if run.returncode: pytest.fail(f"mergekit failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return {name: state(work / name) for name in mergekit_configs(models)}


@pytest.mark.parametrize("name", [n for n in mergekit_configs(Path(".")) if n != "dare_drop"])
def test_adaptkit_equals_mergekit(models, mergekit_outputs, name):
    ours = merge_from_config(mergekit_configs(models)[name], progress=False)
    theirs = mergekit_outputs[name]
    assert set(ours.state_dict) == set(theirs)
    for k, v in theirs.items():
        torch.testing.assert_close(ours.state_dict[k], v, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}, {k}: {m}")


def test_dare_drops_like_mergekit_in_law(models, mergekit_outputs):
    "Random masks differ by construction: both keep ~30% of the entries and the L1 mass of the task vector."
    cfg = mergekit_configs(models)["dare_drop"]
    ours, theirs = merge_from_config(cfg, progress=False).state_dict, mergekit_outputs["dare_drop"]
    pre, ft = state(models / "base"), state(models / "ft0")
    for merged in (ours, theirs):
        delta = torch.cat([(merged[k] - pre[k]).reshape(-1) for k in pre])
        tau = torch.cat([(ft[k] - pre[k]).reshape(-1) for k in pre])
        assert abs((delta != 0).float().mean().item() - 0.3) < 0.02
        assert abs(delta.abs().sum().item() / tau.abs().sum().item() - 1) < 0.05


# ---- the per-tensor steps, by hand ----

@pytest.mark.parametrize("rescale, factor", [(None, 2.0), (True, 2.0), (False, 1.0)])  # None: the default
def test_merge_tensor_drops_like_dare_and_rescales_by_default(rescale, factor):
    "One model, weight 1, density 0.5: each entry is dropped where the generator's draw is >= 0.5, else kept / 0.5."
    tau, base = torch.randn(1, 8, 6, generator=torch.Generator().manual_seed(1)), torch.randn(8, 6)
    keep = torch.rand((8, 6), generator=tensor_generator(0, "a", "w")) < 0.5
    options = {} if rescale is None else {"rescale": rescale}
    got = merge_tensor(base, tau, "dare_linear", [1.0], [0.5], generators=[tensor_generator(0, "a", "w")], **options)
    assert 0 < keep.sum() < keep.numel()
    torch.testing.assert_close(got, base + tau[0] * keep * factor, rtol=0, atol=1e-6)


def test_merge_tensor_and_tensor_parameters_take_a_method_or_its_name():
    taus, base = task_vectors(2), torch.randn(8, 6)
    by_name = merge_tensor(base, taus, "ties", [0.4, 0.6], [0.5, 0.5])
    assert torch.equal(merge_tensor(base, taus, MERGE_METHODS["ties"], [0.4, 0.6], [0.5, 0.5]), by_name)
    settings = {"weight": {"a": 0.5, "b": [{"filter": "mlp", "value": 2}, {"value": 1}]}, "density": {"a": 0.3}}
    want = {"mlp.w": {"weight": [0.5, 2.0], "density": [0.3, 1.0]}, "attn.w": {"weight": [0.5, 1.0],
                                                                                "density": [0.3, 1.0]}}
    for method in ("ties", MERGE_METHODS["ties"]):
        assert tensor_parameters(method, settings, ["a", "b"], ["mlp.w", "attn.w"]) == want


@pytest.mark.parametrize("settings, message", [
    ({"weight": {"a": 1.0}}, "task 'b': no weight given"),
    ({"weight": {"a": 1.0, "b": [0.1, 0.2]}}, "task 'b': weight: a list of values is a mergekit gradient"),
    ({"weight": {"a": {"filter": "mlp"}, "b": 1}}, "task 'a': weight: a condition must be {filter, value}"),
])
def test_tensor_parameters_name_the_task_and_parameter(settings, message):
    with pytest.raises(ValueError) as e:
        tensor_parameters("task_arithmetic", settings, ["a", "b"], ["w"])
    assert str(e.value).startswith(message)


def test_sign_agreement_elects_plus_on_a_zero_sum():
    weighted = torch.tensor([[1.0, 2.0, 0.0], [-1.0, -1.0, 0.0]])
    assert sign_agreement(weighted).tolist() == [[True, True, False], [False, False, False]]
    # the engine's numpy arrays elect the same
    assert sign_agreement(weighted.numpy()).tolist() == [[True, True, False], [False, False, False]]


@pytest.mark.parametrize("consensus", [True, False])
def test_combine_weighted_divides_a_zero_weight_sum_by_one(consensus):
    "Weights 1 and -1 on opposite task vectors: both agree with the elected sign, their weights sum to 0."
    weights = torch.tensor([1.0, -1.0]).reshape(2, 1)
    weighted = weights * torch.tensor([[1.0, 3.0], [-1.0, -3.0]])  # [[1, 3], [1, 3]]
    got = combine_weighted(weighted, weights, consensus, normalize=True)
    assert got.tolist() == [2.0, 6.0]  # the sum, undivided


def test_combine_weighted_normalizes_by_summed_weights_below_one():
    weights = torch.tensor([0.25, 0.25]).reshape(2, 1)
    weighted = weights * torch.tensor([[1.0, -2.0], [3.0, -2.0]])
    assert combine_weighted(weighted, weights, False, normalize=True).tolist() == [2.0, -2.0]
    assert combine_weighted(weighted, weights, True, normalize=True).tolist() == [2.0, -2.0]
    assert combine_weighted(weighted, weights, False, normalize=False).tolist() == [1.0, -1.0]


def test_combine_weighted_divides_by_a_weight_sum_of_1e_8_as_mergekit():
    "mergekit replaces a summed weight below 1e-8 by 1 (`divisor.abs() < 1e-8`): 1e-8 itself still divides."
    for total, want in [(1e-8, 2.0), (-1e-8, 2.0), (9e-9, 1.8e-8)]:  # 9e-9: the sum, undivided
        weights = torch.tensor([total, 0.0], dtype=torch.float64).reshape(2, 1)
        weighted = weights * torch.tensor([[2.0], [5.0]], dtype=torch.float64)
        assert combine_weighted(weighted, weights, False, normalize=True).tolist() == [pytest.approx(want)], total
