"""A team mirror (`LocalHub(upstream=...)`, `adaptkit hub serve --upstream`) in front of a second LocalHub as its
upstream, driven by the stock client: fetched once, pinned by commit, verified, kept, served with the upstream
stopped or `offline`; and `export_repos`/`import_repos` (`adaptkit hub export|import`) between two hubs."""
import http.client
import json
import re
import socket
import tarfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from adaptkit.cli import main
from adaptkit.localhub.mirror import MirrorStore, export_repos, import_repos, parse_repo_spec
from adaptkit.localhub.server import LocalHub
from adaptkit.localhub.storage import RepoStore

UP_TOKEN, MIRROR_TOKEN = "hf_upstream_token", "hf_mirror_token"
FILES = {"config.json": b'{"model_type": "llama"}', "sub/notes.txt": b"nested\n",
         "model.safetensors": bytes(range(256)) * 40}


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the upstream stores model.safetensors with LFS
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture
def upstream(tmp_path):
    "A LocalHub with team/tiny (a regular file, a nested one, an LFS file) whose main is tagged v1."
    with LocalHub(tmp_path / "upstream", token=UP_TOKEN, lfs=True) as hub:
        api = HfApi(endpoint=hub.endpoint, token=UP_TOKEN)
        api.create_repo("team/tiny")
        folder = tmp_path / "art"
        for name, data in FILES.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        hub.first = api.upload_folder(folder_path=folder, repo_id="team/tiny").oid
        api.create_tag("team/tiny", tag="v1")
        yield hub


def _mirror(tmp_path, upstream, name="mirror", **kw):
    return LocalHub(tmp_path / name, upstream=upstream.endpoint, upstream_token=UP_TOKEN, **kw)


def _asked(hub) -> int: return sum(hub.counts.values())


def _snapshot(endpoint, tmp_path, cache, token=False, **kw) -> tuple:
    "(commit folder name, {path: bytes}) of a snapshot_download through `endpoint` into a fresh cache."
    got = Path(snapshot_download("team/tiny", endpoint=endpoint, token=token, cache_dir=tmp_path / cache, **kw))
    return got.name, {p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()}


def _tree(endpoint, rev=None) -> list:
    files = HfApi(endpoint=endpoint, token=False).list_repo_tree("team/tiny", revision=rev, recursive=True)
    return sorted((f.path, getattr(f, "size", None), getattr(f, "blob_id", None), getattr(f, "lfs", None))
                  for f in files)


def test_first_pull_fetches_the_commit_then_the_mirror_serves_it_with_the_upstream_stopped(upstream, tmp_path):
    sha, files = _snapshot(upstream.endpoint, tmp_path, "c0", token=UP_TOKEN)
    assert sha == upstream.first and files == {**files, **FILES}
    with _mirror(tmp_path, upstream) as mirror:
        served = upstream.counts["resolve"]
        assert _snapshot(mirror.endpoint, tmp_path, "c1") == (sha, files)  # byte-identical, the upstream's commit id
        assert upstream.counts["resolve"] - served == 2 * len(files)  # each file fetched once (a HEAD, a GET)
        assert _tree(mirror.endpoint) == _tree(upstream.endpoint) and any(t[3] for t in _tree(mirror.endpoint))
        asked = _asked(upstream)
        assert _snapshot(mirror.endpoint, tmp_path, "c2", revision=sha) == (sha, files)  # held: upstream not asked
        assert _snapshot(mirror.endpoint, tmp_path, "c3") == (sha, files)  # main within `refresh`: not asked either
        assert _asked(upstream) == asked
        upstream.stop()
        got = hf_hub_download("team/tiny", "model.safetensors", endpoint=mirror.endpoint, token=False,
                              cache_dir=tmp_path / "c4")
        assert Path(got).read_bytes() == FILES["model.safetensors"] and Path(got).parent.name == sha
        assert [m.id for m in HfApi(endpoint=mirror.endpoint).list_models()] == ["team/tiny"]
    with _mirror(tmp_path, upstream, refresh=0) as mirror:  # restarted, upstream gone, main re-checked: held main
        assert _snapshot(mirror.endpoint, tmp_path, "c5") == (sha, files)
        with pytest.raises(RepositoryNotFoundError) as e:  # a 404 the client raises at once, naming the upstream
            HfApi(endpoint=mirror.endpoint).model_info("team/never-fetched")
        assert upstream.endpoint in str(e.value) and "could not be reached" in str(e.value)


