"""What LocalHub's request checks decide, one rule a test: the Host header, the bearer token's form, which methods a
cross-site Origin may use, and the store's commit rules (branch names, parent commits, the message kept)."""
import http.client
import logging

import pytest

from adaptkit.localhub.server import read_token_file
from adaptkit.localhub.storage import HubError, RepoStore, check_path
from adaptkit.localhub.wire import host_and_port

# the `hub` fixture (tests/conftest.py) requires `token`, and holds team/r with a.txt
pytestmark = pytest.mark.hub(guarded=True, repos={"team/r": {"a.txt": b"hello"}})


def _get(hub, method, path, headers=None, host=True):
    "Status and body of one raw request; `host=False` sends no Host header at all."
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=30)
    conn.putrequest(method, path, skip_host=not host, skip_accept_encoding=True)
    for k, v in (headers or {}).items(): conn.putheader(k, v)
    conn.endheaders()
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, body


def test_a_request_without_host_is_400_naming_the_header(hub):
    status, body = _get(hub, "GET", "/api/models/team/r", host=False)
    assert status == 400 and b"the request has no valid Host header" in body


def test_an_authorization_that_is_not_bearer_is_no_token(hub, token):
    "The Hub reads only `Bearer <token>`; another scheme is no token at all, so a public read still works."
    assert _get(hub, "GET", "/api/models/team/r", {"Authorization": "Basic bm9uZTpub25l"})[0] == 200
    assert _get(hub, "GET", "/api/models/team/r", {"Authorization": f"bearer {token}"})[0] == 200  # any case
    assert _get(hub, "GET", "/api/models/team/r", {"Authorization": "Bearer hf_wrong"})[0] == 401


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_reads_with_a_foreign_origin_are_served(hub, method):
    "Only writes are refused cross-site; a page elsewhere may read a public repo, as on the Hub."
    status, _ = _get(hub, method, "/team/r/resolve/main/a.txt", {"Origin": "https://elsewhere.example"})
    assert status == 200


def test_an_empty_path_is_refused():
    with pytest.raises(HubError) as e: check_path("")
    assert e.value.status == 400


def test_host_and_port_reads_lower_case_ipv6():
    assert host_and_port("[fe80::ab]:8080") == ("fe80::ab", 8080)
    assert host_and_port("[FE80::AB]")[1] is None and host_and_port("[FE80::AB]")[0].lower() == "fe80::ab"


def test_the_token_file_warning_tells_the_command_that_fixes_it(tmp_path, caplog):
    path = tmp_path / "token"
    path.write_text("hf_abc\n")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="adaptkit.localhub"): read_token_file(path)
    assert caplog.text.rstrip().endswith(f"chmod 600 {path}")


@pytest.fixture
def store(tmp_path):
    s = RepoStore(tmp_path / "store")
    s.create("model", "team/s", False)
    yield s
    s.close()


def _head(store): return store.repo("model", "team/s")["refs"]["main"]


def test_a_commit_takes_the_branch_as_a_full_ref_and_keeps_its_message(store):
    c = store.commit("model", "team/s", "refs/heads/main", [("add", "x.txt", store.blobs.put_bytes(b"x"))],
                     "add x", "a longer message")
    assert _head(store) == c["id"]
    assert store.load("model", "team/s", c["id"])["message"] == "a longer message"


def test_a_commit_to_a_missing_branch_is_revision_not_found(store):
    with pytest.raises(HubError) as e: store.commit("model", "team/s", "dev", [], "nothing")
    assert (e.value.status, e.value.code) == (404, "RevisionNotFound")
    assert "dev" in e.value.message and "team/s" in e.value.message


def test_a_parent_commit_is_matched_from_seven_hex_digits(store):
    head = _head(store)
    store.commit("model", "team/s", "main", [], "on a 7-digit parent", parent=head[:7])
    with pytest.raises(HubError) as e: store.commit("model", "team/s", "main", [], "stale", parent=head[:7])
    assert e.value.status == 412
    with pytest.raises(HubError) as e: store.commit("model", "team/s", "main", [], "short", parent=_head(store)[:6])
    assert e.value.status == 412
