"""adaptkit.hub against a LocalHub on loopback: push/pull, cards through the stock client, tokens, datasets, adapters."""
import json
import logging

import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from adaptkit.data import QAC, DataError, load_rows
from adaptkit.hub import model_card, pull, push_folder, read_metadata, source_of
from adaptkit.localhub import LocalHub
from adaptkit.models import load_adapter, load_causal_lm, load_tokenizer

TOKEN = "hf_adaptkit_secret_token_123"


@pytest.fixture
def hub(tmp_path):
    with LocalHub(tmp_path / "hub", token=TOKEN) as h:
        yield h


def _card(**kw):
    return model_card("pissa", model_name="tiny", base_model="adaptkit/tiny-base", library_name="peft",
                      datasets=["adaptkit/arith"], settings={"r": 4}, **kw)


def test_push_pull_round_trip_with_card(hub, tiny_model_dir, tmp_path):
    results = [{"task": "text-generation", "dataset": "arith", "metric": "accuracy", "value": 0.25, "split": "test"}]
    commit = push_folder(tiny_model_dir, "team/tiny", card=_card(results=results), endpoint=hub.endpoint, token=TOKEN)
    assert read_metadata(tiny_model_dir)["hub"]["commit"] == commit
    info = HfApi(endpoint=hub.endpoint, token=TOKEN).model_info("team/tiny")
    assert info.sha == commit
    data = info.card_data
    assert (data.base_model, data.library_name, data.datasets) == ("adaptkit/tiny-base", "peft", ["adaptkit/arith"])
    assert {"adaptkit", "pissa", "arxiv:2404.02948"} <= set(data.tags)
    (res,) = data.eval_results
    assert (res.metric_type, res.metric_value, res.dataset_split) == ("accuracy", 0.25, "test")
    folder = pull("team/tiny", endpoint=hub.endpoint, token=TOKEN, revision=commit)
    assert source_of(folder) == {"repo_id": "team/tiny", "revision": commit}
    for name in ["config.json", "model.safetensors", "tokenizer.json"]:
        assert (folder / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    model, ref = load_causal_lm("team/tiny", endpoint=hub.endpoint, token=TOKEN), load_causal_lm(tiny_model_dir)
    ids = load_tokenizer(tiny_model_dir)(["two plus two"], return_tensors="pt")
    assert torch.equal(model(**ids).logits, ref(**ids).logits)


def test_push_mirrors_the_folder(hub, tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    (art / "a.txt").write_text("a")
    (art / "old.txt").write_text("old")
    (art / ".cache").mkdir()
    (art / ".cache" / "junk").write_text("x")
    first = push_folder(art, "team/mirror", endpoint=hub.endpoint, token=TOKEN)
    (art / "old.txt").unlink()
    second = push_folder(art, "team/mirror", endpoint=hub.endpoint, token=TOKEN, commit_message="drop old")
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    assert first != second
    assert set(api.list_repo_files("team/mirror")) - {".gitattributes"} == {"a.txt", "adaptkit.json"}
    assert "old.txt" in api.list_repo_files("team/mirror", revision=first)


def test_private_repo_and_token_hygiene(hub, tiny_model_dir, caplog):
    push_folder(tiny_model_dir, "team/private", endpoint=hub.endpoint, token=TOKEN, private=True, card=_card())
    with pytest.raises(Exception) as anonymous:
        pull("team/private", endpoint=hub.endpoint)
    assert TOKEN not in str(anonymous.value)
    wrong = TOKEN[:-1] + "X"
    with caplog.at_level(logging.DEBUG), pytest.raises(HfHubHTTPError) as refused:
        push_folder(tiny_model_dir, "team/other", endpoint=hub.endpoint, token=wrong)
    assert refused.value.response.status_code in (401, 403)
    assert wrong not in str(refused.value) and wrong not in caplog.text
    assert pull("team/private", endpoint=hub.endpoint, token=TOKEN).is_dir()
    card_text = (pull("team/private", endpoint=hub.endpoint, token=TOKEN) / "README.md").read_text()
    assert TOKEN not in card_text


def test_bad_push_inputs_fail_before_any_request(tmp_path):
    with pytest.raises(NotADirectoryError, match="not a folder"):
        push_folder(tmp_path / "missing", "team/x", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="not a Hub repo id"):
        push_folder(tmp_path, "../x", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="nothing to push"):
        push_folder(tmp_path, "team/x", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="not a local path"):
        model_card("emr", model_name="x", base_model=str(tmp_path))


def test_load_rows_from_a_hub_dataset_repo(hub, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"{i}+1?", "answer": str(i), "correction": str(i + 1)} for i in range(5)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(dict(rows[0], answer="")) + "\n")
    push_folder(data, "team/qac", endpoint=hub.endpoint, token=TOKEN, repo_type="dataset")
    ds = load_rows("team/qac", QAC, endpoint=hub.endpoint, token=TOKEN)
    assert ds["correction"] == [r["correction"] for r in rows]
    with pytest.raises(DataError, match=r"test.jsonl: rows do not fit question/answer/correction:\n  row 1, column 'answer': empty text"):
        load_rows("team/qac", QAC, split="test", endpoint=hub.endpoint, token=TOKEN)


def test_adapter_from_the_hub(hub, tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    peft_model = get_peft_model(load_causal_lm(tiny_model_dir), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "lora")
    commit = push_folder(tmp_path / "lora", "team/lora", endpoint=hub.endpoint, token=TOKEN, card=_card())
    again = load_adapter(load_causal_lm(tiny_model_dir), "team/lora", endpoint=hub.endpoint, token=TOKEN, revision=commit)
    ids = load_tokenizer(tiny_model_dir)(["one two"], return_tensors="pt")
    assert torch.allclose(peft_model(**ids).logits, again(**ids).logits)