def test_offline_mirror_serves_what_it_holds_and_refuses_the_rest(upstream, tmp_path):
    with _mirror(tmp_path, upstream) as mirror: _snapshot(mirror.endpoint, tmp_path, "c0")
    asked = _asked(upstream)
    with _mirror(tmp_path, upstream, offline=True) as mirror:
        api = HfApi(endpoint=mirror.endpoint, token=False)
        assert _snapshot(mirror.endpoint, tmp_path, "c1")[0] == upstream.first
        assert api.model_info("team/tiny", revision="v1").sha == upstream.first
        with pytest.raises(RepositoryNotFoundError, match="team/other is not mirrored here .*offline"):
            api.model_info("team/other")
        with pytest.raises(RevisionNotFoundError, match="mirrored here, but not at that revision"):
            api.list_repo_files("team/tiny", revision="dev")
        assert not api.repo_exists("team/other") and not api.revision_exists("team/tiny", "0" * 40)
    assert _asked(upstream) == asked  # offline: not one request upstream


def test_a_commit_stays_pinned_when_the_upstream_moves_main(upstream, tmp_path):
    up = HfApi(endpoint=upstream.endpoint, token=UP_TOKEN)
    first = upstream.first
    with _mirror(tmp_path, upstream, refresh=0) as live, _mirror(tmp_path, upstream, "lazy", refresh=3600) as lazy:
        for m in (live, lazy): _snapshot(m.endpoint, tmp_path, f"c-{m.port}")
        second = up.upload_file(path_or_fileobj=b'{"model_type": "mistral"}', path_in_repo="config.json",
                                repo_id="team/tiny").oid
        up.delete_tag("team/tiny", tag="v1")
        up.create_tag("team/tiny", tag="v2", revision=second)
        assert second != first
        asked = _asked(upstream)
        [listed] = HfApi(endpoint=live.endpoint).list_models()  # a listing shows what is held and asks nothing
        assert listed.sha == first and _asked(upstream) == asked
        got = hf_hub_download("team/tiny", "config.json", revision=first, endpoint=live.endpoint, token=False,
                              cache_dir=tmp_path / "old")
        assert Path(got).read_bytes() == FILES["config.json"] and _asked(upstream) == asked  # the pinned commit, held
        # online with refresh=0, main is the upstream's: the new commit is fetched, the mirror's main moved
        assert HfApi(endpoint=live.endpoint).model_info("team/tiny").sha == second
        assert _snapshot(live.endpoint, tmp_path, "new")[1]["config.json"] == b'{"model_type": "mistral"}'
        assert HfApi(endpoint=live.endpoint).model_info("team/tiny", revision="v2").sha == second
        refs = HfApi(endpoint=live.endpoint).list_repo_refs("team/tiny")
        assert {b.name: b.target_commit for b in refs.branches} == {"main": second}
        assert {t.name: t.target_commit for t in refs.tags} == {"v1": first, "v2": second}  # v1 held: kept
        asked = _asked(upstream)  # within `refresh`, the lazy mirror's main is still the one it fetched
        assert HfApi(endpoint=lazy.endpoint).model_info("team/tiny").sha == first and _asked(upstream) == asked
        upstream.stop()  # unreachable: the live mirror serves the main it holds
        assert _snapshot(live.endpoint, tmp_path, "down")[0] == second
        assert HfApi(endpoint=live.endpoint).model_info("team/tiny", revision=first).sha == first


def test_a_mirrored_repo_is_read_only_and_the_mirrors_own_repos_are_its_own(upstream, tmp_path):
    with _mirror(tmp_path, upstream) as mirror:
        api = HfApi(endpoint=mirror.endpoint, token="any")
        api.model_info("team/tiny")
        for write in (lambda: api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/tiny"),
                      lambda: api.create_branch("team/tiny", branch="dev"),
                      lambda: api.update_repo_settings("team/tiny", gated="auto")):
            with pytest.raises(HfHubHTTPError, match="read-only: push to the upstream") as e: write()
            assert e.value.response.status_code == 403
        assert api.list_repo_files("team/tiny") == [".gitattributes", *sorted(FILES)]
        api.create_repo("team/own")
        commit = api.upload_file(path_or_fileobj=b"mine", path_in_repo="a.txt", repo_id="team/own").oid
        asked = _asked(upstream)
        assert api.model_info("team/own").sha == commit and _asked(upstream) == asked  # never looked up upstream
        assert not HfApi(endpoint=upstream.endpoint, token=UP_TOKEN).repo_exists("team/own")
        api.delete_repo("team/tiny")  # drops the copy: the next request fetches it again
        assert not mirror.server.store.held("model", "team/tiny")
        assert api.model_info("team/tiny").sha == upstream.first


