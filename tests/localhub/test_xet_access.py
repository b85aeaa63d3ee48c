"""What a Xet access token reads, and for how long: LocalHub decides access when each CAS request is served, against the
repo as it is then (its visibility, its gating, and which repo holds the name), not only when the token was made; a
signed xorb fetch URL is checked the same way and expires; tokens and fetch URLs outlive a restart on the same root
(the signing key lives there), not a change of the hub's token. Nothing here touches the network."""
import json
import stat
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download

from adaptkit.localhub import SIGNING_KEY_FILE, LocalHub, hash_file
from adaptkit.localhub import http as localhub_http

pytest.importorskip("hf_xet")

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`


def _read_token(raw, hub, repo, auth=None) -> dict:
    "A Xet read token for `repo`'s main, asked with the hub's token `auth` or without one."
    status, _, body = raw("GET", f"{hub.endpoint}/api/models/{repo}/xet-read-token/main",
                          headers={"Authorization": f"Bearer {auth}"} if auth else {})
    assert status == 200, body
    return json.loads(body)


def _plan(raw, token, xet_hash) -> tuple:
    "(status, body) of the reconstruction of `xet_hash` asked with `token`."
    status, _, body = raw("GET", f"{token['casUrl']}/v1/reconstructions/{xet_hash}",
                          headers={"Authorization": f"Bearer {token['accessToken']}"})
    return status, body


def _fetches(body) -> list:
    "(url, first, last) of every xorb range a reconstruction lists."
    return [(f["url"], f["url_range"]["start"], f["url_range"]["end"])
            for fs in json.loads(body)["fetch_info"].values() for f in fs]


def _fetch(raw, url, first, last) -> tuple:
    "(status, body) of a signed fetch URL, asked as hf_xet asks it: its range, no Authorization."
    status, _, body = raw("GET", url, headers={"Range": f"bytes={first}-{last}"})
    return status, body


@pytest.fixture
def public(random_bytes, api):
    "A public repo `me/r` holding a Xet file `w.bin`; its Xet hash."
    data = random_bytes(300_000)
    api.create_repo("me/r")
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="me/r")
    assert api.get_paths_info("me/r", ["w.bin"])[0].xet_hash == hash_file(data).xet_hash  # stored with Xet
    return hash_file(data).xet_hash


def test_a_read_token_stops_reading_a_repo_made_private_or_gated(raw, hub, api, public, token):
    anon = _read_token(raw, hub, "me/r")  # a public repo: anyone may read it, with no token
    status, body = _plan(raw, anon, public)
    assert status == 200, body
    fetches = _fetches(body)
    assert [_fetch(raw, *f)[0] for f in fetches] == [206] * len(fetches)
    api.update_repo_settings("me/r", private=True)
    status, body = _plan(raw, anon, public)  # the same token, within its hour
    assert status == 401 and b"now private" in body, body
    for f in fetches:  # fetch URLs made while it was public: decided again when fetched, with no token
        status, body = _fetch(raw, *f)
        assert status == 403 and b"now private" in body, body
    assert raw("GET", f"{hub.endpoint}/api/models/me/r/xet-read-token/main")[0] == 404  # no new anonymous token
    owner = _read_token(raw, hub, "me/r", token)  # with the hub's token: it reads, and so do its fetch URLs
    status, body = _plan(raw, owner, public)
    assert status == 200 and all(_fetch(raw, *f)[0] == 206 for f in _fetches(body))
    api.update_repo_settings("me/r", private=False, gated="auto")
    status, body = _plan(raw, anon, public)
    assert status == 401 and b"now gated" in body, body
    assert all(_fetch(raw, *f)[0] == 403 for f in fetches)
    assert _plan(raw, owner, public)[0] == 200
    api.update_repo_settings("me/r", gated=False)  # decided on the repo as it is now: public again, it reads again
    assert _plan(raw, anon, public)[0] == 200 and all(_fetch(raw, *f)[0] == 206 for f in fetches)


def test_a_read_token_does_not_read_another_repo_made_under_its_name(random_bytes, raw, hub, api, public):
    api.create_repo("me/keep")  # another repo names the same file, so its xorbs stay through the delete
    api.upload_file(path_or_fileobj=random_bytes(300_000), path_in_repo="w.bin", repo_id="me/keep")
    anon = _read_token(raw, hub, "me/r")
    status, body = _plan(raw, anon, public)
    assert status == 200
    fetches = _fetches(body)
    api.delete_repo("me/r")
    assert _plan(raw, anon, public)[0] == 401
    api.create_repo("me/r", private=True)  # the name again, for a private repo that holds the same file
    api.upload_file(path_or_fileobj=random_bytes(300_000), path_in_repo="w.bin", repo_id="me/r")
    status, body = _plan(raw, anon, public)
    assert status == 401 and b"not the one this Xet token was made for" in body, body
    assert all(_fetch(raw, *f)[0] == 403 for f in fetches)
    api.delete_repo("me/r")
    api.create_repo("me/r")  # public this time: still another repo than the token's
    api.upload_file(path_or_fileobj=random_bytes(300_000), path_in_repo="w.bin", repo_id="me/r")
    assert _plan(raw, anon, public)[0] == 401 and all(_fetch(raw, *f)[0] == 403 for f in fetches)
    assert _plan(raw, _read_token(raw, hub, "me/r"), public)[0] == 200  # a token of the repo under the name reads it
    moved = _read_token(raw, hub, "me/r")
    api.move_repo("me/r", "me/moved")  # moved: the token's name no longer holds it
    assert _plan(raw, moved, public)[0] == 401


def test_a_signed_fetch_url_expires(raw, hub, api, public, monkeypatch):
    monkeypatch.setattr(localhub_http, "XET_FETCH_LIFE", 2)  # seconds a fetch URL is good for
    status, body = _plan(raw, _read_token(raw, hub, "me/r"), public)
    (url, first, last), *_ = _fetches(body)
    exp = int(dict(p.split("=", 1) for p in url.split("?", 1)[1].split("&"))["exp"])
    assert exp <= time.time() + 2
    assert _fetch(raw, url, first, last)[0] == 206
    time.sleep(max(exp - time.time(), 0) + 0.05)
    status, body = _fetch(raw, url, first, last)
    assert status == 403 and b"has expired" in body, body
    assert _plan(raw, _read_token(raw, hub, "me/r"), public)[0] == 200  # a new reconstruction lists new URLs


def test_xet_tokens_outlive_a_restart_on_the_same_root(random_bytes, raw, tmp_path, token):
    "A client that used Xet before a restart keeps working after it, in the same process, with the tokens it holds."
    root, data = tmp_path / "hub", random_bytes(400_000, 3)
    with LocalHub(root, token=token) as hub:
        api, port = HfApi(endpoint=hub.endpoint, token=token), hub.port
        api.create_repo("me/r")
        api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="me/r")
        got = hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c1")
        assert Path(got).read_bytes() == data
        xet_token = _read_token(raw, hub, "me/r", token)
        status, body = _plan(raw, xet_token, hash_file(data).xet_hash)
        fetches = _fetches(body)
    key = root / SIGNING_KEY_FILE
    before = key.read_bytes()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(before) == 32  # its owner's only
    with LocalHub(root, token=token, port=port) as hub:  # the same root and port
        got = hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
        assert Path(got).read_bytes() == data
        assert _plan(raw, xet_token, hash_file(data).xet_hash)[0] == 200
        assert all(_fetch(raw, *f)[0] == 206 for f in fetches)
    assert key.read_bytes() == before  # kept, not made anew
    with LocalHub(root, token="hf_another_token", port=port) as hub:  # another hub token: what the old one let in, no
        assert _plan(raw, xet_token, hash_file(data).xet_hash)[0] == 401
        assert all(_fetch(raw, *f)[0] == 403 for f in fetches)
