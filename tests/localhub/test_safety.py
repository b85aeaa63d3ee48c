"""Each safety rule of LocalHub refusing: cross-site writes, foreign Host, stalled sockets, oversized or malformed
bodies, a second server on one root, concurrent pushes, a full disk; tokens from a file or the environment."""
import base64
import errno
import hashlib
import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

from adaptkit.localhub.http import MAX_JSON
from adaptkit.localhub.server import LocalHub, read_token_file

# the `hub` fixture (tests/conftest.py) requires `token`, and holds the public repo team/g
pytestmark = pytest.mark.hub(guarded=True, repos={"team/g": {}})


def _request(hub, method, path, body=b"", headers=None):
    "A raw request: (status, headers, JSON or bytes body)."
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
    conn.request(method, path, body=body, headers={"Host": f"127.0.0.1:{hub.port}", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try: return r.status, r.headers, json.loads(data)
    except ValueError: return r.status, r.headers, data


JSON = {"Content-Type": "application/json"}


def test_cross_site_writes_are_refused(tmp_path):
    "An open hub (no token): a browser's simple POST or a foreign Origin cannot create or delete repos."
    with LocalHub(tmp_path / "hub") as hub:
        create = json.dumps({"name": "x", "organization": "team"}).encode()
        status, _, body = _request(hub, "POST", "/api/repos/create", create, {"Content-Type": "text/plain"})
        assert status == 403 and "JSON body" in body["error"]
        status, _, body = _request(hub, "POST", "/api/repos/create", create, {**JSON, "Origin": "http://evil.example"})
        assert status == 403 and "cross-site" in body["error"]
        assert not HfApi(endpoint=hub.endpoint, token=False).repo_exists("team/x")
        assert (
            _request(hub, "POST", "/api/repos/create", create, {**JSON, "Origin": f"http://127.0.0.1:{hub.port}"})[0]
            == 200
        )
        delete = json.dumps({"name": "x", "organization": "team"}).encode()
        assert _request(hub, "DELETE", "/api/repos/delete", delete, {**JSON, "Origin": "null"})[0] == 403
        assert HfApi(endpoint=hub.endpoint, token=False).repo_exists("team/x")


def test_foreign_host_is_refused(tmp_path, token):
    "A DNS-rebinding page reaches the port under its own name: 421, even for public reads."
    with LocalHub(tmp_path / "hub", token=token) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/secret", private=True)
        auth = {"Authorization": f"Bearer {token}"}
        for host in ["evil.example", f"evil.example:{hub.port}", f"127.0.0.1:{hub.port + 1}", "127.0.0.1.evil.example"]:
            status, _, body = _request(hub, "GET", "/api/models/team/secret", headers={**auth, "Host": host})
            assert status == 421 and "does not serve Host" in body["error"], host
        for host in [f"localhost:{hub.port}", f"127.0.0.1:{hub.port}", "localhost"]:
            assert _request(hub, "GET", "/api/models/team/secret", headers={**auth, "Host": host})[0] == 200, host
    with LocalHub(tmp_path / "hub", token=token, allowed_hosts=["hub.internal"]) as hub:
        assert (
            _request(
                hub,
                "GET",
                "/api/models/team/secret",
                headers={"Authorization": f"Bearer {token}", "Host": "hub.internal"},
            )[0]
            == 200
        )


class _Forward:
    "A loopback TCP port forward, as `ssh -L` or `docker run -p` make one: connections to `.port` go to `.target`."
    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port, self.target, self.open = self.sock.getsockname()[1], None, True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.open:
            try: client, _ = self.sock.accept()
            except TimeoutError: continue
            except OSError: return
            server = socket.create_connection(("127.0.0.1", self.target), timeout=30)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self):
        self.open = False
        self.sock.close()


def _pipe(a, b):
    "Copy what `a` sends to `b` until `a` ends, then end `b`'s side too."
    try:
        while data := a.recv(1 << 16): b.sendall(data)
    except OSError: pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass


def test_a_hub_behind_a_port_forward_serves_the_host_port_it_is_given(tmp_path, monkeypatch, random_bytes, token):
    """Issue 47, item 4. Before, a request through a port forward (its Host names the forward's port) was a 421 that
    hid the port, and no `allowed_hosts` value helped. Now `allowed_hosts` takes `name:port`: the stock client pushes
    (through Xet: the CAS URL names the forward) and downloads through the forward, while other names and ports are
    still refused (the DNS-rebinding guard) with a 421 that names the Host it refused and what the hub serves."""
    forward = _Forward()
    via = f"http://127.0.0.1:{forward.port}"
    try:
        with LocalHub(tmp_path / "hub", token=token) as hub:
            forward.target = hub.port
            with pytest.raises(HfHubHTTPError) as e: HfApi(endpoint=via, token=token).whoami()
            assert e.value.response.status_code == 421
            message = str(e.value)
            assert f"does not serve Host '127.0.0.1:{forward.port}'" in message and f"127.0.0.1:{hub.port}" in message
            assert f"allowed_hosts=['127.0.0.1:{forward.port}']" in message, message
        with LocalHub(tmp_path / "hub", token=token, allowed_hosts=[f"127.0.0.1:{forward.port}"]) as hub:
            forward.target, api, data = hub.port, HfApi(endpoint=via, token=token), random_bytes(300_000)
            api.create_repo("team/fwd")
            api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/fwd")
            api.upload_file(path_or_fileobj=b"inline", path_in_repo="a.txt", repo_id="team/fwd")
            got = hf_hub_download("team/fwd", "w.bin", endpoint=via, token=token, cache_dir=tmp_path / "c")
            assert open(got, "rb").read() == data and api.get_paths_info("team/fwd", ["w.bin"])[0].xet_hash
            assert hub.counts["cas-xorb"] >= 1  # pushed through Xet, via the forward
            assert HfApi(endpoint=hub.endpoint, token=token).list_repo_files("team/fwd") == [".gitattributes", "a.txt",
                                                                                             "w.bin"]
            for host in [f"evil.example:{forward.port}", f"127.0.0.1:{forward.port + 1}", "127.0.0.1.evil.example"]:
                status, _, body = _request(hub, "GET", "/api/models/team/fwd", headers={"Host": host})
                assert status == 421 and f"does not serve Host {host!r}" in body["error"], (host, body)
    finally: forward.close()
    with pytest.raises(ValueError, match="'http://127.0.0.1:9000' is not a Host"):
        LocalHub(tmp_path / "other", allowed_hosts=["http://127.0.0.1:9000"])


def test_stalled_sockets_are_closed(tmp_path):
    with LocalHub(tmp_path / "hub", timeout=0.5) as hub:
        stalled = []
        for partial in [
            b"GET /api/models HTTP/1.1\r\nHost: 127",
            b"POST /api/repos/create HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\"",
        ]:
            s = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
            s.sendall(partial)
            stalled.append(s)
        time.sleep(0.3)
        assert len(hub.server.conns) == 2
        start = time.monotonic()
        for s in stalled:
            s.settimeout(5)
            assert s.recv(1000) == b""  # closed by the server, without an answer
            s.close()
        time.sleep(0.1)
        assert time.monotonic() - start < 4 and not hub.server.conns
        assert HfApi(endpoint=hub.endpoint, token=False).list_models() is not None  # still serving


def test_oversized_and_deep_json_refused(tmp_path, token):
    with LocalHub(tmp_path / "hub", token=token) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/j")
        auth = {**JSON, "Authorization": f"Bearer {token}"}
        big = b'{"files": [' + b" " * (MAX_JSON + 10) + b"]}"
        status, headers, body = _request(hub, "POST", "/api/models/team/j/preupload/main", big, auth)
        assert status == 413 and f"at most {MAX_JSON}" in body["error"]
        conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)  # chunked: no length to check up front
        conn.request("POST", "/api/models/team/j/preupload/main", body=iter([b" " * (1 << 20)] * 9), headers=auth,
                     encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 413 and b"over" in r.read()
        conn.close()
        status, _, body = _request(hub, "POST", "/api/models/team/j/preupload/main", b"[" * 200000, auth)
        assert status == 400 and "not valid JSON" in body["error"]


def test_malformed_bodies_name_the_field(tmp_path, token):
    with LocalHub(tmp_path / "hub", token=token) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/m")
        auth = {**JSON, "Authorization": f"Bearer {token}"}
        cases = [
            ("/api/repos/create", {"name": 3}, "field 'name' of the request body must be str, not int"),
            ("/api/repos/create", {"name": "x", "type": "car"}, "field 'type'"),
            ("/api/repos/create", {"name": "x", "private": "yes"}, "field 'private'"),
            ("/api/repos/move", {"fromRepo": "team/m"}, "no 'toRepo' field"),
            ("/api/models/team/m/preupload/main", {"files": "x"}, "field 'files' of the request body must be list"),
            ("/api/models/team/m/preupload/main", {"files": [{"path": "a", "size": "1"}]}, "field 'size' of files[0]"),
            ("/api/models/team/m/branch/b", {"startingPoint": ["main"]}, "field 'startingPoint'"),
            ("/api/models/team/m/tag/main", {"tag": None}, "no 'tag' field"),
            ("/api/validate-yaml", {"content": 1}, "field 'content'"),
        ]
        for path, body, part in cases:
            status, _, answer = _request(hub, "POST", path, json.dumps(body).encode(), auth)
            assert status == 400 and part in answer["error"], (path, body, status, answer)
        status, _, answer = _request(
            hub, "PUT", "/api/models/team/m/settings", json.dumps({"gated": "yes"}).encode(), auth
        )
        assert status == 400 and "field 'gated'" in answer["error"]
        lines = [
            {"key": "header", "value": {"summary": "x"}},
            {"key": "file", "value": {"path": "a.txt", "content": "%%%"}},
        ]
        ndjson = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        status, _, answer = _request(hub, "POST", "/api/models/team/m/commit/main", ndjson,
                                     {"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {token}"})
        assert status == 400 and "commit line 2" in answer["error"] and "field 'content'" in answer["error"]
        assert HfApi(endpoint=hub.endpoint, token=token).list_repo_files("team/m") == [".gitattributes"]
        assert not list((hub.root / "blobs" / "tmp").iterdir())


def test_second_server_on_one_root_is_refused(tmp_path):
    with LocalHub(tmp_path / "hub") as first:
        with pytest.raises(RuntimeError, match=f"already used by another LocalHub \\(pid {os.getpid()}\\)"):
            LocalHub(tmp_path / "hub").start()
        assert HfApi(endpoint=first.endpoint, token=False).create_repo("team/ok").repo_id == "team/ok"
    with LocalHub(tmp_path / "hub") as again:  # released on stop
        assert HfApi(endpoint=again.endpoint, token=False).repo_exists("team/ok")


def test_concurrent_pushes_are_commits_or_clean_refusals(tmp_path, token):
    "8 mirrors of different folders at once, each naming the head it listed: every commit's tree is one folder."
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/busy")
        folders = {
            i: {
                f"run{i}/w.bin": os.urandom(2000),
                f"run{i}/notes.txt": f"run {i}".encode(),
                "shared.txt": f"{i}".encode(),
            }
            for i in range(8)
        }
        barrier, results = threading.Barrier(8), {}

        def push(i):
            head = api.list_repo_commits("team/busy")[0].commit_id
            old = [
                f
                for f in api.list_repo_files("team/busy", revision=head)
                if f != ".gitattributes" and f not in folders[i]
            ]
            ops = [CommitOperationDelete(f) for f in old] + [CommitOperationAdd(p, b) for p, b in folders[i].items()]
            barrier.wait()
            try: results[i] = api.create_commit("team/busy", ops, commit_message=f"push {i}", parent_commit=head).oid
            except HfHubHTTPError as e: results[i] = e.response.status_code

        threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        landed = {i: r for i, r in results.items() if isinstance(r, str)}
        assert len(results) == 8 and landed and all(r == 412 for r in results.values() if not isinstance(r, str))
        commits = api.list_repo_commits("team/busy")
        assert len(commits) == len(landed) + 1 and {c.commit_id for c in commits[:-1]} == set(landed.values())
        for c in commits[:-1]:
            i = int(c.title.split()[-1])
            assert set(api.list_repo_files("team/busy", revision=c.commit_id)) == {".gitattributes", *folders[i]}


def test_full_disk_is_507_and_nothing_half_written(tmp_path, monkeypatch, token):
    import adaptkit.localhub.storage as hubstore
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/full")
        before = (hub.root / "repos" / "model" / "team" / "full" / "repo.json").read_bytes()
        real_fsync = os.fsync
        def fsync(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(hubstore.os, "fsync", fsync)
        with pytest.raises(HfHubHTTPError, match="disk .* is full") as e:
            api.upload_file(path_or_fileobj=b"inline text " * 500, path_in_repo="w.txt", repo_id="team/full")
        assert e.value.response.status_code == 507
        monkeypatch.setattr(hubstore.os, "fsync", real_fsync)
        assert (hub.root / "repos" / "model" / "team" / "full" / "repo.json").read_bytes() == before
        assert not list((hub.root / "blobs" / "tmp").iterdir()) and api.list_repo_files("team/full") == [
            ".gitattributes"
        ]
        assert not [p for p in (hub.root / "repos").rglob("*.tmp")]


def _enospc(fd):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_stops_a_xet_push_at_once_and_the_log_names_the_store(tmp_path, monkeypatch, caplog,
                                                                           random_bytes, token):
    """Issue 49, item 6. Before, a Xet upload onto a full disk was a 507, which hf_xet retries (any 5xx) for about
    four minutes, then shows only "507 Insufficient Storage". Now the CAS answers a full disk 413, which hf_xet does
    not retry (a 4xx other than 408 and 429): the push stops at its first xorb, and LocalHub's log names the store
    that is full (hf_xet shows the user only the status and the URL)."""
    pytest.importorskip("hf_xet")
    import adaptkit.localhub.xet as hubxet
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/full")
        real_fsync, data = os.fsync, random_bytes(300_000)
        monkeypatch.setattr(hubxet.os, "fsync", _enospc)
        start = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="adaptkit.localhub"):
            with pytest.raises(ConnectionError, match="413"):
                api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/full")
        assert time.monotonic() - start < 30 and hub.counts["cas-xorb"] == 1  # asked once: not retried
        monkeypatch.setattr(hubxet.os, "fsync", real_fsync)
        assert f"the Xet store at {hub.root / 'xet'} is full" in caplog.text, caplog.text
        assert not list((hub.root / "xet" / "tmp").iterdir()) and not list((hub.root / "xet" / "xorbs").rglob("*"))
        assert api.list_repo_files("team/full") == [".gitattributes"]
        api.upload_file(path_or_fileobj=data, path_in_repo="w.bin", repo_id="team/full")  # room again: it goes through
        assert api.get_paths_info("team/full", ["w.bin"])[0].xet_hash


def test_a_push_the_disk_cannot_hold_is_refused_before_any_upload_naming_the_disk(tmp_path, monkeypatch,
                                                                                   random_bytes, token):
    """Issue 49, item 6. A push whose large files are bigger than the free space of the hub's disk is refused at its
    preupload with a 507 that the stock client shows as it is (it does not retry a 507 there): the disk, what is free
    and what the push brings, before a byte is uploaded. Inline files and files already stored at their path with
    their size are not counted."""
    import adaptkit.localhub.http as hubhttp
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/small")
        data = random_bytes(300_000)
        api.upload_file(path_or_fileobj=data, path_in_repo="kept.bin", repo_id="team/small")
        real = hubhttp.shutil.disk_usage
        monkeypatch.setattr(hubhttp.shutil, "disk_usage",
                            lambda p: real(p)._replace(free=200_000) if str(p).startswith(str(hub.root)) else real(p))
        before = dict(hub.counts)
        with pytest.raises(HfHubHTTPError, match=r"disk at .* has 0\.2 MB \(200,000 bytes\) free, and this push brings "
                                                 r"up to 0\.3 MB \(300,001 bytes\)") as e:
            api.upload_file(path_or_fileobj=b"\0" + data, path_in_repo="w.bin", repo_id="team/small")
        assert e.value.response.status_code == 507 and str(hub.root) in str(e.value)
        assert {k: hub.counts[k] - before.get(k, 0) for k in ("xet-token", "cas-xorb", "lfs-batch", "commit")} == {
            "xet-token": 0, "cas-xorb": 0, "lfs-batch": 0, "commit": 0}
        api.upload_file(path_or_fileobj=b"a small inline file", path_in_repo="a.txt", repo_id="team/small")
        api.upload_file(path_or_fileobj=data, path_in_repo="kept.bin", repo_id="team/small")  # held: not counted
        assert api.list_repo_files("team/small") == [".gitattributes", "a.txt", "kept.bin"]


def test_inline_upload_is_streamed_not_held(tmp_path, token):
    "A 24 MiB inline file, sent in pieces: the server never holds the line (32 MiB of base64) in memory."
    data = os.urandom(24 << 20)
    with LocalHub(tmp_path / "hub", token=token) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/big")
        b64 = base64.b64encode(data)
        head = (
            json.dumps({"key": "header", "value": {"summary": "big"}}).encode()
            + b'\n{"key": "file", "value": {"content": "'
        )
        tail = b'", "path": "big.bin", "encoding": "base64"}}\n'
        pieces = [head] + [b64[i:i + (1 << 20)] for i in range(0, len(b64), 1 << 20)] + [tail]
        tracemalloc.start()
        conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=60)
        conn.request("POST", "/api/models/team/big/commit/main", body=iter(pieces), encode_chunked=True,
                     headers={"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {token}"})
        r = conn.getresponse()
        answer = json.loads(r.read())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert r.status == 200 and answer["success"], answer
        assert peak < 12 << 20, f"peak {peak / 2**20:.1f} MiB"
        assert hub.server.store.blobs.read(hashlib.sha256(data).hexdigest(), len(data)) == data


