"""LocalHub serves Xet: the stock `huggingface_hub` client with `hf_xet` installed (its default transfer) pushes and
pulls through the hub's own CAS, and every route checks its Xet token. The request log shows which path each transfer
took, so every test can tell that Xet (or LFS) was really used. Nothing here touches the network."""
import hashlib
import json
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

from adaptkit.localhub import LocalHub, hash_file, make_xet_token
from adaptkit.localhub.http import NO_GATED

hf_xet = pytest.importorskip("hf_xet")
pytestmark = pytest.mark.hub(guarded=True, log=True)  # the `hub` fixture (tests/conftest.py): requires `token`, logs




def _hits(hub) -> list:
    "(method, target, status) of every request the hub has logged so far."
    return [tuple(line.split()[3:6]) for line in hub.log_path.read_text().splitlines()]


def _hit(hub, method, part, status=None) -> int:
    "How many logged requests were `method` with `part` in their target (and this status, if given)."
    return sum(m == method and part in t and (status is None or s == str(status)) for m, t, s in _hits(hub))


def _xorbs(hub) -> list: return sorted((hub.root / "xet" / "xorbs").glob("*/*"))


def _stored(hub) -> int: return sum(p.stat().st_size for p in _xorbs(hub))


@pytest.fixture
def folder(random_bytes, tmp_path):
    "A model folder: a 2 MB binary (LFS by the Hub's rule), a small config (regular), a binary in a subfolder."
    d = tmp_path / "model"
    (d / "extra").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(random_bytes(2_000_000))
    (d / "config.json").write_text(json.dumps({"hidden_size": 32}))
    (d / "extra" / "head.bin").write_bytes(b"\0" + random_bytes(300_000, 1))
    return d


