"""Tensors the models do not share, decided from the headers before any tensor is read: a fine-tune whose vocabulary
was resized (`resize_token_embeddings(520)` on a base of 512 rows) is refused by every merge, naming the task, the
tensor, both shapes and the remedy, where a merged model used to be written without `embed_tokens` and `lm_head`; a
float tensor of the base that no fine-tune has is refused for one merged model, which transformers would load with
it initialised afresh; heads of other labels stay each task's own."""
import subprocess
import sys

import pytest
import yaml
from safetensors.torch import load_file, save_file

from adaptkit.emr import emr_merge, merge_from_config, merge_models
from adaptkit.emr.merge import plan_merge_config

EMBED = r"'(lm_head|model\.embed_tokens)\.weight'"


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_finetunes):
    "A tiny Llama base (512 rows of vocabulary, untied head), two fine-tuned copies and one resized to 520 rows."
    from transformers import AutoModelForCausalLM
    root = tmp_path_factory.mktemp("shared")
    base = tiny_finetunes(root, 2, tokenizer=True)
    assert base.config.vocab_size == 512 and not base.config.tie_word_embeddings
    resized = AutoModelForCausalLM.from_pretrained(root / "ft1")
    resized.resize_token_embeddings(520, mean_resizing=False)  # a fine-tune that added 8 tokens
    resized.save_pretrained(root / "ft-520")
    return root


def config(models, method, tasks=("ft0", "ft-520")) -> dict:
    per_model = {"weight": 1.0} | ({"density": 0.5} if method == "ties" else {})
    return {"merge_method": method, "base_model": str(models / "base"),
            "models": [{"model": str(models / t), "parameters": per_model} for t in tasks]}


@pytest.mark.parametrize("method", ["ties", "linear"])
def test_a_resized_vocabulary_is_refused_by_merge_from_config_and_its_plan(models, tmp_path, monkeypatch, method,
                                                                      no_tensor_may_be_read):
    "TIES or linear over a fine-tune of 520 rows: refused naming the task, tensor, both shapes and the remedy."
    no_tensor_may_be_read(monkeypatch)
    message = (rf"task 'ft-520': tensor {EMBED} has shape \[520, 32\] in .*ft-520/model.safetensors, the base "
               rf"\[512, 32\] in .*base/model.safetensors \(and 1 more: \[{EMBED}\]\): their configs differ in "
               rf"vocab_size 520 \(the base: 512\).*nothing was written.*resize_token_embeddings\(520\).*"
               rf"exclude=\['lm_head.weight', 'model.embed_tokens.weight'\]")
    with pytest.raises(ValueError, match=message):
        merge_from_config(config(models, method), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=message):
        plan_merge_config(config(models, method), tmp_path / "out")  # the CLI's --dry-run says it too


def test_a_resized_vocabulary_is_refused_by_merge_models_and_emr_merge(models, tmp_path, monkeypatch,
                                                                       no_tensor_may_be_read):
    no_tensor_may_be_read(monkeypatch)
    tasks = {"ft0": models / "ft0", "ft-520": models / "ft-520"}
    message = rf"task 'ft-520': tensor {EMBED} has shape \[520, 32\].*the base \[512, 32\].*vocab_size 520"
    with pytest.raises(ValueError, match=message):
        merge_models(models / "base", tasks, method="ties", density=0.5, out_dir=tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match=message):
        merge_models(models / "base", tasks, progress=False)  # in memory too
    # EMR kept both tensors unmerged per task (full copies, task ft0's included): now the same refusal
    with pytest.raises(ValueError, match=message + ".*EMR's task models take theirs"):
        emr_merge(models / "base", tasks, out_dir=tmp_path / "emr", progress=False)
    assert not list(tmp_path.iterdir())


def test_a_resized_vocabulary_kept_per_task_when_excluded(models, tmp_path):
    "`exclude` names the vocabulary tensors: EMR keeps each task's own, and each task's model is whole."
    tasks = {"ft0": models / "ft0", "ft-520": models / "ft-520"}
    bundle = emr_merge(models / "base", tasks, exclude=["model.embed_tokens.weight", "lm_head.weight"],
                       out_dir=tmp_path / "emr", progress=False)
    assert bundle.meta["own"]["ft-520"]["model.embed_tokens.weight"]["shape"] == [520, 32]
    assert bundle.load_task_model("ft-520").get_input_embeddings().weight.shape == (520, 32)


def test_the_cli_refuses_a_resized_vocabulary_and_exits_nonzero(models, tmp_path):
    (tmp_path / "merge.yml").write_text(yaml.safe_dump(config(models, "ties")))
    run = subprocess.run([sys.executable, "-m", "adaptkit.cli", "merge", str(tmp_path / "merge.yml"), "--output_dir",
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2 and "vocab_size 520 (the base: 512)" in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_base_tensor_no_fine_tune_has_is_refused_for_one_merged_model(models, tmp_path, monkeypatch,
                                                                         no_tensor_may_be_read):
    """Fine-tunes saved without the base's untied `lm_head`: one merged model (loaded alone, with the base's config)
    would lack it and transformers would initialise it afresh, so the merge refuses it unless excluded."""
    for t in ("ft0", "ft1"):
        (tmp_path / t).mkdir()
        (tmp_path / t / "config.json").write_bytes((models / t / "config.json").read_bytes())
        sd = load_file(models / t / "model.safetensors")
        save_file({k: v for k, v in sd.items() if k != "lm_head.weight"}, tmp_path / t / "model.safetensors")
    tasks = {t: tmp_path / t for t in ("ft0", "ft1")}
    with monkeypatch.context() as m:
        no_tensor_may_be_read(m)
        with pytest.raises(ValueError, match=r"tensor 'lm_head.weight' of the base \(.*base/model.safetensors\) is in "
                                             r"no fine-tuned model: the merged checkpoint would lack it"):
            merge_models(models / "base", tasks, out_dir=tmp_path / "out", progress=False)
        cfg = {"merge_method": "linear", "base_model": str(models / "base"),
               "models": [{"model": str(p), "parameters": {"weight": 1.0}} for p in tasks.values()]}
        with pytest.raises(ValueError, match="tensor 'lm_head.weight' of the base"):
            plan_merge_config(cfg)  # the CLI's --dry-run
    assert not (tmp_path / "out").exists()
    merged = merge_models(models / "base", tasks, exclude=["lm_head.weight"], progress=False)  # knowingly
    assert "lm_head.weight" not in merged.state_dict
    # one fine-tune lacking it while the other has it: an incomplete checkpoint, for every merge
    with pytest.raises(ValueError, match="task 'ft0' .* has no tensor 'lm_head.weight', which the base and task 'b'"):
        emr_merge(models / "base", {"ft0": tasks["ft0"], "b": models / "ft1"}, progress=False)
