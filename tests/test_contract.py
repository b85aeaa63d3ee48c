"""The artifact contract, as a user meets it: every method's artifact goes save -> push -> pull -> use through the same
verbs against a LocalHub, its card is adaptkit's, every trainer's `push_to_hub()` (TRL's habit, through HF_ENDPOINT)
uploads adaptkit's card, and every adapter refuses a base it was not made on."""
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from huggingface_hub import HfApi

import adaptkit
from adaptkit.artifacts import Artifact
from adaptkit.models import BaseMismatchError
from adaptkit.hub import push_folder
from adaptkit.models import tiny_causal_lm

PAPER = {"pissa": "2404.02948", "aligner": "2402.02416", "repnoise": "2405.14577", "translora": "2405.17258", "emr": "2405.17461"}


def test_the_three_verbs_have_one_signature_shape():
    "Every public artifact class of the five methods has the contract's verbs, with the contract's parameters."
    classes = [adaptkit.PiSSAAdapter, adaptkit.Aligner, adaptkit.EMRBundle]
    classes += [getattr(adaptkit, n) for n in ("ImmunisedModel", "Discriminator", "TransferredAdapter") if n in adaptkit.__all__]
    for cls in classes:
        pull = inspect.signature(cls.from_pretrained).parameters
        assert "repo_id_or_path" in pull, (cls, list(pull))
        assert {"revision", "endpoint", "token"} <= set(pull), (cls, list(pull))
        push = inspect.signature(cls.push_to_hub).parameters
        assert {"repo_id", "endpoint", "token", "private", "revision", "commit_message"} <= set(push), (cls, list(push))
        assert "save_directory" in inspect.signature(cls.save_pretrained).parameters, cls


@pytest.fixture
def base_repo(hub, tiny_model_dir):
    "The tiny base pushed to the LocalHub: (repo id, commit)."
    return "me/tiny-base", push_folder(tiny_model_dir, "me/tiny-base", endpoint=hub.endpoint)


def _check_card(hub, repo_id: str, method: str, base: str, library: str):
    data = HfApi(endpoint=hub.endpoint).model_info(repo_id).card_data
    assert data.library_name == library, data
    assert {"adaptkit", method, f"arxiv:{PAPER[method]}"} <= set(data.tags), data.tags
    assert data.base_model == base


def _pissa_adapter(base_model, tok):
    from adaptkit.pissa import PiSSAAdapter, init_pissa, pissa_config
    from adaptkit.models import fingerprint
    import tempfile
    model = tiny_causal_lm(tok)
    fp = fingerprint(model)
    init = tempfile.mkdtemp()
    pm = init_pissa(model, pissa_config(4, niter=None), init_dir=f"{init}/init")
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n: p.add_(0.05)  # stands in for training: the adapter moved away from its init
    art = PiSSAAdapter(pm, tok, init_dir=f"{init}/init")
    art.base_model, art.base_fingerprint, art.settings = base_model, fp, {"pissa_rank": 4, "lora_rank": 8}
    return art


@pytest.mark.filterwarnings("ignore:init_pissa replaced")
def test_pissa_adapter_round_trip_and_wrong_base(hub, base_repo, tiny_tok, tmp_path):
    art = _pissa_adapter(base_repo[0], tiny_tok)
    ids = tiny_tok(["2 + 2 ="], return_tensors="pt")
    want = art.model(**ids).logits
    art.save_pretrained(tmp_path / "local")
    commit = art.push_to_hub("me/pissa", endpoint=hub.endpoint, revision="v1", commit_message="first")
    assert HfApi(endpoint=hub.endpoint).list_repo_commits("me/pissa", revision="v1")[0].commit_id == commit
    pulled = adaptkit.PiSSAAdapter.from_pretrained("me/pissa", revision="v1", endpoint=hub.endpoint)
    assert torch.allclose(pulled.model(**ids).logits, want, atol=1e-4)  # on the recorded base, pulled by repo id
    local = adaptkit.PiSSAAdapter.from_pretrained(tmp_path / "local", base=tiny_causal_lm(tiny_tok))
    assert torch.allclose(local.model(**ids).logits, want, atol=1e-4)
    art.push_to_hub("me/pissa", endpoint=hub.endpoint)
    _check_card(hub, "me/pissa", "pissa", base_repo[0], "peft")
    with pytest.raises(BaseMismatchError, match=r"made on the base me/tiny-base"):
        adaptkit.PiSSAAdapter.from_pretrained("me/pissa", endpoint=hub.endpoint, revision="v1", base=tiny_causal_lm(tiny_tok, seed=5))
    with pytest.raises(BaseMismatchError, match=r"made on the base me/tiny-base"):  # adaptkit's plain loader checks too
        adaptkit.load_adapter(tiny_causal_lm(tiny_tok, seed=5), "me/pissa", endpoint=hub.endpoint)