def test_a_private_upstream_repo_is_mirrored_only_behind_the_mirrors_token(upstream, tmp_path):
    HfApi(endpoint=upstream.endpoint, token=UP_TOKEN).update_repo_settings("team/tiny", private=True)
    with _mirror(tmp_path, upstream) as open_mirror:
        with pytest.raises(HfHubHTTPError, match="private on .* no token of its own") as e:
            HfApi(endpoint=open_mirror.endpoint, token=False).model_info("team/tiny")
        assert e.value.response.status_code == 403
    with _mirror(tmp_path, upstream, "guarded", token=MIRROR_TOKEN) as mirror:
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=mirror.endpoint, token=False).model_info("team/tiny")
        assert _snapshot(mirror.endpoint, tmp_path, "c", token=MIRROR_TOKEN)[0] == upstream.first
        assert HfApi(endpoint=mirror.endpoint, token=MIRROR_TOKEN).model_info("team/tiny").private
    with LocalHub(tmp_path / "no-access", upstream=upstream.endpoint, upstream_token=False) as mirror:
        with pytest.raises(RepositoryNotFoundError, match="not mirrored here"):
            HfApi(endpoint=mirror.endpoint, token=False).model_info("team/tiny")


@pytest.mark.parametrize("path", ["config.json", "model.safetensors"])  # checked by git blob id, by sha256
def test_bytes_that_differ_from_the_upstream_tree_are_refused_and_nothing_is_kept(upstream, tmp_path, path,
                                                                                  monkeypatch):
    with _mirror(tmp_path, upstream) as mirror:
        store = mirror.server.store
        real = store.api.hf_hub_download
        def tampered(repo_id, filename, **kw):
            got = Path(real(repo_id, filename, **kw))
            if filename == path:
                data = bytearray(got.read_bytes()); data[0] ^= 1
                got.unlink(); got.write_bytes(bytes(data))  # the cache's link points at a blob: replace the file
            return str(got)
        monkeypatch.setattr(store.api, "hf_hub_download", tampered)
        with pytest.raises(HfHubHTTPError, match=f"sent {path} of model team/tiny .* other bytes than its tree") as e:
            HfApi(endpoint=mirror.endpoint).model_info("team/tiny")
        assert e.value.response.status_code == 502
        assert store.held("model", "team/tiny") is None and not list(store.tmp.iterdir())
        monkeypatch.setattr(store.api, "hf_hub_download", real)
        assert _snapshot(mirror.endpoint, tmp_path, "c")[1]["config.json"] == FILES["config.json"]


@pytest.fixture
def two_repos(tmp_path):
    "A running LocalHub with model team/a (two commits, tag v1 on the first) and dataset team/d."
    with LocalHub(tmp_path / "a") as hub:
        api = HfApi(endpoint=hub.endpoint, token=False)
        api.create_repo("team/a")
        hub.v1 = api.upload_file(path_or_fileobj=b"one", path_in_repo="w/x.txt", repo_id="team/a").oid
        api.create_tag("team/a", tag="v1")
        hub.main = api.upload_file(path_or_fileobj=bytes(range(256)) * 9, path_in_repo="w.bin", repo_id="team/a").oid
        api.create_repo("team/d", repo_type="dataset")
        api.upload_file(path_or_fileobj=b"a,b\n1,2\n", path_in_repo="data.csv", repo_id="team/d", repo_type="dataset")
        yield hub


def _files(endpoint, repo_id, rev, cache, repo_type="model") -> tuple:
    api = HfApi(endpoint=endpoint, token=False)
    out = {}
    for f in api.list_repo_files(repo_id, revision=rev, repo_type=repo_type):
        got = Path(hf_hub_download(repo_id, f, revision=rev, repo_type=repo_type, endpoint=endpoint, token=False,
                                   cache_dir=cache))
        out[f] = (got.read_bytes(), got.parent.name if "/" not in f else got.parent.parent.name)
    return api.repo_info(repo_id, revision=rev, repo_type=repo_type).sha, out


