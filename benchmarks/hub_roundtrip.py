"""Push and pull of a 256 MiB model folder with the stock huggingface_hub client (`upload_folder`,
`snapshot_download`) through LocalHub, against a null server in the same run (same HTTP stack; it reads and discards
request bodies and serves the same bytes from memory with no lookup) and against a page-cache copy. Three modes:

- xet (the client's defaults, `hf_xet` installed; LocalHub's default): large files go through LocalHub's own Xet CAS.
  The null server takes Xet uploads (a token, xorbs and shards read and discarded); for pulls it serves the plain
  bytes, so its pull is the plain-HTTP floor (a reconstruction cannot be answered without Xet's own work). Here a
  floor server runs too: it receives the same xorbs and shards, decodes and hashes every chunk of a xorb (LocalHub's
  own `chunk_hash`, `decode_chunk`, `merkle_root`) and refuses one whose merkle root is not the hash it was sent
  under, writes and fsyncs each xorb and shard, and does nothing else; LocalHub's Xet push over the floor's is
  `xet_push_vs_floor` (goal <= 1.2). A second LocalHub runs beside it with the one check the floor lacks switched off
  (its store's `verify_sha256=False`: the sha256 a shard gives each new file is recorded unchecked, not recomputed
  from the file's bytes after the shard arrives); its push over the floor's is `xet_push_vs_floor_no_sha256_check`,
  so the two ratios say how much of the gap is that check. A third server is the floor plus that check, which any
  Hub needs before the sha256 a shard gives a file may name it (the LFS oid of every repo's commits and LFS batches):
  it also keeps each xorb's chunk table in memory, and on each shard parses it (LocalHub's `parse_shard`), reads each
  file's bytes back from the xorbs it stored, in file order (LocalHub's `plain_chunks`), hashes them, a thread a file
  up to the core count (hashlib frees the GIL), as LocalHub does, and refuses a shard whose sha256 differs (400), and
  does nothing else; LocalHub's push over this floor's is `xet_push_vs_floor_with_sha256`.
- lfs (Xet disabled in the client): the LFS batch API. Here a floor server runs too: it receives the same bytes,
  hashes them while receiving, writes and fsyncs them, and does nothing else; LocalHub's LFS push over the floor's is
  `lfs_push_vs_floor` (goal <= 1.2).
- inline (LocalHub with lfs=False): every file base64-encoded in the commit body.

Then, in the xet and lfs modes, a second push of the model with one tensor (1/64 of the model, in one shard) changed:
the bytes the client sent (counted by a proxy in front of LocalHub) and the bytes LocalHub stored, each over the
changed tensor's bytes (goal for Xet: <= 1.2).

Each server runs in its own process, as `adaptkit hub serve` does. Medians of 5. Every timed push and pull starts
with no dirty pages (`os.sync()`): on ext4 an fsync also waits for the writeback of files written before it, so back
to back each server was billed for the pushes before its own (measured: the floor's push rose from 0.60 to 1.13 s
over five pushes in a row; without the sync the ratio came out 1.54 in this benchmark and 0.74 and 0.91 in two
runs of 5 and 7 LocalHub/floor pairs alone).
Waits for a quiet machine and writes through benchmarks/_bench.py: benchmarks/results/hub.json (hub.loaded.json
when ADAPTKIT_BENCH_ALLOW_LOADED=1 on a loaded machine). `--size-mib N`, `--repeats N` or `--modes xet` (some of
the modes: xet, lfs, inline) checks the script at another setting: it prints the result and writes nothing.
Run: .venv/bin/python benchmarks/hub_roundtrip.py"""
import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _bench import median, quiet_start, write_result  # noqa: E402

from adaptkit.localhub.xet import (  # noqa: E402
    XetError,
    Xorb,
    XorbChunk,
    chunk_hash,
    decode_chunk,
    hash_to_hex,
    hex_to_hash,
    merkle_root,
    parse_shard,
    plain_chunks,
)

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MIB, FILES, REPEATS, SIZE_MIB = 1 << 20, 4, 5, 256
MODES = {"xet": "xet (client defaults, LocalHub's default)", "lfs": "lfs (Xet disabled)",
         "inline": "inline (LocalHub lfs=False)"}
