"""LocalHub serves no Xet byte it has not checked: a xorb damaged on disk is refused, by the fetch route the client
with hf_xet reads (naming the file and the xorb, and logged), by a plain download, by the global dedup answer and by
the check of a file's bytes; and a push of the same bytes stores it anew, from a client whose own cache still lists
it too. A renewal (a push, a shard, a dedup answer naming a xorb) keeps what was checked: a pull right after a push
hashes nothing again, and a change of the bytes before or after a renewal is still found. Nothing here touches the
network."""
import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download

import adaptkit.localhub.xet as xet
from adaptkit.localhub.storage import RepoStore
from adaptkit.localhub.xet import (
    Shard,
    ShardFile,
    Term,
    XetError,
    XetStore,
    chunk_hash,
    file_hash,
    hash_file,
    hash_to_hex,
    iter_chunks,
    serialize_shard,
    serialize_xorb,
    verification_hash,
)

pytest.importorskip("hf_xet")

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`


def _xorbs(root: Path) -> list: return sorted((root / "xorbs").glob("*/*"))


def _flip(path: Path, at: int = 5000) -> None:
    "Flip one bit of byte `at` of a file (in a xorb: inside its first chunk's data)."
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1
    path.write_bytes(bytes(raw))


@pytest.fixture
def pushed(random_bytes, hub, api):
    "1 MiB pushed with Xet to `me/r` as `w.bin`: (bytes, the xorb's path)."
    data = random_bytes(1 << 20)
    api.create_repo("me/r")
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="me/r")
    (xorb,) = _xorbs(hub.root / "xet")
    return data, xorb


def test_a_damaged_xorb_is_refused_naming_the_file_and_the_xorb(raw, hub, pushed, caplog):
    data, xorb = pushed
    file = hash_file(data).xet_hash
    auth = {"Authorization": f"Bearer {hub.token}"}
    token = json.loads(raw("GET", f"{hub.endpoint}/api/models/me/r/xet-read-token/main", headers=auth)[2])
    bearer = {"Authorization": f"Bearer {token['accessToken']}"}
    plan = json.loads(raw("GET", f"{token['casUrl']}/v1/reconstructions/{file}", headers=bearer)[2])
    (fetch,) = [f for fs in plan["fetch_info"].values() for f in fs]
    url, rng = fetch["url"], {"Range": f"bytes={fetch['url_range']['start']}-{fetch['url_range']['end']}"}
    assert raw("GET", url, headers=rng)[0] == 206
    _flip(xorb)
    with caplog.at_level(logging.ERROR, logger="adaptkit.localhub"):
        status, _, body = raw("GET", url, headers=rng)  # the fetch hf_xet makes: refused before a byte is sent
    assert status == 500 and xorb.name.encode() in body and file.encode() in body, body
    assert any(xorb.name in r.getMessage() and file in r.getMessage() for r in caplog.records), caplog.text
    status, _, body = raw("GET", url, headers=rng)  # moved aside: asked again, it is gone, and says why
    assert status == 404 and xorb.name.encode() in body and b"damaged" in body, body
    status, _, body = raw("GET", f"{token['casUrl']}/v1/reconstructions/{file}", headers=bearer)
    assert status == 404 and xorb.name.encode() in body and file.encode() in body, body
    status, _, body = raw("GET", f"{hub.endpoint}/me/r/resolve/main/w.bin", headers=auth)  # the plain download too
    assert status == 500 and file.encode() in body, body


def test_the_stock_client_gets_an_error_not_other_bytes_and_a_push_repairs(hub, api, pushed, tmp_path, token):
    data, xorb = pushed
    _flip(xorb)
    with pytest.raises(Exception) as e:
        hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c1")
    assert not isinstance(e.value, AssertionError)
    assert not list((tmp_path / "c1").rglob("w.bin"))  # nothing saved under the file's name
    # the same bytes pushed again, from the same process and hf_xet cache (which lists the xorb as uploaded)
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="me/r")
    got = hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert xorb.read_bytes() != b"" and (hub.root / "xet" / "damaged" / xorb.name).is_file()  # stored anew; kept aside


def test_a_push_repairs_a_damage_no_download_found(hub, api, pushed, tmp_path, token):
    "The damage is found by the push itself (the hub checks a file's bytes before it calls them stored)."
    data, xorb = pushed
    _flip(xorb)
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="me/r")
    got = hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c")
    assert Path(got).read_bytes() == data


def _two_xorb_file(random_bytes, store: RepoStore) -> dict:
    "A Xet file of two xorbs (200 KB each), recorded as an upload would; its commit entry."
    parts = [random_bytes(200_000, 1), random_bytes(200_000, 2)]
    terms, chunks = [], []
    for part in parts:
        pieces = list(iter_chunks(part))
        xhex, blob = serialize_xorb(pieces)
        store.xet.put_xorb(xhex, blob)
        x = store.xet.xorb(xhex)
        terms.append(Term(x.hash, 0, len(x.chunks), x.size, verification_hash(c.hash for c in x.chunks)))
        chunks += [(chunk_hash(p), len(p)) for p in pieces]
    sha = hashlib.sha256(b"".join(parts)).hexdigest()
    shard = Shard(files=(ShardFile(file_hash(chunks), tuple(terms), sha),))
    (rec,) = store.xet.put_shard(serialize_shard(shard, footer=False))
    assert len({t[0] for t in rec.terms}) == 2
    return {"sha256": rec.sha256, "size": rec.size, "sha1": None, "lfs": True, "xet": rec.hash}


def test_a_file_is_intact_only_when_every_xorb_it_names_is(random_bytes, tmp_path):
    store = RepoStore(tmp_path / "hub")
    try:
        e = _two_xorb_file(random_bytes, store)
        assert store.entry_intact(e)
        for path in _xorbs(store.xet.root):  # either one missing: not intact (a client is asked to upload it again)
            aside = path.with_name("aside")
            path.rename(aside)
            assert not store.entry_intact(e), path.name
            aside.rename(path)
            assert store.entry_intact(e)
        last = _xorbs(store.xet.root)[-1]
        _flip(last, 100)  # either one damaged: not intact either
        assert not store.entry_intact(e)
        with pytest.raises(Exception, match=last.name):
            b"".join(store.iter_entry(e))
    finally: store.close()


def test_the_store_never_vouches_for_a_damaged_xorb_and_stores_it_anew(random_bytes, tmp_path):
    store = XetStore(tmp_path / "xet")
    content = random_bytes(300_000, 4)
    rec = store.put_file(content)
    (path,) = _xorbs(store.root)
    xhex, blob = serialize_xorb(iter_chunks(content))
    assert xhex == path.name and store.put_xorb(xhex, blob) is False  # held and intact: not stored twice
    chunk = hash_to_hex(store.xorb(xhex).chunks[0].hash)  # a file's first chunk is in the global dedup index
    assert store.dedup_shard(chunk)
    old = store.id
    _flip(path, 100)
    with pytest.raises(XetError) as e:  # the dedup answer checks the xorb it would name: damaged, it names none
        store.dedup_shard(chunk)
    assert e.value.status == 404 and xhex in str(e.value)
    assert not path.exists() and (store.root / "damaged" / xhex).is_file()  # moved aside: no answer names it now
    assert store.id != old and store.serves(old)  # a new name: clients' caches of the old one list it as stored
    with pytest.raises(XetError, match="damaged"):
        b"".join(store.iter_file(rec.hash))
    assert store.put_xorb(xhex, blob) is True  # the next upload stores it anew
    assert b"".join(store.iter_file(rec.hash)) == content and store.dedup_shard(chunk)
    _flip(path, 100)
    with pytest.raises(XetError, match="no longer matches its hash") as e:
        store.check_xorb(xhex)
    assert e.value.status == 500 and xhex in str(e.value) and not path.exists()
    assert store.put_xorb(xhex, blob) is True and b"".join(store.iter_file(rec.hash)) == content
    _flip(path, 100)  # a copy damaged while the store holds it: an upload of it replaces it
    assert store.put_xorb(xhex, blob) is True and b"".join(store.iter_file(rec.hash)) == content


def _count_chunk_checks(monkeypatch) -> list:
    "Count every chunk `check_xorb` re-reads and re-hashes from disk: the list's length."
    calls, check = [], xet._chunk_fault
    monkeypatch.setattr(xet, "_chunk_fault", lambda f, c, i: calls.append(i) or check(f, c, i))
    return calls


def test_a_pull_right_after_a_push_hashes_nothing_the_push_checked(hub, api, pushed, tmp_path, token, monkeypatch):
    """The push checked every chunk, then its shard renewed the xorb (a new mtime and ctime): the check is carried
    over, so the first pull hashes no chunk again (it re-hashed every one before); bytes changed later still refuse."""
    data, xorb = pushed
    calls = _count_chunk_checks(monkeypatch)
    got = hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c1")
    assert Path(got).read_bytes() == data and calls == []
    api.upload_file(path_or_fileobj=data, path_in_repo="again.bin", repo_id="me/r")  # renews the xorb once more
    _flip(xorb)
    with pytest.raises(Exception) as e:
        hf_hub_download("me/r", "w.bin", endpoint=hub.endpoint, token=token, cache_dir=tmp_path / "c2")
    assert not isinstance(e.value, AssertionError) and calls  # checked again, found damaged
    assert (hub.root / "xet" / "damaged" / xorb.name).is_file()


def _flip_keeping_mtime(path: Path) -> None:
    "Flip a byte, then put the old atime and mtime back: only the ctime tells."
    st = path.stat()
    _flip(path, 100)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _fetch(xs: XetStore, xhex: str) -> bytes:
    "All of a xorb's chunk bytes, as the fetch route hf_xet reads serves them (checked first: `check_xorb`)."
    return b"".join(xs.xorb_bytes(xhex, 0, xs.xorb(xhex).data_length))


@pytest.mark.parametrize("change", ["none", "before", "after", "mtime kept"])
def test_a_renewal_keeps_a_check_and_a_change_of_bytes_is_still_found(random_bytes, tmp_path, monkeypatch, change):
    """A file of two xorbs, its shard renews both: served, no chunk is hashed again; bytes changed before or after a
    renewal, or rewritten with the old mtime put back: found and refused; only renewed: served unhashed."""
    store = RepoStore(tmp_path / "hub")
    try:
        _two_xorb_file(random_bytes, store)  # each xorb checked whole as it came, then renewed by the shard
        xs, calls, paths = store.xet, _count_chunk_checks(monkeypatch), _xorbs(store.xet.root)
        assert all(_fetch(xs, p.name) for p in paths) and calls == []
        path, stamp = paths[0], xet._stamp(paths[0])
        if change == "before": _flip(path, 100)  # changed, then renewed: the check is not carried over to it
        assert xs._renew(path) and xet._stamp(path) != stamp
        if change == "after": _flip(path, 100)
        if change == "mtime kept": _flip_keeping_mtime(path)
        if change == "none":  # only renewed: still checked, hashed not again
            assert _fetch(xs, path.name) and calls == []
            return
        with pytest.raises(XetError, match="damaged") as e:
            _fetch(xs, path.name)
        assert e.value.status == 500 and calls and (xs.root / "damaged" / path.name).is_file()
        assert _fetch(xs, paths[1].name) and len(calls) == 1  # the other xorb: still checked, hashed not again
    finally: store.close()