def test_export_then_import_gives_byte_identical_downloads_on_another_hub(two_repos, tmp_path):
    out = export_repos(two_repos.root, ["team/a", "team/a@v1", "datasets/team/d"], tmp_path / "bundle.tar")
    assert [(r["id"], r["commits"], r["tags"]) for r in out["repos"]] == [
        ("team/a", [two_repos.main, two_repos.v1], ["v1"]), ("team/d", out["repos"][1]["commits"], [])]
    with tarfile.open(tmp_path / "bundle.tar") as tar: names = tar.getnames()
    assert names[:2] == ["manifest.json", "manifest.json.sha256"] and len(names) == 2 + out["blobs"]
    summary = import_repos(tmp_path / "bundle.tar", tmp_path / "b")
    assert [(r["id"], r["refs"], r["tags"]) for r in summary["repos"]] == [("team/a", ["main"], ["v1"]),
                                                                             ("team/d", ["main"], [])]
    with LocalHub(tmp_path / "b") as b:
        for rev in ("main", "v1", two_repos.v1):
            assert _files(b.endpoint, "team/a", rev, tmp_path / "cb") == _files(two_repos.endpoint, "team/a", rev,
                                                                               tmp_path / "ca")
        assert (_files(b.endpoint, "team/d", None, tmp_path / "cb", "dataset")
                == _files(two_repos.endpoint, "team/d", None, tmp_path / "ca", "dataset"))
        assert {m.id for m in HfApi(endpoint=b.endpoint).list_models()} == {"team/a"}
    assert import_repos(tmp_path / "bundle.tar", tmp_path / "b")["repos"][0]["commits"] == out["repos"][0]["commits"]
    with LocalHub(tmp_path / "b", offline=True) as b:  # imported repos are mirrored: read-only behind a mirror
        with pytest.raises(HfHubHTTPError, match="read-only"):
            HfApi(endpoint=b.endpoint).upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="team/a")


def test_an_export_at_a_tag_alone_gets_a_main(two_repos, tmp_path):
    export_repos(two_repos.root, ["team/a@v1"], tmp_path / "v1.tar")
    [r] = import_repos(tmp_path / "v1.tar", tmp_path / "b")["repos"]
    assert r["refs"] == ["main"] and r["tags"] == ["v1"] and "main points at its first commit" in r["note"]
    with LocalHub(tmp_path / "b") as b: assert HfApi(endpoint=b.endpoint).model_info("team/a").sha == two_repos.v1


def _flip(path: Path, member: str, at: int = 0) -> None:
    with tarfile.open(path) as tar: offset = tar.getmember(member).offset_data
    with open(path, "r+b") as f:
        f.seek(offset + at); byte = f.read(1); f.seek(offset + at); f.write(bytes([byte[0] ^ 1]))