COMMIT = "0" * 40
PROFILE = {  # cProfile of LocalHub's handler threads, one 64 MiB inline push and pull, in-process, before and after
    "before (issue 13)": "2.2 s in handlers: b64decode(validate=True) of the whole 85 MiB line 0.66 s, json.loads of "
                         "that line 0.34 s, one 64 MiB write 0.32 s, download sendfile 0.30 s, sha256 + git sha1 "
                         "0.22 s, joins 0.12 s; every download re-hashed the blob",
    "after": "0.72 s in handlers: a2b_base64 of 1 MiB pieces 0.28 s (CPython's decoder, ~4 ns/byte), sha256 0.05 s "
             "(now in a writer thread), fsync 0.05 s, socket waits; no JSON parse of the content, no git sha1 for "
             "LFS-class files, downloads re-hash only files changed on disk",
    "lfs push (py-spy, 2026-11-27)": "the four PUT handlers read 1 MiB at most per read1 and hand each piece to a "
                                     "writer thread (sha256, write); the readers wait on the writers' full queues "
                                     "(the disk, not the socket, sets the pace), then fsync: the same work as the "
                                     "floor's, which hashes and writes inline",
    "what is left": "an inline push is mostly the client: it base64-encodes and joins the whole body before sending "
                    "(about 2.5 s CPU for 256 MiB); the server's decode (about 1 s CPU) cannot start before",
    "xet push (issue 47)": "CPU time (thread_time) of every server thread, 4 pushes of 256 MiB by the stock client in "
                           "another process to LocalHub and to the Xet floor in-process, alternating, on the 2-core "
                           "machine under a CPU cap (shares and ratios only). Before: LocalHub 1.81x the floor's "
                           "server CPU (the floor then read into a bytearray); of LocalHub's, receiving the xorbs 32% "
                           "(read1 pieces joined: every byte copied twice), writing them 26%, parse_xorb 12% (a bytes "
                           "copy per chunk, BLAKE3), the shard's sha256 pass 23% (each chunk read and copied again, "
                           "the files one after another), the shard's other checks 3%. After (two runs): 1.51x and "
                           "1.56x; receiving 20% (into one numpy buffer, as the floor now does), writing 28-33% (the "
                           "floor's own write, whose CPU varies 0.2-0.5 s a push from run to run), parse_xorb 13% "
                           "(plain chunks hashed in place), sha256 28-31% (blocks of whole chunks hashed in place, a "
                           "thread a file), the shard's other checks 4%; LocalHub's xorb requests take the floor's CPU"
                           " (0.57 and 0.65 s a push against 0.60 and 0.63 s)",
    "xet: what is left": "recomputing each new file's sha256, which the floor does not: LocalHub's own check (the "
                         "sha256 a shard claims names the file for every repo's commits and LFS batches). It needs "
                         "the files' byte order, which only the shard gives, so it runs after the client has sent "
                         "everything: about its CPU over min(files, cores) added to the push",
    "xet push critical path (issue 47, wall)": "time.perf_counter around every server request and store step, 6 "
                                               "pushes of 256 MiB each to LocalHub before (609a82e) and to the floor, "
                                               "alternating, on the 2-core machine loaded by other work (pushes "
                                               "3.6-3.8 s, so shares only). From the last xorb's answer to the push's "
                                               "return: LocalHub 0.68 s, the floor 0.10 s (the client's own steps, "
                                               "which LocalHub has too: 60-80 ms). Of LocalHub's, the sha256 pass "
                                               "62% (0.19-0.21 s CPU a push over 2 threads), parse_shard 3%, the "
                                               "shard's other checks 6%, its 12 fsynced writes 4% (4 file records, 4 "
                                               "sha256 entries, 4 dedup entries, one after another), the commit 2% "
                                               "(3 fsyncs), the client's steps 11%. Changed: the sha256 pass starts "
                                               "once the shard is parsed, beside the other checks; dedup entries "
                                               "(hints) are no longer fsynced: 15 fsyncs a push, were 22-27. Not "
                                               "done: concurrent fsyncs of the records (on this disk, ext4 without a "
                                               "journal, 8 of them took 29 ms against 18 ms one after another, "
                                               "loaded); mmap for the sha256 pass (10-13% less of its CPU, but a "
                                               "xorb cut short under the map would kill the server with SIGBUS)",
}


