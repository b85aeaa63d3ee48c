"""The Xet CAS (`adaptkit.localhub.xet`) against the stock client, `hf_xet`, offline.

`hf_xet` computes file hashes itself (`hash_files`), and uploads and downloads through a small CAS on loopback built
here on `XetStore`: the same endpoints, headers and token JSON the Hub's CAS answers with. What it sends is recorded,
so the tests also check the exact objects it produced (xorbs, shards) against the module's own parsers."""
import hashlib
import hmac
import json
import re
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

hf_xet = pytest.importorskip("hf_xet")

from adaptkit.localhub.xet import (  # noqa: E402
    XORB_MAX_BYTES,
    XORB_MAX_CHUNKS,
    XetError,
    XetStore,
    encode_chunk,
    hash_file,
    hash_to_hex,
    iter_chunks,
    parse_shard,
    parse_xorb,
    serialize_xorb,
)

XET_TOKEN = "xet-access-token"  # what the token endpoint hands out; every CAS request must carry it
SIGNING_KEY = b"the CAS's own secret"  # signs fetch URLs: hf_xet sends no Authorization there


class CAS(BaseHTTPRequestHandler):
    "A loopback Xet CAS on `XetStore`, with the Hub's token endpoint: the wiring LocalHub needs, in miniature."
    protocol_version = "HTTP/1.1"

    def log_message(self, *args): pass

    def _reply(self, status, body=b"", ctype="application/json", headers=()):
        self.send_response(status)
        for k, v in headers: self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(body)

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(parts)
        return self.rfile.read(n)

    def do_GET(self): self._route("GET")
    def do_POST(self): self._route("POST")
    def do_PUT(self): self._route("PUT")

    def _route(self, method):
        srv, path = self.server, self.path.split("?")[0]
        body = self._body() if method in ("POST", "PUT") else b""
        srv.log.append((method, path, len(body), self.headers.get("Range")))
        srv.bodies.setdefault((method, re.sub(r"/[0-9a-f]{64}$", "", path)), []).append(body)
        base = f"http://127.0.0.1:{srv.server_port}"
        try:
            if m := re.fullmatch(r"/api/(models|datasets|spaces)s?/[^/]+/[^/]+/xet-(read|write)-token/[^/]+", path):
                # hf_xet reads the JSON; huggingface_hub's own refresh (downloads) reads the same values as headers
                exp = int(time.time()) + 3600
                token = {"accessToken": XET_TOKEN, "exp": exp, "casUrl": base}
                return self._reply(200, json.dumps(token).encode(), headers=[
                    ("X-Xet-Cas-Url", base), ("X-Xet-Access-Token", XET_TOKEN), ("X-Xet-Token-Expiration", str(exp))])
            if path.startswith("/xorbs/"):  # the fetch URL a reconstruction hands out (presigned on the Hub)
                xhex = path.rsplit("/", 1)[1]
                query = dict(q.split("=", 1) for q in self.path.split("?", 1)[1].split("&"))
                start, end = _range(self.headers.get("Range"))
                allowed = [tuple(map(int, r.split("-"))) for r in query["r"].split(",")]
                if (not hmac.compare_digest(query["sig"], _sign(xhex, query["r"]))
                        or not any(a <= start and end - 1 <= b for a, b in allowed)):
                    return self._reply(403, b'{"error": "not a range this URL was signed for"}')
                data = b"".join(srv.store.xorb_bytes(xhex, start, end))
                return self._reply(206, data, "application/octet-stream",
                                   [("Content-Range", f"bytes {start}-{end - 1}/*")])
            if self.headers.get("Authorization") != f"Bearer {XET_TOKEN}": return self._reply(401)
            if method == "GET" and (m := re.fullmatch(r"/v([12])/reconstructions/([0-9a-f]{64})", path)):
                if srv.v1_only and m.group(1) == "2": return self._reply(404)
                plan = srv.store.reconstruction(m.group(2), self.headers.get("Range"), version=int(m.group(1)),
                                                xorb_url=lambda h, ranges: _signed_url(base, h, ranges))
                return self._reply(200, json.dumps(plan).encode())
            if method == "GET" and (m := re.fullmatch(r"/v1/chunks/(default|default-merkledb)/([0-9a-f]{64})", path)):
                return self._reply(200, srv.store.dedup_shard(m.group(2)), "application/octet-stream")
            if method == "POST" and (m := re.fullmatch(r"/v1/xorbs/default/([0-9a-f]{64})", path)):
                return self._reply(200, json.dumps({"was_inserted": srv.store.put_xorb(m.group(1), body)}).encode())
            if method == "POST" and path == "/v1/shards":
                srv.store.put_shard(body)
                return self._reply(200, b'{"result": 1}')
            if method == "POST" and path == "/v1/telemetry": return self._reply(204)
            return self._reply(404, b'{"error": "not served"}')  # /v1/xorb-grants, /v2/shards: the client falls back
        except XetError as e:
            return self._reply(e.status, json.dumps({"error": str(e)}).encode())


