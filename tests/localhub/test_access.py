"""Who may read a private repo (issue 38, item 6): on a hub without a token no bearer proves anything, so a root that
holds private repos is not served without a token unless their privacy is dropped explicitly, `hub import` refuses a
private repo into a hub known to run without one, and a token-less hub answers any bearer 401 for a private repo."""
import http.client
import json

import pytest
from huggingface_hub import HfApi

from adaptkit.localhub.mirror import export_repos, import_repos
from adaptkit.localhub.server import LocalHub


def _get(hub, path, bearer=None):
    "A raw GET, with `Authorization: Bearer <bearer>` if given: (status, JSON or bytes body)."
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
    conn.request("GET", path, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try: return r.status, json.loads(data)
    except ValueError: return r.status, data


def _private_root(root, token):
    "A root holding the private model team/secret (with a file) and the public model team/open, served with `token`."
    with LocalHub(root, token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/secret", private=True)
        api.upload_file(path_or_fileobj=b"weights", path_in_repo="w.bin", repo_id="team/secret")
        api.create_repo("team/open")


def test_a_root_with_private_repos_is_not_served_without_a_token(tmp_path, token):
    _private_root(tmp_path / "hub", token)
    with pytest.raises(ValueError, match=r"private repos \(model team/secret\).*no token.*drop_privacy"):
        LocalHub(tmp_path / "hub").start()
    with LocalHub(tmp_path / "hub", token=token) as hub:  # the failed start released the root; with its token as before
        assert _get(hub, "/team/secret/resolve/main/w.bin", token) == (200, b"weights")
        assert _get(hub, "/team/secret/resolve/main/w.bin", "anything")[0] == 401


def test_dropping_privacy_is_explicit_and_makes_the_repos_public(tmp_path, caplog, token):
    _private_root(tmp_path / "hub", token)
    with LocalHub(tmp_path / "hub", drop_privacy=True) as hub:
        assert _get(hub, "/team/secret/resolve/main/w.bin") == (200, b"weights")
        assert not HfApi(endpoint=hub.endpoint, token=False).model_info("team/secret").private
    assert "made public: model team/secret" in caplog.text
    with LocalHub(tmp_path / "hub") as hub:  # public now: served without a token, nothing to drop
        assert _get(hub, "/api/models/team/secret")[0] == 200


def test_a_token_less_hub_answers_any_bearer_401_for_a_private_repo(tmp_path):
    with LocalHub(tmp_path / "hub") as hub:
        HfApi(endpoint=hub.endpoint, token=False).create_repo("team/p")
        hub.server.store.update_settings("model", "team/p", private=True)  # e.g. written into the root by hand
        for path in ("/api/models/team/p", "/team/p/resolve/main/.gitattributes", "/api/models/team/p/tree/main"):
            status, body = _get(hub, path, "anything")
            assert status == 401 and "no token" in body["error"], (path, status, body)
            assert _get(hub, path)[0] == 404
        assert [m["id"] for m in _get(hub, "/api/models", "anything")[1]] == []


def test_hub_import_refuses_a_private_repo_into_a_token_less_hub(tmp_path, token):
    _private_root(tmp_path / "src", token)
    export_repos(tmp_path / "src", ["team/secret", "team/open"], tmp_path / "x.tar")
    with LocalHub(tmp_path / "plain"): pass  # a hub that runs without a token
    with pytest.raises(ValueError, match=r"private.*model team/secret.*without a token.*drop_privacy"):
        import_repos(tmp_path / "x.tar", tmp_path / "plain")
    assert not (tmp_path / "plain" / "repos" / "model" / "team").exists()  # nothing was imported
    report = import_repos(tmp_path / "x.tar", tmp_path / "plain", drop_privacy=True)
    assert [r["id"] for r in report["repos"]] == ["team/secret", "team/open"]
    with LocalHub(tmp_path / "plain") as hub:
        assert _get(hub, "/team/secret/resolve/main/w.bin") == (200, b"weights")
    with LocalHub(tmp_path / "guarded", token=token): pass  # a hub served with a token takes it private
    import_repos(tmp_path / "x.tar", tmp_path / "guarded")
    with LocalHub(tmp_path / "guarded", token=token) as hub:
        assert _get(hub, "/team/secret/resolve/main/w.bin")[0] == 404
        assert _get(hub, "/team/secret/resolve/main/w.bin", token) == (200, b"weights")


def test_hub_serve_has_the_drop_privacy_option():
    from adaptkit.cli import command_help
    assert "--drop_privacy" in command_help("hub serve") and "--drop_privacy" in command_help("hub import")


@pytest.mark.parametrize("repo_type", ["model", "dataset", "space"])
def test_a_private_repo_of_any_type_stops_a_token_less_start(tmp_path, repo_type, token):
    "Issue 49: a private space is as private as a model or a dataset; without a token the start is refused."
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        extra = {"space_sdk": "static"} if repo_type == "space" else {}
        api.create_repo("team/secret", repo_type=repo_type, private=True, **extra)
        api.upload_file(path_or_fileobj=b"weights", path_in_repo="w.bin", repo_id="team/secret", repo_type=repo_type)
    with pytest.raises(ValueError, match=rf"private repos \({repo_type} team/secret\).*no token.*drop_privacy"):
        LocalHub(tmp_path / "hub").start()
    prefix = {"model": "", "dataset": "/datasets", "space": "/spaces"}[repo_type]
    with LocalHub(tmp_path / "hub", token=token) as hub:  # still private, served with its token
        assert _get(hub, f"{prefix}/team/secret/resolve/main/w.bin")[0] in (401, 404)
        assert _get(hub, f"{prefix}/team/secret/resolve/main/w.bin", token) == (200, b"weights")