def test_token_from_file_and_environment(tmp_path, token):
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    assert read_token_file(path) == token
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"): read_token_file(tmp_path / "empty")
    with LocalHub(tmp_path / "hub", token_file=path) as hub:
        assert HfApi(endpoint=hub.endpoint, token=token).whoami()["name"] == "localhub"
        with pytest.raises(HfHubHTTPError) as e: HfApi(endpoint=hub.endpoint, token=False).create_repo("team/x")
        assert e.value.response.status_code == 401
        assert _request(hub, "POST", "/api/validate-yaml", b'{"content": ""}', JSON)[0] == 200  # no token: as the Hub
    code = "import sys; from adaptkit.localhub import serve; serve(sys.argv[1], port=0)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "hub2")], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "ADAPTKIT_HUB_TOKEN": token})
    try:
        line = proc.stdout.readline()
        assert "token required to write" in line and token not in line
        endpoint = line.split(" at ")[1].split()[0]
        assert HfApi(endpoint=endpoint, token=token).create_repo("team/env").repo_id == "team/env"
        with pytest.raises(HfHubHTTPError) as e: HfApi(endpoint=endpoint, token="hf_wrong").create_repo("team/y")
        assert e.value.response.status_code == 401
    finally:
        proc.terminate(); proc.wait(10)