def _range(header):
    a, b = re.fullmatch(r"bytes=(\d+)-(\d+)", header).groups()
    return int(a), int(b) + 1


def _sign(xorb, ranges): return hmac.new(SIGNING_KEY, f"{xorb}:{ranges}".encode(), "sha256").hexdigest()


def _signed_url(base, xorb, ranges):
    "A fetch URL good for these (first, last) byte ranges of one xorb only, as the Hub presigns them."
    spec = ",".join(f"{a}-{b}" for a, b in ranges)
    return f"{base}/xorbs/{xorb}?r={spec}&sig={_sign(xorb, spec)}"


@pytest.fixture
def cas(tmp_path, monkeypatch):
    "A loopback CAS on a fresh `XetStore`; `cas.url` is the Hub-side token route hf_xet refreshes from."
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # hf_xet's logs
    srv = ThreadingHTTPServer(("127.0.0.1", 0), CAS)
    srv.store, srv.log, srv.bodies, srv.v1_only = XetStore(tmp_path / "xet"), [], {}, False
    srv.token_url = f"http://127.0.0.1:{srv.server_port}/api/models/team/repo/xet-{{}}-token/main"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def session(tmp_path, monkeypatch, name="client"):
    "A fresh hf_xet session with its own cache (no shard cache shared with another 'client'), failing fast."
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / name))
    return hf_xet.XetSession(hf_xet.XetConfig().with_config({"client.retry_max_attempts": 1}))


def upload(sess, cas, *contents):
    "Upload byte strings with hf_xet as huggingface_hub does; return their (xet hash, sha256, size)."
    with sess.new_upload_commit(token_refresh_url=cas.token_url.format("write"),
                                token_refresh_headers={"Authorization": "Bearer hub-token"}) as commit:
        handles = [commit.start_upload_bytes(c, sha256=hf_xet.COMPUTE_SHA256) for c in contents]
    infos = [h.result().xet_info for h in handles]
    return [(i.hash, i.sha256, i.file_size) for i in infos]


def download(sess, cas, xet_hash, size, dest):
    with sess.new_file_download_group(token_refresh_url=cas.token_url.format("read"),
                                      token_refresh_headers={"Authorization": "Bearer hub-token"}) as group:
        group.start_download_file(hf_xet.XetFileInfo(xet_hash, size), str(dest))
    return dest.read_bytes()


def _contents(seed=0):
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, 1_500_000, dtype=np.uint8).tobytes()
    floats = rng.normal(size=150_000).astype(np.float32).tobytes()  # bg4 territory
    return {"noise": noise, "floats": floats, "text": b"adaptkit " * 30_000, "small": b"hello xet", "empty": b""}


def test_hash_file_matches_hf_xet(tmp_path):
    rng = np.random.default_rng(1)
    samples = [b"", b"x", bytes(8191), bytes(8192), rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes(),
               bytes(500_000) + rng.integers(0, 256, 2_000_000, dtype=np.uint8).tobytes() + bytes(300_000)]
    paths = []
    for i, s in enumerate(samples):
        (tmp_path / f"f{i}").write_bytes(s)
        paths.append(str(tmp_path / f"f{i}"))
    for s, theirs in zip(samples, hf_xet.hash_files(paths)):
        ours = hash_file(s)
        assert (ours.xet_hash, ours.size) == (theirs.hash, theirs.file_size), len(s)
        assert ours.sha256 == hashlib.sha256(s).hexdigest()


