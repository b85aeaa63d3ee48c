"""What `XetStore` accepts from an uploaded shard, the dedup answers it hands out, and what a killed writer leaves.

A shard is the client's word for a file: each term's verification hash and the file's sha256 must match the bytes
the store holds, or the shard is refused and nothing is recorded. A dedup answer is a shard whose footer carries an
expiry: an absolute time (seconds since the epoch), `dedup_expiry` seconds from when it was made. A write goes
through xet/tmp; what a killed writer left there is removed."""
import hashlib
import os
import threading
import time

import numpy as np
import pytest

from adaptkit.localhub.xet import (
    Shard,
    ShardFile,
    Term,
    XetError,
    XetStore,
    chunk_hash,
    file_hash,
    hash_to_hex,
    iter_chunks,
    parse_shard,
    serialize_shard,
    serialize_xorb,
    verification_hash,
)


def _random(n, seed=0) -> bytes: return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _upload(store: XetStore, data: bytes) -> tuple:
    "Store `data`'s xorb as a client would; its chunks, the xorb's table and the term's right verification hash."
    chunks = list(iter_chunks(data))
    assert len(chunks) > 1
    xhex, blob = serialize_xorb(chunks)
    store.put_xorb(xhex, blob)
    x = store.xorb(xhex)
    return chunks, x, verification_hash(c.hash for c in x.chunks)


def _shard(x, chunks, verification: bytes, sha256: str) -> tuple[str, bytes]:
    "A shard of one file, one term over all of `x`: the file's hash (hex) and the shard's bytes, as uploaded."
    term = Term(x.hash, 0, len(x.chunks), x.size, verification)
    f = ShardFile(file_hash((chunk_hash(c), len(c)) for c in chunks), (term,), sha256)
    return f.hex, serialize_shard(Shard(files=(f,)), footer=False)


def test_a_shard_whose_verification_hash_does_not_match_its_term_is_refused(tmp_path):
    store, data = XetStore(tmp_path / "xet"), _random(300_000)
    chunks, x, right = _upload(store, data)
    sha = hashlib.sha256(data).hexdigest()
    wrong = [bytes(32), verification_hash(c.hash for c in reversed(x.chunks)),
             verification_hash(c.hash for c in x.chunks[1:])]  # wrong order, a chunk short
    for bad in wrong:
        assert bad != right
        fhex, blob = _shard(x, chunks, bad, sha)
        with pytest.raises(XetError, match=r"term 0's verification hash does not match chunks \[0, \d+\)"):
            store.put_shard(blob)
        assert not store.has_file(fhex) and store.file_by_sha256(sha) is None  # nothing recorded
    fhex, blob = _shard(x, chunks, right, sha)  # the same shard with the right hash: taken
    assert [r.hash for r in store.put_shard(blob)] == [fhex]
    assert store.file_by_sha256(sha).hash == fhex


def test_a_shard_whose_sha256_does_not_match_the_bytes_is_refused_by_default(tmp_path):
    store, data = XetStore(tmp_path / "xet"), _random(300_000, seed=1)
    chunks, x, verification = _upload(store, data)
    lie = hashlib.sha256(b"other bytes").hexdigest()
    fhex, blob = _shard(x, chunks, verification, lie)
    with pytest.raises(XetError, match=f"its bytes have sha256 {hashlib.sha256(data).hexdigest()}, not the {lie}"):
        store.put_shard(blob)  # no verify_sha256 given: checked
    assert not store.has_file(fhex) and store.file_by_sha256(lie) is None
    _, blob = _shard(x, chunks, verification, hashlib.sha256(data).hexdigest())
    assert store.put_shard(blob)[0].sha256 == hashlib.sha256(data).hexdigest()


def test_the_sha256s_of_a_shards_files_are_checked_together_and_one_lie_refuses_them_all(tmp_path):
    """Issue 47, item 2: the files of a shard have their sha256s recomputed at once (threads: hashing frees the GIL),
    each read a block at a time and hashed where it lies. Files across two xorbs (one stored plain, one LZ4-compressed),
    part of a xorb, and a whole one: one lie among them refuses the shard, naming its file, and records none."""
    store = XetStore(tmp_path / "xet")
    plain, floats = _random(300_000, seed=2), np.linspace(-1, 1, 100_000, dtype=np.float32).tobytes()
    (c1, x1, v1), (c2, x2, v2) = _upload(store, plain), _upload(store, floats)
    assert all(c.end - c.start - 8 < c.size for c in x2.chunks)  # the floats' xorb is stored compressed
    part = [c.hash for c in x2.chunks[1:]]
    files = [  # (terms, the file's chunks, its bytes)
        ((Term(x1.hash, 0, len(x1.chunks), x1.size, v1), Term(x2.hash, 0, len(x2.chunks), x2.size, v2)), c1 + c2,
         plain + floats),
        ((Term(x2.hash, 1, len(x2.chunks), x2.size - x2.chunks[0].size, verification_hash(part)),), c2[1:],
         b"".join(c2[1:])),
        ((Term(x1.hash, 0, len(x1.chunks), x1.size, v1),), c1, plain)]
    def shard(lie_at=None):
        made = [ShardFile(file_hash((chunk_hash(c), len(c)) for c in chunks), terms,
                          hashlib.sha256(b"lie" if k == lie_at else data).hexdigest())
                for k, (terms, chunks, data) in enumerate(files)]
        return made, serialize_shard(Shard(files=tuple(made)), footer=False)
    made, blob = shard(lie_at=1)
    with pytest.raises(XetError, match=f"shard file {made[1].hex}: its bytes have sha256 "
                                       f"{hashlib.sha256(files[1][2]).hexdigest()}, not the"):
        store.put_shard(blob)
    assert not any(store.has_file(f.hex) for f in made)
    made, blob = shard()
    assert [r.hash for r in store.put_shard(blob)] == [f.hex for f in made]
    for f, (_, _, data) in zip(made, files):
        assert store.file_by_sha256(f.sha256).hash == f.hex and b"".join(store.iter_file(f.hex)) == data


