"""LocalHub with the stock clients: huggingface_hub uploads (inline and LFS) and downloads, transformers and peft
loading straight from it, tokens and private repos, concurrency, restarts, corruption, traversal and malformed ids."""
import base64
import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from adaptkit.localhub.server import LocalHub

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`
BIG = 12 << 20  # bytes in the big safetensors file: above the Hub's 10 MiB LFS threshold


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    "A model-like folder: a >10 MiB safetensors file, a config, a card and a nested text file."
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp("art")
    g = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(BIG // 4, generator=g)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    (d / "README.md").write_text("---\nlicense: apache-2.0\ntags:\n- adaptkit\n---\n# A test artifact\n")
    (d / "sub").mkdir()
    (d / "sub" / "notes.txt").write_text("nested file\n")
    return d


def _files(root: Path) -> dict:
    "The files under `root` by relative path (a repo's initial `.gitattributes` left out: folders have none)."
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.parts and p.name != ".gitattributes"}


def _ndjson_commit(raw, hub, repo_id, lines, token=None):
    "A raw NDJSON commit of `lines` to `repo_id`'s main, with `token` (default: the hub's)."
    body = b"".join(json.dumps(x).encode() + b"\n" for x in [{"key": "header", "value": {"summary": "raw"}}, *lines])
    return raw("POST", f"{hub.endpoint}/api/models/{repo_id}/commit/main", body,
               {"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {token or hub.token}"})


def test_upload_folder_round_trip_default_client(hub, api, folder, tmp_path, token):
    "Xet on (the client's default), the hub's default (the Hub's LFS rule): the 12 MiB file goes through Xet."
    api.create_repo("team/art")
    commit = api.upload_folder(folder_path=folder, repo_id="team/art", commit_message="add art")
    assert hub.counts["lfs-batch"] == 0 and hub.counts["commit"] == 1 and hub.counts["cas-shard"] == 1
    assert api.model_info("team/art").sha == commit.oid
    snap = snapshot_download("team/art", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c1")
    assert _files(Path(snap)) == _files(folder)
    one = hf_hub_download(
        "team/art", "model.safetensors", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2"
    )
    assert Path(one).read_bytes() == (folder / "model.safetensors").read_bytes()
    data = (folder / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()  # an LFS file (stored with Xet): its etag is its sha256
    meta = get_hf_file_metadata(hf_hub_url("team/art", "model.safetensors", endpoint=hub.endpoint), token=token)
    size = (folder / "model.safetensors").stat().st_size
    assert (meta.etag, meta.size, meta.commit_hash) == (sha, size, commit.oid) and meta.xet_file_data.file_hash
    assert size > BIG
    entry = {f.path: f for f in api.list_repo_tree("team/art", recursive=True)}
    assert entry["model.safetensors"].lfs.sha256 == sha and entry["model.safetensors"].xet_hash and "sub" in entry
    card = api.model_info("team/art").card_data
    assert card.license == "apache-2.0" and card.tags == ["adaptkit"]


def test_upload_folder_round_trip_inline_hub(tmp_path, folder, token):
    "lfs=False: preupload says 'regular', so even the 12 MiB file travels inline and is stored as a regular file."
    with LocalHub(tmp_path / "hub", token=token, lfs=False) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/art")
        commit = api.upload_folder(folder_path=folder, repo_id="team/art", commit_message="add art")
        assert hub.counts["lfs-batch"] == 0 and hub.counts["xet-token"] == 0 and hub.counts["commit"] == 1
        data = (folder / "model.safetensors").read_bytes()
        git_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # sent inline: stored as a regular file
        meta = get_hf_file_metadata(hf_hub_url("team/art", "model.safetensors", endpoint=hub.endpoint), token=token)
        assert (meta.etag, meta.size, meta.commit_hash, meta.xet_file_data) == (git_id, len(data), commit.oid, None)
        entry = {f.path: f for f in api.list_repo_tree("team/art", recursive=True)}
        assert entry["model.safetensors"].blob_id == git_id and entry["model.safetensors"].lfs is None
        one = hf_hub_download("team/art", "model.safetensors", endpoint=hub.endpoint, token=token,
                              cache_dir=tmp_path / "c")
        assert Path(one).read_bytes() == data


def test_range_and_head(raw, hub, api, folder):
    api.create_repo("team/art")
    api.upload_folder(folder_path=folder, repo_id="team/art")
    url = hf_hub_url("team/art", "model.safetensors", endpoint=hub.endpoint)
    data = (folder / "model.safetensors").read_bytes()
    status, headers, body = raw("GET", url, headers={"Range": "bytes=100-199"})
    assert (status, body, headers["Content-Range"]) == (206, data[100:200], f"bytes 100-199/{len(data)}")
    assert raw("GET", url, headers={"Range": "bytes=-10"})[2] == data[-10:]
    assert raw("GET", url, headers={"Range": f"bytes={len(data)}-"})[0] == 416
    status, headers, body = raw("HEAD", url)
    assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(data)
    # an LFS file stored with Xet: X-Linked-* headers and its Xet hash, as on the Hub
    assert headers["X-Linked-Size"] == str(len(data)) and len(headers["X-Xet-Hash"]) == 64 and headers["X-Repo-Commit"]
    readme = raw("HEAD", hf_hub_url("team/art", "README.md", endpoint=hub.endpoint))[1]
    assert "X-Linked-Size" not in readme and "X-Xet-Hash" not in readme  # a small text file: regular


def test_lfs_batch_path_with_xet_disabled(tmp_path, folder, monkeypatch):
    "A client with Xet disabled and a hub with lfs=True: large/binary files go through LFS batch + PUT + verify."
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with LocalHub(tmp_path / "hub", lfs=True) as hub:
        api = HfApi(endpoint=hub.endpoint, token="any")
        api.create_repo("team/lfs")
        api.upload_folder(folder_path=folder, repo_id="team/lfs")
        assert (hub.counts["lfs-batch"], hub.counts["lfs-upload"], hub.counts["lfs-verify"]) == (1, 1, 1)
        snap = snapshot_download("team/lfs", endpoint=hub.endpoint, cache_dir=tmp_path / "c")
        assert _files(Path(snap)) == _files(folder)
        siblings = {s.rfilename: s for s in api.model_info("team/lfs", files_metadata=True).siblings}
        assert siblings["model.safetensors"].lfs.size == (folder / "model.safetensors").stat().st_size
        # the same bytes under another name: stored already, so the batch asks for no upload
        api.upload_file(
            path_or_fileobj=str(folder / "model.safetensors"), path_in_repo="copy.safetensors", repo_id="team/lfs"
        )
        assert (hub.counts["lfs-batch"], hub.counts["lfs-upload"]) == (2, 1)
        got = hf_hub_download("team/lfs", "copy.safetensors", endpoint=hub.endpoint, cache_dir=tmp_path / "c2")
        assert Path(got).read_bytes() == (folder / "model.safetensors").read_bytes()


def test_lfs_protocol_raw(raw, tmp_path, token):
    "The LFS batch/PUT/verify protocol by hand: chunked uploads, and every way an upload can be wrong."
    import http.client
    with LocalHub(tmp_path / "hub", lfs=True, token=token) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/raw")
        auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        data = b"\0lfs object\0" * 5000
        oid = hashlib.sha256(data).hexdigest()
        batch = lambda objects, h=auth: raw("POST", f"{hub.endpoint}/team/raw.git/info/lfs/objects/batch",
                                            json.dumps({"operation": "upload", "objects": objects}).encode(), h)
        assert batch([{"oid": oid, "size": len(data)}], {})[0] == 401  # writes need the token
        status, _, body = batch([{"oid": oid, "size": len(data)}, {"oid": "../../etc", "size": 1}])
        ok, bad = json.loads(body)["objects"]
        assert status == 200 and bad["error"]["code"] == 422 and set(ok["actions"]) == {"upload", "verify"}
        href = ok["actions"]["upload"]["href"]
        assert raw("PUT", href.replace("sig=", "sig=0"), data)[0] == 403
        assert raw("PUT", href, data[:-1] + b"!")[0] == 400 and not list((hub.root / "blobs" / "tmp").iterdir())
        assert (
            _ndjson_commit(
                raw, hub, "team/raw", [{"key": "lfsFile", "value": {"path": "o.bin", "algo": "sha256", "oid": oid}}]
            )[0]
            == 400
        )
        url = urllib.parse.urlsplit(href)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("PUT", f"{url.path}?{url.query}", body=iter([data[:1000], data[1000:]]), encode_chunked=True)
        assert conn.getresponse().status == 200
        verify = json.dumps({"oid": oid, "size": len(data)}).encode()
        assert raw("POST", ok["actions"]["verify"]["href"], verify, auth)[0] == 200
        assert "actions" not in json.loads(batch([{"oid": oid, "size": len(data)}])[2])["objects"][0]  # stored now
        status, _, body = _ndjson_commit(
            raw,
            hub,
            "team/raw",
            [{"key": "lfsFile", "value": {"path": "o.bin", "algo": "sha256", "oid": oid, "size": len(data)}}],
        )
        assert status == 200, body
        got = hf_hub_download("team/raw", "o.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
        assert Path(got).read_bytes() == data


def test_inline_hub_serves_the_default_client(tmp_path):
    "lfs=False: every file is inline, so the stock client (Xet on) never asks for a Xet token."
    with LocalHub(tmp_path / "hub", lfs=False) as hub:
        api = HfApi(endpoint=hub.endpoint, token="any")
        api.create_repo("team/x")
        api.upload_file(path_or_fileobj=b"\0binary" * 100, path_in_repo="w.bin", repo_id="team/x")
        assert hub.counts["commit"] == 1 and hub.counts["xet-token"] == 0 and hub.counts["cas-xorb"] == 0
        assert api.get_paths_info("team/x", ["w.bin"])[0].lfs is None


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    "A tiny random Llama (hidden 32, 2 layers, vocab 128) saved with save_pretrained."
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    d = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(d)
    return d, model


def test_transformers_and_peft_load_from_localhub(hub, api, tiny_llama, tmp_path, monkeypatch, token):
    """transformers/peft take no endpoint argument: the test (only) points huggingface_hub's defaults at the hub, as
    HF_ENDPOINT would before import. Three values are fixed at import time: the endpoint, the file URL template and
    the module-level `HfApi` behind `huggingface_hub.file_exists` (which peft calls)."""
    import huggingface_hub.hf_api
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", hub.endpoint)
    d, ref = tiny_llama
    api.create_repo("team/tiny-llama", private=True)
    api.upload_folder(folder_path=d, repo_id="team/tiny-llama")
    model = AutoModelForCausalLM.from_pretrained("team/tiny-llama", token=token, cache_dir=tmp_path / "c").eval()
    ids = torch.tensor([[1, 5, 9, 20, 127]])
    with torch.no_grad(): assert torch.equal(model(ids).logits, ref(ids).logits)

    torch.manual_seed(1)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(d), LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                                               init_lora_weights=False)).eval()
    lora.save_pretrained(tmp_path / "adapter")
    api.create_repo("team/tiny-lora")
    api.upload_folder(folder_path=tmp_path / "adapter", repo_id="team/tiny-lora")
    base = AutoModelForCausalLM.from_pretrained("team/tiny-llama", token=token, cache_dir=tmp_path / "c").eval()
    pulled = PeftModel.from_pretrained(base, "team/tiny-lora", cache_dir=str(tmp_path / "c")).eval()
    with torch.no_grad():
        assert torch.allclose(pulled(ids).logits, lora(ids).logits) and not torch.allclose(
            pulled(ids).logits, ref(ids).logits
        )


def test_private_repos_and_tokens(raw, hub, api, tmp_path):
    api.create_repo("team/secret", private=True)
    api.upload_file(path_or_fileobj=b"top secret", path_in_repo="s.txt", repo_id="team/secret")
    api.create_repo("team/open")
    api.upload_file(path_or_fileobj=b"hello", path_in_repo="o.txt", repo_id="team/open")
    anon, wrong = HfApi(endpoint=hub.endpoint, token=False), HfApi(endpoint=hub.endpoint, token="hf_wrong")
    with pytest.raises(RepositoryNotFoundError): anon.model_info("team/secret")
    with pytest.raises(RepositoryNotFoundError): anon.list_repo_files("team/secret")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("team/secret", "s.txt", endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
    assert raw("GET", hf_hub_url("team/secret", "s.txt", endpoint=hub.endpoint))[0] == 404
    assert anon.model_info("team/open").id == "team/open"  # public reads need no token
    assert (
        Path(
            hf_hub_download("team/open", "o.txt", endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
        ).read_bytes()
        == b"hello"
    )
    with pytest.raises(HfHubHTTPError) as e: wrong.model_info("team/open")
    assert e.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError): wrong.whoami()
    with pytest.raises(HfHubHTTPError) as e: anon.create_repo("team/new")
    assert e.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as e:
        anon.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="team/open")
    assert e.value.response.status_code == 401
    assert _ndjson_commit(raw, hub, "team/open", [], token="hf_wrong")[0] == 401
    assert api.model_info("team/secret").private and api.whoami()["name"] == "localhub"


def test_concurrent_snapshot_downloads(hub, api, folder, tmp_path, token):
    api.create_repo("team/art")
    api.upload_folder(folder_path=folder, repo_id="team/art")
    with ThreadPoolExecutor(8) as pool:
        snaps = list(pool.map(lambda i: snapshot_download("team/art", endpoint=hub.endpoint, token=token,
                                                          cache_dir=tmp_path / f"c{i}"), range(8)))
    want = _files(folder)
    assert len(set(snaps)) == 8 and all(_files(Path(s)) == want for s in snaps)


def test_restart_keeps_everything(tmp_path, folder, token):
    with LocalHub(tmp_path / "hub", token=token) as first:
        api = HfApi(endpoint=first.endpoint, token=token)
        api.create_repo("team/art", private=True)
        c1 = api.upload_folder(folder_path=folder, repo_id="team/art").oid
        api.create_repo("team/data", repo_type="dataset")
    with LocalHub(tmp_path / "hub", token=token) as second:
        api = HfApi(endpoint=second.endpoint, token=token)
        info = api.model_info("team/art")
        assert info.sha == c1 and info.private and api.dataset_info("team/data").id == "team/data"
        snap = snapshot_download("team/art", endpoint=second.endpoint, token=token, cache_dir=tmp_path / "c")
        assert _files(Path(snap)) == _files(folder)
        c2 = api.upload_file(path_or_fileobj=b"more", path_in_repo="more.txt", repo_id="team/art").oid
        assert [c.commit_id for c in api.list_repo_commits("team/art")][:2] == [c2, c1]
        assert api.list_repo_files("team/art", revision=c1) == sorted([".gitattributes", *_files(folder)])


def test_corrupted_blob_is_not_served(raw, hub, api, tmp_path, token):
    "A text file, so inline and stored as a blob (a binary one would be stored with Xet)."
    api.create_repo("team/c")
    data = b"precious bytes " * 1000
    api.upload_file(path_or_fileobj=data, path_in_repo="p.txt", repo_id="team/c")
    blob = hub.root / "blobs" / hashlib.sha256(data).hexdigest()[:2] / hashlib.sha256(data).hexdigest()
    damaged = bytearray(blob.read_bytes())
    damaged[10] ^= 0xFF
    blob.write_bytes(bytes(damaged))
    with pytest.raises(HfHubHTTPError, match="corrupted") as e:
        hf_hub_download("team/c", "p.txt", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
    assert e.value.response.status_code == 500
    assert not [p for p in (tmp_path / "c").rglob("p.txt")]  # nothing half-downloaded left in the cache
    status, _, body = raw(
        "GET", hf_hub_url("team/c", "p.txt", endpoint=hub.endpoint), headers={"Authorization": f"Bearer {token}"}
    )
    assert status == 500 and b"precious" not in body
    # repair: delete the file and upload the same bytes again
    api.delete_file("p.txt", repo_id="team/c")
    api.upload_file(path_or_fileobj=data, path_in_repo="p.txt", repo_id="team/c")
    assert (
        Path(
            hf_hub_download("team/c", "p.txt", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
        ).read_bytes()
        == data
    )


def test_traversal_and_malformed_ids_are_refused(raw, hub, api, tmp_path, token):
    api.create_repo("team/t")
    content = base64.b64encode(b"pwned").decode()
    for path, want in [("../x", 422), ("/etc/passwd", 400), ("a/../../x", 422), ("a\\..\\x", 422), ("./a", 400),
                       ("a//b", 400), (".git/config", 400), ("", 400)]:  # climbing out: 422, as the Hub for ..\x
        status, _, body = _ndjson_commit(
            raw, hub, "team/t", [{"key": "file", "value": {"path": path, "content": content, "encoding": "base64"}}]
        )
        assert status == want and b"Invalid path" in body, (path, status, body)
    status, _, _ = _ndjson_commit(raw, hub, "team/t", [{"key": "deletedFolder", "value": {"path": "../"}}])
    assert status == 422
    pre = json.dumps({"files": [{"path": "../x", "sample": "", "size": 1}]}).encode()
    assert raw("POST", f"{hub.endpoint}/api/models/team/t/preupload/main", pre,
               {"Content-Type": "application/json", "Authorization": f"Bearer {token}"})[0] == 422
    assert raw("GET", f"{hub.endpoint}/team/t/resolve/main/%2E%2E/%2E%2E/etc/passwd")[0] == 422
    assert (
        api.list_repo_files("team/t") == [".gitattributes"]
        and not (tmp_path / "x").exists()
        and not (hub.root.parent / "x").exists()
    )
    for org, name in [("team", "bad--name"), ("team", "bad..name"), ("team", "-x"), ("team", "a/b"), ("", "x"),
                      ("api", "x"), ("team", "x" * 97), ("team", "x.git"), ("tëam", "x")]:
        body = json.dumps({"name": name, "organization": org, "type": "model"}).encode()
        status, _, _ = raw("POST", f"{hub.endpoint}/api/repos/create", body,
                           {"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        assert status == 400, (org, name, status)
    assert raw("GET", f"{hub.endpoint}/api/models/team/bad..x")[0] == 400
    assert raw("GET", f"{hub.endpoint}/api/models/%2E%2E/repos")[0] == 400
    assert sorted(p.name for p in (hub.root / "repos" / "model").iterdir()) == ["team"]


def test_delete_file_and_folder_commits(hub, api, folder):
    api.create_repo("team/d")
    first = api.upload_folder(folder_path=folder, repo_id="team/d").oid
    api.delete_file("config.json", repo_id="team/d")
    api.delete_folder("sub", repo_id="team/d")
    assert api.list_repo_files("team/d") == [".gitattributes", "README.md", "model.safetensors"]
    with pytest.raises(EntryNotFoundError) as e: api.delete_file("nope.txt", repo_id="team/d")
    assert e.value.response.status_code == 404 and "A file with this name doesn't exist: nope.txt" in str(e.value)
    with pytest.raises(EntryNotFoundError) as e: api.delete_folder("nope", repo_id="team/d")
    assert e.value.response.status_code == 404 and "No folder nope" in str(e.value)
    # history is kept
    assert api.list_repo_files("team/d", revision=first) == sorted([".gitattributes", *_files(folder)])
    with pytest.raises(RevisionNotFoundError): api.list_repo_files("team/d", revision="no-such-branch")
    assert [c.title for c in api.list_repo_commits("team/d")] == [
        "Delete folder sub with huggingface_hub", "Delete config.json with huggingface_hub",
        "Upload folder using huggingface_hub", "initial commit"]


def test_repo_delete_create_conflict_and_datasets(hub, api, tmp_path, token):
    url = api.create_repo("team/ds", repo_type="dataset")
    assert url.repo_type == "dataset" and url.repo_id == "team/ds"
    with pytest.raises(HfHubHTTPError) as e: api.create_repo("team/ds", repo_type="dataset")
    assert e.value.response.status_code == 409 and e.value.response.json()["url"].endswith("/datasets/team/ds")
    assert api.create_repo("team/ds", repo_type="dataset", exist_ok=True).repo_id == "team/ds"
    card = "---\nlicense: mit\ntask_categories:\n- text-generation\npretty_name: Tiny Q&A\n---\n# Data\n"
    api.upload_file(path_or_fileobj=card.encode(), path_in_repo="README.md", repo_id="team/ds", repo_type="dataset")
    api.upload_file(
        path_or_fileobj=b'{"q": "2+2", "a": "4"}\n',
        path_in_repo="data/train.jsonl",
        repo_id="team/ds",
        repo_type="dataset",
    )
    info = api.dataset_info("team/ds")
    assert info.card_data.pretty_name == "Tiny Q&A" and info.card_data.license == "mit"
    snap = snapshot_download(
        "team/ds", repo_type="dataset", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c"
    )
    assert (Path(snap) / "data" / "train.jsonl").read_bytes() == b'{"q": "2+2", "a": "4"}\n'
    with pytest.raises(RepositoryNotFoundError): api.model_info("team/ds")  # a dataset is not a model
    with pytest.raises(ValueError, match="Invalid metadata"):
        api.upload_file(
            path_or_fileobj=b"---\nlicense: [mit\n---\n",
            path_in_repo="README.md",
            repo_id="team/ds",
            repo_type="dataset",
        )
    api.delete_repo("team/ds", repo_type="dataset")
    with pytest.raises(RepositoryNotFoundError): api.dataset_info("team/ds")
    with pytest.raises(RepositoryNotFoundError): api.delete_repo("team/ds", repo_type="dataset")
    api.delete_repo("team/ds", repo_type="dataset", missing_ok=True)
    api.create_repo("team/ds", repo_type="dataset")
    assert api.list_repo_files("team/ds", repo_type="dataset") == [".gitattributes"]


def test_concurrent_commits_are_serialised(hub, api):
    api.create_repo("team/busy")
    def push(i):
        return api.upload_file(path_or_fileobj=f"{i}".encode(), path_in_repo=f"f{i}.txt", repo_id="team/busy").oid
    with ThreadPoolExecutor(8) as pool: oids = list(pool.map(push, range(16)))
    assert len(set(oids)) == 16 and len(api.list_repo_commits("team/busy")) == 17
    assert api.list_repo_files("team/busy") == [".gitattributes"] + sorted(f"f{i}.txt" for i in range(16))