@pytest.mark.parametrize("version", [1, 2])
def test_hf_xet_uploads_and_downloads_through_the_store(cas, tmp_path, monkeypatch, version):
    contents = _contents()
    sent = upload(session(tmp_path, monkeypatch, "pusher"), cas, *contents.values())
    for (xet_hash, sha256, size), content in zip(sent, contents.values()):
        assert (xet_hash, sha256, size) == hash_file(content)  # hf_xet names files exactly as this module does
        rec = cas.store.file(xet_hash)
        assert (rec.sha256, rec.size) == (sha256, size) and cas.store.file_by_sha256(sha256) == rec
        assert b"".join(cas.store.iter_file(xet_hash)) == content
    # the objects hf_xet sent are the ones this module parses: one xorb per upload here, one shard
    (xorb_body,) = cas.bodies[("POST", "/v1/xorbs/default")]
    (shard_body,) = cas.bodies[("POST", "/v1/shards")]
    shard = parse_shard(shard_body)
    assert {f.hex for f in shard.files} == {s[0] for s in sent}
    assert parse_xorb(xorb_body, hash_to_hex(shard.xorbs[0].hash)).size == sum(map(len, contents.values()))
    assert {t.verification is not None for f in shard.files for t in f.terms} == {True}
    # a reader with a fresh cache downloads every file, whole and in ranges, through reconstructions
    cas.v1_only = version == 1
    reader = session(tmp_path, monkeypatch, "reader")
    for (xet_hash, _, size), (name, content) in zip(sent, contents.items()):
        assert download(reader, cas, xet_hash, size, tmp_path / name) == content
    asked = {p.split("/")[1] for m, p, *_ in cas.log if "/reconstructions/" in p and m == "GET"}
    assert "v1" in asked if version == 1 else asked == {"v2"}
    with reader.new_download_stream_group(token_refresh_url=cas.token_url.format("read"),
                                          token_refresh_headers={"Authorization": "Bearer hub"}) as group:
        xet_hash, _, size = sent[0]
        info = hf_xet.XetFileInfo(xet_hash, size)
        for start, end in [(0, 10), (131_000, 400_000), (size - 7, size)]:
            assert b"".join(group.download_stream(info, start, end)) == contents["noise"][start:end]
    assert any(rng for _, p, _, rng in cas.log if rng and "/reconstructions/" in p)  # ranges reached the CAS
    # a fetch URL serves the bytes it was signed for, and no others (a xorb may hold other files' chunks)
    (fetch,) = _get_json(cas, f"/v1/reconstructions/{sent[0][0]}", "bytes=0-9")["fetch_info"].values()
    url, first, last = fetch[0]["url"], fetch[0]["url_range"]["start"], fetch[0]["url_range"]["end"]
    assert len(_get(url, f"bytes={first}-{last}")) == last - first + 1
    with pytest.raises(urllib.error.HTTPError, match="403"):
        _get(url, f"bytes={first}-{last + 1}")


def _get(url, byte_range=None, headers=()):
    request = urllib.request.Request(url, headers=dict(headers, **({"Range": byte_range} if byte_range else {})))
    with urllib.request.urlopen(request, timeout=30) as r: return r.read()


def _get_json(cas, path, byte_range=None):
    url = f"http://127.0.0.1:{cas.server_port}{path}"
    return json.loads(_get(url, byte_range, {"Authorization": f"Bearer {XET_TOKEN}"}))


@pytest.mark.parametrize("compression", ["none", "lz4", "bg4-lz4"])
def test_hf_xet_reads_files_the_store_made(cas, tmp_path, monkeypatch, compression):
    content = _contents()["floats"] + b"tail" * 40_000
    rec = cas.store.put_file(content, compression=compression)
    assert (rec.hash, rec.sha256, rec.size) == hash_file(content)
    got = download(session(tmp_path, monkeypatch), cas, rec.hash, rec.size, tmp_path / "out")
    assert got == content


def test_global_dedup_serves_a_second_client(cas, tmp_path, monkeypatch):
    first = np.random.default_rng(2).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
    (a,) = upload(session(tmp_path, monkeypatch, "alice"), cas, first)
    stored = sum(p.stat().st_size for p in (cas.store.root / "xorbs").glob("*/*"))
    # bob has never seen the file (no shard cache): he changes 100 KB in the middle and pushes
    second = first[:1_500_000] + bytes(100_000) + first[1_600_000:]
    cas.log.clear()
    (b,) = upload(session(tmp_path, monkeypatch, "bob"), cas, second)
    queries = [p for m, p, *_ in cas.log if p.startswith("/v1/chunks/")]
    assert queries, "hf_xet asked no global dedup query"
    sent = sum(n for m, p, n, _ in cas.log if p.startswith("/v1/xorbs/"))
    grown = sum(p.stat().st_size for p in (cas.store.root / "xorbs").glob("*/*")) - stored
    assert sent < 600_000 and grown < 600_000, (sent, grown)  # far less than the 3 MB file
    assert b"".join(cas.store.iter_file(b[0])) == second
    assert download(session(tmp_path, monkeypatch, "carol"), cas, b[0], b[2], tmp_path / "b") == second


