"""What `XetStore` makes durable, and what a crash may cost. A xorb, a file record and a sha256 entry are each fsynced
before they are renamed into place: what the store answers for (the client's `was_inserted`, a recorded file, the
LFS oid a commit names) survives a power loss. A global dedup entry is a hint, renamed into place but not fsynced: one
a crash cut short is answered as unknown, and the next upload of its chunk writes it anew. A full disk under a shard's
records is a 507, with no record nor sha256 entry left. (A kill -9 loses nothing the page cache holds: each object is
renamed into place whole, so a reader sees all of it or none.)"""
import errno
import hashlib
import os
from pathlib import Path

import pytest

import adaptkit.localhub.xet as hubxet
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
    serialize_shard,
    serialize_xorb,
    verification_hash,
)


def _inodes(root: Path, kind: str) -> dict:
    "{inode: path} of every object of one kind (xorbs, files, sha256, dedup) the store holds."
    return {p.stat().st_ino: p for p in (root / kind).glob("*/*")}


def _shard_of(store: XetStore, files: list) -> bytes:
    "A shard recording each of `files` (bytes) whole, its xorb uploaded first, as a client sends it."
    made = []
    for data in files:
        chunks = list(iter_chunks(data))
        xhex, blob = serialize_xorb(chunks)
        store.put_xorb(xhex, blob)
        x = store.xorb(xhex)
        term = Term(x.hash, 0, len(x.chunks), x.size, verification_hash(c.hash for c in x.chunks))
        made.append(ShardFile(file_hash((chunk_hash(c), len(c)) for c in chunks), (term,),
                              hashlib.sha256(data).hexdigest()))
    return serialize_shard(Shard(files=tuple(made)), footer=False)


def test_xorbs_records_and_sha256_entries_are_fsynced_before_they_appear_and_dedup_hints_are_not(tmp_path, monkeypatch,
                                                                                                   random_bytes):
    store, synced, visible_at_sync = XetStore(tmp_path / "xet"), set(), []
    real_fsync = os.fsync
    def fsync(fd):
        ino = os.fstat(fd).st_ino
        synced.add(ino)
        visible_at_sync.extend(k for k in ("xorbs", "files", "sha256", "dedup") if ino in _inodes(store.root, k))
        real_fsync(fd)
    monkeypatch.setattr(hubxet.os, "fsync", fsync)
    files = [random_bytes(300_000, seed=k) for k in range(3)]
    recs = store.put_shard(_shard_of(store, files))
    assert [r.sha256 for r in recs] == [hashlib.sha256(d).hexdigest() for d in files]
    assert visible_at_sync == []  # each was fsynced while still in tmp/, before its rename
    for kind, n in (("xorbs", 3), ("files", 3), ("sha256", 3)):
        held = _inodes(store.root, kind)
        assert len(held) == n and set(held) <= synced, kind
    hints = _inodes(store.root, "dedup")
    assert len(hints) >= 3 and not set(hints) & synced  # every file's first chunk, none fsynced


def test_a_dedup_entry_a_crash_cut_short_is_no_answer_and_the_next_upload_writes_it_anew(tmp_path, random_bytes):
    store, data = XetStore(tmp_path / "xet"), random_bytes(300_000, seed=5)
    rec = store.put_file(data)
    first = hash_to_hex(store.xorb(rec.terms[0][0]).chunks[0].hash)
    entry = store.root / "dedup" / first[:2] / first
    assert entry.read_text() == rec.terms[0][0]
    for torn in ("", rec.terms[0][0][:20], "\0" * 64):  # what a power loss may leave of a file never fsynced
        entry.write_text(torn)
        with pytest.raises(XetError, match="not in the global dedup index") as e: store.dedup_shard(first)
        assert e.value.status == 404
    longer = store.put_file(data + random_bytes(200_000, seed=6))  # a new file, same first chunk, in a new xorb
    assert longer.terms[0][0] != rec.terms[0][0]
    assert hash_to_hex(store.xorb(longer.terms[0][0]).chunks[0].hash) == first
    assert entry.read_text() == longer.terms[0][0]  # written anew
    assert store.dedup_shard(first)  # answered again
    # a third xorb with that chunk: the entry names a held xorb, so it is kept
    store.put_file(data + random_bytes(100_000, seed=7))
    assert entry.read_text() == longer.terms[0][0]


def test_a_full_disk_under_a_shards_records_is_507_and_records_nothing(tmp_path, monkeypatch, random_bytes):
    store, files = XetStore(tmp_path / "xet"), [random_bytes(300_000, seed=k) for k in (8, 9)]
    shard = _shard_of(store, files)  # the xorbs are stored: the disk fills before the records
    def full(fd): raise OSError(errno.ENOSPC, "No space left on device")
    real_fsync = os.fsync
    monkeypatch.setattr(hubxet.os, "fsync", full)
    with pytest.raises(XetError, match=f"the Xet store at {store.root} is full") as e: store.put_shard(shard)
    assert e.value.status == 507
    assert not list((store.root / "files").rglob("*.json")) and not list((store.root / "sha256").rglob("*"))
    assert not list((store.root / "tmp").iterdir())
    assert all(store.file_by_sha256(hashlib.sha256(d).hexdigest()) is None for d in files)
    monkeypatch.setattr(hubxet.os, "fsync", real_fsync)
    assert [r.sha256 for r in store.put_shard(shard)] == [hashlib.sha256(d).hexdigest() for d in files]