def test_a_damaged_export_is_refused_naming_the_member_and_nothing_is_imported(two_repos, tmp_path):
    export_repos(two_repos.root, ["team/a"], tmp_path / "good.tar")
    with tarfile.open(tmp_path / "good.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    sha = manifest["repos"][0]["commits"][0]["files"]["w.bin"]["sha256"]
    (tmp_path / "bad.tar").write_bytes((tmp_path / "good.tar").read_bytes())
    _flip(tmp_path / "bad.tar", f"blobs/{sha}", 100)
    with pytest.raises(ValueError, match=f"member blobs/{sha} is damaged \\(used by model team/a: w.bin\\)"):
        import_repos(tmp_path / "bad.tar", tmp_path / "b")
    assert not list((tmp_path / "b" / "repos").rglob("*")) and not list((tmp_path / "b" / "blobs").rglob("??/*"))
    (tmp_path / "bad.tar").write_bytes((tmp_path / "good.tar").read_bytes())
    _flip(tmp_path / "bad.tar", "manifest.json", 10)
    with pytest.raises(ValueError, match="member manifest.json is damaged"):
        import_repos(tmp_path / "bad.tar", tmp_path / "b")
    with tarfile.open(tmp_path / "good.tar") as tar: cut = tar.getmember(f"blobs/{sha}").offset_data + 1000
    (tmp_path / "bad.tar").write_bytes((tmp_path / "good.tar").read_bytes()[:cut])  # a copy that stopped half-way
    with pytest.raises(ValueError, match="bad.tar"):
        import_repos(tmp_path / "bad.tar", tmp_path / "b")
    assert not list((tmp_path / "b" / "repos").rglob("*"))
    assert import_repos(tmp_path / "good.tar", tmp_path / "b")["repos"][0]["commits"] == [two_repos.main]


def test_import_refuses_to_overwrite_a_repo_of_the_hubs_own_and_export_names_what_it_lacks(two_repos, tmp_path):
    export_repos(two_repos.root, ["team/a"], tmp_path / "a.tar")
    with LocalHub(tmp_path / "b") as b:
        HfApi(endpoint=b.endpoint).create_repo("team/a")
        with pytest.raises(ValueError, match="cannot import into .* already used by another LocalHub"):
            import_repos(tmp_path / "a.tar", tmp_path / "b")
    with pytest.raises(ValueError, match="model team/a exists in .* as a repo of that hub's own"):
        import_repos(tmp_path / "a.tar", tmp_path / "b")
    with pytest.raises(ValueError, match="holds no model team/nope"):
        export_repos(two_repos.root, ["team/nope"], tmp_path / "x.tar")
    with pytest.raises(ValueError, match="has no revision 'v9'"):
        export_repos(two_repos.root, ["team/a@v9"], tmp_path / "x.tar")
    assert not (tmp_path / "x.tar").exists()
    assert parse_repo_spec("datasets/team/d@v1") == ("dataset", "team/d", "v1")
    assert parse_repo_spec("team/a") == ("model", "team/a", "main")
    with pytest.raises(ValueError, match="'team'"): parse_repo_spec("team")


def test_cli_hub_export_and_import(two_repos, tmp_path, capsys):
    assert main(["hub", "export", "--root", str(two_repos.root), "--repo", "team/a@v1", "datasets/team/d",
                 "-o", str(tmp_path / "out.tar")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["id"] for r in out["repos"]] == ["team/a", "team/d"] and out["repos"][0]["commits"] == [two_repos.v1]
    assert main(["hub", "import", str(tmp_path / "out.tar"), "--root", str(tmp_path / "b")]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["repos"]] == ["team/a",
                                                                                                        "team/d"]
    _flip(tmp_path / "out.tar", "manifest.json")
    assert main(["hub", "import", "--file", str(tmp_path / "out.tar"), "--root", str(tmp_path / "c")]) == 2
    assert "adaptkit hub import: error:" in (err := capsys.readouterr().err) and "manifest.json is damaged" in err


def test_mirror_store_is_what_a_mirror_hub_opens(upstream, tmp_path):
    with _mirror(tmp_path, upstream) as mirror, LocalHub(tmp_path / "plain") as plain:
        assert type(mirror.server.store) is MirrorStore and mirror.server.store.online
        assert type(plain.server.store) is RepoStore
    with LocalHub(tmp_path / "off", offline=True) as off:
        assert type(off.server.store) is MirrorStore and not off.server.store.online
        assert "offline=True" in repr(off)


@contextmanager
def _hanging_upstream():
    "The URL of a server that accepts connections and never answers (a Hub behind a stuck proxy)."
    s = socket.create_server(("127.0.0.1", 0), backlog=64)
    s.settimeout(0.05)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try: held.append(s.accept()[0])
            except OSError: pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try: yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        for c in held: c.close()
        s.close()


def test_a_hanging_upstream_costs_a_held_branch_a_short_deadline_once_and_marks_it_stale(upstream, tmp_path):
    """Issue 38, item 13. The mirror exists for the day the upstream is down: by branch it serves what it holds at
    once (a short deadline, then the last known ref, marked stale), not after the client's own timeouts."""
    with _mirror(tmp_path, upstream) as mirror: _snapshot(mirror.endpoint, tmp_path, "c0")
    with _hanging_upstream() as url, LocalHub(tmp_path / "mirror", upstream=url, upstream_token=False,
                                              refresh=0) as mirror:
        start = time.monotonic()
        got = hf_hub_download("team/tiny", "config.json", endpoint=mirror.endpoint, token=False,
                              cache_dir=tmp_path / "c1")
        assert Path(got).read_bytes() == FILES["config.json"] and time.monotonic() - start < 6
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", mirror.port, timeout=30)
        conn.request("GET", "/api/models/team/tiny/revision/main")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["sha"] == upstream.first
        assert url in r.headers["X-LocalHub-Stale"] and "main" in r.headers["X-LocalHub-Stale"]
        assert time.monotonic() - start < 1  # the upstream just failed: not asked again for a while
        conn.request("GET", f"/api/models/team/tiny/revision/{upstream.first}")  # by commit: nothing is stale
        r = conn.getresponse()
        assert r.status == 200 and r.read() and "X-LocalHub-Stale" not in r.headers
        conn.close()


def test_an_upstream_down_at_first_fetch_is_named_at_once(upstream, tmp_path):
    url = upstream.endpoint
    upstream.stop()
    with LocalHub(tmp_path / "mirror", upstream=url, upstream_token=False) as mirror:
        start = time.monotonic()
        with pytest.raises(RepositoryNotFoundError, match=f"{re.escape(url)} .*could not be reached"):
            hf_hub_download("team/tiny", "config.json", endpoint=mirror.endpoint, token=False,
                            cache_dir=tmp_path / "c1")
        assert time.monotonic() - start < 5  # no retries of a 5xx: the answer names the upstream at once


@pytest.mark.parametrize("options, message", [
    ({"upstream": "huggingface.co"}, "upstream='huggingface.co': give the Hub's URL with its scheme"),
    ({"upstream": "ftp://hub.example"}, "give the Hub's URL with its scheme"),
    ({"upstream": "https://huggingface.co", "refresh": -5}, "refresh=-5: seconds, 0 or more"),
    ({"offline": True, "refresh": float("nan")}, "refresh=nan"),
])
def test_mirror_options_are_refused_at_start(tmp_path, options, message):
    with pytest.raises(ValueError, match=re.escape(message)): LocalHub(tmp_path / "m", **options)
    assert not (tmp_path / "m").exists()


def test_cli_hub_serve_refuses_an_upstream_without_scheme(tmp_path, capsys):
    assert main(["hub", "serve", "--root", str(tmp_path / "m"), "--upstream", "huggingface.co"]) == 2
    assert "give the Hub's URL with its scheme" in capsys.readouterr().err
    assert main(["hub", "serve", "--root", str(tmp_path / "m"), "--refresh", "-5", "--offline"]) == 2
    assert "refresh=-5" in capsys.readouterr().err


# Issue 36, item 5: a mirror keeps the upstream's LFS files in its Xet store, as a push with Xet on would.
XET_FILES = {"config.json": b'{"model_type": "llama"}', "a.bin": b"\0" + bytes(range(251)) * 1200,
             "model.safetensors": bytes(reversed(range(256))) * 1500}  # two LFS files (binary), a regular one


@pytest.fixture
def xet_upstream(tmp_path, monkeypatch):
    "A LocalHub with team/x pushed by the stock client with Xet on (its LFS files stored with Xet)."
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)  # the client as it comes
    with LocalHub(tmp_path / "upstream", token=UP_TOKEN) as hub:
        api = HfApi(endpoint=hub.endpoint, token=UP_TOKEN)
        api.create_repo("team/x")
        folder = tmp_path / "art"
        folder.mkdir()
        for name, data in XET_FILES.items(): (folder / name).write_bytes(data)
        hub.first = api.upload_folder(folder_path=folder, repo_id="team/x").oid
        hub.infos = {i.path: i for i in api.get_paths_info("team/x", list(XET_FILES))}
        assert hub.infos["model.safetensors"].xet_hash and hub.infos["a.bin"].xet_hash  # pushed through Xet
        assert hub.infos["config.json"].xet_hash is None
        yield hub


def _xet_state(root: Path) -> tuple:
    "(xorb names, Xet file names) under a hub's root."
    return (sorted(p.name for p in (root / "xet" / "xorbs").glob("*/*")),
            sorted(p.stem for p in (root / "xet" / "files").glob("*/*.json")))


def _get(hub, path, cache, repo="team/x") -> bytes:
    return Path(hf_hub_download(repo, path, endpoint=hub.endpoint, token=False, cache_dir=cache)).read_bytes()


def test_a_mirrored_lfs_file_is_served_with_its_xet_hash_to_clients_with_xet_on_and_off(xet_upstream, tmp_path,
                                                                                         monkeypatch):
    up, sha = xet_upstream, xet_upstream.infos["model.safetensors"].lfs.sha256
    with _mirror(tmp_path, up) as mirror:
        api = HfApi(endpoint=mirror.endpoint, token=False)
        infos = {i.path: i for i in api.get_paths_info("team/x", list(XET_FILES))}
        for p, i in infos.items():  # the upstream's tree, and the Xet hash a pushed file gets
            assert (i.xet_hash, i.lfs, i.blob_id) == (up.infos[p].xet_hash, up.infos[p].lfs, up.infos[p].blob_id)
        assert mirror.server.store.blobs.size(sha) is None  # stored once: in the Xet store, not also as a blob
        assert _get(mirror, "model.safetensors", tmp_path / "on") == XET_FILES["model.safetensors"]
        assert mirror.counts["cas-reconstruction"] >= 1 and mirror.counts["cas-fetch"] >= 1  # through the CAS
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # a client without Xet
        resolved = mirror.counts["resolve"]
        assert _get(mirror, "model.safetensors", tmp_path / "off") == XET_FILES["model.safetensors"]
        assert mirror.counts["resolve"] - resolved == 2  # HEAD, then the plain bytes rebuilt from the xorbs
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    asked = _asked(up)
    with _mirror(tmp_path, up, offline=True) as mirror:  # offline: what it holds, with Xet on and off
        [info] = HfApi(endpoint=mirror.endpoint).get_paths_info("team/x", ["a.bin"])
        assert info.xet_hash == up.infos["a.bin"].xet_hash
        assert _get(mirror, "a.bin", tmp_path / "on2") == XET_FILES["a.bin"] and mirror.counts["cas-reconstruction"]
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        assert _get(mirror, "a.bin", tmp_path / "off2") == XET_FILES["a.bin"]
    assert _asked(up) == asked


def test_a_held_file_is_not_stored_again_and_its_xorbs_live_while_a_repo_names_them(xet_upstream, tmp_path):
    up = xet_upstream
    upapi = HfApi(endpoint=up.endpoint, token=UP_TOKEN)
    upapi.create_repo("team/y")  # the same model file in a second repo, and a new one
    upapi.upload_file(path_or_fileobj=XET_FILES["model.safetensors"], path_in_repo="model.safetensors",
                      repo_id="team/y")
    upapi.upload_file(path_or_fileobj=b"\0new" * 5000, path_in_repo="b.bin", repo_id="team/y")
    with _mirror(tmp_path, up, token=MIRROR_TOKEN) as mirror:
        api, root, store = HfApi(endpoint=mirror.endpoint, token=MIRROR_TOKEN), mirror.root, mirror.server.store
        api.model_info("team/x")
        xorbs, files = _xet_state(root)
        assert xorbs and len(files) == 2  # a.bin and model.safetensors
        real, asked = store.api.hf_hub_download, []
        store.api.hf_hub_download = lambda repo_id, filename, **kw: asked.append(filename) or real(repo_id, filename,
                                                                                                   **kw)
        [info] = api.get_paths_info("team/y", ["model.safetensors"])
        assert info.xet_hash == up.infos["model.safetensors"].xet_hash
        assert sorted(asked) == [".gitattributes", "b.bin"]  # model.safetensors is held: not downloaded
        now = _xet_state(root)
        assert set(xorbs) < set(now[0]) and len(now[1]) == 3  # b.bin's xorb is new; model.safetensors' are not
        assert mirror.gc(older_than=0) == {"files": 0, "xorbs": 0, "bytes": 0}  # all named
        api.delete_repo("team/x")  # frees nothing at once; model.safetensors is still named by team/y
        assert len(_xet_state(root)[1]) == 3 and mirror.gc(older_than=0)["files"] == 1  # a.bin's
        assert _get(mirror, "model.safetensors", tmp_path / "c", "team/y") == XET_FILES["model.safetensors"]
        assert len(_xet_state(root)[1]) == 2
        api.delete_repo("team/y")
        assert len(_xet_state(root)[1]) == 2 and mirror.gc(older_than=0)["files"] == 2
        assert _xet_state(root) == ([], [])  # nothing names them any more: reclaimed


def test_tampered_upstream_bytes_leave_no_blob_and_no_xorb_of_theirs(xet_upstream, tmp_path, monkeypatch):
    with _mirror(tmp_path, xet_upstream) as mirror:
        store = mirror.server.store
        store.workers, real, asked = 1, store.api.hf_hub_download, []  # a.bin is stored before the bad file comes
        def tampered(repo_id, filename, **kw):
            asked.append(filename)
            got = Path(real(repo_id, filename, **kw))
            if filename == "model.safetensors":
                data = bytearray(got.read_bytes()); data[-1] ^= 1
                got.unlink(); got.write_bytes(bytes(data))
            return str(got)
        monkeypatch.setattr(store.api, "hf_hub_download", tampered)
        with pytest.raises(HfHubHTTPError, match="sent model.safetensors of model team/x .* other bytes") as e:
            HfApi(endpoint=mirror.endpoint).model_info("team/x")
        assert e.value.response.status_code == 502 and asked.index("a.bin") < asked.index("model.safetensors")
        assert store.held("model", "team/x") is None and not list(store.tmp.iterdir())
        xorbs, files = _xet_state(mirror.root)
        assert files == [xet_upstream.infos["a.bin"].xet_hash]  # only a.bin's: kept for a gc, as a push's would be
        assert mirror.gc(older_than=0)["files"] == 1 and _xet_state(mirror.root) == ([], [])  # nothing names it
        for p in ("a.bin", "model.safetensors"): assert store.blobs.size(xet_upstream.infos[p].lfs.sha256) is None
        monkeypatch.setattr(store.api, "hf_hub_download", real)
        [info] = HfApi(endpoint=mirror.endpoint).get_paths_info("team/x", ["model.safetensors"])
        assert info.xet_hash == xet_upstream.infos["model.safetensors"].xet_hash


def test_a_mirrored_xet_repo_exports_and_imports_back_into_the_mirror(xet_upstream, tmp_path):
    with _mirror(tmp_path, xet_upstream) as mirror:
        HfApi(endpoint=mirror.endpoint).model_info("team/x")
        out = export_repos(mirror.root, ["team/x"], tmp_path / "x.tar")  # from the running mirror
    assert out["repos"][0]["commits"] == [xet_upstream.first]
    import_repos(tmp_path / "x.tar", tmp_path / "site")
    assert import_repos(tmp_path / "x.tar", tmp_path / "mirror")["repos"][0]["commits"] == [xet_upstream.first]
    for root in ("site", "mirror"):
        with LocalHub(tmp_path / root, offline=True) as hub:
            for p, data in XET_FILES.items(): assert _get(hub, p, tmp_path / f"c-{root}") == data
            [info] = HfApi(endpoint=hub.endpoint).get_paths_info("team/x", ["a.bin"])
            assert info.lfs.sha256 == xet_upstream.infos["a.bin"].lfs.sha256
            assert bool(info.xet_hash) == (root == "mirror")  # the mirror keeps its Xet copy; the site has blobs


def test_a_mirror_with_lfs_off_keeps_blobs_and_a_held_blob_is_chunked_into_xet_without_a_download(xet_upstream,
                                                                                                  tmp_path):
    up, sha = xet_upstream, xet_upstream.infos["model.safetensors"].lfs.sha256
    with _mirror(tmp_path, up, lfs=False) as mirror:  # a hub that keeps no pushed file in Xet keeps none mirrored
        [info] = HfApi(endpoint=mirror.endpoint).get_paths_info("team/x", ["model.safetensors"])
        assert info.xet_hash is None and info.lfs.sha256 == sha and mirror.server.store.blobs.size(sha) == info.size
        assert _get(mirror, "model.safetensors", tmp_path / "c") == XET_FILES["model.safetensors"]
        assert _xet_state(mirror.root) == ([], [])
    upapi = HfApi(endpoint=up.endpoint, token=UP_TOKEN)
    upapi.create_repo("team/y")
    upapi.upload_file(path_or_fileobj=XET_FILES["model.safetensors"], path_in_repo="model.safetensors",
                      repo_id="team/y")
    with _mirror(tmp_path, up) as mirror:
        store = mirror.server.store
        real, asked = store.api.hf_hub_download, []
        store.api.hf_hub_download = lambda repo_id, filename, **kw: asked.append(filename) or real(repo_id, filename,
                                                                                                   **kw)
        [info] = HfApi(endpoint=mirror.endpoint).get_paths_info("team/y", ["model.safetensors"])
        assert info.xet_hash == up.infos["model.safetensors"].xet_hash and asked == [".gitattributes"]
        assert _get(mirror, "model.safetensors", tmp_path / "c2", "team/y") == XET_FILES["model.safetensors"]