def test_what_hf_xet_sends_is_refused_when_damaged(cas, tmp_path, monkeypatch):
    content = _contents()["noise"]
    upload(session(tmp_path, monkeypatch), cas, content)
    (xorb_body,) = cas.bodies[("POST", "/v1/xorbs/default")]
    (shard_body,) = cas.bodies[("POST", "/v1/shards")]
    xhex = hash_to_hex(parse_shard(shard_body).xorbs[0].hash)
    fresh = XetStore(tmp_path / "fresh")
    tampered = bytearray(xorb_body)
    tampered[len(tampered) // 2] ^= 0x10
    for bad, words in [(bytes(tampered), "not to the hash it was sent under"), (xorb_body[:-1000], "truncated")]:
        with pytest.raises(XetError, match=words) as e:
            fresh.put_xorb(xhex, bad)
        assert e.value.status == 400 and xhex in str(e.value)
    with pytest.raises(XetError, match=f"xorb {xhex}, which is not stored"):
        fresh.put_shard(shard_body)  # a shard naming a xorb the store does not have
    assert [p.name for p in fresh.root.rglob("*") if p.is_file()] == ["id"]  # nothing half-written or recorded
    assert fresh.put_xorb(xhex, xorb_body) and len(fresh.put_shard(shard_body)) == 1


def test_hf_xet_fills_a_xorb_with_64_mib_of_plain_bytes_and_the_store_takes_it(cas, tmp_path, monkeypatch):
    """hf_xet counts a xorb's 64 MiB before the chunk headers, so a xorb of incompressible chunks arrives over 64 MiB
    serialized (the spec words the limit as serialized): the store takes what the stock client sends."""
    # seed 12: the chunks hf_xet packs into the first xorb hold 67,108,229 plain bytes (635 under 64 MiB), so their
    # 1,051 headers take it 7,773 bytes over (1 of the 8 seeds tried)
    content = np.random.default_rng(12).integers(0, 256, 66 << 20, dtype=np.uint8).tobytes()
    ((xet_hash, sha256, size),) = upload(session(tmp_path, monkeypatch), cas, content)
    full = max(cas.bodies[("POST", "/v1/xorbs/default")], key=len)  # the xorbs arrive in any order
    assert len(full) > XORB_MAX_BYTES and parse_xorb(full).size <= XORB_MAX_BYTES
    assert (sha256, size) == (hashlib.sha256(content).hexdigest(), len(content))
    assert b"".join(cas.store.iter_file(xet_hash)) == content


def test_a_xorb_past_the_chunk_or_byte_limit_is_refused_naming_the_chunk():
    chunks = [np.random.default_rng(i).integers(0, 256, 64 << 10, dtype=np.uint8).tobytes() for i in range(1025)]
    xhex, blob = serialize_xorb(chunks[:1024], "none")  # exactly 64 MiB of plain bytes: 64 KiB of headers over it
    assert len(blob) > XORB_MAX_BYTES and parse_xorb(blob, xhex).size == XORB_MAX_BYTES
    with pytest.raises(XetError, match=f"chunk 1024 passes the limit of {XORB_MAX_CHUNKS} chunks, {XORB_MAX_BYTES}"):
        parse_xorb(blob + encode_chunk(chunks[1024], "none"))
    with pytest.raises(ValueError, match="1025 chunks"):
        serialize_xorb(chunks, "none")
    tiny = b"".join(encode_chunk(bytes([i % 256]), "none") for i in range(XORB_MAX_CHUNKS + 1))
    assert parse_xorb(tiny[:-9]).chunks[-1].end == len(tiny) - 9  # 8,192 one-byte chunks: within the limit
    with pytest.raises(XetError, match=f"chunk {XORB_MAX_CHUNKS} passes the limit"):
        parse_xorb(tiny)


def test_same_file_pushed_by_two_clients_at_once(cas, tmp_path, monkeypatch):
    content = _contents(3)["noise"]
    results, errors = [], []

    def push(name):
        try: results.append(upload(session(tmp_path, monkeypatch, name), cas, content))
        except Exception as e: errors.append(e)  # noqa: BLE001 (reported below)
    threads = [threading.Thread(target=push, args=(n,)) for n in ("one", "two")]
    for t in threads: t.start()
    for t in threads: t.join(120)
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert len(list((cas.store.root / "xorbs").glob("*/*"))) == 1  # stored once
    assert list((cas.store.root / "tmp").iterdir()) == []
    assert b"".join(cas.store.iter_file(results[0][0][0])) == content


def test_plain_bytes_stream_chunk_by_chunk(tmp_path):
    store = XetStore(tmp_path / "xet")
    content = np.random.default_rng(4).integers(0, 256, 5_000_000, dtype=np.uint8).tobytes()
    rec = store.put_file(iter([content[:1_000_001], content[1_000_001:]]))
    pieces = list(store.iter_file(rec.hash))
    assert b"".join(pieces) == content and max(map(len, pieces)) <= 128 * 1024  # never more than a chunk at a time
    assert [len(c) for c in iter_chunks(content)] == [len(p) for p in pieces]
    assert b"".join(store.iter_file(rec.hash, 4_999_990)) == content[4_999_990:]
    # a xorb damaged on disk is refused while streaming, not served
    xorb_path = next((store.root / "xorbs").glob("*/*"))
    raw = bytearray(xorb_path.read_bytes())
    raw[100] ^= 1
    xorb_path.write_bytes(bytes(raw))
    with pytest.raises(XetError, match="no longer matches its hash"):
        b"".join(store.iter_file(rec.hash))
