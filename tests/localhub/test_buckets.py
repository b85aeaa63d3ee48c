"""Buckets with the stock client: `HfApi`'s bucket API and the `hf buckets` commands of huggingface_hub 2.4 against a
LocalHub on loopback (create, list, info, upload through Xet, download, copy, move, settings, delete), with the access
rules of repos (a private bucket is a 404 without the hub's token; every change needs it), and `LocalHub.gc` keeping
every Xet object a bucket names. Nothing touches the network."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, HfFileSystem
from huggingface_hub.errors import BucketBatchError, BucketNotFoundError, EntryNotFoundError, HfHubHTTPError
from huggingface_hub.utils import _xet

from adaptkit.localhub import LocalHub

pytest.importorskip("hf_xet")

pytestmark = pytest.mark.hub(guarded=True)  # private buckets need a hub with a token


@pytest.fixture(autouse=True)
def xet_client():
    "A fresh hf_xet session on the test's own cache (`HF_XET_CACHE`, set by the conftest)."
    _xet.abort_xet_session()
    yield
    _xet.abort_xet_session()


@pytest.fixture
def anonymous(hub):
    "The stock client on `hub` without a token."
    return HfApi(endpoint=hub.endpoint, token=False)


def _status(call) -> int:
    "The HTTP status of the error `call()` raises."
    with pytest.raises(HfHubHTTPError) as e: call()
    return e.value.response.status_code


def test_create_info_list_delete(hub, api, anonymous):
    url = api.create_bucket("data")  # no namespace: the token's user, as for repos
    assert (url.bucket_id, url.url, url.uri.to_uri()) == ("localhub/data", f"{hub.endpoint}/buckets/localhub/data",
                                                          "hf://buckets/localhub/data")
    assert _status(lambda: api.create_bucket("localhub/data")) == 409
    assert api.create_bucket("localhub/data", exist_ok=True) == url
    api.create_bucket("team/other")
    info = anonymous.bucket_info("localhub/data")
    assert (info.id, info.private, info.size, info.total_files) == ("localhub/data", False, 0, 0)
    assert abs(info.created_at.timestamp() - time.time()) < 600
    assert {b.id for b in api.list_buckets()} == {"localhub/data"}  # "me": the hub's user
    assert {b.id for b in anonymous.list_buckets(namespace="team")} == {"team/other"}
    assert [b.id for b in api.list_buckets(namespace="localhub", search="DAT")] == ["localhub/data"]
    assert list(api.list_buckets(namespace="localhub", search="nothing")) == []
    assert _status(lambda: api.bucket_info("data")) == 404  # an id without its namespace, as on the Hub
    assert _status(lambda: api.delete_bucket("data")) == 404
    assert _status(lambda: api.list_buckets(namespace="nobody").__next__()) == 404
    assert _status(lambda: api.create_bucket("localhub/x", region="us")) == 400  # no regions here
    api.delete_bucket("localhub/data")
    with pytest.raises(BucketNotFoundError): api.bucket_info("localhub/data")
    with pytest.raises(BucketNotFoundError): api.delete_bucket("localhub/data")
    api.delete_bucket("localhub/data", missing_ok=True)
    assert hub.counts["create-bucket"] == 5 and hub.counts["delete-bucket"] == 3 and hub.counts["no-bucket"] == 1


def test_upload_list_download(hub, api, anonymous, tmp_path, random_bytes, raw):
    api.create_bucket("localhub/b")
    local = tmp_path / "weights.bin"
    local.write_bytes(weights := random_bytes(300_000))
    os.utime(local, (1_700_000_000, 1_700_000_000))
    api.batch_bucket_files("localhub/b", add=[(b"hello", "file.txt"), (local, "sub/weights.bin"),
                                             (b"deep", "sub/deep/file.txt"), (b"", "empty.txt")])
    assert hub.counts["cas-shard"] >= 1 and hub.counts["bucket-batch"] == 1  # the bytes went through Xet
    tree = {f.path: f for f in anonymous.list_bucket_tree("localhub/b")}  # the Hub's default: every file
    assert set(tree) == {"file.txt", "sub/weights.bin", "sub/deep/file.txt", "empty.txt"}
    assert (tree["sub/weights.bin"].size, tree["sub/weights.bin"].mtime.timestamp()) == (300_000, 1_700_000_000)
    assert all(len(f.xet_hash) == 64 and f.uploaded_at is not None for f in tree.values())
    top = [(f.type, f.path) for f in api.list_bucket_tree("localhub/b", recursive=False)]
    assert top == [("file", "empty.txt"), ("file", "file.txt"), ("directory", "sub")]
    assert [(f.type, f.path) for f in api.list_bucket_tree("localhub/b", prefix="sub", recursive=False)] == [
        ("directory", "sub/deep"), ("file", "sub/weights.bin")]
    assert {f.path for f in api.list_bucket_tree("localhub/b", prefix="sub/", recursive=True)} == {
        "sub/weights.bin", "sub/deep/file.txt"}
    found = list(api.get_bucket_paths_info("localhub/b", ["file.txt", "sub", "missing.txt", "file.txt"]))
    assert [(f.path, f.size, f.xet_hash) for f in found] == [("file.txt", 5, tree["file.txt"].xet_hash)]
    info = api.bucket_info("localhub/b")
    assert (info.size, info.total_files) == (300_000 + 5 + 4, 4)
    meta = api.get_bucket_file_metadata("localhub/b", "sub/weights.bin")
    assert (meta.size, meta.xet_file_data.file_hash) == (300_000, tree["sub/weights.bin"].xet_hash)

    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="missing.txt"):
        anonymous.download_bucket_files("localhub/b", [("sub/weights.bin", out / "w.bin"), ("missing.txt", out / "m"),
                                                       (tree["file.txt"], out / "f.txt"), ("empty.txt", out / "e")])
    assert [(out / n).read_bytes() for n in ("w.bin", "f.txt", "e")] == [weights, b"hello", b""]
    assert hub.counts["cas-reconstruction"] >= 2  # the bytes came through Xet
    with pytest.raises(EntryNotFoundError):
        api.download_bucket_files("localhub/b", [("missing.txt", out / "m")], raise_on_missing_files=True)
    status, headers, body = raw("GET", f"{hub.endpoint}/buckets/localhub/b/resolve/sub%2Fweights.bin",
                                headers={"Range": "bytes=10-19"})  # a reader without Xet (curl)
    assert (status, body, headers["X-Xet-Hash"]) == (206, weights[10:20], tree["sub/weights.bin"].xet_hash)

    api.batch_bucket_files("localhub/b", add=[(b"HELLO!", "file.txt")], delete=["sub/deep/file.txt", "never.txt"])
    assert {f.path: f.size for f in api.list_bucket_tree("localhub/b")} == {
        "file.txt": 6, "sub/weights.bin": 300_000, "empty.txt": 0}
    api.download_bucket_files("localhub/b", [("file.txt", out / "f.txt")])
    assert (out / "f.txt").read_bytes() == b"HELLO!"


def test_private_bucket_is_refused_without_the_token(hub, api, anonymous, tmp_path):
    api.create_bucket("localhub/secret", private=True)
    api.batch_bucket_files("localhub/secret", add=[(b"classified", "a.txt")])
    assert api.bucket_info("localhub/secret").private
    for read in (lambda: anonymous.bucket_info("localhub/secret"),
                 lambda: list(anonymous.list_bucket_tree("localhub/secret")),
                 lambda: list(anonymous.get_bucket_paths_info("localhub/secret", ["a.txt"]))):
        with pytest.raises(BucketNotFoundError): read()
    assert [b.id for b in anonymous.list_buckets(namespace="localhub")] == []
    assert [b.id for b in api.list_buckets(namespace="localhub")] == ["localhub/secret"]
    with pytest.raises(HfHubHTTPError):
        anonymous.get_bucket_file_metadata("localhub/secret", "a.txt")
    with pytest.raises(HfHubHTTPError):
        anonymous.download_bucket_files("localhub/secret", [("a.txt", tmp_path / "a.txt")])
    assert not (tmp_path / "a.txt").exists()
    # every change needs the hub's token: a new bucket, a batch, its Xet write token, settings, a deletion
    assert _status(lambda: anonymous.create_bucket("localhub/open")) == 401
    assert _status(lambda: anonymous.batch_bucket_files("localhub/secret", delete=["a.txt"])) == 401
    assert _status(lambda: anonymous.delete_bucket("localhub/secret")) == 401
    api.create_bucket("localhub/open")
    assert _status(lambda: anonymous.update_bucket_settings("localhub/open", private=True)) == 401
    with pytest.raises(Exception, match="401"):  # hf_xet asks for the write token first, and is refused
        anonymous.batch_bucket_files("localhub/open", add=[(b"x", "x.txt")])
    assert api.bucket_info("localhub/open").total_files == 0 and hub.counts["bucket-batch"] == 1  # refused before
    api.download_bucket_files("localhub/secret", [("a.txt", tmp_path / "a.txt")])
    assert (tmp_path / "a.txt").read_bytes() == b"classified"
    api.update_bucket_settings("localhub/secret", private=False)  # now anyone reads it
    assert [f.path for f in anonymous.list_bucket_tree("localhub/secret")] == ["a.txt"]
    anonymous.download_bucket_files("localhub/secret", [("a.txt", tmp_path / "b.txt")])
    assert (tmp_path / "b.txt").read_bytes() == b"classified"


def test_a_hub_without_a_token_keeps_no_private_bucket(tmp_path, token):
    with LocalHub(tmp_path / "open") as hub:
        api = HfApi(endpoint=hub.endpoint, token=False)
        assert _status(lambda: api.create_bucket("localhub/secret", private=True)) == 400
        api.create_bucket("localhub/public")
        assert _status(lambda: api.update_bucket_settings("localhub/public", private=True)) == 400
        api.batch_bucket_files("localhub/public", add=[(b"open", "a.txt")])  # anyone writes an open hub
    with LocalHub(tmp_path / "guarded", token=token) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_bucket("localhub/secret", private=True)
    with pytest.raises(ValueError, match="bucket localhub/secret"):  # a start without the token would expose it
        LocalHub(tmp_path / "guarded").start()


def test_a_mirror_keeps_buckets_of_its_own(tmp_path, token):
    "A mirror asks its upstream for the repos it lacks, never for a bucket: a bucket is the hub's own."
    with LocalHub(tmp_path / "upstream") as upstream, \
            LocalHub(tmp_path / "mirror", upstream=upstream.endpoint, upstream_token=False, token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        with pytest.raises(BucketNotFoundError): api.bucket_info("localhub/b")  # a 404, not a question upstream
        api.create_bucket("localhub/b")
        api.batch_bucket_files("localhub/b", add=[(b"local", "a.txt")])
        api.download_bucket_files("localhub/b", [("a.txt", tmp_path / "a.txt")])
        assert (tmp_path / "a.txt").read_bytes() == b"local"
        api.delete_bucket("localhub/b")
        with pytest.raises(BucketNotFoundError): api.bucket_info("localhub/b")
        assert upstream.counts.total() == 0


def _records(hub) -> set:
    "The Xet hashes of every file record the hub's store holds (read from disk)."
    return {p.stem for p in (Path(hub.root) / "xet" / "files").glob("*/*.json")}


def test_gc_keeps_what_a_bucket_names(hub, api, random_bytes, tmp_path):
    api.create_bucket("localhub/b")
    api.batch_bucket_files("localhub/b", add=[(random_bytes(200_000, 1), "a.bin"), (random_bytes(200_000, 2), "b.bin")])
    names = {f.path: f.xet_hash for f in api.list_bucket_tree("localhub/b")}
    assert set(names.values()) <= _records(hub)
    freed = hub.gc(older_than=0)  # right after the upload, no retention at all: a bucket's files stay
    assert set(names.values()) <= _records(hub) and freed["files"] == 0
    api.download_bucket_files("localhub/b", [("a.bin", tmp_path / "a.bin")])
    assert (tmp_path / "a.bin").read_bytes() == random_bytes(200_000, 1)
    api.batch_bucket_files("localhub/b", delete=["b.bin"])  # a file deleted from the bucket: nothing goes at once
    assert hub.gc()["files"] == 0 and names["b.bin"] in _records(hub)
    assert hub.gc(older_than=0)["files"] == 1  # past the retention: exactly the file nothing names any more
    assert _records(hub) >= {names["a.bin"]} and names["b.bin"] not in _records(hub)
    api.delete_bucket("localhub/b")  # the bucket too: its files stay for the retention
    assert hub.gc()["files"] == 0 and names["a.bin"] in _records(hub)
    assert hub.gc(older_than=0)["files"] == 1 and names["a.bin"] not in _records(hub)


def test_copy_files_to_a_bucket(hub, api, random_bytes, tmp_path):
    api.create_bucket("localhub/src")
    api.create_bucket("localhub/dst")
    api.batch_bucket_files("localhub/src", add=[(b"a", "logs/a.txt"), (b"b", "logs/sub/b.txt"), (b"c", "other/c.txt")])
    api.copy_files("hf://buckets/localhub/src/logs", "hf://buckets/localhub/dst/backup/")  # no data moves
    api.copy_files("hf://buckets/localhub/src/other/c.txt", "hf://buckets/localhub/dst/c-copy.txt")
    assert {f.path for f in api.list_bucket_tree("localhub/dst")} == {
        "backup/a.txt", "backup/sub/b.txt", "c-copy.txt"}
    api.create_repo("localhub/model")
    weights = random_bytes(50_000, 3)
    api.upload_file(path_or_fileobj=weights, path_in_repo="w.safetensors", repo_id="localhub/model")  # Xet
    api.upload_file(path_or_fileobj=b"{}", path_in_repo="config.json", repo_id="localhub/model")  # inline
    api.copy_files("hf://localhub/model/", "hf://buckets/localhub/dst/model/")
    out = tmp_path / "out"
    api.download_bucket_files("localhub/dst", [("model/w.safetensors", out / "w"), ("model/config.json", out / "c"),
                                               ("backup/sub/b.txt", out / "b")])
    assert [(out / n).read_bytes() for n in ("w", "c", "b")] == [weights, b"{}", b"b"]
    assert "model/.gitattributes" not in {f.path for f in api.list_bucket_tree("localhub/dst")}
    a = next(iter(api.get_bucket_paths_info("localhub/src", ["logs/a.txt"]))).xet_hash
    with pytest.raises(BucketBatchError) as e:  # the good copy goes, the two others are listed
        api.batch_bucket_files("localhub/dst", copy=[("bucket", "localhub/src", a, "ok.txt"),
                                                     ("bucket", "localhub/nothing", a, "x.txt"),
                                                     ("model", "localhub/model", a, "y.txt")])
    failed = {f["path"]: f["error"] for f in e.value.failures}
    assert set(failed) == {"x.txt", "y.txt"} and "does not exist" in failed["x.txt"] and "holds no" in failed["y.txt"]
    assert "ok.txt" in {f.path for f in api.list_bucket_tree("localhub/dst")}


def test_batch_lines_are_checked(hub, api, raw):
    api.create_bucket("localhub/b")
    url, auth = f"{hub.endpoint}/api/buckets/localhub/b/batch", {"Authorization": f"Bearer {hub.token}",
                                                               "Content-Type": "application/x-ndjson"}
    lines = [{"type": "addFile", "path": "a.txt", "xetHash": "0" * 64, "mtime": 1},
             {"type": "renameFile", "path": "b.txt"}, {"type": "addFile", "path": "../c.txt", "xetHash": "0" * 64},
             {"type": "deleteFile", "path": "d.txt"}]
    status, _, body = raw("POST", url, "\n".join(map(json.dumps, lines)).encode(), auth)
    failed = json.loads(body)["failed"]
    assert status == 200 and [f["path"] for f in failed] == ["a.txt", "b.txt", "../c.txt"]
    assert "not stored" in failed[0]["error"] and "renameFile" in failed[1]["error"]
    status, _, body = raw("POST", url, json.dumps(lines[0]).encode(), auth)
    assert status == 422 and len(json.loads(body)["failed"]) == 1  # every operation failed
    status, _, body = raw("POST", url, b'{"type": "deleteFile", "path": "x"}\nnot json\n', auth)
    assert status == 400 and "line 2 of the batch" in json.loads(body)["error"]


def test_move_and_settings(hub, api, anonymous):
    api.create_bucket("localhub/old")
    api.batch_bucket_files("localhub/old", add=[(b"kept", "a.txt")])
    api.move_bucket(from_id="localhub/old", to_id="team/new")
    with pytest.raises(BucketNotFoundError): api.bucket_info("localhub/old")
    assert [f.path for f in anonymous.list_bucket_tree("team/new")] == ["a.txt"]
    assert _status(lambda: api.move_bucket(from_id="localhub/old", to_id="team/newer")) == 404
    api.update_bucket_settings("team/new", private=True)
    with pytest.raises(BucketNotFoundError): anonymous.bucket_info("team/new")
    assert api.bucket_info("team/new").private


def test_hf_file_system_on_a_bucket(hub, api):
    api.create_bucket("localhub/fs")
    api.batch_bucket_files("localhub/fs", add=[(b"dummy text data", "data/text_data.txt"), (b"# card", "README.md")])
    fs, root = HfFileSystem(endpoint=hub.endpoint, token=hub.token, skip_instance_cache=True), "buckets/localhub/fs"
    assert fs.ls(root, detail=False) == [f"{root}/README.md", f"{root}/data"]
    assert fs.ls(f"{root}/data", detail=False) == [f"{root}/data/text_data.txt"]
    with pytest.raises(FileNotFoundError): fs.ls(f"{root}/dat")  # a prefix of a folder is no folder
    with fs.open(f"{root}/data/text_data.txt", "rb") as f:  # read through `resolve` with ranges
        f.seek(6)
        assert f.read(4) == b"text"
    with fs.open(f"{root}/new.txt", "wb") as f: f.write(b"written by fsspec")
    assert fs.cat(f"{root}/new.txt") == b"written by fsspec" and fs.info(f"{root}/new.txt")["size"] == 17
    fs.cp(f"{root}/README.md", f"{root}/copy.md")
    fs.rm(f"{root}/new.txt")
    assert sorted(fs.glob(f"{root}/**/*.*")) == [f"{root}/README.md", f"{root}/copy.md", f"{root}/data/text_data.txt"]
    assert hub.counts["bucket-resolve"] >= 1 and hub.counts["bucket-batch"] >= 4


def _hf(hub, *args, cwd=None) -> subprocess.CompletedProcess:
    "The stock `hf` command on `hub`, with the test module's token."
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": hub.token, "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "NO_COLOR": "1"}
    hf = Path(sys.executable).with_name("hf")
    return subprocess.run([str(hf), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_hf_buckets_commands(hub, api, tmp_path):
    assert _hf(hub, "buckets", "create", "cli", "--quiet").stdout.strip() == "hf://buckets/localhub/cli"
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha")
    (data / "sub" / "b.txt").write_text("beta")
    r = _hf(hub, "buckets", "sync", str(data), "hf://buckets/localhub/cli")
    assert r.returncode == 0, r.stderr
    r = _hf(hub, "buckets", "cp", str(data / "a.txt"), "hf://buckets/localhub/cli/copies/")
    assert r.returncode == 0, r.stderr
    r = _hf(hub, "buckets", "list", "localhub/cli", "-R", "--quiet")
    assert r.stdout.split() == ["a.txt", "copies/a.txt", "sub/b.txt"], r.stderr
    r = _hf(hub, "buckets", "rm", "localhub/cli/copies/a.txt", "--yes")
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back"
    r = _hf(hub, "buckets", "sync", "hf://buckets/localhub/cli", str(back))
    assert r.returncode == 0, r.stderr
    assert sorted(str(p.relative_to(back)) for p in back.rglob("*") if p.is_file()) == ["a.txt", "sub/b.txt"]
    assert (back / "sub" / "b.txt").read_text() == "beta"
    r = _hf(hub, "buckets", "info", "localhub/cli")
    assert json.loads(r.stdout)["total_files"] == 2, r.stderr
    r = _hf(hub, "buckets", "delete", "localhub/cli", "--yes")
    assert r.returncode == 0, r.stderr
    with pytest.raises(BucketNotFoundError): api.bucket_info("localhub/cli")
