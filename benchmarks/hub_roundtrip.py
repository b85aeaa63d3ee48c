"""Push and pull of a 256 MiB folder with the stock huggingface_hub client (`upload_folder`, `snapshot_download`)
through LocalHub, against a null server in the same run (same HTTP stack; it reads and discards request bodies and
serves the same bytes from memory with no lookup) and against a page-cache copy. Two modes: inline (the client's
default settings, Xet on: LocalHub answers "regular") and LFS (Xet disabled, LocalHub with lfs=True). Each server
runs in its own process, as `adaptkit hub serve` does. Medians of 3. Waits for a quiet machine and writes through
benchmarks/_bench.py: benchmarks/results/hub.json (hub.loaded.json when ADAPTKIT_BENCH_ALLOW_LOADED=1 on a loaded
machine). Run: .venv/bin/python benchmarks/hub_roundtrip.py"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import median, quiet_start, write_result  # noqa: E402

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MIB, FILES, REPEATS = 1 << 20, 4, 3
COMMIT = "0" * 40
PROFILE = {  # cProfile of LocalHub's handler threads, one 64 MiB inline push and pull, in-process, before and after
    "before (issue 13)": "2.2 s in handlers: b64decode(validate=True) of the whole 85 MiB line 0.66 s, json.loads of "
                         "that line 0.34 s, one 64 MiB write 0.32 s, download sendfile 0.30 s, sha256 + git sha1 "
                         "0.22 s, joins 0.12 s; every download re-hashed the blob",
    "after": "0.72 s in handlers: a2b_base64 of 1 MiB pieces 0.28 s (CPython's decoder, ~4 ns/byte), sha256 0.05 s "
             "(now in a writer thread), fsync 0.05 s, socket waits; no JSON parse of the content, no git sha1 for "
             "LFS-class files, downloads re-hash only files changed on disk",
    "what is left": "an inline push is mostly the client: it base64-encodes and joins the whole body before sending "
                    "(about 2.5 s CPU for 256 MiB); the server's decode (about 1 s CPU) cannot start before",
}


def make_folder(root: Path) -> Path:
    "256 MiB: four 64 MiB random weight shards plus a small config."
    folder = root / "artifact"
    folder.mkdir()
    for i in range(FILES):
        (folder / f"model-{i:05d}-of-{FILES:05d}.safetensors").write_bytes(os.urandom(64 * MIB))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


class NullHandler(BaseHTTPRequestHandler):
    "Answers just what upload_folder and snapshot_download ask, with the folder's bytes held in memory."
    protocol_version, disable_nagle_algorithm = "HTTP/1.1", True
    files, lfs = {}, False  # name -> (bytes, sha256 hex, git blob sha1)

    def log_message(self, *args): pass

    def _drain(self):
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0: left -= len(self.rfile.read(min(left, MIB)))

    def _json(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

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
        self._drain(); self._send(b"")

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
    if kind == "null":
        for f in sorted(Path(folder).iterdir()):
            data = f.read_bytes()
            NullHandler.files[f.name] = (data, hashlib.sha256(data).hexdigest(),
                                         hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        NullHandler.lfs = lfs
        server = ThreadingHTTPServer(("127.0.0.1", 0), NullHandler)
        server.daemon_threads = True
        print(server.server_address[1], flush=True)
        server.serve_forever()
    from adaptkit.localhub.server import LocalHub
    hub = LocalHub(root, lfs=lfs).start()
    print(hub.port, flush=True)
    while True: time.sleep(3600)


def fresh_bytes(folder: Path) -> None:
    "Change the first bytes of every shard, so no repeat finds its blobs stored already (LocalHub deduplicates)."
    for f in folder.glob("*.safetensors"):
        with open(f, "r+b") as fh: fh.write(os.urandom(16))


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def start_server(kind: str, folder: Path, root: Path, lfs: bool) -> tuple:
    "(process, endpoint) of one server in its own process."
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(folder), str(root / f"{kind}-lfs{lfs}"),
                             str(int(lfs))], stdout=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


def run_mode(folder: Path, root: Path, lfs: bool) -> dict:
    "Push (upload_folder) and pull (snapshot_download, fresh cache) through both servers, interleaved; medians."
    from huggingface_hub import HfApi, constants, snapshot_download
    servers = {kind: start_server(kind, folder, root, lfs) for kind in ("null", "localhub")}
    times = {kind: {"push_s": [], "pull_s": []} for kind in servers}
    ok = True
    constants.HF_HUB_DISABLE_XET = lfs  # the LFS path is what clients with Xet disabled use
    try:
        for i in range(REPEATS):
            fresh_bytes(folder)
            order = list(servers) if i % 2 == 0 else list(servers)[::-1]  # back to back, first one alternating
            for kind in order:
                endpoint = servers[kind][1]
                api, repo, got = HfApi(endpoint=endpoint, token="bench"), f"bench/artifact-{i}", {}
                api.create_repo(repo, exist_ok=True)
                times[kind]["push_s"].append(timed(lambda: api.upload_folder(folder_path=folder, repo_id=repo)))
                cache = root / f"cache-{kind}-{lfs}-{i}"
                times[kind]["pull_s"].append(timed(lambda: got.setdefault("p", snapshot_download(
                    repo, endpoint=endpoint, token="bench", cache_dir=cache))))
                if kind == "localhub":  # the null server serves the bytes it read at its start
                    ok &= all((Path(got["p"]) / f.name).read_bytes() == f.read_bytes() for f in folder.iterdir())
                shutil.rmtree(cache)
    finally:
        constants.HF_HUB_DISABLE_XET = False
        for proc, _ in servers.values(): proc.terminate(); proc.wait(10)
    for t in times.values():
        t.update(push_median_s=median(t["push_s"]), pull_median_s=median(t["pull_s"]))
    times["localhub"]["identical_bytes"] = ok
    return times


def main():
    start = quiet_start()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        folder = make_folder(root)
        size = sum(f.stat().st_size for f in folder.iterdir())
        copies = [timed(lambda i=i: shutil.copytree(folder, root / f"copy-{i}")) for i in range(REPEATS)]
        copy_s = median(copies)
        result = {"bytes": size, "repeats": REPEATS, "client": "huggingface_hub upload_folder / snapshot_download",
                  "copy_s": copies, "copy_median_s": copy_s, "profile": PROFILE, "modes": {}}
        for name, lfs in [("inline (client defaults, Xet on)", False), ("lfs (Xet disabled)", True)]:
            times = run_mode(folder, root, lfs)
            null, hub = times["null"], times["localhub"]
            m = {"localhub": hub, "null_server": null}
            for op in ("push", "pull"):
                m[f"{op}_vs_null"] = hub[f"{op}_median_s"] / null[f"{op}_median_s"]
                m[f"{op}_vs_copy"] = hub[f"{op}_median_s"] / copy_s
                m[f"{op}_mib_per_s"] = size / MIB / hub[f"{op}_median_s"]
            result["modes"][name] = m
            print(
                f"{name}: push {hub['push_median_s']:.2f} s "
                f"({m['push_vs_null']:.2f}x null {null['push_median_s']:.2f} s,"
                f" {m['push_vs_copy']:.0f}x copy), pull {hub['pull_median_s']:.2f} s ({m['pull_vs_null']:.2f}x null "
                f"{null['pull_median_s']:.2f} s, {m['pull_vs_copy']:.0f}x copy), identical: {hub['identical_bytes']}",
                flush=True,
            )
        print(f"page-cache copy: {copy_s:.3f} s; load average at start {start['load_average_at_start'][0]:.2f}")
    write_result("hub", result, start)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]: serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
    else: main()