def test_stock_client_pushes_and_pulls_through_xet(random_bytes, hub, folder, tmp_path, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/m")
    api.upload_folder(folder_path=folder, repo_id="team/m")
    cas = f"/xet/{hub.server.store.xet.id}"
    assert _hit(hub, "GET", "/api/models/team/m/xet-write-token/main", 200) == 1
    assert _hit(hub, "POST", f"{cas}/v1/xorbs/default/", 200) >= 1 and _hit(hub, "POST", f"{cas}/v1/shards", 200) == 1
    assert hub.counts["lfs-batch"] == 0 and hub.counts["cas-xorb"] >= 1  # Xet, not the LFS batch API
    infos = {i.path: i for i in api.get_paths_info("team/m", ["model.safetensors", "config.json", "extra/head.bin"])}
    for name in ("model.safetensors", "extra/head.bin"):
        data = (folder / name).read_bytes()
        assert infos[name].xet_hash == hash_file(data).xet_hash  # LFS files, stored with Xet
        assert infos[name].lfs.sha256 == hashlib.sha256(data).hexdigest() and infos[name].lfs.size == len(data)
    assert infos["config.json"].xet_hash is None and infos["config.json"].lfs is None  # small text: inline
    # downloads go through the CAS: resolve is asked for its headers only, the bytes come from xorb fetches
    got = hf_hub_download("team/m", "model.safetensors", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
    assert Path(got).read_bytes() == (folder / "model.safetensors").read_bytes()
    assert _hit(hub, "HEAD", "/team/m/resolve/main/model.safetensors", 200) == 1
    assert _hit(hub, "GET", "/team/m/resolve/main/model.safetensors") == 0
    assert _hit(hub, "GET", "/xet-read-token/", 200) >= 1 and _hit(hub, "GET", "/reconstructions/", 200) >= 1
    assert _hit(hub, "GET", f"{cas}/xorbs/", 206) >= 1
    snap = Path(snapshot_download("team/m", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "s"))
    for p in folder.rglob("*"):
        if p.is_file(): assert (snap / p.relative_to(folder)).read_bytes() == p.read_bytes(), p
    # the same bytes pushed again, to another repo: nothing new is stored
    before = _xorbs(hub)
    api.create_repo("team/copy")
    api.upload_file(path_or_fileobj=str(folder / "model.safetensors"), path_in_repo="w.safetensors",
                    repo_id="team/copy")
    assert _xorbs(hub) == before
    assert api.get_paths_info("team/copy", ["w.safetensors"])[0].xet_hash == infos["model.safetensors"].xet_hash
    # a new version with 100 KB changed in the middle: only about that much more is stored
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[1_000_000:1_100_000] = random_bytes(100_000, 2)
    (tmp_path / "v2.safetensors").write_bytes(data)
    stored = _stored(hub)
    api.upload_file(path_or_fileobj=str(tmp_path / "v2.safetensors"), path_in_repo="model.safetensors",
                    repo_id="team/m")
    assert _stored(hub) - stored < 500_000, _stored(hub) - stored  # the file has 2 MB
    got = hf_hub_download("team/m", "model.safetensors", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
    assert Path(got).read_bytes() == bytes(data)
    # a pull request through Xet: the write token for a PR being opened is asked with revision None
    pr = api.upload_file(path_or_fileobj=random_bytes(50_000, 3), path_in_repo="pr.bin", repo_id="team/m",
                         create_pr=True)
    assert _hit(hub, "GET", "/api/models/team/m/xet-write-token/None", 200) == 1
    got = hf_hub_download("team/m", "pr.bin", revision=pr.pr_revision, endpoint=hub.endpoint, token=token,
                          cache_dir=tmp_path / "c3")
    assert Path(got).read_bytes() == random_bytes(50_000, 3)


def test_client_without_xet_uses_lfs_and_reads_xet_files(hub, folder, tmp_path, monkeypatch, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/m")
    api.upload_file(path_or_fileobj=str(folder / "model.safetensors"), path_in_repo="xet.safetensors",
                    repo_id="team/m")  # with Xet
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # from here on, a client without Xet
    tokens = _hit(hub, "GET", "xet-write-token")
    api.upload_file(path_or_fileobj=str(folder / "extra" / "head.bin"), path_in_repo="lfs.bin", repo_id="team/m")
    assert (hub.counts["lfs-batch"], hub.counts["lfs-upload"], hub.counts["lfs-verify"]) == (1, 1, 1)
    assert _hit(hub, "GET", "xet-write-token") == tokens  # the classic LFS path, no Xet
    infos = {i.path: i for i in api.get_paths_info("team/m", ["xet.safetensors", "lfs.bin"])}
    assert infos["lfs.bin"].lfs.size == (folder / "extra" / "head.bin").stat().st_size
    assert infos["lfs.bin"].xet_hash is None and infos["xet.safetensors"].xet_hash is not None
    # the Xet-stored file, read without Xet: plain bytes from resolve, rebuilt from the xorbs as they are sent
    got = hf_hub_download("team/m", "xet.safetensors", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
    assert Path(got).read_bytes() == (folder / "model.safetensors").read_bytes()
    assert _hit(hub, "GET", "/team/m/resolve/main/xet.safetensors", 200) == 1
    assert hub.counts["cas-reconstruction"] == 0
    # an LFS client pushing bytes Xet already holds is asked for no upload; its commit names the Xet file
    api.upload_file(path_or_fileobj=str(folder / "model.safetensors"), path_in_repo="again.safetensors",
                    repo_id="team/m")
    assert (hub.counts["lfs-batch"], hub.counts["lfs-upload"]) == (2, 1)
    again = api.get_paths_info("team/m", ["again.safetensors"])[0]
    assert again.xet_hash == infos["xet.safetensors"].xet_hash
    got = hf_hub_download("team/m", "lfs.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
    assert Path(got).read_bytes() == (folder / "extra" / "head.bin").read_bytes()


def test_range_requests_on_a_xet_file(random_bytes, raw, hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    api.create_repo("team/m")
    data = random_bytes(1_500_000, 4)
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/m")
    url, auth = f"{hub.endpoint}/team/m/resolve/main/w.bin", {"Authorization": f"Bearer {hub.token}"}
    status, headers, body = raw("HEAD", url, headers=auth)
    assert status == 200 and headers["X-Xet-Hash"] == hash_file(data).xet_hash
    route = headers["X-Xet-Refresh-Route"]
    assert "/api/models/team/m/xet-read-token/" in route and f"<{route}>" in headers["Link"]
    status, headers, body = raw("GET", url, headers={**auth, "Range": "bytes=200000-299999"})
    assert (status, body, headers["Content-Range"]) == (206, data[200_000:300_000], f"bytes 200000-299999/{len(data)}")
    assert raw("GET", url, headers={**auth, "Range": "bytes=-10"})[2] == data[-10:]
    assert raw("GET", url, headers={**auth, "Range": f"bytes={len(data)}-"})[0] == 416
    # hf_xet asks for byte ranges too: the reconstruction honours Range
    session = hf_xet.XetSession(hf_xet.XetConfig().with_config({"client.retry_max_attempts": 1}))
    with session.new_download_stream_group(token_refresh_url=route, token_refresh_headers=auth) as group:
        info = hf_xet.XetFileInfo(hash_file(data).xet_hash, len(data))
        for start, end in [(0, 10), (131_000, 400_000), (len(data) - 7, len(data))]:
            assert b"".join(group.download_stream(info, start, end)) == data[start:end]
    token = json.loads(raw("GET", route, headers=auth)[2])
    cas = token["casUrl"]
    status, _, body = raw("GET", f"{cas}/v1/reconstructions/{hash_file(data).xet_hash}",
                          headers={"Authorization": f"Bearer {token['accessToken']}", "Range": "bytes=700000-700999"})
    plan = json.loads(body)
    assert status == 200 and sum(t["unpacked_length"] for t in plan["terms"]) - plan["offset_into_first_range"] >= 1000
    assert sum(t["unpacked_length"] for t in plan["terms"]) < len(data) // 2  # only the chunks the range needs


def _token(raw, hub, repo, mode, auth=True, rev="main"):
    "The answer of the Xet token route, asked with `auth`: True, the hub's token; None, none; else that token."
    auth = hub.token if auth is True else auth
    return raw("GET", f"{hub.endpoint}/api/models/{repo}/xet-{mode}-token/{rev}",
               headers={"Authorization": f"Bearer {auth}"} if auth else {})


def test_xet_tokens_are_checked_on_every_route(random_bytes, raw, hub, tmp_path, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    for repo, private in (("team/open", False), ("team/secret", True)):
        api.create_repo(repo, private=private)
        api.upload_file(path_or_fileobj=random_bytes(200_000, int(private)), path_in_repo="w.bin", repo_id=repo)
    secret_hash = hash_file(random_bytes(200_000, 1)).xet_hash
    open_hash = hash_file(random_bytes(200_000, 0)).xet_hash
    # the token routes follow the repo's rules
    status, headers, body = _token(raw, hub, "team/open", "write")
    write = json.loads(body)
    assert status == 200 and headers["X-Xet-Access-Token"] == write["accessToken"]
    assert headers["X-Xet-Cas-Url"] == write["casUrl"] and int(headers["X-Xet-Token-Expiration"]) == write["exp"]
    assert _token(raw, hub, "team/open", "write", auth=None)[0] == 401  # writes need the hub's token
    assert _token(raw, hub, "team/open", "write", auth="hf_wrong")[0] == 401
    assert _token(raw, hub, "team/open", "write", rev="nobranch")[0] == 404
    assert _token(raw, hub, "team/secret", "read", auth=None)[0] == 404  # private: as if it did not exist
    status, _, body = _token(raw, hub, "team/open", "read", auth=None)  # public: anyone may read
    read, cas = json.loads(body), write["casUrl"]
    assert status == 200 and read["casUrl"] == cas
    secret = hub.server.secret
    expired = make_xet_token(secret, "model", "team/open", "w", expires=time.time() - 1)[0]
    forged = write["accessToken"][:-4] + ("0000" if not write["accessToken"].endswith("0000") else "1111")
    routes = [("GET", f"{cas}/v1/chunks/default-merkledb/{'0' * 64}", None, True),
              ("POST", f"{cas}/v1/xorbs/default/{'0' * 64}", b"not a xorb", True),
              ("POST", f"{cas}/v1/shards", b"not a shard", True),
              ("GET", f"{cas}/v1/reconstructions/{open_hash}", None, False),
              ("GET", f"{cas}/v2/reconstructions/{open_hash}", None, False)]
    for method, url, body, writes in routes:
        for bad in (None, token, forged, expired):  # none, the hub's own token, forged, expired
            status, _, answer = raw(method, url, body, {"Authorization": f"Bearer {bad}"} if bad else {})
            assert status == 401, (method, url, bad, answer)
        status, _, answer = raw(method, url, body, {"Authorization": f"Bearer {read['accessToken']}"})
        assert status == (403 if writes else 200), (method, url, answer)
        if writes: assert b"only reads" in answer
        status, _, answer = raw(method, url, body, {"Authorization": f"Bearer {write['accessToken']}"})
        assert status == (404 if "chunks" in url else 400 if writes else 200), (method, url, answer)
    # a token for one repo does not reconstruct a file only another (private) repo names
    status, _, answer = raw("GET", f"{cas}/v1/reconstructions/{secret_hash}",
                            headers={"Authorization": f"Bearer {read['accessToken']}"})
    assert status == 404 and b"is not a file of the model repo team/open" in answer
    # another root's CAS address is refused
    other = cas.rsplit("/", 1)[0] + "/" + "0" * 16
    assert raw("GET", f"{other}/v1/reconstructions/{open_hash}",
               headers={"Authorization": f"Bearer {read['accessToken']}"})[0] == 404
    # a fetch URL serves the ranges it was signed for, until it expires, and nothing else
    plan = json.loads(raw("GET", f"{cas}/v1/reconstructions/{open_hash}",
                          headers={"Authorization": f"Bearer {read['accessToken']}"})[2])
    (fetch,) = [f for fs in plan["fetch_info"].values() for f in fs]
    url, first, last = fetch["url"], fetch["url_range"]["start"], fetch["url_range"]["end"]
    status, headers, body = raw("GET", url, headers={"Range": f"bytes={first}-{last}"})
    assert status == 206 and len(body) == last - first + 1 and headers["Content-Range"].startswith(f"bytes {first}-")
    assert raw("GET", url, headers={"Range": f"bytes={first}-{last + 1}"})[0] == 403
    assert raw("GET", url.replace("sig=", "sig=0"), headers={"Range": f"bytes={first}-{last}"})[0] == 403
    assert raw("GET", url.replace("&exp=", "&exp=1"), headers={"Range": f"bytes={first}-{last}"})[0] == 403


def test_a_gc_collects_the_xet_objects_only_a_deleted_repo_named(random_bytes, hub, token):
    "Deleting a repo frees nothing (tests/localhub/test_xet_gc.py says why); a gc frees what no repo names any more."
    api = HfApi(endpoint=hub.endpoint, token=token)
    shared, own = random_bytes(600_000, 5), random_bytes(600_000, 6)
    api.create_repo("team/a")
    api.upload_file(path_or_fileobj=shared, path_in_repo="shared.bin", repo_id="team/a")
    after_a, store = _xorbs(hub), hub.server.store.xet
    api.create_repo("team/b")
    api.upload_file(path_or_fileobj=shared, path_in_repo="shared.bin", repo_id="team/b")
    api.upload_file(path_or_fileobj=own, path_in_repo="own.bin", repo_id="team/b")
    held = _xorbs(hub)
    assert len(held) > len(after_a) and store.file_by_sha256(hashlib.sha256(own).hexdigest())
    api.delete_repo("team/b")
    assert _xorbs(hub) == held  # kept: the client may still build on them
    assert hub.gc(older_than=0)["files"] == 1  # a retention of 0: what no repo names goes
    assert _xorbs(hub) == after_a and store.file_by_sha256(hashlib.sha256(own).hexdigest()) is None
    got = hf_hub_download("team/a", "shared.bin", endpoint=hub.endpoint, token=token, force_download=True)
    assert Path(got).read_bytes() == shared  # what another repo names stays
    api.delete_repo("team/a")
    assert hub.gc(older_than=0)["files"] == 1
    assert _xorbs(hub) == [] and list((hub.root / "xet" / "files").glob("*/*")) == []


def test_a_gated_repo_needs_a_real_identity(raw, tmp_path, token):
    "Issue 38: a hub started without a token cannot check a bearer, so no bearer opens a gated repo there."
    root = tmp_path / "hub"
    with LocalHub(root, token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/g")
        api.upload_file(path_or_fileobj=b"weights", path_in_repo="w.txt", repo_id="team/g")
        api.update_repo_settings("team/g", gated="auto")
        assert raw("GET", f"{hub.endpoint}/team/g/resolve/main/w.txt",
                   headers={"Authorization": f"Bearer {token}"})[2] == b"weights"
        assert raw("GET", f"{hub.endpoint}/team/g/resolve/main/w.txt",
                   headers={"Authorization": "Bearer hf_anything"})[0] == 401  # a wrong token, as before
    with LocalHub(root) as hub:  # the same root, served without a token
        for auth in ({}, {"Authorization": "Bearer hf_anything"}):
            status, headers, _ = raw("GET", f"{hub.endpoint}/team/g/resolve/main/w.txt", headers=auth)
            assert (status, headers["X-Error-Code"]) == (401, "GatedRepo"), auth
            assert raw("GET", f"{hub.endpoint}/api/models/team/g/xet-read-token/main", headers=auth)[0] == 401
        with pytest.raises(GatedRepoError):
            hf_hub_download("team/g", "w.txt", endpoint=hub.endpoint, token="hf_anything", cache_dir=tmp_path / "c")
        api = HfApi(endpoint=hub.endpoint, token="hf_anything")
        assert api.model_info("team/g").gated == "auto"  # listed as gated, as on the Hub
        with pytest.raises(HfHubHTTPError, match="no one can sign in to a gated repo") as e:
            api.update_repo_settings("team/g", gated="manual")
        assert e.value.response.status_code == 400 and NO_GATED in e.value.response.json()["error"]
        api.update_repo_settings("team/g", gated=False)  # un-gating needs no identity: it opens the repo
        assert raw("GET", f"{hub.endpoint}/team/g/resolve/main/w.txt")[2] == b"weights"


def test_preupload_does_not_vouch_for_a_xet_file_missing_a_xorb(random_bytes, raw, hub, token):
    "A Xet file whose xorb is gone from disk is not reported as stored, so a client uploads it again."
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/m")
    data = random_bytes(300_000, 8)
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/m")
    body = json.dumps({"files": [{"path": "w.bin", "size": len(data), "sample": ""}]}).encode()
    preupload = lambda: json.loads(raw("POST", f"{hub.endpoint}/api/models/team/m/preupload/main", body, {
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})[2])["files"][0]
    assert preupload()["oid"] == hashlib.sha256(data).hexdigest() and preupload()["uploadMode"] == "lfs"
    for p in _xorbs(hub): p.unlink()
    assert preupload()["oid"] is None


def test_export_and_import_carry_xet_stored_files(random_bytes, hub, tmp_path, token):
    from adaptkit.localhub.mirror import export_repos, import_repos
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/m")
    data = random_bytes(400_000, 9)
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/m")
    assert api.get_paths_info("team/m", ["w.bin"])[0].xet_hash  # stored with Xet
    export_repos(hub.root, ["team/m"], tmp_path / "bundle.tar")  # from a running hub
    import_repos(tmp_path / "bundle.tar", tmp_path / "other")
    with LocalHub(tmp_path / "other", token=token) as other:
        got = hf_hub_download("team/m", "w.bin", endpoint=other.endpoint, token=token, cache_dir=tmp_path / "c")
        assert Path(got).read_bytes() == data
        info = HfApi(endpoint=other.endpoint, token=token).get_paths_info("team/m", ["w.bin"])[0]
        assert info.lfs.sha256 == hashlib.sha256(data).hexdigest()  # an LFS file there, its bytes a blob


def _disk(root: Path) -> int:
    "Bytes on disk under a folder (its files' sizes)."
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


_XET_OFF = """import sys
from huggingface_hub import constants, hf_hub_download
assert constants.HF_HUB_DISABLE_XET
print(hf_hub_download(sys.argv[1], sys.argv[2], endpoint=sys.argv[3], token=sys.argv[4], cache_dir=sys.argv[5]))
"""


def test_outside_check_a_24_mib_binary_as_a_user_pushes_it(random_bytes, tmp_path, monkeypatch, token):
    """Issue 36's outside check, as written: a `LocalHub(root, token=...)` in its default mode, the stock client with
    Xet on pushes a 24 MiB binary; paths-info shows LFS with a Xet hash; a second push with 1 MiB changed stores
    <= 3 MiB more under the root's CAS store; downloads with Xet on and Xet off (`HF_HUB_DISABLE_XET=1`, another
    process) return the same bytes."""
    import os
    import subprocess
    import sys
    assert not constants.HF_HUB_DISABLE_XET  # the client as it comes: Xet on
    root, size = tmp_path / "root", 24 * 2**20
    data = bytearray(random_bytes(size, 11))
    with LocalHub(root, token=token, log=tmp_path / "requests.log") as hub:
        hub.log_path = tmp_path / "requests.log"
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("user/big")
        api.upload_file(path_or_fileobj=bytes(data), path_in_repo="weights.bin", repo_id="user/big")
        assert _hit(hub, "POST", "/v1/shards", 200) == 1 and hub.counts["lfs-batch"] == 0  # it went through Xet
        (info,) = api.get_paths_info("user/big", ["weights.bin"])
        assert info.lfs is not None and info.lfs.size == size and info.lfs.sha256 == hashlib.sha256(data).hexdigest()
        assert info.xet_hash == hash_file(bytes(data)).xet_hash
        cas = root / "xet"
        assert cas.is_dir() and _disk(cas) >= size  # the CAS store under the root holds the file
        stored = _disk(cas)
        data[12 * 2**20:13 * 2**20] = random_bytes(2**20, 12)  # 1 MiB changed in the middle
        api.upload_file(path_or_fileobj=bytes(data), path_in_repo="weights.bin", repo_id="user/big")
        assert _hit(hub, "POST", "/v1/shards", 200) == 2
        assert _disk(cas) - stored <= 3 * 2**20, _disk(cas) - stored
        (info,) = api.get_paths_info("user/big", ["weights.bin"])
        assert info.xet_hash == hash_file(bytes(data)).xet_hash
        xet_on = hf_hub_download("user/big", "weights.bin", endpoint=hub.endpoint, token=token,
                                 cache_dir=tmp_path / "on")
        assert Path(xet_on).read_bytes() == data and _hit(hub, "GET", "/reconstructions/", 200) >= 1
        env = {**os.environ, "HF_HUB_DISABLE_XET": "1"}
        out = subprocess.run([sys.executable, "-c", _XET_OFF, "user/big", "weights.bin", hub.endpoint, token,
                              str(tmp_path / "off")], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert Path(out.stdout.strip().splitlines()[-1]).read_bytes() == data
        assert _hit(hub, "GET", "/user/big/resolve/main/weights.bin", 200) == 1  # the plain bytes, from resolve


def test_copy_files_between_repos_with_the_stock_client(hub, folder, raw, tmp_path, token):
    """Issue 47, item 3. Before, `copy_files` between repos got a 404 from `lfs-files/duplicate`. Now the stock client
    copies a folder from one repo to another (its Xet files by reference, its regular files by content), and the
    route keeps the repos' rules: a write (the token), a source the caller may read, a target that exists, and only
    Xet files the source names."""
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/src", private=True)
    api.upload_folder(folder_path=folder, repo_id="team/src")
    api.create_repo("team/dst")
    stored = _stored(hub)
    api.copy_files("hf://team/src/", "hf://team/dst/")
    assert _hit(hub, "POST", "/api/models/team/src/lfs-files/duplicate", 200) == 1
    assert _stored(hub) == stored  # nothing copied: the Xet store is shared
    got = Path(snapshot_download("team/dst", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c"))
    for p in ("model.safetensors", "config.json", "extra/head.bin"):
        assert (got / p).read_bytes() == (folder / p).read_bytes(), p
    info = {f.path: f for f in api.get_paths_info("team/dst", ["model.safetensors", "config.json"])}
    assert info["model.safetensors"].xet_hash and info["config.json"].lfs is None
    src_file = api.get_paths_info("team/src", ["model.safetensors"])[0]
    url, body = f"{hub.endpoint}/api/models/team/src/lfs-files/duplicate", {
        "target": {"type": "model", "name": "team/dst"},
        "files": [{"xetHash": src_file.xet_hash, "sha256": src_file.lfs.sha256, "filename": "model.safetensors"}]}
    ask = lambda b, auth=token, u=url: raw("POST", u, json.dumps(b).encode(), {
        "Content-Type": "application/json", **({"Authorization": f"Bearer {auth}"} if auth else {})})
    assert ask(body)[0] == 200 and json.loads(ask(body)[2]) == {"failed": []}
    assert ask(body, auth=None)[0] == 401  # a write: the hub's token
    assert ask(body, u=url.replace("team/src", "team/none"))[0] == 404
    assert ask({**body, "target": {"type": "model", "name": "team/none"}})[0] == 404
    api.create_repo("team/other")
    api.upload_file(path_or_fileobj=b"\0" + bytes(range(256)) * 2000, path_in_repo="o.bin", repo_id="team/other")
    other = api.get_paths_info("team/other", ["o.bin"])[0]
    status, _, answer = ask({**body, "files": [{"xetHash": other.xet_hash, "sha256": other.lfs.sha256,
                                                "filename": "o.bin"}]})  # held by the store, but not team/src's
    assert status == 200 and "o.bin" in json.loads(answer)["failed"][0]["error"], answer
    assert "is not a Xet file of the model repo team/src" in json.loads(answer)["failed"][0]["error"]
