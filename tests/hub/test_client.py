"""adaptkit.hub against a loopback LocalHub: push/pull, cards through the stock client, tokens, datasets, adapters."""
import http.server
import json
import logging
import os
import re
import threading
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

import adaptkit.hub.client
from adaptkit.artifacts import ArtifactTrainerMixin, ModelArtifact
from adaptkit.data import QAC, DataError, load_rows
from adaptkit.hub import PushConflictError, is_repo_id, pull, push_folder, read_metadata, source_of, write_folder
from adaptkit.hub import render_card as model_card

# private on purpose: what a push uploads (the symlink rule) and what of the record goes up are the contracts tested
from adaptkit.hub.client import _folder_files, _metadata_upload
from adaptkit.localhub.server import LocalHub
from adaptkit.models import fingerprint, load_adapter, load_base, load_causal_lm, load_tokenizer, tiny_causal_lm
from adaptkit.pissa import METHOD as PISSA

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`
DEAD = "http://127.0.0.1:9"  # a closed port: a request would fail with a connection error, not the errors asserted


def _card(**kw):
    return model_card(PISSA, model_name="tiny", base_model="adaptkit/tiny-base", library_name="peft",
                      datasets=["adaptkit/arith"], settings={"r": 4}, **kw)


def test_push_pull_round_trip_with_card(hub, tiny_model_dir, tiny_model_copy, tmp_path):
    results = [{"task": "text-generation", "dataset": "arith", "metric": "accuracy", "value": 0.25, "split": "test"}]
    commit = push_folder(tiny_model_copy, "team/tiny", card=_card(results=results), endpoint=hub.endpoint,
                         token=hub.token)  # the push records itself in the folder: a private copy
    assert read_metadata(tiny_model_copy)["hub"]["commit"] == commit
    info = HfApi(endpoint=hub.endpoint, token=hub.token).model_info("team/tiny")
    assert info.sha == commit
    data = info.card_data
    assert (data.base_model, data.library_name, data.datasets) == ("adaptkit/tiny-base", "peft", ["adaptkit/arith"])
    assert {"adaptkit", "pissa", "arxiv:2404.02948"} <= set(data.tags)
    (res,) = data.eval_results
    assert (res.metric_type, res.metric_value, res.dataset_split) == ("accuracy", 0.25, "test")
    folder = pull("team/tiny", endpoint=hub.endpoint, token=hub.token, revision=commit)
    assert source_of(folder) == {"repo_id": "team/tiny", "revision": commit}
    for name in ["config.json", "model.safetensors", "tokenizer.json"]:
        assert (folder / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    model, ref = load_causal_lm("team/tiny", endpoint=hub.endpoint, token=hub.token), load_causal_lm(tiny_model_dir)
    ids = load_tokenizer(tiny_model_dir)(["two plus two"], return_tensors="pt")
    assert torch.equal(model(**ids).logits, ref(**ids).logits)


def test_push_mirrors_the_folder(hub, tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    (art / "a.txt").write_text("a")
    (art / "old.txt").write_text("old")
    (art / ".cache").mkdir()
    (art / ".cache" / "junk").write_text("x")
    first = push_folder(art, "team/mirror", endpoint=hub.endpoint, token=hub.token)
    (art / "old.txt").unlink()
    second = push_folder(art, "team/mirror", endpoint=hub.endpoint, token=hub.token, commit_message="drop old")
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    assert first != second
    # the only content of adaptkit.json was the first push's record, which describes the folder and is not uploaded
    assert set(api.list_repo_files("team/mirror")) - {".gitattributes"} == {"a.txt"}
    assert "old.txt" in api.list_repo_files("team/mirror", revision=first)


def test_private_repo_and_token_hygiene(hub, tiny_model_copy, caplog):
    push_folder(tiny_model_copy, "team/private", endpoint=hub.endpoint, token=hub.token, private=True, card=_card())
    # private: hidden from strangers
    with pytest.raises(RepositoryNotFoundError, match="404 Client Error") as anonymous:
        pull("team/private", endpoint=hub.endpoint)
    assert anonymous.value.response.status_code == 404 and hub.token not in str(anonymous.value)
    wrong = hub.token[:-1] + "X"
    with caplog.at_level(logging.DEBUG), pytest.raises(HfHubHTTPError) as refused:
        push_folder(tiny_model_copy, "team/other", endpoint=hub.endpoint, token=wrong)
    assert refused.value.response.status_code == 401
    assert wrong not in str(refused.value) and wrong not in caplog.text
    assert pull("team/private", endpoint=hub.endpoint, token=hub.token).is_dir()
    card_text = (pull("team/private", endpoint=hub.endpoint, token=hub.token) / "README.md").read_text()
    assert hub.token not in card_text


def test_bad_push_inputs_fail_before_any_request(tmp_path):
    with pytest.raises(NotADirectoryError, match="not a folder"):
        push_folder(tmp_path / "missing", "team/x", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="not a Hub repo id"):
        push_folder(tmp_path, "../x", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="nothing to push"):
        push_folder(tmp_path, "team/x", endpoint="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="not a local path"):
        model_card(None, model_name="x", base_model=str(tmp_path))


def test_load_rows_from_a_hub_dataset_repo(hub, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"{i}+1?", "answer": str(i), "correction": str(i + 1)} for i in range(5)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(dict(rows[0], answer="")) + "\n")
    push_folder(data, "team/qac", endpoint=hub.endpoint, token=hub.token, repo_type="dataset")
    ds = load_rows("team/qac", QAC, endpoint=hub.endpoint, token=hub.token)
    assert ds["correction"] == [r["correction"] for r in rows]
    with pytest.raises(DataError, match=r"test.jsonl: rows do not fit question/answer/correction:\n"
                                        r"  line 2: row 1, column 'answer': empty text"):
        load_rows("team/qac", QAC, split="test", endpoint=hub.endpoint, token=hub.token)


def test_adapter_from_the_hub(hub, tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    peft_model = get_peft_model(load_causal_lm(tiny_model_dir), config)
    peft_model.save_pretrained(tmp_path / "lora")
    commit = push_folder(tmp_path / "lora", "team/lora", endpoint=hub.endpoint, token=hub.token, card=_card())
    again = load_adapter(load_causal_lm(tiny_model_dir), "team/lora", endpoint=hub.endpoint, token=hub.token,
                         revision=commit)
    ids = load_tokenizer(tiny_model_dir)(["one two"], return_tensors="pt")
    assert torch.allclose(peft_model(**ids).logits, again(**ids).logits)


# --- what push_folder uploads, concurrent pushes, refused tokens ------------------------------------------------------

def _folder(tmp_path, name="art", **files):
    folder = tmp_path / name
    folder.mkdir()
    for rel, text in (files or {"a.txt": "a"}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def _tree(api, repo_id, revision=None):
    "{path: text} of every file of `repo_id` at `revision` but .gitattributes."
    files = [f for f in api.list_repo_files(repo_id, revision=revision) if f != ".gitattributes"]
    return {f: Path(api.hf_hub_download(repo_id, f, revision=revision)).read_text() for f in files}


def test_push_refuses_a_concurrent_push_instead_of_merging(hub, tmp_path, monkeypatch):
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    push_folder(_folder(tmp_path, "v1", **{"v1.txt": "1"}), "team/race", endpoint=hub.endpoint, token=hub.token)
    listed = HfApi.list_repo_files

    def list_then_someone_else_pushes(self, *a, **kw):
        files = listed(self, *a, **kw)
        monkeypatch.setattr(HfApi, "list_repo_files", listed)  # the other writer is a plain client
        api.upload_file(path_or_fileobj=b"theirs", path_in_repo="theirs.txt", repo_id="team/race")
        return files

    monkeypatch.setattr(HfApi, "list_repo_files", list_then_someone_else_pushes)
    with pytest.raises(PushConflictError, match=r"team/race@main: another commit landed while pushing"):
        push_folder(_folder(tmp_path, "v2", **{"v2.txt": "2"}), "team/race", endpoint=hub.endpoint, token=hub.token)
    assert set(api.list_repo_files("team/race")) - {".gitattributes"} == {"v1.txt", "theirs.txt"}  # not merged with v2
    assert "hub" not in read_metadata(tmp_path / "v2")


def test_eight_concurrent_pushes_give_commits_or_clean_refusals(hub, tmp_path):
    folders = [_folder(tmp_path, f"f{i}", **{f"f{i}.txt": str(i)}) for i in range(8)]
    outcomes = [None] * 8

    def push(i):
        try: outcomes[i] = push_folder(folders[i], "team/eight", endpoint=hub.endpoint, token=hub.token)
        except PushConflictError as e: outcomes[i] = e

    HfApi(endpoint=hub.endpoint, token=hub.token).create_repo("team/eight")
    threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join(60)
    commits = {i: c for i, c in enumerate(outcomes) if isinstance(c, str)}
    assert commits and all(isinstance(c, (str, PushConflictError)) for c in outcomes), outcomes
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    for i, commit in commits.items():  # every landed commit holds exactly its own folder
        assert set(api.list_repo_files("team/eight", revision=commit)) - {".gitattributes"} == {f"f{i}.txt"}


def test_push_to_a_branch_creates_it_from_main(hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    hub_kw = {"endpoint": hub.endpoint, "token": hub.token}
    main = push_folder(_folder(tmp_path, "r1", **{"model.txt": "round 1"}), "team/dpo", **hub_kw)
    r2 = _folder(tmp_path, "r2", **{"model.txt": "round 2"})
    commit = push_folder(r2, "team/dpo", **hub_kw, revision="round-2", commit_message="round 2")
    assert api.model_info("team/dpo").sha == main  # main untouched
    assert api.model_info("team/dpo", revision="round-2").sha == commit
    assert api.list_repo_commits("team/dpo", revision="round-2")[1].commit_id == main  # branched from main's head
    assert (pull("team/dpo", **hub_kw, revision="round-2") / "model.txt").read_text() == "round 2"
    assert read_metadata(r2)["hub"] == {"repo_id": "team/dpo", "commit": commit, "revision": "round-2",
                                        "endpoint": hub.endpoint}
    assert push_folder(r2, "team/dpo", **hub_kw, revision="round-2") == commit  # nothing changed: no new commit
    (r2 / "model.txt").write_text("round 2, fixed")
    again = push_folder(r2, "team/dpo", **hub_kw, revision="round-2")  # the branch exists now
    assert api.model_info("team/dpo", revision="round-2").sha == again != commit
    assert api.model_info("team/dpo").sha == main


def test_push_as_a_pull_request_returns_its_revision_and_leaves_the_branch(hub, tmp_path):
    "`create_pr=True`: the folder's whole content on `refs/pr/N` (what it lacks deleted there), the branch untouched."
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    hub_kw = {"endpoint": hub.endpoint, "token": hub.token}
    main = push_folder(_folder(tmp_path, "v1", **{"model.txt": "v1", "old.txt": "o"}), "team/pr", **hub_kw)
    v2 = _folder(tmp_path, "v2", **{"model.txt": "v2"})
    pr = push_folder(v2, "team/pr", **hub_kw, create_pr=True, commit_message="v2 for review")
    assert pr == "refs/pr/1" and api.model_info("team/pr").sha == main
    assert sorted(api.list_repo_files("team/pr", revision=pr)) == [".gitattributes", "model.txt"]
    assert (pull("team/pr", **hub_kw, revision=pr) / "model.txt").read_text() == "v2"
    assert read_metadata(v2)["hub"] == {"repo_id": "team/pr", "commit": api.model_info("team/pr", revision=pr).sha,
                                        "revision": "refs/pr/1", "endpoint": hub.endpoint}
    details = api.get_discussion_details("team/pr", 1)
    assert (details.is_pull_request, details.title, details.status) == (True, "v2 for review", "open")
    on_branch = push_folder(v2, "team/pr", **hub_kw, revision="dev", create_pr=True)  # against a new branch
    assert on_branch == "refs/pr/2" and api.model_info("team/pr", revision="dev").sha == main
    api.merge_pull_request("team/pr", 1)
    assert (pull("team/pr", **hub_kw) / "model.txt").read_text() == "v2"


def test_push_to_a_commit_id_is_refused(tmp_path):
    with pytest.raises(ValueError, match="push to a branch name"):
        push_folder(_folder(tmp_path), "team/x", endpoint="http://127.0.0.1:9", revision="a" * 40)


def test_symlinks_inside_are_uploaded_outside_refused_before_any_request(hub, tmp_path):
    art = _folder(tmp_path, **{"weights.txt": "w", "sub/inner.txt": "i"})
    (art / "alias.txt").symlink_to("weights.txt")
    (art / "linked").symlink_to("sub", target_is_directory=True)
    push_folder(art, "team/links", endpoint=hub.endpoint, token=hub.token)
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    expected = {"weights.txt": "w", "alias.txt": "w", "sub/inner.txt": "i", "linked/inner.txt": "i"}
    assert _tree(api, "team/links") == expected
    secret = tmp_path / "token"
    secret.write_text(hub.token)
    (art / "leak.txt").symlink_to(secret)
    dead = "http://127.0.0.1:9"  # a closed port: any request would fail with a connection error, not these
    with pytest.raises(ValueError, match=r"leak.txt: a symlink to .*outside the folder being pushed"):
        push_folder(art, "team/links", endpoint=dead)
    (art / "leak.txt").unlink()
    (art / "up").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ValueError, match=r"up: a symlink to .*outside"):
        push_folder(art, "team/links", endpoint=dead)
    (art / "up").unlink()
    (art / "sub" / "loop").symlink_to(art, target_is_directory=True)
    with pytest.raises(ValueError, match=r"loop: a symlink loop"):
        push_folder(art, "team/links", endpoint=dead)
    (art / "sub" / "loop").unlink()
    (art / "dangling.txt").symlink_to(art / "gone.txt")
    with pytest.raises(FileNotFoundError, match=r"dangling.txt: a symlink to .*which does not exist"):
        push_folder(art, "team/links", endpoint=dead)
    assert hub.token not in "".join(_tree(api, "team/links").values())


def test_a_pulled_snapshot_can_be_pushed_on(hub, tmp_path):
    push_folder(_folder(tmp_path, **{"w.txt": "w", "d/x.txt": "x"}), "team/src", endpoint=hub.endpoint, token=hub.token)
    snap = pull("team/src", endpoint=hub.endpoint, token=hub.token)
    assert (snap / "w.txt").is_symlink()  # files of the HF cache link into ../../blobs, outside the snapshot folder
    push_folder(snap, "team/copy", endpoint=hub.endpoint, token=hub.token)
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    assert _tree(api, "team/copy") == {"w.txt": "w", "d/x.txt": "x"}


def test_read_only_folder_is_pushed_and_its_commit_returned(hub, tmp_path, monkeypatch, caplog):
    art = _folder(tmp_path, **{"a.txt": "a"})
    os.chmod(art, 0o555)
    if os.geteuid() == 0:  # root writes anyway: make the write fail as it does for other users
        def read_only(folder, **_): raise PermissionError(13, "Permission denied", str(folder))
        monkeypatch.setattr(adaptkit.hub.client, "write_metadata", read_only)
    try:
        with caplog.at_level(logging.DEBUG, logger="adaptkit.hub"):
            commit = push_folder(art, "team/ro", endpoint=hub.endpoint, token=hub.token)
    finally:
        os.chmod(art, 0o755)
    assert HfApi(endpoint=hub.endpoint, token=hub.token).model_info("team/ro").sha == commit
    assert not (art / "adaptkit.json").exists()
    assert f"pushed {art} as team/ro@{commit}; no record written" in caplog.text


def test_push_record_names_only_its_own_repo(hub, tmp_path):
    art = _folder(tmp_path, **{"a.txt": "a"})
    adaptkit.hub.client.write_metadata(art, source={"base_model": "org/base"})
    first = push_folder(art, "me/first", endpoint=hub.endpoint, token=hub.token)
    assert read_metadata(art)["hub"]["commit"] == first
    second = push_folder(art, "me/second", endpoint=hub.endpoint, token=hub.token)
    pulled = pull("me/second", endpoint=hub.endpoint, token=hub.token)
    assert read_metadata(pulled) == {"source": {"base_model": "org/base"}}
    assert "me/first" not in (pulled / "adaptkit.json").read_text()
    assert source_of(pulled) == {"repo_id": "me/second", "revision": second}
    assert read_metadata(art)["hub"] == {"repo_id": "me/second", "commit": second, "endpoint": hub.endpoint}


def test_endpoint_credentials_are_written_nowhere(tmp_path):
    with LocalHub(tmp_path / "open-hub") as open_hub:  # no token: basic auth in the URL is ignored by the server
        endpoint = open_hub.endpoint.replace("http://", "http://alice:s3cret-pw@")
        art = _folder(tmp_path, **{"a.txt": "a"})
        commit = push_folder(art, "me/creds", endpoint=endpoint)
        assert read_metadata(art)["hub"] == {"repo_id": "me/creds", "commit": commit, "endpoint": open_hub.endpoint}
        pulled = pull("me/creds", endpoint=endpoint)
        assert (pulled / "a.txt").read_text() == "a"
        written = [str(p) for p in Path(os.environ["HF_HOME"]).rglob("*")] + [str(p) for p in tmp_path.rglob("*")]
        texts = [p.read_text(errors="ignore") for p in [*art.rglob("*"), *tmp_path.joinpath("open-hub").rglob("*")]
                 if p.is_file()]
        assert not [w for w in written + texts if "s3cret-pw" in w or "alice" in w]


def test_pull_with_a_refused_token_raises_instead_of_using_the_cache(hub, tiny_model_dir, tmp_path):
    commit = push_folder(_folder(tmp_path), "team/priv", endpoint=hub.endpoint, token=hub.token, private=True)
    assert (pull("team/priv", endpoint=hub.endpoint, token=hub.token) / "a.txt").read_text() == "a"  # now cached
    wrong = hub.token[:-1] + "X"
    for revision in [None, "main", commit]:
        with pytest.raises(HfHubHTTPError) as refused:
            pull("team/priv", endpoint=hub.endpoint, token=wrong, revision=revision)
        assert refused.value.response.status_code == 401 and wrong not in str(refused.value)
    with pytest.raises(RepositoryNotFoundError):  # anonymous: a private repo does not exist for you
        pull("team/priv", endpoint=hub.endpoint, revision=commit)


def test_pull_falls_back_to_the_cache_when_the_hub_is_down(token, tmp_path, monkeypatch):
    with LocalHub(tmp_path / "h", token=token) as h:
        endpoint = h.endpoint
        commit = push_folder(_folder(tmp_path, **{"a.txt": "a"}), "team/cached", endpoint=endpoint, token=token)
        first = pull("team/cached", endpoint=endpoint, token=token)
        with monkeypatch.context() as offline_mode:  # HF_HUB_OFFLINE: the cache answers
            offline_mode.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
            assert pull("team/cached", endpoint=endpoint, token=token) == first
    assert pull("team/cached", endpoint=endpoint, token=token) == first  # server gone: the cached snapshot answers
    assert first.name == commit


# --- a path is a path, only a repo id goes to a Hub -------------------------------------------------------------------

class _CountingServer(http.server.ThreadingHTTPServer):
    "A loopback HTTP server that answers 404 to everything and counts the requests it got."
    def __init__(self):
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                server.requests.append(f"{self.command} {self.path}")
                self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
            do_GET = do_HEAD = do_POST = do_PUT = _any
            def log_message(self, *a): pass
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self): return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def counting_server():
    server = _CountingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown(); server.server_close()


@pytest.mark.parametrize("name", ["data/train.jsonl", "train.jsonl", "rows.csv", "x.parquet", "rows.json",
                                  "model.safetensors", "m.gguf", "./model", "../model", "/no/such/model",
                                  "~/no-such-adaptkit-model", "a/b/c", "a\\b"])
def test_a_missing_local_path_never_reaches_a_hub(counting_server, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such local file or folder"):
        pull(name, endpoint=counting_server.endpoint)
    with pytest.raises(FileNotFoundError, match="no such local file or folder"):
        pull(Path(name), endpoint=counting_server.endpoint)
    with pytest.raises(FileNotFoundError, match="no such local file or folder"):
        load_rows(name, QAC, endpoint=counting_server.endpoint)
    assert counting_server.requests == []


def test_a_repo_id_does_reach_the_hub(counting_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the control: the counter sees requests when a name is a repo id
    with pytest.raises(HfHubHTTPError):
        pull("org/model", endpoint=counting_server.endpoint)
    assert counting_server.requests and counting_server.requests[0].startswith("GET /api/models/org/model")
    (tmp_path / "org").mkdir(); (tmp_path / "org" / "model").mkdir()
    assert pull("org/model", endpoint=counting_server.endpoint) == Path("org/model")  # an existing folder wins


def test_is_repo_id_follows_huggingface_hub():
    assert all(map(is_repo_id, ["gpt2", "org/model", "HuggingFaceTB/SmolLM2-135M-Instruct", "a/b.c-d_e"]))
    assert not any(map(is_repo_id, ["", "a/b/c", "../x", "a--b", "a..b", "x.git", "-x", "a b", "x" * 97, None, 3]))


# --- hub: names, paths, folders ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a b", "a--b", "-x", "x.git", "a..b"])
def test_a_name_that_is_neither_path_nor_repo_id_asks_no_hub(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(f"{name!r} is neither an existing local path nor a Hub repo id ('namespace/name' or 'name')"),
    ):
        pull(name, endpoint=DEAD)


def test_push_refuses_a_repo_id_without_namespace_and_a_blank_branch(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    for repo_id in ["gpt2", "a/b/c", "", "team/x y"]:
        with pytest.raises(
            ValueError, match=re.escape(f"{repo_id!r} is not a Hub repo id of the form 'namespace/name'")
        ):
            push_folder(tmp_path, repo_id, endpoint=DEAD)
    for revision in ["", "  ", "0123456789abcdef0123456789abcdef01234567"]:
        with pytest.raises(ValueError, match=re.escape(f"revision={revision!r}: push to a branch name")):
            push_folder(tmp_path, "team/x", endpoint=DEAD, revision=revision)


@pytest.mark.parametrize("text, message", [
    ("{not json", "adaptkit.json: not valid JSON (Expecting property name"),
    ("[1, 2]", "adaptkit.json: expected a JSON object"),
])
def test_push_refuses_a_broken_adaptkit_json_before_any_request(tmp_path, text, message):
    art = tmp_path / "art"
    art.mkdir()
    (art / "w.txt").write_text("w")
    (art / "adaptkit.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        push_folder(art, "team/x", endpoint=DEAD)
    (art / "adaptkit.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=re.escape("adaptkit.json: not valid JSON")):
        push_folder(art, "team/x", endpoint=DEAD)


def test_write_folder_refuses_a_folder_or_file_it_did_not_write(tmp_path):
    def fill(folder):
        (folder / "adaptkit.json").write_text("{}")
        (folder / "w.txt").write_text("new")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match=re.escape(f"{theirs} exists and was not written by adaptkit (no "
                                                        "adaptkit.json): not replacing it")):
        write_folder(theirs, fill)
    assert (theirs / "thesis.tex").read_text() == "years of work" and not list(tmp_path.glob(".theirs.*"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(
        FileExistsError, match=re.escape(f"{tmp_path / 'afile'} exists and was not written by adaptkit")
    ):
        write_folder(tmp_path / "afile", fill)
    with pytest.raises(FileExistsError, match=re.escape("(no weights.bin)")):
        write_folder(theirs, fill, marker="weights.bin")
    (tmp_path / "empty").mkdir()
    assert (write_folder(tmp_path / "empty", fill) / "w.txt").read_text() == "new"  # an empty folder may be filled
    (tmp_path / "empty" / "w.txt").write_text("old")
    assert (write_folder(tmp_path / "empty", fill) / "w.txt").read_text() == "new"  # ours: replaced


def test_write_folder_keeps_the_old_folder_when_writing_fails(tmp_path):
    out = tmp_path / "out"
    write_folder(out, lambda f: (f / "adaptkit.json").write_text('{"v": 1}'))
    def broken(folder):
        (folder / "adaptkit.json").write_text('{"v": 2}')
        raise RuntimeError("killed half way")
    with pytest.raises(RuntimeError, match="killed half way"):
        write_folder(out, broken)
    assert (out / "adaptkit.json").read_text() == '{"v": 1}' and not list(tmp_path.glob(".out.*"))


def test_write_folder_restores_what_a_killed_save_moved_aside(tmp_path):
    "A save killed between moving the old folder aside and moving the new one in: the next save puts the old one back."
    out = tmp_path / "out"
    aside = tmp_path / ".out.old-999999999-x"  # no such process: a dead save's folder
    aside.mkdir()
    (aside / "adaptkit.json").write_text('{"v": 1}')
    half = tmp_path / ".out.tmp-999999999-y"
    half.mkdir()
    seen = []
    write_folder(
        out, lambda f: seen.append((out / "adaptkit.json").read_text()) or (f / "adaptkit.json").write_text("{}")
    )
    assert seen == ['{"v": 1}'] and not aside.exists() and not half.exists()
    live = tmp_path / f".out.tmp-{os.getpid()}-z"  # this process: a save in progress, left alone
    other = tmp_path / ".out.old-1-w"  # process 1 is alive: its save is left alone too
    old_style = tmp_path / ".out.tmp-nopid"  # an older adaptkit's name, without a pid: dead
    for p in (live, other, old_style): p.mkdir()
    (tmp_path / ".other.tmp-999999999-v").mkdir()  # another folder's leftovers are not this save's business
    write_folder(out, lambda f: (f / "adaptkit.json").write_text("{}"))
    assert (
        live.is_dir() and other.is_dir() and not old_style.exists() and (tmp_path / ".other.tmp-999999999-v").is_dir()
    )
    assert adaptkit.hub.leftover_folders(out) == [other, live]


def test_looks_like_path_for_dots_path_objects_and_existing_names(tmp_path, monkeypatch):
    from adaptkit.hub import looks_like_path
    monkeypatch.chdir(tmp_path)
    assert looks_like_path(".") and looks_like_path("..") and looks_like_path(Path("org/model"))
    assert not looks_like_path("org") and not looks_like_path(".hidden") and not looks_like_path("org/model")
    (tmp_path / "org").mkdir()
    assert looks_like_path("org") and looks_like_path("ORG.JSONL") and not looks_like_path("org/model")


@pytest.mark.parametrize("status, refused", [(500, False), (503, False), (403, True), (404, True), (499, True)])
def test_pull_uses_the_cache_on_server_errors_and_raises_client_errors(hub, tmp_path, monkeypatch, status, refused):
    import httpx2
    push_folder(_folder(tmp_path, **{"a.txt": "a"}), "team/flaky", endpoint=hub.endpoint, token=hub.token)
    cached = pull("team/flaky", endpoint=hub.endpoint, token=hub.token)
    response = httpx2.Response(status, request=httpx2.Request("GET", hub.endpoint))
    def failing_repo_info(self, *a, **kw): raise HfHubHTTPError(f"repo_info answered {status}", response=response)
    monkeypatch.setattr(HfApi, "repo_info", failing_repo_info)
    if refused:
        with pytest.raises(HfHubHTTPError, match=f"repo_info answered {status}"):
            pull("team/flaky", endpoint=hub.endpoint, token=hub.token)
    else:  # a Hub failing with 5xx is like one out of reach: the cached snapshot answers
        assert pull("team/flaky", endpoint=hub.endpoint, token=hub.token) == cached



# Boundary cases found by mutation testing (`make mutation`): each asserts a behaviour a mutant broke.

SHA = "0123456789abcdef0123456789abcdef01234567"


def _fill(text):
    return lambda folder: (folder / "adaptkit.json").write_text(text)


# --- the pushed adaptkit.json ----------------------------------------------------------------------------------------

def test_the_uploaded_metadata_is_sorted_two_space_json_without_the_push_record(tmp_path):
    (tmp_path / "adaptkit.json").write_text(json.dumps({"z": 1, "a": {"y": "é", "b": [1]}, "hub": {"commit": SHA}}))
    want = '{\n  "a": {\n    "b": [\n      1\n    ],\n    "y": "\\u00e9"\n  },\n  "z": 1\n}\n'
    assert _metadata_upload(tmp_path) == want.encode("utf-8")
    (tmp_path / "adaptkit.json").write_text(json.dumps({"hub": {"commit": SHA}}))
    assert _metadata_upload(tmp_path) is None  # nothing but the local record: no file is uploaded


# --- symlinks in a pulled snapshot ------------------------------------------------------------------------------------

def test_a_snapshot_may_link_into_its_blobs_but_nowhere_else(tmp_path):
    repo = tmp_path / "models--team--m"
    snapshot, blobs = repo / "snapshots" / SHA, repo / "blobs"
    snapshot.mkdir(parents=True); blobs.mkdir()
    (blobs / "abc").write_text("weights")
    (snapshot / "w.bin").symlink_to(blobs / "abc")
    assert _folder_files(snapshot) == {"w.bin": snapshot / "w.bin"}
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("secret")
    (snapshot / "leak.txt").symlink_to(outside)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{snapshot / 'leak.txt'}: a symlink to {outside}, outside the folder "
            "being pushed; only links inside it are uploaded (copy the file in, "
            "or remove the link)"
        ),
    ):
        _folder_files(snapshot)


# --- write_folder -----------------------------------------------------------------------------------------------------

def test_write_folder_creates_missing_parents(tmp_path):
    out = write_folder(tmp_path / "a" / "b" / "out", _fill("{}"))
    assert out == tmp_path / "a" / "b" / "out" and (out / "adaptkit.json").read_text() == "{}"


def test_write_folder_names_the_folder_it_refuses_to_replace_and_says_what_to_do(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match=re.escape(f"{tmp_path / 'theirs'} exists and was not written by adaptkit "
                                                        "(no adaptkit.json): not replacing it; remove it or choose "
                                                        "another folder")):
        write_folder(tmp_path / "theirs", _fill("{}"))


def test_the_new_folder_is_written_beside_the_target_under_a_name_naming_this_process(tmp_path):
    seen = []
    write_folder(tmp_path / "out", lambda f: seen.append(f) or _fill("{}")(f))
    assert seen[0].parent == tmp_path and seen[0].name.startswith(f".out.tmp-{os.getpid()}-")


def test_a_failed_swap_puts_the_old_folder_back_from_an_aside_folder_beside_it(tmp_path, monkeypatch):
    out = write_folder(tmp_path / "out", _fill('{"v": 1}'))
    renames, real = [], os.rename
    def rename(src, dst):
        renames.append((Path(src), Path(dst)))
        if ".tmp-" in Path(src).name: raise OSError("disk gone")  # moving the new folder in fails
        return real(src, dst)
    monkeypatch.setattr(adaptkit.hub.client.os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        write_folder(out, _fill('{"v": 2}'))
    assert (out / "adaptkit.json").read_text() == '{"v": 1}'
    aside = renames[0][1]
    assert renames[0][0] == out and aside.parent == tmp_path and aside.name.startswith(f".out.old-{os.getpid()}-")
    assert renames[-1] == (aside, out) and not list(tmp_path.glob(".out.*"))


def _failing_rmtree(part, monkeypatch):
    "shutil.rmtree failing on folders whose name holds `part`, but honouring ignore_errors as the real one does."
    real, failed = adaptkit.hub.client.shutil.rmtree, []
    def rmtree(path, ignore_errors=False, **kw):
        if part in Path(path).name:
            failed.append(Path(path))
            if not ignore_errors: raise PermissionError(f"cannot remove {path}")
            return
        return real(path, ignore_errors=ignore_errors, **kw)
    monkeypatch.setattr(adaptkit.hub.client.shutil, "rmtree", rmtree)
    return failed


def test_an_old_folder_that_cannot_be_removed_does_not_fail_the_save(tmp_path, monkeypatch):
    out = write_folder(tmp_path / "out", _fill('{"v": 1}'))
    failed = _failing_rmtree(".old-", monkeypatch)
    assert write_folder(out, _fill('{"v": 2}')) == out and (out / "adaptkit.json").read_text() == '{"v": 2}'
    assert len(failed) == 1 and failed[0].name.startswith(f".out.old-{os.getpid()}-")


def test_a_dead_saves_leftover_that_cannot_be_removed_does_not_fail_the_save(tmp_path, monkeypatch):
    dead = tmp_path / ".out.tmp-999999999-x"
    dead.mkdir()
    failed = _failing_rmtree(".tmp-999999999-", monkeypatch)
    out = write_folder(tmp_path / "out", _fill("{}"))
    assert (out / "adaptkit.json").read_text() == "{}" and failed == [dead]


def test_a_dead_saves_half_written_new_folder_is_never_restored(tmp_path):
    "Only an `.old-` folder (the complete previous save) is put back; a dead `.tmp-` one may be half written."
    half = tmp_path / ".out.tmp-999999999-y"
    half.mkdir()
    (half / "adaptkit.json").write_text('{"half": true}')
    def broken(folder):
        raise RuntimeError("killed again")
    with pytest.raises(RuntimeError, match="killed again"):
        write_folder(tmp_path / "out", broken)
    assert not (tmp_path / "out").exists() and not half.exists()


# --- pull -------------------------------------------------------------------------------------------------------------

def test_pull_from_another_endpoint_uses_a_cache_folder_of_its_own(hub, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.txt").write_text("a")
    push_folder(tmp_path / "m", "team/cached", endpoint=hub.endpoint, token=hub.token)
    folder = pull("team/cached", endpoint=hub.endpoint, token=hub.token)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", hub.endpoint.split("://", 1)[1]).strip("_")
    assert folder.is_relative_to(Path(huggingface_hub.constants.HF_HUB_CACHE) / "endpoints" / slug)
    assert (folder / "a.txt").read_text() == "a"


def test_pull_checks_access_to_the_revision_it_was_asked_for(request_log):
    from huggingface_hub.errors import HfHubHTTPError
    endpoint, log = request_log
    url = f"{endpoint}/api/datasets/team/x/revision/v1"
    with pytest.raises(HfHubHTTPError, match=re.escape(f"404 Not Found' for url '{url}")):
        pull("team/x", revision="v1", endpoint=endpoint, repo_type="dataset")
    assert log[0] == "GET /api/datasets/team/x/revision/v1"


def test_an_artifacts_record_lists_its_own_files_and_names_a_changed_one(tmp_path):
    "`file_checksums` skips the card, the record, hidden and `_*` files and `checkpoint-*` folders; `verify_checksums`."
    from adaptkit.hub import file_checksums, sha256_file, verify_checksums
    d = tmp_path / "art"
    for rel, data in {"w.bin": b"abc", "sub/x.json": b"{}", "README.md": b"card", "adaptkit.json": b"{}",
                      ".cache/a": b"1", "_init/b": b"2", "sub/_private": b"3", "checkpoint-2/c": b"4",
                      "checkpoint-notes.txt": b"5"}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True); (d / rel).write_bytes(data)
    files = file_checksums(d)
    assert files == {
        "checkpoint-notes.txt": sha256_file(d / "checkpoint-notes.txt"),
        "sub/x.json": sha256_file(d / "sub/x.json"),
        "w.bin": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    }
    verify_checksums(d, files)
    (d / "w.bin").write_bytes(b"abd")
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{d / 'w.bin'}: sha256 a52d159f262b... differs from adaptkit.json's "
            "ba7816bf8f01...: the file was altered or damaged"
        ),
    ):
        verify_checksums(d, files)
    with pytest.raises(ValueError, match=re.escape(f"{d / 'gone.bin'}: listed in adaptkit.json, missing")):
        verify_checksums(d, {"gone.bin": "0" * 64})
    for outside in ("../x", "/etc/passwd", "sub/../../x"):
        with pytest.raises(ValueError, match=re.escape(f"file {outside!r} is not inside the artifact folder")):
            verify_checksums(d, {outside: "0" * 64})


def test_json_is_written_whole_or_not_at_all(tmp_path):
    "`write_json` replaces a file atomically: a value that cannot be written leaves the old file and no temporary one."
    from adaptkit.hub import write_json
    path = tmp_path / "r.json"
    write_json(path, {"b": 1, "a": [1, 2]}, indent=2, sort_keys=True)
    assert path.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    with pytest.raises(TypeError):
        write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


# --- source_of names the folder itself, never the base its record names -----------------------------------------------

class _Trainer(ArtifactTrainerMixin):
    "A trainer's stand-in: what `ArtifactTrainerMixin._load_base` stamps for the base it is given."
    def __init__(self, base): self.model = self._load_base(base)


def _fine_tune_of(tiny_tok, folder, base_model="team/base"):
    "An unpushed artifact folder: a full model (other weights than its base) whose record names `base_model`."
    art = ModelArtifact(tiny_causal_lm(tiny_tok, seed=3), tiny_tok)
    art.base_model, art.base_revision = base_model, "b" * 40
    art.base_fingerprint = fingerprint(tiny_causal_lm(tiny_tok))  # the base's, as a trainer stamps it
    return art.save_pretrained(folder)


def test_source_of_an_unpushed_artifact_folder_is_its_path_not_its_recorded_base(tiny_tok, tmp_path):
    """Before, an artifact's `source.base_model` was returned as the folder's own repo id: a trainer given a merged
    or fine-tuned model's folder recorded that model's base as its own (and `from_pretrained` would load it)."""
    folder = _fine_tune_of(tiny_tok, tmp_path / "tuned")
    assert read_metadata(folder)["source"]["base_model"] == "team/base"  # the record does name its base
    assert source_of(folder) == {"path": str(folder.resolve())}
    assert load_base(str(folder))[1] == {"path": str(folder.resolve())}
    trainer = _Trainer(str(folder))  # the artifact is the base here: its folder is what the trainer records
    assert (trainer.base_model, trainer.base_revision) == (None, None)
    assert trainer.base_path == str(folder.resolve())
    assert trainer.base_fingerprint == fingerprint(tiny_causal_lm(tiny_tok, seed=3))  # the fine-tune's, not team/base's


def test_source_of_a_pushed_or_pulled_artifact_is_its_own_repo_at_its_commit(hub, tiny_tok, tmp_path):
    "A pushed artifact folder (its push record) and its pulled snapshot are the artifact's repo, never its base's."
    folder = _fine_tune_of(tiny_tok, tmp_path / "tuned")
    commit = push_folder(folder, "team/tuned", endpoint=hub.endpoint, token=hub.token)
    assert source_of(folder) == {"repo_id": "team/tuned", "revision": commit, "endpoint": hub.endpoint}
    pulled = pull("team/tuned", endpoint=hub.endpoint, token=hub.token, revision=commit)
    assert read_metadata(pulled)["source"]["base_model"] == "team/base"  # the uploaded record keeps its base
    assert source_of(pulled) == {"repo_id": "team/tuned", "revision": commit}
    trainer = _Trainer(str(pulled))
    assert (trainer.base_model, trainer.base_revision, trainer.base_path) == ("team/tuned", commit, None)


def test_source_of_a_folder_pushed_to_another_hub_keeps_that_hub(hub, tiny_tok, tiny_model_copy, tmp_path,
                                                                   monkeypatch):
    """A folder pushed to a LocalHub is that repo on that Hub: before, it read as a bare repo id, which a record or card
    made from it named as if on huggingface.co (and a later load looked for there). A trainer working with that Hub
    records the repo; without it, the trainer and an adapter on it record the folder, which loads with no Hub."""
    from peft import LoraConfig, get_peft_model

    from adaptkit.artifacts import AdapterArtifact
    commit = push_folder(tiny_model_copy, "team/local-base", endpoint=hub.endpoint, token=hub.token)
    assert source_of(tiny_model_copy) == {"repo_id": "team/local-base", "revision": commit, "endpoint": hub.endpoint}
    on_hub = ArtifactTrainerMixin()
    on_hub._load_base(str(tiny_model_copy), endpoint=hub.endpoint)
    assert (on_hub.base_model, on_hub.base_revision, on_hub.base_path) == ("team/local-base", commit, None)
    trainer = _Trainer(str(tiny_model_copy))  # no Hub given: not a repo id on huggingface.co, but the folder
    assert (trainer.base_model, trainer.base_revision) == (None, None)
    assert trainer.base_path == str(tiny_model_copy.resolve())
    lora = get_peft_model(load_causal_lm(tiny_model_copy), LoraConfig(r=2, target_modules=["q_proj"]))
    source = read_metadata(AdapterArtifact(lora, tiny_tok).save_pretrained(tmp_path / "lora"))["source"]
    assert (source["base_model"], source["base_revision"], source["base_path"]) == (
        None, None, str(tiny_model_copy.resolve()))
    loaded = AdapterArtifact.from_pretrained(tmp_path / "lora")  # the folder, checked; no Hub asked
    assert loaded.model.get_base_model().config.name_or_path == str(tiny_model_copy.resolve())
    monkeypatch.setattr(adaptkit.hub.client.constants, "ENDPOINT", hub.endpoint)  # this Hub as the default one:
    again = push_folder(tiny_model_copy, "team/local-base", endpoint=hub.endpoint, token=hub.token)
    assert source_of(tiny_model_copy) == {"repo_id": "team/local-base", "revision": again}  # a bare repo id, as before
