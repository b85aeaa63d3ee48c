"""LocalHub against the stock huggingface_hub client at its defaults (Xet disabled where LFS is used), one test per
behaviour of the Hub that issue 26 found missing: card validation without a token, repo ids without a namespace,
request ids, `.gitignore`/`.gitattributes` at preupload, one rule for regular vs LFS with unchanged files skipped,
backslashes in paths, deleting a folder by its name, refs, the Hub's error texts, the request log, and `private`
on a hub without a token. Each docstring says what the Hub does."""
import hashlib
import http.client
import io
import json
import re
import time
from pathlib import Path

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    ModelCard,
    constants,
    hf_hub_download,
    metadata_update,
)
from huggingface_hub import hf_api as hf_api_module
from huggingface_hub.errors import (
    BadRequestError,
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile

from adaptkit.localhub.http import MAX_JSON
from adaptkit.localhub.server import LocalHub
from adaptkit.localhub.storage import USER

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`


def _raw(hub, method, path, body=b"", headers=None):
    "A raw request: (status, headers, JSON or bytes body)."
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try: return r.status, r.headers, json.loads(data)
    except ValueError: return r.status, r.headers, data


def _auth(hub) -> dict:
    return {"Authorization": f"Bearer {hub.token}", "Content-Type": "application/json"}


def _preupload(hub, repo_id, paths, **extra):
    files = [{"path": p, "size": 3, "sample": ""} for p in paths]
    status, _, body = _raw(hub, "POST", f"/api/models/{repo_id}/preupload/main",
                           json.dumps({"files": files, **extra}).encode(), _auth(hub))
    assert status == 200, body
    return {f["path"]: f for f in body["files"]}


def _log_fields(log: io.StringIO) -> list:
    "The request log's lines as fields: time, client, user, method, target, status, bytes, duration, request id."
    return [line.split(" ") for line in log.getvalue().splitlines()]


def test_card_validation_needs_no_token(hub, api, monkeypatch, token):
    """Item 1. The Hub answers `/api/validate-yaml` without a token, and `RepoCard.validate()` (so `metadata_update`
    and `card.push_to_hub`) sends none; the body limit stays."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # what RepoCard.validate() and hf_hub_download read
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_api_module.api, "endpoint", hub.endpoint)  # the module-level client metadata_update uses
    hub.server.request_log = log = io.StringIO()
    ModelCard("---\nlicense: mit\n---\n# a card\n").validate()
    api.create_repo("team/card")
    metadata_update("team/card", {"tags": ["adaptkit"]}, token=token)
    assert api.model_info("team/card").card_data.tags == ["adaptkit"]
    calls = [(f[2], f[5]) for f in _log_fields(log) if f[4] == "/api/validate-yaml"]
    assert calls == [("-", "200"), ("-", "200"), (USER, "200")]  # validate(), metadata_update's, the commit's
    json_only = {"Content-Type": "application/json"}
    status, _, body = _raw(hub, "POST", "/api/validate-yaml", b'{"content": "---\\nlicense: [mit\\n---\\n"}', json_only)
    assert status == 400 and body["errors"][0]["message"].startswith("Invalid YAML metadata")
    big = json.dumps({"content": "x" * (MAX_JSON + 1)}).encode()
    status, _, body = _raw(hub, "POST", "/api/validate-yaml", big, json_only)
    assert status == 413 and f"at most {MAX_JSON}" in body["error"]


def test_repo_ids_without_a_namespace_are_repo_not_found(hub, api):
    """Item 2. The Hub answers a missing repo id without a namespace with 404 `RepoNotFound`, so the client's
    `repo_exists`, `file_exists` and `revision_exists` answer False and other calls raise RepositoryNotFoundError."""
    assert not api.repo_exists("repo-that-does-not-exist")
    assert not api.repo_exists("repo-that-does-not-exist", repo_type="dataset")
    assert not api.file_exists("repo-that-does-not-exist", "config.json")
    assert not api.file_exists("repo-that-does-not-exist", "train.csv", repo_type="dataset")
    assert not api.revision_exists("repo-that-does-not-exist", "main")
    with pytest.raises(RepositoryNotFoundError): api.list_repo_files("repo-that-does-not-exist")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("repo-that-does-not-exist", "a.txt", endpoint=hub.endpoint)
    status, headers, _ = _raw(hub, "POST", "/api/models/repo-that-does-not-exist/preupload/main", b"{}", _auth(hub))
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")
    api.create_repo("tiny")  # goes to the token's user; the bare id still names no repo
    assert api.repo_exists(f"{USER}/tiny") and not api.repo_exists("tiny")


def test_every_answer_carries_its_own_request_id(hub, api):
    """Item 3. The Hub sends `X-Request-Id` on every answer; the client quotes it in its errors."""
    ids = [_raw(hub, "GET", path)[1]["X-Request-Id"] for path in ["/api/models", "/api/models/team/none", "/nope"]]
    assert len(set(ids)) == 3 and all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    with pytest.raises(RepositoryNotFoundError) as e: api.model_info("team/none")
    assert re.fullmatch(r"[0-9a-f]{24}", e.value.request_id) and f"(Request ID: {e.value.request_id})" in str(e.value)


def test_preupload_honours_gitignore_and_gitattributes(tmp_path, monkeypatch, token):
    """Item 4. The Hub answers `shouldIgnore` for what the repo's `.gitignore` ignores (or the one the commit adds,
    which the client sends as `gitIgnore`), and "lfs" for what `.gitattributes` tracks with `filter=lfs`."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with LocalHub(tmp_path / "hub", token=token, lfs=True) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/g")
        api.upload_file(path_or_fileobj=b"*.csv filter=lfs diff=lfs merge=lfs -text\n", path_in_repo=".gitattributes",
                        repo_id="team/g")
        folder = tmp_path / "f"
        files = {".gitignore": "*.log\n!keep.log\nlogs/\n", "a.log": "x", "keep.log": "k", "logs/1.txt": "1",
                 "notes.txt": "n", "data/table.csv": "a,b\n", "w.bin": "text weights"}
        for p, text in files.items():
            (folder / p).parent.mkdir(parents=True, exist_ok=True)
            (folder / p).write_text(text)
        api.upload_folder(folder_path=folder, repo_id="team/g")  # the .gitignore comes in this very commit
        listed = {f.path: f for f in api.list_repo_tree("team/g", recursive=True) if isinstance(f, RepoFile)}
        assert sorted(listed) == [".gitattributes", ".gitignore", "data/table.csv", "keep.log", "notes.txt", "w.bin"]
        assert hub.counts["lfs-upload"] == 1 and listed["data/table.csv"].lfs is not None  # *.csv: tracked
        assert listed["w.bin"].lfs is None and listed["notes.txt"].lfs is None  # *.bin is no longer tracked here
        got = _preupload(hub, "team/g", ["b.log", "logs/2.txt", "keep.log", "x.csv", "y.txt"])
        assert {p: (f["uploadMode"], f["shouldIgnore"]) for p, f in got.items()} == {
            "b.log": ("regular", True), "logs/2.txt": ("regular", True), "keep.log": ("regular", False),
            "x.csv": ("lfs", False), "y.txt": ("regular", False)}
        got = _preupload(hub, "team/g", ["b.log", "y.txt"], gitIgnore="*.txt\n")  # the commit's own .gitignore wins
        assert (got["b.log"]["shouldIgnore"], got["y.txt"]["shouldIgnore"]) == (False, True)


def test_inline_files_are_regular_and_unchanged_ones_are_skipped(tmp_path, token):
    """Item 5. On the Hub what is stored decides every answer; a file the client already has there (same `oid` at
    preupload) is skipped, and a commit of nothing but unchanged files is not made. A `.bin` sent inline (a hub with
    lfs=False) is a regular file: tree, paths-info and siblings say so, and preupload gives its git blob id."""
    with LocalHub(tmp_path / "hub", token=token, lfs=False) as hub:
        _inline_files_are_regular(hub, HfApi(endpoint=hub.endpoint, token=token))


def _inline_files_are_regular(hub, api):
    api.create_repo("team/u")
    data = b"\0binary weights\0" * 10
    first = api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/u").oid
    git_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    info = api.get_paths_info("team/u", ["w.bin"])[0]
    tree = next(f for f in api.list_repo_tree("team/u") if f.path == "w.bin")
    sibling = next(s for s in api.model_info("team/u", files_metadata=True).siblings if s.rfilename == "w.bin")
    assert info.lfs is None and tree.lfs is None and sibling.lfs is None
    assert info.blob_id == tree.blob_id == sibling.blob_id == git_id
    assert _preupload(hub, "team/u", ["w.bin"])["w.bin"] == {
        "path": "w.bin", "uploadMode": "regular", "shouldIgnore": False, "oid": git_id}
    commits = hub.counts["commit"]
    again = api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/u")
    assert again.oid == first and hub.counts["commit"] == commits and len(api.list_repo_commits("team/u")) == 2
    changed = api.upload_file(path_or_fileobj=data + b"!", path_in_repo="w.bin", repo_id="team/u").oid
    assert changed != first and hub.counts["commit"] == commits + 1  # the control: a change is a commit


def test_unchanged_lfs_files_are_skipped_too(tmp_path, monkeypatch, token):
    """Item 5, LFS side. With Xet disabled and an LFS hub, a tracked file goes through LFS, is listed as LFS, and
    preupload's `oid` is its sha256, so the same bytes again are skipped."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with LocalHub(tmp_path / "hub", token=token, lfs=True) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/l")
        data = b"tracked by the default .gitattributes" * 10
        first = api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/l").oid
        assert api.get_paths_info("team/l", ["w.bin"])[0].lfs.sha256 == hashlib.sha256(data).hexdigest()
        assert _preupload(hub, "team/l", ["w.bin"])["w.bin"]["oid"] == hashlib.sha256(data).hexdigest()
        counts = (hub.counts["commit"], hub.counts["lfs-upload"])
        assert api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/l").oid == first
        assert (hub.counts["commit"], hub.counts["lfs-upload"]) == counts


def test_backslashes_in_paths(hub, api, tmp_path, token):
    """Item 6. The Hub stores a name with a backslash as one name (the client guards its downloads) and answers a
    path starting with `..\\` with a 422. LocalHub does the same, and also refuses (422) a name a Windows client would
    write outside its folder: a `..` part under either separator, a leading backslash, a drive letter."""
    api.create_repo("team/p")
    api.upload_file(path_or_fileobj=b"bs", path_in_repo="notes\\v1.txt", repo_id="team/p")
    assert api.list_repo_files("team/p") == [".gitattributes", "notes\\v1.txt"]
    got = hf_hub_download("team/p", "notes\\v1.txt", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
    assert Path(got).read_bytes() == b"bs" and Path(got).name == "notes\\v1.txt"  # one name on POSIX
    for bad in ["..\\x.txt", "a\\..\\..\\x.txt", "C:\\x.txt", "d/\\\\host\\share\\x"]:
        with pytest.raises(HfHubHTTPError) as e:
            api.upload_file(path_or_fileobj=b"x", path_in_repo=bad, repo_id="team/p")
        assert e.value.response.status_code == 422 and "would leave the repo's folder" in str(e.value), bad
    assert _raw(hub, "GET", "/team/p/resolve/main/..%5Cx.txt")[0] == 422
    assert api.list_repo_files("team/p") == [".gitattributes", "notes\\v1.txt"]


def test_deleting_a_folder_by_its_name(api):
    """Item 7. The Hub deletes the folder for `CommitOperationDelete("dir")` (no trailing slash: `is_folder` is False,
    so the client sends `deletedFile`)."""
    api.create_repo("team/d")
    ops = [CommitOperationAdd(p, b"x") for p in ["dir/a.txt", "dir/sub/b.txt", "dir2/c.txt", "top.txt"]]
    api.create_commit("team/d", ops, commit_message="files")
    op = CommitOperationDelete("dir")
    assert op.is_folder is False
    api.create_commit("team/d", [op], commit_message="rm dir")
    assert api.list_repo_files("team/d") == [".gitattributes", "dir2/c.txt", "top.txt"]
    api.create_commit("team/d", [CommitOperationDelete("top.txt")], commit_message="rm a file")
    assert api.list_repo_files("team/d") == [".gitattributes", "dir2/c.txt"]
    with pytest.raises(EntryNotFoundError):
        api.create_commit("team/d", [CommitOperationDelete("dir")], commit_message="gone already")


def test_refs_like_the_hub(api):
    """Item 8. The Hub tags a short commit id, checks a tag's revision before its name (a missing revision is
    RevisionNotFound even for a bad name), and lets a branch share a tag's name (huggingface_hub's tests)."""
    api.create_repo("team/r")
    c1 = api.upload_file(path_or_fileobj=b"one", path_in_repo="f.txt", repo_id="team/r").oid
    c2 = api.upload_file(path_or_fileobj=b"two", path_in_repo="f.txt", repo_id="team/r").oid
    api.create_tag("team/r", tag="commit_1", revision=c1)
    api.create_tag("team/r", tag="commit_2", revision=c2[:7])  # shorthand
    assert api.model_info("team/r", revision="commit_1").sha == c1
    assert api.model_info("team/r", revision="commit_2").sha == c2
    assert api.model_info("team/r", revision=c1[:10]).sha == c1
    with pytest.raises(RevisionNotFoundError): api.create_tag("team/r", tag="invalid tag", revision="foobar")
    with pytest.raises(BadRequestError): api.create_tag("team/r", tag="invalid tag")
    api.create_branch("team/r", branch="commit_1")  # from main, named like a tag
    refs = api.list_repo_refs("team/r")
    assert sorted(b.name for b in refs.branches) == ["commit_1", "main"]
    assert sorted(t.name for t in refs.tags) == ["commit_1", "commit_2"]
    assert api.model_info("team/r", revision="commit_1").sha == c2  # a bare name is the branch
    assert api.model_info("team/r", revision="refs/tags/commit_1").sha == c1


def test_error_texts_are_the_hubs(api):
    """Item 9. The wording huggingface_hub's own tests expect from the Hub (tests/test_hf_api.py): "The branch was
    updated since you opened this page. Please refresh and try again." (412, the whole text),
    "Reference refs/heads/<b> already exists" (409), "Cannot delete refs/heads/main" (403), "Invalid rev id" (a missing
    branch)."""
    api.create_repo("team/w")
    head = api.list_repo_commits("team/w")[0].commit_id
    api.create_commit("team/w", [CommitOperationAdd("a.txt", b"a")], commit_message="a", parent_commit=head)
    with pytest.raises(HfHubHTTPError) as e:
        api.create_commit("team/w", [CommitOperationAdd("b.txt", b"b")], commit_message="b", parent_commit=head)
    assert e.value.response.status_code == 412
    assert "The branch was updated since you opened this page. Please refresh and try again." in str(e.value)
    assert e.value.server_message == "The branch was updated since you opened this page. Please refresh and try again."
    api.create_branch("team/w", branch="cool-branch")
    for branch in ["cool-branch", "main"]:
        with pytest.raises(HfHubHTTPError, match=f"Reference refs/heads/{branch} already exists") as e:
            api.create_branch("team/w", branch=branch)
        assert e.value.response.status_code == 409
        api.create_branch("team/w", branch=branch, exist_ok=True)
    with pytest.raises(HfHubHTTPError, match="Cannot delete refs/heads/main") as e:
        api.delete_branch("team/w", branch="main")
    assert e.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError, match="Invalid rev id"): api.delete_branch("team/w", branch="nope")
    api.create_tag("team/w", tag="v1")
    with pytest.raises(HfHubHTTPError, match="Reference refs/tags/v1 already exists"):
        api.create_tag("team/w", tag="v1")
    api.create_tag("team/w", tag="v1", exist_ok=True)


def test_create_commit_repo_does_not_exist_reads_as_on_the_hub(api):
    """Item 9, huggingface_hub's `test_create_commit_repo_does_not_exist`: the server's words for a missing repo are
    contained in the client's own message, so the error is the client's text and nothing more."""
    with pytest.raises(RepositoryNotFoundError) as context:
        api.create_commit(repo_id=f"{USER}/repo_that_do_not_exist", operations=[CommitOperationAdd("config.json",
                          b"content")], commit_message="fake_message")
    request_id = context.value.response.headers.get("X-Request-Id")
    expected_message = (
        f"404 Client Error. (Request ID: {request_id})\n\nRepository Not"
        " Found for url:"
        f" {api.endpoint}/api/models/{USER}/repo_that_do_not_exist/preupload/main.\nPlease"
        " make sure you specified the correct `repo_id` and"
        " `repo_type`.\nIf you are trying to access a private or gated"
        " repo, make sure you are authenticated and your token has the required permissions."
        "\nFor more details, see https://huggingface.co/docs/huggingface_hub/authentication"
        "\nNote: Creating a commit assumes that the repo already exists on the Huggingface Hub."
        " Please use `create_repo` if it's not the case."
    )
    assert str(context.value) == expected_message
    assert request_id and context.value.server_message == "Repository not found"


def test_request_log_has_one_line_per_request_and_no_secrets(hub, api, token):
    """Item 10. An operator's log: one line per request (method, target, status, bytes, duration, user or '-', the
    request id the answer carried); never the token, nor a signed upload URL's `sig`. Off unless set."""
    assert hub.server.request_log is None  # the default
    hub.server.request_log = log = io.StringIO()
    before = sum(hub.counts.values())
    api.create_repo("team/l")
    api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/l")
    with pytest.raises(RepositoryNotFoundError) as missing:
        HfApi(endpoint=hub.endpoint, token=False).model_info("team/no")
    status, _, _ = _raw(hub, "PUT", "/team/l.git/info/lfs/objects/" + "0" * 64 + "?size=1&sig=deadbeef", b"x",
                        _auth(hub))
    assert status == 403
    answered = sum(hub.counts.values()) - before
    for _ in range(200):  # a line is written once its answer is out, so the last one may trail the client a little
        if len(log.getvalue().splitlines()) >= answered: break
        time.sleep(0.01)
    rows, text = _log_fields(log), log.getvalue()
    assert len(rows) == answered and all(len(r) == 9 for r in rows)
    assert token not in text and "deadbeef" not in text and "?size=1&sig=<hidden> 403 " in text
    create = next(r for r in rows if r[4] == "/api/repos/create")
    assert (create[1], create[2], create[3], create[5]) == ("127.0.0.1", USER, "POST", "200")
    assert int(create[6]) > 100 and re.fullmatch(r"\d+\.\dms", create[7])
    anon = next(r for r in rows if r[4] == "/api/models/team/no")
    assert (anon[2], anon[3], anon[5], anon[8]) == ("-", "GET", "404", missing.value.request_id)
    assert [r[3] for r in rows if "/commit/" in r[4]] == ["POST"]


def test_private_repos_need_a_hub_with_a_token(tmp_path):
    """Item 16. The Hub keeps private repos from strangers; a LocalHub without a token cannot (anyone who reaches it
    reads everything), so it refuses `private=True` with a clear 400, before any repo is made."""
    with LocalHub(tmp_path / "open") as hub:
        api = HfApi(endpoint=hub.endpoint, token=False)
        for exist_ok in (False, True):
            with pytest.raises(BadRequestError, match="has no token, so it cannot keep a repo private"):
                api.create_repo("team/secret", private=True, exist_ok=exist_ok)
        assert not api.repo_exists("team/secret") and not (hub.root / "repos" / "model" / "team").exists()
        api.create_repo("team/public")
        with pytest.raises(BadRequestError, match="cannot keep a repo private"):
            api.update_repo_settings("team/public", private=True)
        assert api.model_info("team/public").private is False
        assert api.create_repo("team/public", private=True, exist_ok=True).repo_id == "team/public"  # ignored, as
        # on the Hub, for a repo that exists
