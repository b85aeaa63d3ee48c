"""What the merge path imports (issue 37): `adaptkit merge` of local safetensors files needs torch, safetensors and the
files' JSON. transformers' model machinery, tokenizers, PIL and jinja2 load only where a model or tokenizer is built or
a card rendered, and the Hub's HTTP client only where a repo is downloaded or pushed (or, huggingface_hub's repocard
loading it, a card rendered); every MB imported counts against the merge's peak memory. Each check is a fresh
process."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

# never needed to merge local files; jinja2 and the HTTP client (huggingface_hub.hf_api) only once a card is rendered
MODEL_MACHINERY = ("transformers", "tokenizers", "PIL", "trl.trainer", "peft", "accelerate", "datasets")
CARD_AND_HTTP = ("jinja2", "huggingface_hub.hf_api", "huggingface_hub.repocard", "httpcore2", "trio", "anyio")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    "A tiny Llama-shaped base and two fine-tuned copies: safetensors and a config.json, written without transformers."
    root = tmp_path_factory.mktemp("models")
    shapes = {"model.embed_tokens.weight": (64, 16), "model.layers.0.self_attn.q_proj.weight": (16, 16),
              "model.layers.0.mlp.up_proj.weight": (32, 16), "model.norm.weight": (16,), "lm_head.weight": (64, 16)}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "vocab_size": 64}
    for i, name in enumerate(["base", "ft0", "ft1"]):
        g = torch.Generator().manual_seed(i)
        (root / name).mkdir()
        save_file({n: torch.randn(s, generator=g) for n, s in shapes.items()}, root / name / "model.safetensors",
                  metadata={"format": "pt"})
        (root / name / "config.json").write_text(json.dumps(config))
    return root


def merge_config(root, method: str) -> dict:
    models = [str(root / "ft0"), str(root / "ft1")] if method == "emr" else [
        {"model": str(root / t), "parameters": {"weight": 1.0, "density": 0.5}} for t in ("ft0", "ft1")]
    return {"merge_method": method, "base_model": str(root / "base"), "models": models}


def imported_after(code: str) -> dict:
    "Run `code` in a fresh interpreter; the heavy modules in `sys.modules` at each `seen('<stage>')` it calls."
    heavy = MODEL_MACHINERY + CARD_AND_HTTP
    prelude = ("import json, sys\nstages = {}\n"
               f"def seen(stage): stages[stage] = [m for m in {heavy!r} if m in sys.modules]\n")
    run = subprocess.run([sys.executable, "-c", prelude + code + "\nprint(json.dumps(stages))"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TQDM_DISABLE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_importing_the_merge_and_planning_one_load_no_model_machinery_card_or_http_client(models, tmp_path):
    cfg = merge_config(models, "ties")
    stages = imported_after(
        "from adaptkit.emr.merge import merge_from_config, plan_merge_config\nseen('import')\n"
        f"plan = plan_merge_config({cfg!r}, {str(tmp_path / 'out')!r}, max_shard_size='5KB')\nseen('plan')\n"
        "assert plan['shards'] > 1 and plan['merged_tensors'] == 5, plan\n")
    assert stages == {"import": [], "plan": []}


@pytest.mark.parametrize("method", ["ties", "emr"])
def test_a_local_merge_loads_no_model_machinery_and_the_card_alone_the_http_client(models, tmp_path, method):
    "The merge streams with none of them; the card (jinja2, huggingface_hub's repocard) is written after the tensors."
    out = tmp_path / "out"
    stages = imported_after(
        "import adaptkit.emr.merge as m\nimport adaptkit.emr.artifact as a\n"
        "def before_card(render):  # the tensors are written when the card is rendered\n"
        "    def wrapped(*args, **kw): seen('tensors'); return render(*args, **kw)\n"
        "    return wrapped\n"
        "for cls in (a.MergedModel, a.EMRBundle): cls.model_card = before_card(cls.model_card)\n"
        f"m.merge_from_config({merge_config(models, method)!r}, {str(out)!r}, max_shard_size='5KB', progress=False)\n"
        "seen('merged')\n")
    assert stages["tensors"] == [], stages
    assert not set(stages["merged"]) & set(MODEL_MACHINERY), stages
    assert (out / "README.md").is_file() and (out / "adaptkit.json").is_file()


def test_the_merge_commands_dry_run_loads_no_model_machinery(models, tmp_path):
    "`adaptkit merge --dry-run`: the command's parser (trl's) and the plan, and none of the model machinery."
    yaml_file = tmp_path / "merge.yaml"
    yaml_file.write_text(json.dumps(merge_config(models, "ties")))  # YAML reads JSON
    stages = imported_after(
        "from adaptkit.cli import main\n"
        f"assert main(['merge', {str(yaml_file)!r}, '--output_dir', {str(tmp_path / 'out')!r}, '--dry-run']) == 0\n"
        "seen('dry-run')\n")
    assert stages == {"dry-run": []}
    assert not (tmp_path / "out").exists()
