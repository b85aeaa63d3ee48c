"""benchmarks/hub_roundtrip.py's Xet floor servers, over HTTP as hf_xet uploads to them: the floor stores the xorbs and
shards it is sent (refusing a xorb whose chunks do not hash to its name), and the floor with the sha256 check also
refuses a shard whose files' bytes, read back from its own xorbs in each file's term order, do not have the sha256 the
shard gives."""
import hashlib
import http.client
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from adaptkit.localhub.xet import (
    Shard,
    ShardFile,
    Term,
    chunk_hash,
    file_hash,
    hex_to_hash,
    iter_chunks,
    serialize_shard,
    serialize_xorb,
    verification_hash,
)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hub_roundtrip.py"


@pytest.fixture(scope="module")
def bench(benchmark_module):
    "benchmarks/hub_roundtrip.py as a module."
    with benchmark_module("hub_roundtrip") as module: yield module


@pytest.fixture
def floor(bench, tmp_path):
    "`start(sha256)`: a floor server (with the sha256 check or not): its `post(path, body) -> (status, text)`, folder."
    servers = []
    def start(sha256: bool):
        folder = tmp_path / f"floor-{sha256}"
        folder.mkdir()
        handler = type("Floor", (bench.NullHandler,), {"floor": str(folder), "sha256": sha256, "tables": {}})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        def post(path: str, body: bytes) -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
            conn.request("POST", path, body)
            r = conn.getresponse()
            out = r.status, r.read().decode()
            conn.close()
            return out
        return post, folder
    yield start
    for server in servers: server.shutdown(); server.server_close()


def _file() -> tuple:
    """A file of two parts, each its own xorb (random bytes, stored plain; a compressible run, stored lz4): its bytes,
    the xorbs (hex, bytes), its terms in file order and its Xet hash."""
    parts = [np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes(),
             bytes(range(256)) * 1200]
    data, xorbs, terms, chunks = b"".join(parts), [], [], []
    for part in parts:
        cs = list(iter_chunks(part))
        xhex, blob = serialize_xorb(cs)
        xorbs.append((xhex, blob))
        hashes = [chunk_hash(c) for c in cs]
        terms.append(Term(hex_to_hash(xhex), 0, len(cs), len(part), verification_hash(hashes)))
        chunks += [(h, len(c)) for h, c in zip(hashes, cs)]
    assert len(xorbs[1][1]) < len(parts[1]) / 2  # the second xorb's chunks are compressed: decoded when read back
    return data, xorbs, terms, file_hash(chunks)


def _shard(fhash: bytes, terms, sha256: str) -> bytes:
    return serialize_shard(Shard(files=(ShardFile(fhash, tuple(terms), sha256),)), footer=False)


def test_the_floor_with_the_sha256_check_refuses_a_shard_whose_sha256_is_not_its_files_bytes(bench, floor):
    data, xorbs, terms, fhash = _file()
    right, lie = hashlib.sha256(data).hexdigest(), hashlib.sha256(b"other bytes").hexdigest()
    post, folder = floor(True)
    for xhex, blob in xorbs: assert post(f"/cas/v1/xorbs/default/{xhex}", blob) == (200, '{"was_inserted": true}')
    status, text = post("/cas/v1/shards", _shard(fhash, terms, lie))
    assert status == 400 and f"its bytes have sha256 {right}, not the {lie} the shard gives" in text
    status, text = post("/cas/v1/shards", _shard(fhash, terms[::-1], right))  # the same bytes in another order
    assert status == 400 and f"not the {right} the shard gives" in text
    assert not list(folder.glob("shard-*"))  # nothing refused was stored
    assert post("/cas/v1/shards", _shard(fhash, terms, right)) == (200, '{"result": 1}')
    assert len(list(folder.glob("shard-*"))) == 1
    status, text = post("/cas/v1/shards", _shard(fhash, [Term(bytes(32), 0, 1, 1, bytes(32))], right))
    assert status == 400 and "are not stored" in text  # a xorb it was not sent

    plain, folder = floor(False)  # the floor without the check takes the lie
    for xhex, blob in xorbs: assert plain(f"/cas/v1/xorbs/default/{xhex}", blob)[0] == 200
    assert plain("/cas/v1/shards", _shard(fhash, terms, lie)) == (200, '{"result": 1}')
    status, text = plain(f"/cas/v1/xorbs/default/{xorbs[0][0]}", xorbs[1][1])  # a xorb under another's name
    assert status == 400 and "its chunks hash otherwise" in text