def make_folder(root: Path, size: int) -> Path:
    "`size` bytes of model: four random weight shards plus a small config."
    folder = root / "artifact"
    folder.mkdir()
    for i in range(FILES):
        (folder / f"model-{i:05d}-of-{FILES:05d}.safetensors").write_bytes(os.urandom(size // FILES))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def floor_xorb(data, name: str, table: bool = False) -> Xorb | None:
    """What Xet requires of a received xorb, and no more (the Xet floor): every chunk decoded (a plain one hashed where
    it lies) and hashed, their merkle root equal to `name`; a `XetError` if not. A footer, if any, is left unread. With
    `table`, its chunk table (what the floor with the sha256 check reads the xorb by)."""
    view, off, chunks, starts = memoryview(data).cast("B"), 0, [], []
    while off < len(view) and view[off:off + 7] != b"XETBLOB":
        stored, scheme = int.from_bytes(view[off + 1:off + 4], "little"), view[off + 4]
        size, payload = int.from_bytes(view[off + 5:off + 8], "little"), view[off + 8:off + 8 + stored]
        plain = payload if scheme == 0 and stored == size else decode_chunk(scheme, payload, size)
        chunks.append((chunk_hash(plain), size))
        starts.append(off)
        off += 8 + stored
    if (root := merkle_root(chunks)) != hex_to_hash(name, "xorb hash"):
        raise XetError(f"xorb {name}: its chunks hash otherwise")
    ends = starts[1:] + [off]
    return Xorb(root, tuple(XorbChunk(h, n, s, e) for (h, n), s, e in zip(chunks, starts, ends))) if table else None


def file_sha256(folder: Path, tables: dict, f) -> str:
    "The sha256 of the bytes a shard's file `f` names, in its order, read from the xorbs in `folder` (`tables`)."
    sha = hashlib.sha256()
    for t in f.terms:
        xhex = hash_to_hex(t.xorb)
        if (x := tables.get(xhex)) is None or not 0 <= t.start < t.end <= len(x.chunks):
            raise XetError(f"shard file {f.hex}: chunks [{t.start}, {t.end}) of xorb {xhex} are not stored")
        with open(folder / xhex, "rb", buffering=0) as xorb:
            for _, plain in plain_chunks(xorb, x, t.start, t.end): sha.update(plain)
    return sha.hexdigest()


def floor_shard(data, folder: Path, tables: dict) -> None:
    """The check any Hub needs before a shard's sha256s may name its files, and no more (the Xet floor with the sha256
    check): each file's bytes hashed from the xorbs stored, a thread a file up to the core count (hashlib frees the
    GIL), as LocalHub does; a `XetError` if one is not the sha256 the shard gives."""
    files = parse_shard(bytes(data)).files
    if not files: return
    with ThreadPoolExecutor(min(len(files), os.cpu_count() or 1)) as pool:
        sums = list(pool.map(lambda f: file_sha256(folder, tables, f), files))
    for f, sha in zip(files, sums):
        if f.sha256 is not None and sha != f.sha256:
            raise XetError(f"shard file {f.hex}: its bytes have sha256 {sha}, not the {f.sha256} the shard gives")


class NullHandler(BaseHTTPRequestHandler):
    "Answers just what upload_folder and snapshot_download ask, with the folder's bytes held in memory."
    protocol_version, disable_nagle_algorithm = "HTTP/1.1", True
    files, lfs = {}, False  # name -> (bytes, sha256 hex, git blob sha1)
    floor = None  # a folder: the floor server, which hashes (Xet: verifies), writes and fsyncs what it receives
    sha256, tables = False, {}  # the Xet floor with the sha256 check; xorb hex -> chunk table, for it

    def log_message(self, *args): pass

    def _drain(self):
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0: left -= len(self.rfile.read(min(left, MIB)))

    def _json(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def _keep(self, name: str, check=None) -> XetError | None:
        "A Xet upload: the body read into one buffer as LocalHub's, `check`ed (refused: the error), written, fsynced."
        view, got = memoryview(np.empty(int(self.headers.get("Content-Length") or 0), np.uint8)), 0
        while got < len(view) and (n := self.rfile.readinto(view[got:])): got += n
        try:
            if check is not None: check(view)
        except XetError as e: return e
        with tempfile.NamedTemporaryFile(dir=self.floor, delete=False) as f:
            f.write(view)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f.name, Path(self.floor) / name)
        return None

    def _xorb(self, name: str, body) -> None:
        "The floor's check of a xorb; with the sha256 check, its chunk table kept for the shards that name it."
        if (x := floor_xorb(body, name, self.sha256)) is not None: self.tables[name] = x

    def _send(self, body=b"", status=200, headers=None):
        body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(body)

    def _info(self, repo):
        siblings = [{"rfilename": n, "size": len(b), "blobId": s1} for n, (b, _, s1) in self.files.items()]
        return {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings, "tags": []}

    def do_GET(self):
        p = self.path.split("?")[0].split("/")
        if "xet-write-token" in p:  # the Xet push: its CAS is this server
            cas = f"http://{self.headers['Host']}/cas"
            return self._send({"accessToken": "null", "exp": int(time.time()) + 3600, "casUrl": cas})
        if "chunks" in p: return self._send({"error": "no global dedup"}, 404)
        if "resolve" in p:
            data, sha, sha1 = self.files[p[-1]]
            etag = sha if p[-1].endswith(".safetensors") else sha1
            headers = {"ETag": f'"{etag}"', "X-Repo-Commit": COMMIT, "Content-Type": "application/octet-stream"}
            if p[-1].endswith(".safetensors"):
                headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
            return self._send(data, headers=headers)
        if p[1:3] == ["api", "models"] and "tree" in p:
            return self._send(
                [
                    {
                        "type": "file",
                        "path": n,
                        "size": len(b),
                        "oid": s1,
                        **(
                            {"lfs": {"oid": s, "size": len(b), "pointerSize": 130}}
                            if n.endswith(".safetensors")
                            else {}
                        ),
                    }
                    for n, (b, s, s1) in self.files.items()
                ]
            )
        if p[1:3] == ["api", "models"] and len(p) >= 5: return self._send(self._info(f"{p[3]}/{p[4]}"))
        self._send({"error": "null server: not served"}, 404)

    do_HEAD = do_GET

    def do_PUT(self):
        if self.floor is None: self._drain()
        else:  # the floor: hash while receiving, write, fsync; nothing else
            left, h = int(self.headers.get("Content-Length") or 0), hashlib.sha256()
            with tempfile.NamedTemporaryFile(dir=self.floor, delete=False) as f:
                while left > 0:
                    piece = self.rfile.read(min(left, MIB))
                    h.update(piece)
                    f.write(piece)
                    left -= len(piece)
                f.flush()
                os.fsync(f.fileno())
            os.replace(f.name, Path(self.floor) / h.hexdigest())
        self._send(b"")

    def do_POST(self):
        p = self.path.split("?")[0].split("/")
        if p[-1] == "create":
            body = self._json()
            return self._send({"url": f"http://{self.headers['Host']}/{body['organization']}/{body['name']}"})
        if "preupload" in p:
            files = self._json()["files"]
            mode = lambda f: "lfs" if self.lfs and f["path"].endswith(".safetensors") else "regular"
            return self._send({"files": [{"path": f["path"], "uploadMode": mode(f), "shouldIgnore": False, "oid": None}
                                         for f in files], "commitOid": COMMIT})
        if "commit" in p:
            self._drain()
            url = f"http://{self.headers['Host']}/{p[3]}/{p[4]}/commit/{COMMIT}"
            return self._send({"success": True, "commitOid": COMMIT, "commitUrl": url, "hookOutput": ""})
        if "cas" in p and ("v2" in p or "xorb-grants" in p):  # as LocalHub: neither, so the client uses v1 xorbs
            # (answered 200 before, hf_xet 1.8 took that as a grant and sent no xorb at all: the null server's Xet
            # push in hub.json results before this line was its client's work alone)
            self._drain()
            return self._send({"error": "not served"}, 404)
        if "xorbs" in p:
            if self.floor is None: self._drain()
            elif refused := self._keep(p[-1], lambda body: self._xorb(p[-1], body)):
                return self._send({"error": str(refused)}, 400)
            return self._send({"was_inserted": True})
        if p[-1] == "shards":
            check = (lambda body: floor_shard(body, Path(self.floor), self.tables)) if self.sha256 else None
            if self.floor is None: self._drain()
            elif refused := self._keep(f"shard-{time.monotonic_ns()}-{threading.get_ident()}", check):
                return self._send({"error": str(refused)}, 400)
            return self._send({"result": 1})
        if p[-1] == "batch":
            base = f"http://{self.headers['Host']}/lfs"
            objects = [{"oid": o["oid"], "size": o["size"], "authenticated": True,
                        "actions": {"upload": {"href": f"{base}/{o['oid']}"}, "verify": {"href": f"{base}/verify"}}}
                       for o in self._json()["objects"]]
            return self._send(
                {"transfer": "basic", "objects": objects}, headers={"Content-Type": "application/vnd.git-lfs+json"}
            )
        self._drain(); self._send({})


def serve(kind: str, folder: str, root: str, lfs: bool):
    "Run one server in this process; print its port."
    if kind in ("null", "floor", FLOOR_SHA256):
        for f in sorted(Path(folder).iterdir()):
            data = f.read_bytes()
            NullHandler.files[f.name] = (data, hashlib.sha256(data).hexdigest(),
                                         hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        NullHandler.lfs = lfs
        if kind != "null": NullHandler.floor = Path(root).mkdir(parents=True) or root
        NullHandler.sha256 = kind == FLOOR_SHA256
        server = ThreadingHTTPServer(("127.0.0.1", 0), NullHandler)
        server.daemon_threads = True
        print(server.server_address[1], flush=True)
        server.serve_forever()
    from adaptkit.localhub.server import LocalHub
    hub = LocalHub(root, lfs=lfs, allowed_hosts=[PROXY_HOST]).start()  # the counting proxy's address, same port
    if kind == NO_SHA256: hub.server.store.xet.verify_sha256 = False  # before its port is known: before any request
    print(hub.port, flush=True)
    while True: time.sleep(3600)


def fresh_bytes(folder: Path) -> None:
    "New random shards, so no repeat finds any of its chunks or blobs stored already (LocalHub deduplicates both)."
    for f in folder.glob("*.safetensors"): f.write_bytes(os.urandom(f.stat().st_size))


NO_SHA256 = "localhub_no_sha256_check"  # xet mode: LocalHub recording the sha256s shards give, unchecked
FLOOR_SHA256 = "floor_with_sha256"  # xet mode: the floor checking the sha256s shards give, as any Hub must
PROXY_HOST = "127.0.0.2"  # another loopback address: the proxy listens there on the server's own port


class CountingProxy:
    """A TCP proxy that counts the bytes clients send to a server on 127.0.0.1: it listens on `PROXY_HOST` with the
    server's port, so a request's Host names that port, as LocalHub requires, and passes unchanged."""
    def __init__(self, port: int):
        self.target, self.sent, self.lock = port, 0, threading.Lock()
        self.listener = socket.create_server((PROXY_HOST, port))
        self.port = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src, dst, count):
        try:
            while data := src.recv(MIB):
                dst.sendall(data)
                if count:
                    with self.lock: self.sent += len(data)
        except OSError: pass
        finally:
            for s in (src, dst):
                try: s.shutdown(socket.SHUT_RDWR)
                except OSError: pass


def disk_bytes(root: Path) -> int: return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def start_server(kind: str, folder: Path, root: Path, lfs: bool, mode: str) -> tuple:
    "(process, endpoint, its root) of one server in its own process."
    where = root / f"{kind}-{mode}"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(folder), str(where), str(int(lfs))],
                            stdout=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}", where