# --- LocalHub: token file, store, wire and HTTP checks ------------------------------------------------------------

def test_an_empty_token_file_is_named(tmp_path, caplog):
    for text in ["", "\n\n", "   \n"]:
        path = tmp_path / "token"
        path.write_text(text)
        os.chmod(path, 0o600)
        with pytest.raises(ValueError, match=re.escape(f"the token file {path} is empty")):
            read_token_file(path)
    (tmp_path / "ok").write_text("  hf_abc  \nsecond line\n")
    os.chmod(tmp_path / "ok", 0o600)
    with caplog.at_level(logging.WARNING, logger="adaptkit.localhub"):
        assert read_token_file(tmp_path / "ok") == "hf_abc"
    assert "can be read by other users" not in caplog.text
    os.chmod(tmp_path / "ok", 0o644)
    with caplog.at_level(logging.WARNING, logger="adaptkit.localhub"):
        assert read_token_file(tmp_path / "ok") == "hf_abc"
    assert f"the token file {tmp_path / 'ok'} can be read by other users: chmod 600" in caplog.text


def _raw(hub, method, path, body=b"", headers=None):
    "A raw request with the token: (status, JSON or bytes body)."
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {hub.token}",
                                                   "Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try: return r.status, json.loads(data)
    except ValueError: return r.status, data


