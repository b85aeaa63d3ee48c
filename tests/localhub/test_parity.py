"""The stock `HfApi` driven through every call LocalHub promises, checked the way the Hub documents the results; then
transformers, peft and datasets through HF_ENDPOINT in a subprocess (huggingface_hub reads it at import)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    HfApi,
    hf_hub_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from adaptkit.localhub.server import LocalHub
from adaptkit.localhub.storage import GITATTRIBUTES, USER

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`


def _status(err) -> int: return err.value.response.status_code


def test_create_without_namespace_exist_ok_and_initial_commit(api, hub, token):
    url = api.create_repo("tiny")
    assert (url.repo_id, url.namespace, url.repo_name) == (f"{USER}/tiny", USER, "tiny")
    assert api.whoami()["name"] == USER
    with pytest.raises(HfHubHTTPError) as e: api.create_repo("tiny")
    assert _status(e) == 409
    assert api.create_repo("tiny", exist_ok=True).repo_id == f"{USER}/tiny"
    assert api.create_repo("Localhub/TINY", exist_ok=True).repo_id == f"{USER}/tiny"  # the existing repo's id
    commits = api.list_repo_commits(f"{USER}/tiny")
    assert [c.title for c in commits] == ["initial commit"] and api.list_repo_files(f"{USER}/tiny") == [
        ".gitattributes"
    ]
    got = hf_hub_download(f"{USER}/tiny", ".gitattributes", endpoint=hub.endpoint, token=token)
    assert Path(got).read_text() == GITATTRIBUTES and "*.safetensors filter=lfs" in GITATTRIBUTES
    # case-insensitive lookups, canonical id in answers
    assert api.model_info("LOCALHUB/Tiny").id == f"{USER}/tiny" and api.repo_exists("localhub/TINY")


def test_no_token_hub_creates_for_the_default_user(tmp_path):
    with LocalHub(tmp_path / "open") as hub:
        assert HfApi(endpoint=hub.endpoint, token=False).create_repo("x").repo_id == f"{USER}/x"
        assert HfApi(endpoint=hub.endpoint, token="anything").whoami()["name"] == USER


def test_delete_move_and_settings(api, hub):
    api.create_repo("team/a")
    api.upload_file(path_or_fileobj=b"hi", path_in_repo="a.txt", repo_id="team/a")
    api.move_repo("team/a", "other/b")
    assert not api.repo_exists("team/a") and api.list_repo_files("other/b") == [".gitattributes", "a.txt"]
    api.create_repo("team/c")
    with pytest.raises(HfHubHTTPError) as e: api.move_repo("team/c", "other/b")
    assert _status(e) == 409
    with pytest.raises(RepositoryNotFoundError): api.move_repo("team/none", "other/z")
    anon = HfApi(endpoint=hub.endpoint, token=False)
    api.update_repo_settings("other/b", private=True)
    assert api.model_info("other/b").private and not anon.repo_exists("other/b")
    api.update_repo_settings("other/b", private=False, gated="auto")
    info = anon.model_info("other/b")
    assert not info.private and info.gated == "auto" and anon.repo_exists("other/b")
    with pytest.raises(GatedRepoError):
        hf_hub_download("other/b", "a.txt", endpoint=hub.endpoint, token=False)
    with pytest.raises(GatedRepoError): anon.file_exists("other/b", "a.txt")  # as documented: gated raises
    assert api.file_exists("other/b", "a.txt")
    api.update_repo_settings("other/b", gated=False)
    assert anon.model_info("other/b").gated is False
    api.delete_repo("other/b")
    assert not api.repo_exists("other/b")
    with pytest.raises(RepositoryNotFoundError): api.delete_repo("other/b")
    api.delete_repo("other/b", missing_ok=True)


def test_branches_tags_refs_and_revisions(api, hub, tmp_path, token):
    api.create_repo("team/r")
    c1 = api.upload_file(path_or_fileobj=b"one", path_in_repo="f.txt", repo_id="team/r").oid
    api.create_tag("team/r", tag="v1", tag_message="first release")
    api.create_branch("team/r", branch="round-2")
    c2 = api.upload_file(path_or_fileobj=b"two", path_in_repo="f.txt", repo_id="team/r", revision="round-2").oid
    api.create_branch("team/r", branch="from-init", revision=api.list_repo_commits("team/r")[-1].commit_id)
    refs = api.list_repo_refs("team/r")
    assert {b.name: b.target_commit for b in refs.branches} == {
        "main": c1,
        "round-2": c2,
        "from-init": refs.branches[0].target_commit,
    }
    assert {t.name: (t.ref, t.target_commit) for t in refs.tags} == {"v1": ("refs/tags/v1", c1)}
    read = lambda rev: Path(
        hf_hub_download("team/r", "f.txt", revision=rev, endpoint=hub.endpoint, token=token)
    ).read_bytes()
    assert (read("main"), read("v1"), read("round-2"), read(c1), read(c2)) == (b"one", b"one", b"two", b"one", b"two")
    assert api.list_repo_files("team/r", revision="from-init") == [".gitattributes"]
    assert api.revision_exists("team/r", "round-2") and api.revision_exists("team/r", "v1")
    assert not api.revision_exists("team/r", "nope") and not api.revision_exists("team/none", "main")
    with pytest.raises(HfHubHTTPError) as e: api.create_branch("team/r", branch="round-2")
    assert _status(e) == 409
    api.create_branch("team/r", branch="round-2", exist_ok=True)
    with pytest.raises(HfHubHTTPError) as e: api.create_tag("team/r", tag="v1")
    assert _status(e) == 409
    with pytest.raises(RevisionNotFoundError): api.create_branch("team/r", branch="x", revision="no-such-rev")
    with pytest.raises(HfHubHTTPError) as e: api.delete_branch("team/r", branch="main")
    assert _status(e) == 403
    with pytest.raises(RevisionNotFoundError):  # a commit needs an existing branch, as on the Hub
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="team/r", revision="no-branch")
    api.delete_branch("team/r", branch="round-2")
    api.delete_tag("team/r", tag="v1")
    with pytest.raises(RevisionNotFoundError): api.delete_tag("team/r", tag="v1")
    refs = api.list_repo_refs("team/r")
    assert [b.name for b in refs.branches] == ["from-init", "main"] and refs.tags == []
    assert read(c2) == b"two"  # the commit outlives its branch


def test_parent_commit_refused_when_branch_moved(api):
    api.create_repo("team/p")
    head = api.list_repo_commits("team/p")[0].commit_id
    api.create_commit("team/p", [CommitOperationAdd("a.txt", b"a")], commit_message="a", parent_commit=head)
    with pytest.raises(HfHubHTTPError) as e:
        api.create_commit("team/p", [CommitOperationAdd("b.txt", b"b")], commit_message="b", parent_commit=head)
    assert _status(e) == 412 and api.list_repo_files("team/p") == [".gitattributes", "a.txt"]


def test_tree_paths_info_commits_and_deletions(api):
    api.create_repo("team/t")
    ops = [
        CommitOperationAdd(p, p.encode())
        for p in ["a.txt", "d/b.txt", "d/e/c.bin", "d/e/f.txt", "logs/1.log", "logs/2.log"]
    ]
    c1 = api.create_commit("team/t", ops, commit_message="files").oid
    c2 = api.upload_file(path_or_fileobj=b"new", path_in_repo="d/b.txt", repo_id="team/t").oid
    top = list(api.list_repo_tree("team/t"))
    assert [(type(x).__name__, x.path) for x in top] == [
        ("RepoFolder", "d"),
        ("RepoFolder", "logs"),
        ("RepoFile", ".gitattributes"),
        ("RepoFile", "a.txt"),
    ]
    deep = {x.path: x for x in api.list_repo_tree("team/t", path_in_repo="d", recursive=True, expand=True)}
    assert sorted(deep) == ["d/b.txt", "d/e", "d/e/c.bin", "d/e/f.txt"] and isinstance(deep["d/e"], RepoFolder)
    assert (
        deep["d/b.txt"].last_commit.oid == c2
        and deep["d/e/f.txt"].last_commit.oid == c1
        and deep["d/e"].last_commit.oid == c1
    )
    # sent inline, so regular files, whatever the suffix (the stored kind is what every listing reports)
    # the Hub's rule (LocalHub's default, lfs=True): a .bin file is stored by LFS or Xet, a small text file inline
    assert deep["d/b.txt"].size == 3 and deep["d/e/c.bin"].lfs is not None and deep["d/b.txt"].lfs is None
    with pytest.raises(EntryNotFoundError): list(api.list_repo_tree("team/t", path_in_repo="nope"))
    info = {x.path: x for x in api.get_paths_info("team/t", ["a.txt", "d", "missing"], expand=True)}
    assert sorted(info) == ["a.txt", "d"] and isinstance(info["a.txt"], RepoFile) and info["d"].last_commit.oid == c2
    commits = api.list_repo_commits("team/t")
    assert [c.commit_id for c in commits][:2] == [c2, c1] and commits[-1].title == "initial commit"
    assert commits[0].authors == [USER] and commits[0].created_at.year >= 2024
    api.delete_files("team/t", delete_patterns=["logs/*.log", "*.bin"])
    api.delete_folder("d/e", repo_id="team/t")
    assert api.list_repo_files("team/t") == [".gitattributes", "a.txt", "d/b.txt"]
    with pytest.raises(EntryNotFoundError): api.delete_folder("d/e", repo_id="team/t")
    assert api.list_repo_files("team/t", revision=c1) == sorted([".gitattributes", *[op.path_in_repo for op in ops]])


def test_list_models_and_datasets(api, hub):
    api.create_repo("alice/m1")
    api.create_repo("alice/m2", private=True)
    api.create_repo("bob/m3")
    api.create_repo("alice/d1", repo_type="dataset")
    api.create_repo("alice/d2", repo_type="dataset", private=True)
    anon = HfApi(endpoint=hub.endpoint, token=False)
    assert sorted(m.id for m in api.list_models(author="alice")) == ["alice/m1", "alice/m2"]
    assert sorted(m.id for m in anon.list_models(author="alice")) == ["alice/m1"]
    assert sorted(m.id for m in anon.list_models()) == ["alice/m1", "bob/m3"]
    assert [m.id for m in api.list_models(search="m3")] == ["bob/m3"]
    assert sorted(d.id for d in api.list_datasets(author="ALICE")) == ["alice/d1", "alice/d2"]
    assert [d.id for d in anon.list_datasets()] == ["alice/d1"]
    assert next(iter(api.list_models(author="alice", full=True))).siblings[0].rfilename == ".gitattributes"


def test_repo_file_revision_exists_answer_false(api, hub):
    api.create_repo("team/e")
    assert (
        api.repo_exists("team/e")
        and not api.repo_exists("team/none")
        and not api.repo_exists("team/e", repo_type="dataset")
    )
    assert api.file_exists("team/e", ".gitattributes") and not api.file_exists("team/e", "nope.txt")
    assert not api.file_exists("team/none", "a") and not api.file_exists("team/e", "a", revision="nope")
    assert not api.revision_exists("team/e", "nope") and api.revision_exists("team/e", "main")


_CLIENT = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from peft import LoraConfig, PeftModel, get_peft_model
    from huggingface_hub import HfApi
    import datasets
    out, work = {}, sys.argv[1]
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    commit = model.push_to_hub("tiny")  # no namespace: the token's user
    api = HfApi()
    out["repo_files"] = api.list_repo_files("localhub/tiny")
    api.create_tag("localhub/tiny", tag="v1")
    with torch.no_grad(): model.model.embed_tokens.weight.add_(1.0)
    model.push_to_hub("tiny")  # main moves on; v1 keeps the first weights
    ids = torch.tensor([[1, 5, 9]])
    v1 = AutoModelForCausalLM.from_pretrained("localhub/tiny", revision="v1").eval()
    torch.manual_seed(0); ref = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        out["v1_matches_first_push"] = torch.equal(v1(ids).logits, ref(ids).logits)
        main = AutoModelForCausalLM.from_pretrained("localhub/tiny")
        out["main_differs"] = not torch.equal(main(ids).logits, ref(ids).logits)
    def base(): torch.manual_seed(0); return LlamaForCausalLM(config).eval()  # the first push's weights
    lora = get_peft_model(base(), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)).eval()
    lora.save_pretrained(work + "/adapter")
    api.create_repo("localhub/tiny-lora")
    api.upload_folder(folder_path=work + "/adapter", repo_id="localhub/tiny-lora")
    pulled = PeftModel.from_pretrained(base(), "localhub/tiny-lora").eval()
    with torch.no_grad(): out["peft_same"] = torch.allclose(pulled(ids).logits, lora(ids).logits)
    api.create_repo("localhub/data", repo_type="dataset")
    api.upload_file(path_or_fileobj=b'{"q": "2+2", "a": "4"}\\n{"q": "1+1", "a": "2"}\\n',
                    path_in_repo="data/train.jsonl", repo_id="localhub/data", repo_type="dataset")
    ds = datasets.load_dataset("localhub/data", split="train")
    out["dataset_rows"] = ds.to_list()
    print("RESULT " + json.dumps(out))
""")


def test_transformers_peft_datasets_through_hf_endpoint(hub, tmp_path, token):
    "The libraries take no endpoint argument: HF_ENDPOINT (read at import) points them at the hub, in a subprocess."
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": token,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "ds"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # anything but the hub goes to a proxy that does not exist
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    run = subprocess.run(
        [sys.executable, "-c", _CLIENT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    out = json.loads(lines[-1][7:])
    assert out["repo_files"] == [
        ".gitattributes",
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    assert out["v1_matches_first_push"] and out["main_differs"] and out["peft_same"]
    assert out["dataset_rows"] == [{"q": "2+2", "a": "4"}, {"q": "1+1", "a": "2"}]
