"""Xet objects outlive what named them for as long as a client may count on them: deleting a repo, a branch or a pull
request reclaims nothing, and `LocalHub.gc` / `adaptkit hub gc` reclaim what no commit names and nothing used within
the retention (`XET_RETENTION`, past hf_xet's 21-day shard cache), deleting in an order that a kill -9 at any point
leaves consistent. The stock client with hf_xet against a LocalHub on loopback; nothing touches the network."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download
from huggingface_hub.utils import _xet

from adaptkit.cli import main
from adaptkit.localhub import LocalHub, RootInUseError, hash_file
from adaptkit.localhub.xet import (
    XET_RETENTION,
    Shard,
    ShardFile,
    Term,
    XetError,
    XetStore,
    file_hash,
    hash_to_hex,
    hex_to_hash,
    serialize_shard,
    verification_hash,
)

hf_xet = pytest.importorskip("hf_xet")
pytestmark = pytest.mark.hub(guarded=True, log=True)  # the `hub` fixture (tests/conftest.py): requires `token`, logs

DAY = 24 * 3600
KINDS = ("xorbs", "files", "sha256", "dedup")


@pytest.fixture(autouse=True)
def xet_client():
    "A fresh hf_xet session on the test's own cache, which every push of the test shares (as one user's pushes do)."
    _xet.abort_xet_session()  # the next transfer opens a session that reads HF_XET_CACHE
    yield
    _xet.abort_xet_session()



def _random(n, seed) -> bytes: return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _sha(data: bytes) -> str: return hashlib.sha256(data).hexdigest()


def _posts(hub, part) -> int:
    "How many POSTs with `part` in their target the hub answered 200 so far."
    lines = [line.split()[3:6] for line in hub.log_path.read_text().splitlines()]
    return sum(m == "POST" and part in t and s == "200" for m, t, s in lines)


def _objects(root: Path) -> dict:
    "{kind: sorted names} of the Xet store's objects and index entries under the hub root `root`."
    return {k: sorted(p.name for p in (root / "xet" / k).glob("*/*")) for k in KINDS}


def _records(root: Path) -> dict:
    "{file hash: (sha256, the xorbs its terms name)} of every file record, read from disk (nothing renewed)."
    out = {}
    for p in (root / "xet" / "files").glob("*/*.json"):
        d = json.loads(p.read_text())
        out[p.stem] = (d["sha256"], {t[0] for t in d["terms"]})
    return out


def _age(root: Path, days: float) -> None:
    "Make every Xet object under the hub root `root` look last used `days` ago."
    then = time.time() - days * DAY
    for k in KINDS:
        for p in (root / "xet" / k).glob("*/*"): os.utime(p, (then, then))


def _consistent(root: Path, named=()) -> dict:
    "Check the store under hub root `root`: every file record's xorbs are stored; every file in `named` (Xet hashes a "
    "commit names) is recorded and found by its sha256. Index entries may point at nothing (readers take that as "
    "absent). Return the records."
    records, xorbs = _records(root), set(_objects(root)["xorbs"])
    for h, (_, used) in records.items(): assert used <= xorbs, f"file {h} names missing xorbs {used - xorbs}"
    for h in named:
        assert h in records, f"file {h}, which a commit names, was freed"
        assert (root / "xet" / "sha256" / records[h][0][:2] / records[h][0]).read_text() == h
    return records


def _freed_bytes(root: Path, files, xorbs) -> int:
    "The bytes on disk of these file records and xorbs."
    return (sum((root / "xet" / "files" / h[:2] / f"{h}.json").stat().st_size for h in files)
            + sum((root / "xet" / "xorbs" / x[:2] / x).stat().st_size for x in xorbs))


def _get(hub, repo_id, name, tmp_path, revision=None) -> bytes:
    "A file's bytes downloaded by the stock client (Xet on), into a cache folder of its own."
    cache = tmp_path / f"dl-{time.monotonic_ns()}"
    return Path(hf_hub_download(repo_id, name, revision=revision, endpoint=hub.endpoint, token=hub.token,
                                cache_dir=cache)).read_bytes()


# --- nothing is reclaimed at once ------------------------------------------------------------------------------------

def test_deleting_a_repo_a_branch_or_a_pull_request_reclaims_no_xet_object(hub, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/a")
    api.create_branch("team/a", branch="dev")
    api.upload_file(path_or_fileobj=_random(300_000, 1), path_in_repo="dev.bin", repo_id="team/a", revision="dev")
    pr = api.upload_file(path_or_fileobj=_random(300_000, 2), path_in_repo="pr.bin", repo_id="team/a", create_pr=True)
    api.upload_file(path_or_fileobj=_random(300_000, 3), path_in_repo="main.bin", repo_id="team/a")
    held = _objects(hub.root)
    assert len(held["files"]) == 3 and len(held["xorbs"]) == 3
    api.delete_branch("team/a", branch="dev")
    api.change_discussion_status("team/a", pr.pr_num, "closed")
    assert _objects(hub.root) == held
    api.delete_repo("team/a")
    assert _objects(hub.root) == held  # nothing: the client may still build on every one of them


def test_the_same_bytes_pushed_again_after_their_repo_was_deleted(hub, tmp_path, token):
    "hf_xet answers its own dedup from the shards it cached: the second push sends a shard naming the stored xorbs."
    api = HfApi(endpoint=hub.endpoint, token=token)
    data = _random(2_000_000, 4)
    api.create_repo("team/a")
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/a")
    xorbs, shards = _posts(hub, "/v1/xorbs/"), _posts(hub, "/v1/shards")
    api.delete_repo("team/a")
    for repo in ("team/b", "team/a"):  # another repo, and the deleted name reused
        api.create_repo(repo)
        api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id=repo)
        assert _get(hub, repo, "w.bin", tmp_path) == data
    assert _posts(hub, "/v1/xorbs/") == xorbs and _posts(hub, "/v1/shards") == shards + 2  # shards only


def test_bytes_pre_uploaded_for_one_repo_survive_the_deletion_of_another_holding_them(hub, tmp_path, token):
    "Repo B's upload is accepted (its shard names the xorbs repo A's file uses), then A is deleted, then B commits."
    api = HfApi(endpoint=hub.endpoint, token=token)
    data = _random(1_000_000, 5)
    api.create_repo("team/a")
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/a")
    api.create_repo("team/b")
    op = CommitOperationAdd(path_in_repo="w.bin", path_or_fileobj=data)
    api.preupload_lfs_files("team/b", additions=[op])
    api.delete_repo("team/a")
    api.create_commit("team/b", operations=[op], commit_message="the pre-uploaded file")
    assert _get(hub, "team/b", "w.bin", tmp_path) == data


# --- gc: what it frees, and what it never frees --------------------------------------------------------------------

def test_gc_frees_exactly_what_no_commit_names_and_nothing_used_within_the_retention(hub, tmp_path, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    shared, other = _random(1_000_000, 6), _random(400_000, 8)
    own = shared[:700_000] + _random(300_000, 7)  # the client dedups its first 700 KB against `shared`'s xorb
    api.create_repo("team/keep")
    api.upload_file(path_or_fileobj=shared, path_in_repo="shared.bin", repo_id="team/keep")
    api.create_branch("team/keep", branch="dev")
    dev = api.upload_file(path_or_fileobj=_random(300_000, 9), path_in_repo="dev.bin", repo_id="team/keep",
                          revision="dev")
    pr = api.upload_file(path_or_fileobj=_random(300_000, 10), path_in_repo="pr.bin", repo_id="team/keep",
                         create_pr=True)
    api.delete_branch("team/keep", branch="dev")  # its commit stays, and may be asked for by id
    api.create_repo("team/gone")
    for name, data in (("shared.bin", shared), ("own.bin", own), ("other.bin", other)):
        api.upload_file(path_or_fileobj=data, path_in_repo=name, repo_id="team/gone")
    api.delete_repo("team/gone")
    records = _records(hub.root)
    own_hash, other_hash = hash_file(own).xet_hash, hash_file(other).xet_hash
    assert records[hash_file(shared).xet_hash][1] & records[own_hash][1]  # a xorb both use: `shared` keeps it
    _age(hub.root, 23)
    assert hub.gc(older_than="24d") == {"files": 0, "xorbs": 0, "bytes": 0}  # all used within 24 days
    # `other` pre-uploaded again for team/keep, not committed yet: its known record and xorbs are in use again
    sent = _posts(hub, "/v1/xorbs/")
    again = CommitOperationAdd(path_in_repo="other.bin", path_or_fileobj=other)
    api.preupload_lfs_files("team/keep", additions=[again])
    assert _posts(hub, "/v1/xorbs/") == sent  # from the client's cache: a shard naming what is stored
    before = _objects(hub.root)
    used_by_rest = set().union(*(x for h, (_, x) in records.items() if h != own_hash))
    xorbs = records[own_hash][1] - used_by_rest
    assert len(xorbs) == 1
    expected = {"files": 1, "xorbs": 1, "bytes": _freed_bytes(hub.root, [own_hash], xorbs)}
    assert hub.gc() == expected  # the default retention: XET_RETENTION seconds
    after = _objects(hub.root)
    assert after["files"] == sorted(set(before["files"]) - {f"{own_hash}.json"})
    assert after["xorbs"] == sorted(set(before["xorbs"]) - xorbs)
    assert after["sha256"] == sorted(set(before["sha256"]) - {_sha(own)})
    assert set(after["dedup"]) <= set(before["dedup"])  # less any index entry of the freed xorb
    assert all((hub.root / "xet" / "dedup" / c[:2] / c).read_text() not in xorbs for c in after["dedup"])
    assert other_hash in _consistent(hub.root, named=[h for h in records if h not in (own_hash, other_hash)])
    assert hub.gc() == {"files": 0, "xorbs": 0, "bytes": 0}
    api.create_commit("team/keep", operations=[again], commit_message="pre-uploaded 23 days after its first push")
    for name, rev, data in (("shared.bin", None, shared), ("dev.bin", dev.oid, _random(300_000, 9)),
                            ("pr.bin", pr.pr_revision, _random(300_000, 10)), ("other.bin", None, other)):
        assert _get(hub, "team/keep", name, tmp_path, revision=rev) == data, name


def test_a_global_dedup_answer_renews_the_xorb_it_names(hub, tmp_path, monkeypatch, token):
    "A gc between a client's dedup query and its shard keeps the xorb the answer named, though nothing else uses it."
    api = HfApi(endpoint=hub.endpoint, token=token)
    first = _random(3_000_000, 11)
    api.create_repo("team/a")
    api.upload_file(path_or_fileobj=first, path_in_repo="w.bin", repo_id="team/a")
    api.delete_repo("team/a")
    _age(hub.root, 23)
    [old] = _objects(hub.root)["xorbs"]
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "second-client"))  # no shard of `first` cached: it asks
    _xet.abort_xet_session()
    store, collected = hub.server.store.xet, []
    put_shard = store.put_shard
    def gc_first(data, *args, **kwargs):
        collected.append(hub.gc())
        return put_shard(data, *args, **kwargs)
    monkeypatch.setattr(store, "put_shard", gc_first)
    second = first[:1_500_000] + bytes(100_000) + first[1_600_000:]
    api.create_repo("team/b")
    api.upload_file(path_or_fileobj=second, path_in_repo="w.bin", repo_id="team/b")
    queries = [line for line in hub.log_path.read_text().splitlines() if "/v1/chunks/" in line]
    assert any(" 200 " in q for q in queries)  # a dedup answer named `first`'s xorb
    assert collected[0]["files"] == 1 and collected[0]["xorbs"] == 0  # `first`'s record went; its xorb was asked for
    assert old in _objects(hub.root)["xorbs"] and _get(hub, "team/b", "w.bin", tmp_path) == second


def test_the_store_frees_no_xorb_a_live_file_names_and_renews_a_xorb_it_answers_a_dedup_query_with(tmp_path):
    store = XetStore(tmp_path / "xet")
    a, b, c = _random(300_000, 12), _random(300_000, 13), _random(300_000, 14)
    fa, fb, fc = store.put_file(a), store.put_file(b), store.put_file(c)
    [xa], [xb], [xc] = ({t[0] for t in f.terms} for f in (fa, fb, fc))
    run = store.xorb(xa).chunks[1:3]  # a pending upload's file: two chunks of `a`'s xorb
    start, first_of_a = store.xorb(xa).chunks[0].size, hash_to_hex(store.xorb(xa).chunks[0].hash)
    size = sum(k.size for k in run)
    pending = ShardFile(file_hash([(k.hash, k.size) for k in run]),
                        (Term(hex_to_hash(xa), 1, 3, size, verification_hash(k.hash for k in run)),),
                        _sha(a[start:start + size]))
    [g] = store.put_shard(serialize_shard(Shard(files=(pending,)), footer=False))
    for p in (tmp_path / "xet").glob("*/*/*"): os.utime(p, (0, 0))  # all of it last used in 1970
    os.utime(tmp_path / "xet" / "files" / g.hash[:2] / f"{g.hash}.json")  # the pending file: its shard just came
    store.dedup_shard(hash_to_hex(store.xorb(xc).chunks[0].hash))  # a client may build on `c`'s xorb from now on
    gone = store.collect_garbage(keep=[fb.hash])
    assert (gone["files"], gone["xorbs"]) == (2, 0), gone  # the records of `a` and `c`; no xorb
    assert all(store.has_xorb(x) for x in (xa, xb, xc)) and store.has_file(g.hash) and store.has_file(fb.hash)
    assert not store.has_file(fa.hash) and not store.has_file(fc.hash) and store.file_by_sha256(fc.sha256) is None
    assert b"".join(store.iter_file(fb.hash)) == b and b"".join(store.iter_file(g.hash)) == a[start:start + g.size]
    gone = store.collect_garbage(keep=[fb.hash], older_than=0)  # nothing young any more but what `keep` names
    assert (gone["files"], gone["xorbs"]) == (1, 2) and store.has_xorb(xb) and not store.has_xorb(xa)
    with pytest.raises(XetError) as e: store.dedup_shard(first_of_a)  # its index entry went with the xorb
    assert e.value.status == 404


def test_a_shard_naming_a_reclaimed_xorb_is_refused_naming_it_and_the_stale_cache(hub, tmp_path, monkeypatch, token):
    "After a gc the client's cache still answers its dedup: the 400 says which xorb, why, and what to clear."
    api = HfApi(endpoint=hub.endpoint, token=token)
    data = _random(600_000, 15)
    api.create_repo("team/a")
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/a")
    [xorb] = _objects(hub.root)["xorbs"]
    api.delete_repo("team/a")
    assert hub.gc(older_than=0)["xorbs"] == 1
    store, refused = hub.server.store.xet, []
    put_shard = store.put_shard
    def recorded(data, *args, **kwargs):
        try: return put_shard(data, *args, **kwargs)
        except XetError as e:
            refused.append(e)
            raise
    monkeypatch.setattr(store, "put_shard", recorded)
    api.create_repo("team/b")
    with pytest.raises(Exception):  # noqa: B017 (hf_xet's own error type; what LocalHub said is checked below)
        api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/b")
    assert refused and refused[0].status == 400
    message = str(refused[0])
    assert f"names xorb {xorb}, which is not stored" in message and "cache is likely stale" in message
    assert "HF_XET_CACHE" in message and "hub gc" in message
    _xet.abort_xet_session()  # what the message says: a new process, its cache cleared
    shutil.rmtree(tmp_path / "xet-cache")
    api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/b")
    assert _get(hub, "team/b", "w.bin", tmp_path) == data


# --- gc cut short: a kill -9 at any point leaves a consistent store, and the next gc finishes --------------------

def _mixed_store(root: Path) -> tuple:
    "A store of four files on three xorbs, all last used in 1970: `a`, `b`, `c`, and `g` (part of `a`'s xorb, then "
    "`b`'s). Return the store and `g`."
    store = XetStore(root)
    a, b, c = _random(300_000, 16), _random(300_000, 17), _random(300_000, 18)
    fa, fb, _ = store.put_file(a), store.put_file(b), store.put_file(c)
    xa, xb = store.xorb(fa.terms[0][0]), store.xorb(fb.terms[0][0])
    run, start = xa.chunks[1:3], xa.chunks[0].size
    size = sum(k.size for k in run)
    g = ShardFile(file_hash([(k.hash, k.size) for k in run + xb.chunks]),
                  (Term(xa.hash, 1, 3, size, verification_hash(k.hash for k in run)),
                   Term(xb.hash, 0, len(xb.chunks), xb.size, verification_hash(k.hash for k in xb.chunks))),
                  _sha(a[start:start + size] + b))
    [rec] = store.put_shard(serialize_shard(Shard(files=(g,)), footer=False))
    for p in root.glob("*/*/*"): os.utime(p, (0, 0))
    return store, rec


def _answers_every_index_entry(store: XetStore) -> None:
    "Every index entry reads as a file or a dedup answer, or as absent (None, a 404): never another error."
    seen = 0
    for p in (store.root / "sha256").glob("*/*"):
        rec = store.file_by_sha256(p.name)
        seen += rec is None or store.has_file(rec.hash)
    for p in (store.root / "dedup").glob("*/*"):
        try: seen += bool(store.dedup_shard(p.name))
        except XetError as e: seen += e.status == 404
    assert seen == len(list((store.root / "sha256").glob("*/*"))) + len(list((store.root / "dedup").glob("*/*")))


class _Killed(BaseException):
    "Raised where the process would have died."


def test_a_gc_cut_after_any_deletion_leaves_a_consistent_store_that_the_next_gc_finishes(tmp_path, monkeypatch):
    template, rec = _mixed_store(tmp_path / "template" / "xet")
    whole = tmp_path / "whole"
    shutil.copytree(tmp_path / "template", whole)  # copy2: the time stamps come along
    real_unlink, done = os.unlink, []
    def counted(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        done.append(path)
    with monkeypatch.context() as m:
        m.setattr(os, "unlink", counted)
        freed = XetStore(whole / "xet").collect_garbage(keep=[rec.hash])
    assert (freed["files"], freed["xorbs"]) == (3, 1)  # `a`, `b` and `c`; `c`'s xorb (`g` uses the other two)
    final, total = _objects(whole), len(done)
    assert total > 4  # three records, a xorb, and their index entries
    for k in range(total):
        work = tmp_path / f"cut-{k}"
        shutil.copytree(tmp_path / "template", work)
        done.clear()
        def dies(path, *args, k=k, **kwargs):
            if len(done) == k: raise _Killed(path)
            counted(path, *args, **kwargs)
        with monkeypatch.context() as m, pytest.raises(_Killed):
            m.setattr(os, "unlink", dies)
            XetStore(work / "xet").collect_garbage(keep=[rec.hash])
        _consistent(work, named=[rec.hash])
        readers = tmp_path / f"readers-{k}"  # lookups renew what they find: on a copy, so that `work` stays as cut
        shutil.copytree(work, readers)
        _answers_every_index_entry(XetStore(readers / "xet"))
        store = XetStore(work / "xet")
        assert b"".join(store.iter_file(rec.hash, verify=True)) == b"".join(template.iter_file(rec.hash)), k
        store.collect_garbage(keep=[rec.hash])
        assert _objects(work) == final, k


_GC_KILLED = """import os, sys
from adaptkit.localhub import LocalHub
real = os.unlink
def unlink(path, *args, **kwargs):
    real(path, *args, **kwargs)
    print(os.fspath(path), flush=True)
    sys.stdin.readline()  # the test kills this process while it waits here