def _commit(hub, lines, rev="main", **query):
    body = b"".join(json.dumps(x).encode() + b"\n" for x in [{"key": "header", "value": {"summary": "s"}}, *lines])
    q = "".join(f"?{k}={v}" for k, v in query.items())
    return _raw(hub, "POST", f"/api/models/team/g/commit/{rev}{q}", body, {"Content-Type": "application/x-ndjson"})


def _files(hub):
    return HfApi(endpoint=hub.endpoint, token=hub.token).list_repo_files("team/g")


@pytest.mark.parametrize("method, path, status, message", [
    ("GET", "/no/such/route/here", 404, "LocalHub does not serve GET /no/such/route/here"),
    ("PUT", "/api/repos/create", 405, "PUT is not allowed here (use POST)"),
    ("GET", "/api/models/team/g/commit/main", 405, "GET is not allowed here (use POST)"),
    ("PUT", "/api/models/team/g/branch/b", 405, "PUT is not allowed here (use DELETE or POST)"),
    ("DELETE", "/api/repos/move", 405, "DELETE is not allowed here (use POST)"),
])
def test_unknown_routes_and_methods_are_named(hub, method, path, status, message):
    got, body = _raw(hub, method, path)
    assert (got, body["error"]) == (status, message)


def test_a_bad_content_length_is_400(hub, token):
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
    sock.sendall(b"POST /api/repos/create HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: ten\r\n\r\n{}")
    answer = sock.recv(65536).decode(errors="replace")
    sock.close()
    assert answer.startswith("HTTP/1.1 400") and "the request has a bad Content-Length header" in answer


