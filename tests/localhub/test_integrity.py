"""The tree a hub serves stays one a client can hold (issue 38, item 5: no path that is both a file and a folder, at
commit or at pull-request merge) and a damaged blob heals on a re-push (item 8: preupload vouches only for blobs the
store can verify)."""
import base64
import hashlib
import http.client
import json
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, constants, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

from adaptkit.hub import push_folder
from adaptkit.localhub.server import LocalHub

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`


def _add(api, repo_id, *paths, **kwargs):
    ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=p.encode()) for p in paths]
    return api.create_commit(repo_id, ops, commit_message=f"add {', '.join(paths)}", **kwargs)


@pytest.mark.parametrize("first, then", [
    (["d/x.txt"], ["d"]),  # a file over a folder
    (["d"], ["d/x.txt"]),  # a folder under a file
    (["a/b/c.txt"], ["a/b"]),  # deeper
    ([], ["d", "d/x.txt"]),  # both in one commit
])
def test_a_path_that_is_a_file_and_a_folder_is_refused_at_commit(api, first, then):
    api.create_repo("team/t")
    if first: _add(api, "team/t", *first)
    head = api.list_repo_commits("team/t")[0].commit_id
    with pytest.raises(HfHubHTTPError) as e: _add(api, "team/t", *then)
    file, under = sorted([*first, *then], key=len)[:1][0], max([*first, *then], key=len)
    assert e.value.response.status_code == 409
    assert f"{file!r}" in str(e.value) and f"{under!r}" in str(e.value), str(e.value)
    assert api.list_repo_commits("team/t")[0].commit_id == head  # nothing moved


def test_a_pull_request_whose_merge_makes_a_path_a_file_and_a_folder_is_refused(api):
    api.create_repo("team/m")
    pr = _add(api, "team/m", "e/x.txt", create_pr=True).pr_num
    _add(api, "team/m", "e")  # main adds the file `e` meanwhile: each commit alone is a valid tree
    head = api.list_repo_commits("team/m")[0].commit_id
    with pytest.raises(HfHubHTTPError) as e: api.merge_pull_request("team/m", pr)
    assert e.value.response.status_code == 409 and "'e'" in str(e.value) and "'e/x.txt'" in str(e.value)
    assert api.list_repo_commits("team/m")[0].commit_id == head
    assert api.get_discussion_details("team/m", pr).status == "open"


@pytest.mark.parametrize("lfs", [False, True])
def test_a_re_push_heals_a_corrupted_blob(tmp_path, monkeypatch, lfs, token):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    folder = tmp_path / "art"
    folder.mkdir()
    data = b"\0precious weights " * 1000
    (folder / "w.bin").write_bytes(data)
    (folder / "config.json").write_text("{}")
    with LocalHub(tmp_path / "hub", token=token, lfs=lfs) as hub:
        push_folder(folder, "team/a", endpoint=hub.endpoint, token=token)
        sha = hashlib.sha256(data).hexdigest()
        blob = hub.root / "blobs" / sha[:2] / sha
        raw = bytearray(blob.read_bytes())
        raw[10] ^= 0xFF
        blob.write_bytes(bytes(raw))
        with pytest.raises(HfHubHTTPError, match="corrupted"):
            hf_hub_download("team/a", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c1")
        push_folder(folder, "team/a", endpoint=hub.endpoint, token=token)  # the same folder again
        got = hf_hub_download("team/a", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
        assert Path(got).read_bytes() == data


def test_preupload_vouches_only_for_blobs_it_can_verify(hub, api, token):
    api.create_repo("team/p")
    api.upload_file(path_or_fileobj=b"abc", path_in_repo="a.txt", repo_id="team/p")
    body = json.dumps({"files": [{"path": "a.txt", "size": 3, "sample": base64.b64encode(b"abc").decode()}]})

    def oid():
        conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
        conn.request("POST", "/api/models/team/p/preupload/main", body=body,
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        conn.close()
        return answer["files"][0]["oid"]
    assert oid() is not None  # unchanged: the client skips it
    sha = hashlib.sha256(b"abc").hexdigest()
    (hub.root / "blobs" / sha[:2] / sha).write_bytes(b"abd")
    assert oid() is None  # the stored bytes are not what they should be: the client uploads it again