def test_a_dedup_answer_expires_at_a_time_dedup_expiry_seconds_from_now(tmp_path):
    for duration in (3600, 7 * 24 * 3600):
        store = XetStore(tmp_path / f"xet{duration}", dedup_expiry=duration)
        data = _random(300_000, seed=duration)
        rec = store.put_file(data)
        first = next(iter(iter_chunks(data)))
        before = int(time.time())
        answer = parse_shard(store.dedup_shard(hash_to_hex(chunk_hash(first))))
        after = int(time.time())
        assert [hash_to_hex(sx.hash) for sx in answer.xorbs] == [rec.terms[0][0]]
        assert before <= answer.created <= after
        assert answer.expiry > after  # a time in the future, not a duration (that would be long past)
        assert before + duration <= answer.expiry <= after + duration


def test_a_partial_write_left_in_tmp_is_removed_when_a_hub_takes_the_root(tmp_path):
    """A kill -9 mid-write leaves a file in xet/tmp. A LocalHub holds the root's lock, so no writer of that root can be
    alive: it removes the file when it starts; a store opened without the lock keeps a young one (a writer may be)."""
    from adaptkit.localhub import LocalHub
    XetStore(tmp_path / "hub" / "xet")
    partial = tmp_path / "hub" / "xet" / "tmp" / "tmpk1ll3d"
    partial.write_bytes(b"half a xorb")
    XetStore(tmp_path / "hub" / "xet")
    assert partial.exists()
    os.utime(partial, (time.time() - 7200, time.time() - 7200))
    XetStore(tmp_path / "hub" / "xet")  # two hours old: left by a killed writer, even without the lock
    assert not partial.exists()
    partial.write_bytes(b"half a xorb")
    with LocalHub(tmp_path / "hub"): assert not partial.exists()


def test_the_sha256s_are_hashed_while_the_rest_of_the_shard_is_checked(tmp_path, monkeypatch):
    """Issue 47, item 2: the sha256 pass starts once the shard is parsed, beside its other checks (the xorbs it lists,
    each file's terms), not after them. Here the check of the file's terms waits for the hashing to be under way: had
    the hashing waited for the checks, it would never start."""
    store, data = XetStore(tmp_path / "xet"), _random(300_000, seed=3)
    chunks, x, verification = _upload(store, data)
    fhex, blob = _shard(x, chunks, verification, hashlib.sha256(data).hexdigest())
    hashing, plain_chunks, check = threading.Event(), store._plain_chunks, store._check_shard_file
    def hashed(*args, **kwargs):
        hashing.set()
        yield from plain_chunks(*args, **kwargs)
    def checked(f):
        assert hashing.wait(30), "the sha256 pass waited for the shard's other checks"
        return check(f)
    monkeypatch.setattr(store, "_plain_chunks", hashed)
    monkeypatch.setattr(store, "_check_shard_file", checked)
    assert [r.sha256 for r in store.put_shard(blob)] == [hashlib.sha256(data).hexdigest()]


def test_a_shard_refused_while_its_sha256s_are_hashed_stops_the_hashing(tmp_path, monkeypatch):
    "A check that refuses the shard stops the hashing at its next chunk; no hashing thread outlives `put_shard`."
    store, data = XetStore(tmp_path / "xet"), _random(2_000_000, seed=4)
    chunks, x, verification = _upload(store, data)
    assert len(x.chunks) > 10
    fhex, blob = _shard(x, chunks, verification, hashlib.sha256(data).hexdigest())
    refused, handed, plain_chunks = threading.Event(), [], store._plain_chunks
    def hashed(*args, **kwargs):
        for k, piece in plain_chunks(*args, **kwargs):
            handed.append(k)
            if len(handed) == 2: assert refused.wait(30)  # the second chunk waits for the refusal
            yield k, piece
    def refuse(f):
        refused.set()
        raise XetError(f"shard file {f.hex}: refused by the test")
    monkeypatch.setattr(store, "_plain_chunks", hashed)
    monkeypatch.setattr(store, "_check_shard_file", refuse)
    before = threading.active_count()
    with pytest.raises(XetError, match="refused by the test"): store.put_shard(blob)
    # of its many chunks: 2 if the hashing reached the second before the refusal, 1 if the refusal came first
    assert threading.active_count() == before and 1 <= len(handed) <= 2
    assert not store.has_file(fhex)


def test_a_store_may_trust_the_clients_sha256s_and_a_call_may_still_check(tmp_path):
    "`XetStore(verify_sha256=False)` records the sha256s shards give unchecked; `put_shard(verify_sha256=True)` checks."
    store, data = XetStore(tmp_path / "xet", verify_sha256=False), _random(300_000, seed=6)
    chunks, x, verification = _upload(store, data)
    lie = hashlib.sha256(b"other bytes").hexdigest()
    fhex, blob = _shard(x, chunks, verification, lie)
    with pytest.raises(XetError, match="its bytes have sha256"): store.put_shard(blob, verify_sha256=True)
    assert not store.has_file(fhex)
    assert store.put_shard(blob)[0].sha256 == lie and store.file_by_sha256(lie).hash == fhex
    assert XetStore(tmp_path / "checked").verify_sha256  # the default: checked