def test_a_bad_chunk_size_closes_the_connection_and_commits_nothing(hub, token):
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
    sock.sendall(
        b"POST /api/models/team/g/commit/main HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        + token.encode()
        + b"\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    )
    answer = sock.recv(65536)
    sock.close()
    assert b"200 OK" not in answer and _files(hub) == [".gitattributes"]


def test_paths_info_checks_its_paths(hub):
    status, body = _raw(hub, "POST", "/api/models/team/g/paths-info/main", json.dumps({"paths": ["a", 1]}).encode())
    assert (status, body["error"]) == (400, "field 'paths' must be a list of strings")
    status, body = _raw(hub, "POST", "/api/models/team/g/paths-info/main", b"paths=\xff\xfe",
                        {"Content-Type": "application/x-www-form-urlencoded"})
    assert (status, body["error"]) == (400, "the form body is not UTF-8")
    status, body = _raw(hub, "POST", "/api/models/team/g/paths-info/main", b"paths=.gitattributes",
                        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and [e["path"] for e in body] == [".gitattributes"]


def test_preupload_refuses_a_sample_that_is_not_base64(hub):
    files = {"files": [{"path": "a.bin", "size": 3, "sample": "not base64!"}]}
    status, body = _raw(hub, "POST", "/api/models/team/g/preupload/main", json.dumps(files).encode())
    assert (status, body["error"]) == (400, "field 'sample' of files[0] of the request body is not base64")


def test_commit_refuses_missing_branches_and_unknown_operations_and_a_pr_leaves_main(hub):
    file_line = {"key": "file", "value": {"path": "a.txt", "content": base64.b64encode(b"a").decode()}}
    status, body = _commit(hub, [file_line], create_pr="1")
    assert status == 200 and body["pullRequestUrl"].endswith("/team/g/discussions/1")  # on refs/pr/1, main unchanged
    status, body = _commit(hub, [file_line], rev="nobranch")
    assert (status, body["error"]) == (404, "Invalid rev id: nobranch is not a branch of team/g")
    status, body = _commit(hub, [{"key": "renamedFile", "value": {"path": "a.txt"}}])
    assert (status, body["error"]) == (400, "commit line 2: unknown operation 'renamedFile' in field 'key'")
    assert _files(hub) == [".gitattributes"]
    assert _commit(hub, [file_line])[0] == 200 and _files(hub) == [".gitattributes", "a.txt"]  # the control


def test_commit_refuses_lfs_objects_that_are_missing_or_of_another_size(tmp_path, token):
    with LocalHub(tmp_path / "hub", token=token, lfs=True) as hub:
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/g")
        data = b"\0lfs\0" * 100
        oid = hashlib.sha256(data).hexdigest()
        line = {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": oid, "size": len(data)}}
        status, body = _commit(hub, [line])
        assert (status, body["error"]) == (400, f"LFS object {oid} for w.bin was not uploaded (upload it with Xet or "
                                                "the LFS batch API first)")
        verify = json.dumps({"oid": oid, "size": len(data)}).encode()
        status, body = _raw(hub, "POST", "/team/g.git/info/lfs/verify", verify)
        assert (status, body["error"]) == (404, f"LFS object {oid} with {len(data)} bytes is not stored")
        status, body = _raw(hub, "PUT", f"/team/g.git/info/lfs/objects/{oid}", data)
        assert (status, body["error"]) == (400, "LFS upload URL without size/sig: ask the batch API for one")
        batch = json.dumps({"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]}).encode()
        href = _raw(hub, "POST", "/team/g.git/info/lfs/objects/batch", batch)[1]["objects"][0]["actions"]["upload"][
            "href"
        ]
        assert _raw(hub, "PUT", href.split(str(hub.port), 1)[1], data)[0] == 200
        status, body = _commit(hub, [{**line, "value": {**line["value"], "size": len(data) + 1}}])
        assert (status, body["error"]) == (400, f"LFS object {oid} has {len(data)} bytes, not {len(data) + 1}")
        assert _files(hub) == [".gitattributes"]
        assert _commit(hub, [line])[0] == 200 and "w.bin" in _files(hub)  # the control


def test_streamed_inline_content_that_is_cut_or_truncated_is_refused(hub):
    "A line over the 1 MiB line limit streams its base64 `content`: a body ending inside it, or bad padding, is 400."
    content = base64.b64encode(b"x" * (900 << 10)).decode()  # about 1.2 MB of base64
    head = json.dumps({"key": "header", "value": {"summary": "s"}}).encode() + b"\n"
    line = b'{"key": "file", "value": {"path": "big.txt", "content": "' + content.encode()
    ndjson = {"Content-Type": "application/x-ndjson"}
    status, body = _raw(hub, "POST", "/api/models/team/g/commit/main", head + line, ndjson)
    assert (status, body["error"]) == (400, "commit line 2 ends inside field 'content'")
    status, body = _raw(hub, "POST", "/api/models/team/g/commit/main", head + line + b'QQ"}}\n', ndjson)
    assert (status, body["error"]) == (400, "commit line 2: field 'content' is not valid base64 (Incorrect padding)")
    assert _files(hub) == [".gitattributes"] and not list((hub.root / "blobs" / "tmp").iterdir())
    assert _raw(hub, "POST", "/api/models/team/g/commit/main", head + line + b'"}}\n', ndjson)[0] == 200


@pytest.mark.parametrize("name", ["refs/heads/x", "a.lock", "trailing/", "0123456789abcdef0123456789abcdef01234567",
                                  "two..dots", "sp ace"])
def test_invalid_branch_names_are_refused(hub, name, token):
    with pytest.raises(HfHubHTTPError, match=re.escape("Invalid branch or tag name")) as e:
        HfApi(endpoint=hub.endpoint, token=token).create_branch("team/g", branch=name)
    assert e.value.response.status_code == 400


def test_a_blob_missing_from_the_store_is_a_500_naming_it(hub, tmp_path, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.upload_file(path_or_fileobj=b"kept", path_in_repo="k.txt", repo_id="team/g")
    sha = hashlib.sha256(b"kept").hexdigest()
    hub.server.store.blobs.path(sha).unlink()
    status, body = _raw(hub, "GET", "/team/g/resolve/main/k.txt")
    assert status == 500 and body["error"] == f"blob {sha} is missing from the LocalHub store at {hub.root / 'blobs'}"


# --- the wire helpers, directly: known answers and every refusal ---------------------------------------------------

@pytest.mark.parametrize("header, size, want", [
    ("bytes=0-9", 100, (0, 10)), ("bytes=90-", 100, (90, 100)), ("bytes=-10", 100, (90, 100)),
    ("bytes=-500", 100, (0, 100)), ("bytes=95-200", 100, (95, 100)), (" bytes=0-0 ", 100, (0, 1)),
    (None, 100, None), ("bytes=-", 100, None), ("bytes=0-1,5-6", 100, None), ("items=0-1", 100, None),
])
def test_parse_range_known_answers(header, size, want):
    from adaptkit.localhub.wire import parse_range
    assert parse_range(header, size) == want


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=100-200", "bytes=5-4", "bytes=-0"])
def test_unsatisfiable_ranges_are_416(header):
    from adaptkit.localhub.storage import HubError
    from adaptkit.localhub.wire import parse_range
    with pytest.raises(HubError, match=re.escape(f"Range {header} is not satisfiable for 100 bytes")) as e:
        parse_range(header, 100)
    assert e.value.status == 416 and e.value.headers == {"Content-Range": "bytes */100"}


@pytest.mark.parametrize("header, want", [
    ("LocalHost:8000", ("localhost", 8000)), ("example.org.", ("example.org", None)), ("[::1]:9", ("::1", 9)),
    ("[::1]", ("::1", None)), (" 127.0.0.1 ", ("127.0.0.1", None)), ("a:b:c", (None, None)), ("[zz]:1", (None, None)),
    ("", (None, None)), ("host:port", (None, None)),
])
def test_host_and_port_known_answers(header, want):
    from adaptkit.localhub.wire import host_and_port
    assert host_and_port(header) == want


def test_json_body_and_field_refusals_name_what_is_wrong():
    from adaptkit.localhub.storage import HubError
    from adaptkit.localhub.wire import field, json_body
    assert json_body(b"  ") == {} and json_body(b'{"a": 1}') == {"a": 1}
    for raw, message in [(b"{nope", "the commit line 3 is not valid JSON (Expecting property name"),
                         (b"[1]", "the commit line 3 must be a JSON object, not list"),
                         (b"[" * 100_000 + b"]" * 100_000, "the commit line 3 is not valid JSON (")]:
        with pytest.raises(HubError, match=re.escape(message)) as e:
            json_body(raw, "commit line 3")
        assert e.value.status == 400
    body = {"n": 3, "flag": True, "none": None, "s": "x"}
    assert field(body, "n", int) == 3 and field(body, "flag", bool) is True and field(body, "none", int, 7) == 7
    assert field(body, "absent", str, None) is None and field(body, "n", (int, str)) == 3
    for name, types, message in [("absent", str, "the body has no 'absent' field"),
                                 ("none", int, "the body has no 'none' field"),
                                 ("flag", int, "field 'flag' of the body must be int, not bool"),
                                 ("s", (int, float), "field 's' of the body must be int or float, not str")]:
        with pytest.raises(HubError, match=re.escape(message)) as e:
            field(body, name, types, what="the body")
        assert e.value.status == 400


@pytest.mark.parametrize("repo_id", ["a/b", "Org-1/model.v2_x", "a" * 96 + "/b", "x/" + "y" * 96])
def test_valid_repo_ids_pass(repo_id):
    from adaptkit.localhub.storage import check_repo_id
    assert check_repo_id(repo_id) == repo_id


@pytest.mark.parametrize("repo_id", ["a", "a/b/c", "/b", "a/", "a--x/b", "a/b..c", "a/b.git", "-a/b", "a/b-", ".a/b",
                                     "a/b.", "a" * 97 + "/b", "a b/c", "a/é", None, 3, "datasets/x", "api/x"])
def test_invalid_repo_ids_are_400(repo_id):
    from adaptkit.localhub.storage import HubError, check_repo_id
    with pytest.raises(
        HubError, match=re.escape(f"Invalid repo id {str(repo_id)[:200]!r}: expected 'namespace/name'")
    ) as e:
        check_repo_id(repo_id)
    assert e.value.status == 400


@pytest.mark.parametrize("path", ["a", "a/b.txt", ".gitattributes", "x/.hidden/y", "a" * 1000, "dir/file with space",
                                  "a\\b", "x/a..b", "notes\\v1.txt"])
def test_safe_paths_pass(path):
    from adaptkit.localhub.storage import check_path
    assert check_path(path) == path


@pytest.mark.parametrize("path", ["", "/abs", "a//b", "a/", "./a", "a/.git/config", ".git", "a\\.Git\\config",
                                  "a\nb", "a\x00b", "a" * 1001, None, 7])
def test_unsafe_paths_are_400(path):
    from adaptkit.localhub.storage import HubError, check_path
    with pytest.raises(HubError, match=re.escape(f"Invalid path {str(path)[:200]!r}: use a relative path")) as e:
        check_path(path)
    assert e.value.status == 400


@pytest.mark.parametrize("name, ok", [("main", True), ("v1.0", True), ("round-2/final", True), ("_x", True),
                                      ("a" * 200, True), ("a" * 201, False), ("-x", False), (".x", False),
                                      ("a//b", False), ("a..b", False), ("x.lock", False), ("refs/heads/x", False),
                                      ("0" * 40, False), ("0" * 39, True), ("A" * 40, True), (None, False),
                                      ("", False)])
def test_ref_names(name, ok):
    from adaptkit.localhub.storage import HubError, check_ref_name
    if ok: assert check_ref_name(name) == name
    else:
        with pytest.raises(HubError, match=re.escape(f"Invalid branch or tag name {str(name)[:200]!r}")):
            check_ref_name(name)


@pytest.mark.parametrize("sample", ["!!!!", "aGVsbG8=!!", "a b c d", "aGVsbG8"])
def test_preupload_refuses_an_invalid_base64_sample(hub, sample):
    """Issue 38, item 11. Before, a sample with characters outside base64 was decoded leniently (they were dropped)
    and its file classified from what was left."""
    files = {"files": [{"path": "a.bin", "size": 3, "sample": sample}]}
    status, body = _raw(hub, "POST", "/api/models/team/g/preupload/main", json.dumps(files).encode())
    assert (status, body["error"]) == (400, "field 'sample' of files[0] of the request body is not base64")


def test_a_second_server_on_one_root_gets_a_clear_message_from_the_cli(tmp_path, capsys):
    """Issue 38, item 11. Before, `adaptkit hub serve` on a root another LocalHub serves printed "internal error
    (RuntimeError)"; a holder that had not written its pid yet read as "pid unknown"."""
    from adaptkit.cli import main
    with LocalHub(tmp_path / "hub"):
        assert main(["hub", "serve", "--root", str(tmp_path / "hub"), "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert "internal error" not in err and f"already used by another LocalHub (pid {os.getpid()})" in err
        lock = tmp_path / "hub" / "localhub.lock"
        lock.write_text("")  # a holder between taking the lock and writing its pid
        with pytest.raises(RuntimeError, match="already used by another LocalHub, which has not written its pid"):
            LocalHub(tmp_path / "hub").start()