def test_aligner_round_trip(hub, base_repo, tiny_tok, tmp_path):
    aligner = adaptkit.Aligner(tiny_causal_lm(tiny_tok), tiny_tok, "Q: {question} A: {answer} Better:")
    aligner.base_model, aligner.settings = base_repo[0], {"identity_warmup_ratio": 0.2}
    want = aligner.correct(["2+2?"], ["5"], max_new_tokens=4)
    commit = aligner.push_to_hub("me/aligner", endpoint=hub.endpoint)
    pulled = adaptkit.Aligner.from_pretrained("me/aligner", endpoint=hub.endpoint, revision=commit)
    assert pulled.template == aligner.template and pulled.correct(["2+2?"], ["5"], max_new_tokens=4) == want
    _check_card(hub, "me/aligner", "aligner", base_repo[0], "transformers")
    with pytest.raises(ValueError, match="not a Aligner|not an Aligner|records artifact 'pissa-lora'"):
        _pissa_adapter(base_repo[0], tiny_tok).push_to_hub("me/not-aligner", endpoint=hub.endpoint)
        adaptkit.Aligner.from_pretrained("me/not-aligner", endpoint=hub.endpoint)


TRAINER_SCRIPT = """
import json, sys, datasets
from adaptkit.models import load_tokenizer
{setup}
trainer.train()
trainer.push_to_hub()
print(json.dumps({{"repo_id": trainer.hub_model_id}}))
"""

TRAINERS = {
    "pissa": ("peft", """
from adaptkit.pissa import PiSSAConfig, PiSSATrainer
tok = load_tokenizer("me/tiny-base")
rows = datasets.Dataset.from_list([{"prompt": f"{i} plus {i} is", "completion": f" {2 * i}."} for i in range(8)])
args = PiSSAConfig(sys.argv[1], pissa_r=2, max_steps=1, per_device_train_batch_size=4, use_cpu=True, save_strategy="no", disable_tqdm=True)
trainer = PiSSATrainer("me/tiny-base", args, train_dataset=rows, processing_class=tok)
"""),
    "aligner": ("transformers", """
from adaptkit.aligner.trainer import AlignerConfig, AlignerTrainer
tok = load_tokenizer("me/tiny-base")
rows = [{"question": f"what is {i} plus {i}?", "answer": f"{i}", "correction": f"{2 * i}"} for i in range(8)]
args = AlignerConfig(sys.argv[1], max_steps=1, per_device_train_batch_size=4, use_cpu=True, save_strategy="no", disable_tqdm=True)
trainer = AlignerTrainer("me/tiny-base", args, rows, processing_class=tok)
"""),
    "repnoise": ("transformers", """
from adaptkit.repnoise.trainer import RepNoiseConfig, RepNoiseTrainer
tok = load_tokenizer("me/tiny-base")
rows = [{"prompt": f"how do I do bad thing {i}?", "harmful": f"step {i}: do it", "harmless": "I can't help with that."} for i in range(4)]
args = RepNoiseConfig(sys.argv[1], max_steps=1, per_device_train_batch_size=2, max_length=32, use_cpu=True, save_strategy="no", disable_tqdm=True)
trainer = RepNoiseTrainer("me/tiny-base", args, rows, processing_class=tok)
"""),
}


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_trainer_push_to_hub_writes_adaptkit_card(method, hub, base_repo, tmp_path):
    "TRL's habit: `trainer.push_to_hub()` with HF_ENDPOINT at the LocalHub uploads the artifact with adaptkit's card."
    library, setup = TRAINERS[method]
    script = tmp_path / "train.py"
    script.write_text(TRAINER_SCRIPT.format(setup=textwrap.dedent(setup)))
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
    out = subprocess.run([sys.executable, str(script), str(tmp_path / f"{method}-run")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    repo_id = json.loads(out.stdout.strip().splitlines()[-1])["repo_id"]
    _check_card(hub, repo_id, method, base_repo[0], library)
    files = set(HfApi(endpoint=hub.endpoint).list_repo_files(repo_id))
    assert "adaptkit.json" in files and not any(f.startswith(("_", "checkpoint-")) for f in files), files
    readme = open(HfApi(endpoint=hub.endpoint).hf_hub_download(repo_id, "README.md"), encoding="utf-8").read()
    assert f"at revision `{base_repo[1]}`" in readme, readme[:600]  # the base pinned by commit