def changed_push(folder: Path, endpoint: str, where: Path, repo: str) -> dict:
    """Push `folder` to `repo` again with one tensor (1/64 of the model, inside the first shard) changed: bytes sent
    through a counting proxy and bytes stored under LocalHub's root, each also over the tensor's bytes."""
    from huggingface_hub import HfApi
    shard = sorted(folder.glob("*.safetensors"))[0]
    tensor = shard.stat().st_size * FILES // 64
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 3)
        f.write(os.urandom(tensor))
    os.environ["HF_XET_CACHE"] = str(where.parent / f"xet-client-{where.name}")  # the machine that pushed it first
    proxy, stored = CountingProxy(int(endpoint.rsplit(":", 1)[1])), disk_bytes(where)
    t = timed(lambda: HfApi(endpoint=f"http://{PROXY_HOST}:{proxy.port}", token="bench").upload_folder(
        folder_path=folder, repo_id=repo))
    sent, stored = proxy.sent, disk_bytes(where) - stored
    return {"tensor_bytes": tensor, "bytes_sent": sent, "bytes_stored": stored, "push_s": t,
            "sent_vs_tensor": sent / tensor, "stored_vs_tensor": stored / tensor}


def run_mode(folder: Path, root: Path, mode: str) -> dict:
    "Push (upload_folder) and pull (snapshot_download, fresh caches) through each server, interleaved; medians."
    from huggingface_hub import HfApi, constants, snapshot_download
    lfs = mode != "inline"
    kinds = {"inline": ("null", "localhub"), "lfs": ("null", "floor", "localhub"),
             "xet": ("null", FLOOR_SHA256, "floor", "localhub", NO_SHA256)}[mode]
    servers = {kind: start_server(kind, folder, root, lfs, mode) for kind in kinds}
    times = {kind: {"push_s": [], "pull_s": []} for kind in servers}
    ok, changed = {}, None  # per LocalHub: every pull gave back the pushed bytes
    constants.HF_HUB_DISABLE_XET = mode == "lfs"  # the LFS path is what clients with Xet disabled use
    try:
        for i in range(REPEATS):
            fresh_bytes(folder)
            order = list(servers) if i % 2 == 0 else list(servers)[::-1]  # back to back, first one alternating
            for kind in order:
                endpoint = servers[kind][1]
                api, repo, got = HfApi(endpoint=endpoint, token="bench"), f"bench/artifact-{i}", {}
                api.create_repo(repo, exist_ok=True)
                os.environ["HF_XET_CACHE"] = str(root / f"xet-client-{kind}-{mode}")  # the pushing machine's cache
                os.sync()  # no earlier push's writeback is billed to this one (see the module's docstring)
                times[kind]["push_s"].append(timed(lambda: api.upload_folder(folder_path=folder, repo_id=repo)))
                cache = root / f"cache-{kind}-{mode}-{i}"
                os.environ["HF_XET_CACHE"] = str(cache / "xet")  # no chunk of an earlier pull is at hand
                os.sync()
                times[kind]["pull_s"].append(timed(lambda: got.setdefault("p", snapshot_download(
                    repo, endpoint=endpoint, token="bench", cache_dir=cache))))
                if kind.startswith("localhub"):  # the null server serves the bytes it read at its start
                    ok[kind] = ok.get(kind, True) and all((Path(got["p"]) / f.name).read_bytes() == f.read_bytes()
                                                          for f in folder.iterdir())
                shutil.rmtree(cache)
        if mode != "inline":
            _, endpoint, where = servers["localhub"]
            changed = changed_push(folder, endpoint, where, f"bench/artifact-{REPEATS - 1}")
    finally:
        constants.HF_HUB_DISABLE_XET = False
        for proc, _, _ in servers.values(): proc.terminate(); proc.wait(10)
    for t in times.values():
        t.update(push_median_s=median(t["push_s"]), pull_median_s=median(t["pull_s"]))
    for kind, same in ok.items(): times[kind]["identical_bytes"] = same
    if changed: times["localhub"]["one_tensor_changed"] = changed
    return times