os.unlink = unlink
print(LocalHub(sys.argv[1]).gc(), flush=True)
"""


def test_kill_9_during_gc_leaves_a_consistent_store_that_a_later_gc_finishes(tmp_path, token):
    root = tmp_path / "hub"
    shared, other = _random(1_000_000, 19), _random(400_000, 20)
    own = shared[:600_000] + _random(400_000, 21)
    with LocalHub(root, token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/keep")
        api.upload_file(path_or_fileobj=shared, path_in_repo="shared.bin", repo_id="team/keep")
        api.create_repo("team/gone")
        for name, data in (("own.bin", own), ("other.bin", other)):
            api.upload_file(path_or_fileobj=data, path_in_repo=name, repo_id="team/gone")
        api.delete_repo("team/gone")
    _age(root, 23)
    before, named = _objects(root), [hash_file(shared).xet_hash]
    proc = subprocess.Popen([sys.executable, "-c", _GC_KILLED, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        for i in range(3):  # three deletions, then kill -9 while the fourth waits
            line = proc.stdout.readline()
            assert line.startswith(str(root / "xet")), line
            if i < 2:
                proc.stdin.write("\n")
                proc.stdin.flush()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None: proc.kill()
    cut = _objects(root)
    assert cut != before and _consistent(root, named=named)
    with LocalHub(root, token=token) as hub:  # the dead process's lock is gone with it
        assert _get(hub, "team/keep", "shared.bin", tmp_path) == shared
        freed = hub.gc()
        assert freed["files"] + freed["xorbs"] > 0 and hub.gc() == {"files": 0, "xorbs": 0, "bytes": 0}
        records = _consistent(root, named=named)
        assert list(records) == named and set(_objects(root)["xorbs"]) == records[named[0]][1]
        assert _get(hub, "team/keep", "shared.bin", tmp_path) == shared


# --- the command and its refusals ------------------------------------------------------------------------------------

def _last_json(capsys) -> dict: return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_hub_gc_on_the_command_line(tmp_path, capsys, token):
    root = tmp_path / "hub"
    data = _random(300_000, 22)
    with LocalHub(root, token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/a")
        api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/a")
        api.delete_repo("team/a")
        assert main(["hub", "gc", "--root", str(root)]) == 2  # a served root: stop the server, or call its gc()
        err = capsys.readouterr().err
        assert f"{root} is already used by another LocalHub (pid {os.getpid()})" in err and ".gc()" in err
        with pytest.raises(RootInUseError, match=r"\.gc\(\) on the LocalHub that serves it"): LocalHub(root).gc()
        assert hub.gc(older_than="1d") == {"files": 0, "xorbs": 0, "bytes": 0}  # the serving object collects
    assert main(["hub", "gc", "--root", str(root)]) == 0
    assert _last_json(capsys) == {"files": 0, "xorbs": 0, "bytes": 0, "root": str(root), "older_than": "22d"}
    assert main(["hub", "gc", "--root", str(root), "--older-than", "0s"]) == 0
    report = _last_json(capsys)
    assert (report["files"], report["xorbs"]) == (1, 1) and report["bytes"] > len(data)
    assert _objects(root) == {k: [] for k in KINDS}
    for bad in ("soon", "-1d", "3 fortnights"):
        assert main(["hub", "gc", "--root", str(root), f"--older_than={bad}"]) == 2
        assert f"older_than {bad!r} is not an age" in capsys.readouterr().err
    assert main(["hub", "gc", "--root", str(tmp_path / "nothing")]) == 2
    assert "no LocalHub root" in capsys.readouterr().err and not (tmp_path / "nothing").exists()


def test_the_default_retention_outlasts_hf_xets_shard_cache():
    from adaptkit.localhub import parse_age
    assert XET_RETENTION > 21 * DAY  # hf_xet keeps the shards of its uploads for three weeks
    assert parse_age("22d") == XET_RETENTION == parse_age(XET_RETENTION)
    assert [parse_age(s) for s in ("90s", "2m", "1.5h", "3w", 0, "0")] == [90, 120, 5400, 21 * DAY, 0, 0]
    with pytest.raises(ValueError, match="older_than '-5m' is not an age"): parse_age("-5m")
