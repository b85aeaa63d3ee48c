"""`plan_merge_config` (the CLI's `--dry-run`) against the merge it plans: the bytes it says the merge reads are the
bytes the merge reads from the models' files, counted on the reader the engine uses, for every kind of method: TIES
and breadcrumbs read a tensor streamed in chunks once per pass of their threshold's radix selection, then to merge."""
import pytest
import torch
from transformers import LlamaForSequenceClassification
from transformers.utils import logging as hf_logging

import adaptkit.emr.stream as stream
from adaptkit.emr.merge import merge_from_config, plan_merge_config
from adaptkit.tensorfiles import TensorFiles

hf_logging.disable_progress_bar()
CHUNK = 200  # parameters per chunk in these tests: the 64x16 embeddings and 32x16 MLP weights stream in chunks


@pytest.fixture
def models(tmp_path, classifier):
    "A base and two fine-tuned copies: perturbed weights, and a head of 3 or 4 labels of their own (read once each)."
    base = classifier()
    base.save_pretrained(tmp_path / "base")
    for i in range(2):
        ft, g = classifier(3 + i, seed=i + 1), torch.Generator().manual_seed(i + 1)
        ft.load_state_dict({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in base.state_dict().items()
                            if k != "score.weight"}, strict=False)
        ft.save_pretrained(tmp_path / f"ft{i}", max_shard_size="8KB")  # shards: reads span several files
    return tmp_path


def lora_adapter(folder):
    "A LoRA adapter of q_proj and v_proj (and the head, saved whole) over the base in `folder / 'base'`."
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(LlamaForSequenceClassification.from_pretrained(folder / "base"),
                        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))
    pm.save_pretrained(folder / "lora")
    return folder / "lora"


@pytest.fixture
def counted_reads(monkeypatch):
    "Every read of a tensor (or of its rows) from a safetensors file, as (file, bytes): both readers the engine uses."
    reads, read, read_into = [], TensorFiles.read, TensorFiles.read_into
    def counting_read(self, name, rows=None):
        out = read(self, name, rows)
        reads.append((self.file[name], out.nbytes))
        return out
    def counting_read_into(self, name, rows, buf):
        out = read_into(self, name, rows, buf)
        reads.append((self.file[name], out.nbytes))
        return out
    monkeypatch.setattr(TensorFiles, "read", counting_read)
    monkeypatch.setattr(TensorFiles, "read_into", counting_read_into)
    monkeypatch.setattr(stream, "_MERGE_CHUNK", CHUNK)  # the plan and the engine both chunk by these
    monkeypatch.setattr(stream, "_CHUNK", CHUNK)
    return reads


def config(folder, method, tasks=("ft0", "ft1")):
    "A mergekit-style configuration of `method` over `tasks`; the embeddings kept whole (density 1) by a filter."
    per_model = {"weight": 1.0}
    if method in ("ties", "breadcrumbs", "dare_ties"):
        per_model["density"] = [{"filter": "embed_tokens", "value": 1.0}, {"value": 0.5}]
    cfg = {"merge_method": method, "models": [{"model": str(folder / t), "parameters": per_model} for t in tasks]}
    if method == "emr": cfg["models"] = [str(folder / t) for t in tasks]
    return cfg | ({"base_model": str(folder / "base")} if method != "linear" else {})


def merged_reading(folder, cfg, reads, inputs=("base", "ft0", "ft1", "lora")) -> tuple[dict, int]:
    "The plan of `cfg`, and the bytes its merge then reads from the input folders."
    plan = plan_merge_config(cfg, folder / "out")
    assert not reads  # the plan reads headers only
    merge_from_config(cfg, folder / "out", progress=False)
    return plan, sum(n for f, n in reads if f.parent.name in inputs)


# 20 merged tensors (the heads are each task's own); 10 of them over 200 parameters and pruned at density 0.5 (the
# embeddings are over 200 but kept whole): TIES and breadcrumbs read those 3 times
@pytest.mark.parametrize("method, times", [
    ("ties", {1: 10, 3: 10}), ("breadcrumbs", {1: 10, 3: 10}),
    ("linear", {1: 20}), ("task_arithmetic", {1: 20}), ("dare_ties", {1: 20}), ("emr", {1: 20})])
def test_planned_bytes_to_read_are_the_bytes_the_merge_reads(models, counted_reads, method, times):
    "Issue 37: TIES and breadcrumbs read each pruned tensor that streams in chunks 3 times; the plan counts every read."
    plan, read = merged_reading(models, config(models, method), counted_reads)
    assert plan["bytes_to_read"] == read
    assert plan["tensors_by_reads"] == times
    if 3 in times:
        assert plan["bytes_to_read"] > plan["bytes_of_inputs"]
        assert "radix selection" in plan["reads"] and "read 3 times" in plan["reads"]
    else:  # each tensor once: linear reads its first model twice, as the base of the task vectors and as a model
        assert plan["bytes_to_read"] == plan["bytes_of_inputs"] and "reads each tensor once" in plan["reads"]


@pytest.mark.parametrize("method", ["ties", "emr"])
def test_planned_bytes_count_an_adapters_factors_for_every_chunk(models, counted_reads, method):
    "A LoRA task's `B A` is made per chunk from its whole A and B: the plan counts them once per chunk and pass."
    lora_adapter(models)
    counted_reads.clear()
    plan, read = merged_reading(models, config(models, method, ("ft0", "lora")), counted_reads)
    assert plan["bytes_to_read"] == read and plan["bytes_to_read"] > plan["bytes_of_inputs"]