def main():
    global REPEATS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=SIZE_MIB, help="model size (others: a check, unwritten)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="repeats per server (medians)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to run (default: all)")
    args = parser.parse_args()
    REPEATS = args.repeats
    full = (args.size_mib, args.repeats, args.modes) == (SIZE_MIB, parser.get_default("repeats"), list(MODES))
    start = quiet_start() if full else {"load_average_at_start": list(os.getloadavg()), "loaded": None}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        folder = make_folder(root, args.size_mib * MIB)
        size = sum(f.stat().st_size for f in folder.iterdir())
        copies = [timed(lambda i=i: shutil.copytree(folder, root / f"copy-{i}")) for i in range(REPEATS)]
        copy_s = median(copies)
        result = {"bytes": size, "repeats": REPEATS, "client": "huggingface_hub upload_folder / snapshot_download",
                  "copy_s": copies, "copy_median_s": copy_s, "profile": PROFILE, "modes": {}}
        for mode in args.modes:
            name = MODES[mode]
            times = run_mode(folder, root, mode)
            null, hub = times["null"], times["localhub"]
            m = {"localhub": hub, "null_server": null}
            for op in ("push", "pull"):
                m[f"{op}_vs_null"] = hub[f"{op}_median_s"] / null[f"{op}_median_s"]
                m[f"{op}_vs_copy"] = hub[f"{op}_median_s"] / copy_s
                m[f"{op}_mib_per_s"] = size / MIB / hub[f"{op}_median_s"]
            if "floor" in times:
                m["floor_server"] = times["floor"]
                floor = times["floor"]["push_median_s"]
                m["push_vs_floor"] = result[f"{mode}_push_vs_floor"] = hub["push_median_s"] / floor
                pairs = [h / f for h, f in zip(hub["push_s"], times["floor"]["push_s"])]  # pushed back to back
                m["push_vs_floor_paired"] = {"median": median(pairs), "min": min(pairs), "max": max(pairs)}
            if NO_SHA256 in times:  # the same LocalHub without the sha256 check the floor does not do
                trusting = times[NO_SHA256]
                m[NO_SHA256] = trusting
                m["push_vs_floor_no_sha256_check"] = result[f"{mode}_push_vs_floor_no_sha256_check"] = (
                    trusting["push_median_s"] / floor)
                pairs = [h / f for h, f in zip(trusting["push_s"], times["floor"]["push_s"])]
                m["push_vs_floor_no_sha256_check_paired"] = {"median": median(pairs), "min": min(pairs),
                                                             "max": max(pairs)}
            if FLOOR_SHA256 in times:  # LocalHub against the floor that also checks each file's sha256
                checking = times[FLOOR_SHA256]
                m["floor_server_with_sha256"] = checking
                m["push_vs_floor_with_sha256"] = result[f"{mode}_push_vs_floor_with_sha256"] = (
                    hub["push_median_s"] / checking["push_median_s"])
                pairs = [h / f for h, f in zip(hub["push_s"], checking["push_s"])]
                m["push_vs_floor_with_sha256_paired"] = {"median": median(pairs), "min": min(pairs), "max": max(pairs)}
            result["modes"][name] = m
            line = (f"{name}: push {hub['push_median_s']:.2f} s ({m['push_vs_null']:.2f}x null "
                    f"{null['push_median_s']:.2f} s, {m['push_vs_copy']:.0f}x copy"
                    + (f", {m['push_vs_floor']:.2f}x floor {times['floor']['push_median_s']:.2f} s" if "floor" in times
                       else "")
                    + (f"; without the sha256 check {times[NO_SHA256]['push_median_s']:.2f} s, "
                       f"{m['push_vs_floor_no_sha256_check']:.2f}x floor" if NO_SHA256 in times else "")
                    + (f"; {m['push_vs_floor_with_sha256']:.2f}x the floor with the sha256 check "
                       f"{times[FLOOR_SHA256]['push_median_s']:.2f} s" if FLOOR_SHA256 in times else "")
                    + f"), pull {hub['pull_median_s']:.2f} s ({m['pull_vs_null']:.2f}x null "
                    f"{null['pull_median_s']:.2f} s, {m['pull_vs_copy']:.0f}x copy), "
                    f"identical: {hub['identical_bytes']}")
            if (c := hub.get("one_tensor_changed")):
                line += (f"; one tensor ({c['tensor_bytes'] / MIB:.2f} MiB) changed: sent {c['sent_vs_tensor']:.2f}x, "
                         f"stored {c['stored_vs_tensor']:.2f}x its bytes")
            print(line, flush=True)
        print(f"page-cache copy: {copy_s:.3f} s; load average at start {start['load_average_at_start'][0]:.2f}")
    if full: write_result("hub", result, start)
    else: print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]: serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
    else: main()
