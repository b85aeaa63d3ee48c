"""Pull requests and discussions on a LocalHub, driven by the stock `HfApi`: `create_pr=True` uploads land on
`refs/pr/N` only, every read takes that revision, discussions share the numbering, and merging fast-forwards, makes a
merge commit, or refuses a conflict with a 409; a mirrored repo refuses them, and a damaged record is named."""
from pathlib import Path

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import GitRefInfo

from adaptkit.localhub.server import LocalHub
from adaptkit.localhub.storage import USER

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`


@pytest.fixture
def api(hub, token):
    api = HfApi(endpoint=hub.endpoint, token=token)
    api.create_repo("team/m")
    return api


def _status(err) -> int: return err.value.response.status_code


def _add(path: str, data: bytes) -> CommitOperationAdd:
    return CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)


def test_create_pr_lands_only_on_refs_pr_and_every_read_takes_that_revision(api, hub, tmp_path, token):
    main = api.model_info("team/m").sha
    info = api.upload_file(path_or_fileobj=b"new\n", path_in_repo="a.txt", repo_id="team/m", create_pr=True,
                           commit_message="Add a.txt", commit_description="please")
    assert (info.pr_url, info.pr_num, info.pr_revision) == (f"{hub.endpoint}/team/m/discussions/1", 1, "refs/pr/1")
    assert info.commit_url == f"{hub.endpoint}/team/m/commit/{info.oid}"
    assert api.model_info("team/m").sha == main and not api.file_exists("team/m", "a.txt")  # main is untouched
    with pytest.raises(EntryNotFoundError): api.hf_hub_download("team/m", "a.txt")
    rev = "refs/pr/1"
    assert api.model_info("team/m", revision=rev).sha == info.oid and api.file_exists("team/m", "a.txt", revision=rev)
    assert api.list_repo_files("team/m", revision=rev) == [".gitattributes", "a.txt"]
    assert [f.path for f in api.get_paths_info("team/m", ["a.txt"], revision=rev)] == ["a.txt"]
    assert [c.title for c in api.list_repo_commits("team/m", revision=rev)] == ["Add a.txt", "initial commit"]
    got = hf_hub_download("team/m", "a.txt", revision=rev, endpoint=hub.endpoint, token=token)
    assert Path(got).read_bytes() == b"new\n" and Path(got).parent.name == info.oid
    snap = Path(snapshot_download("team/m", revision=rev, endpoint=hub.endpoint, token=token))
    assert (snap / "a.txt").read_bytes() == b"new\n" and snap.name == info.oid
    # a second commit to the pull request's ref adds to it
    second = api.create_commit("team/m", [_add("b.txt", b"b")], commit_message="and b", revision=rev)
    assert second.pr_url is None and api.model_info("team/m", revision=rev).sha == second.oid
    assert api.list_repo_files("team/m", revision=rev) == [".gitattributes", "a.txt", "b.txt"]
    refs = api.list_repo_refs("team/m", include_pull_requests=True)
    assert refs.pull_requests == [GitRefInfo(name="1", ref="refs/pr/1", target_commit=second.oid)]
    assert api.list_repo_refs("team/m").pull_requests is None
    [pr] = api.get_repo_discussions("team/m")
    assert (pr.num, pr.title, pr.status, pr.is_pull_request, pr.author, pr.git_reference) == (
        1, "Add a.txt", "open", True, USER, "refs/pr/1")
    details = api.get_discussion_details("team/m", 1)
    assert [e.type for e in details.events] == ["comment", "commit", "commit"]
    assert details.events[0].content == "please" and [e.oid for e in details.events[1:]] == [info.oid, second.oid]
    assert (details.target_branch, details.conflicting_files, details.merge_commit_oid) == ("refs/heads/main", [], None)
    assert "+++ b/a.txt\n@@ -0,0 +1 @@\n+new\n" in details.diff and "+++ b/b.txt" in details.diff


def test_merge_fast_forwards_main_and_records_the_merge(api):
    pr = api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/m", create_pr=True)
    api.merge_pull_request("team/m", pr.pr_num, comment="lgtm")
    assert api.model_info("team/m").sha == pr.oid and api.file_exists("team/m", "x.txt")  # main has not moved: ff
    details = api.get_discussion_details("team/m", pr.pr_num)
    assert (details.status, details.merge_commit_oid) == ("merged", pr.oid)
    assert [e.type for e in details.events] == ["comment", "commit", "comment", "status-change"]
    assert details.events[2].content == "lgtm" and details.events[3].new_status == "merged"
    with pytest.raises(HfHubHTTPError, match="merged already") as e: api.merge_pull_request("team/m", pr.pr_num)
    assert _status(e) == 400
    with pytest.raises(HfHubHTTPError, match="is merged") as e:
        api.change_discussion_status("team/m", pr.pr_num, "open")
    assert _status(e) == 400
    with pytest.raises(HfHubHTTPError, match="takes no more commits") as e:
        api.create_commit("team/m", [_add("late.txt", b"late")], commit_message="late", revision="refs/pr/1")
    assert _status(e) == 400


def test_a_moved_target_gets_a_merge_commit_and_a_conflict_is_a_409(api):
    start = api.model_info("team/m").sha
    api.create_commit("team/m", [_add("shared.txt", b"base\n"), _add("gone.txt", b"g")], commit_message="base")
    a = api.create_commit("team/m", [_add("a.txt", b"from the PR\n"), CommitOperationDelete("gone.txt")],
                          commit_message="PR a", create_pr=True)
    c = api.create_commit("team/m", [_add("shared.txt", b"the PR's\n")], commit_message="PR c", create_pr=True)
    api.create_commit("team/m", [_add("shared.txt", b"main's\n"), _add("main.txt", b"m")], commit_message="main")
    assert api.get_discussion_details("team/m", c.pr_num).conflicting_files == ["shared.txt"]
    assert api.get_discussion_details("team/m", a.pr_num).conflicting_files == []
    before = api.model_info("team/m").sha
    api.merge_pull_request("team/m", a.pr_num)
    merged = api.list_repo_commits("team/m")[0]
    assert merged.title == "Merge pull request #1: PR a" and api.model_info("team/m").sha != a.oid
    assert api.list_repo_files("team/m") == [".gitattributes", "a.txt", "main.txt", "shared.txt"]
    assert api.get_discussion_details("team/m", a.pr_num).merge_commit_oid == merged.commit_id
    assert [x.commit_id for x in api.list_repo_commits("team/m")][1] == before  # main's history: its head first
    with pytest.raises(HfHubHTTPError, match=r"cannot be merged into main: .*shared\.txt") as e:
        api.merge_pull_request("team/m", c.pr_num)
    assert _status(e) == 409 and api.get_discussion_details("team/m", c.pr_num).status == "open"
    assert Path(api.hf_hub_download("team/m", "shared.txt")).read_bytes() == b"main's\n"  # nothing merged
    assert api.list_repo_commits("team/m")[0].commit_id == merged.commit_id
    # fixed on the pull request (it now agrees with main on the file): it merges
    api.create_commit("team/m", [_add("shared.txt", b"main's\n")], commit_message="agree", revision="refs/pr/2")
    api.merge_pull_request("team/m", c.pr_num)
    assert api.get_discussion_details("team/m", c.pr_num).status == "merged"
    assert start in [x.commit_id for x in api.list_repo_commits("team/m")]


def test_pull_requests_and_discussions_share_one_numbering_and_filter_as_the_client_asks(api, tmp_path):
    one = api.upload_file(path_or_fileobj=b"1", path_in_repo="one.txt", repo_id="team/m", create_pr=True)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "two.txt").write_bytes(b"2")
    two = api.upload_folder(folder_path=tmp_path / "folder", repo_id="team/m", create_pr=True)
    disc = api.create_discussion("team/m", "  A question about the data  ", description="Is it clean?")
    assert (one.pr_num, two.pr_num, disc.num, disc.title, disc.is_pull_request) == (1, 2, 3, "A question about the "
                                                                                    "data", False)
    assert disc.target_branch is None and disc.diff is None and disc.events[0].content == "Is it clean?"
    assert api.get_discussion_details("team/m", 3) == disc  # what creating it answered, field for field
    empty = api.create_pull_request("team/m", "An empty pull request")
    assert (empty.num, empty.status, empty.is_pull_request, empty.git_reference) == (4, "draft", True, "refs/pr/4")
    assert api.model_info("team/m", revision="refs/pr/4").sha == api.model_info("team/m").sha  # main's head
    nums = lambda **kw: [d.num for d in api.get_repo_discussions("team/m", **kw)]
    assert nums() == [4, 3, 2, 1]  # newest first
    assert nums(discussion_type="pull_request") == [4, 2, 1] and nums(discussion_type="discussion") == [3]
    api.change_discussion_status("team/m", 2, "closed", comment="not needed")
    assert nums(discussion_status="closed") == [2] and nums(discussion_status="open") == [4, 3, 1]  # drafts are open
    assert nums(author=USER, discussion_type="pull_request", discussion_status="open") == [4, 1]
    assert nums(author="someone-else") == []
    with pytest.raises(RevisionNotFoundError): api.model_info("team/m", revision="refs/pr/3")  # a discussion: no ref
    with pytest.raises(HfHubHTTPError, match="publish it first") as e: api.merge_pull_request("team/m", 4)
    assert _status(e) == 400
    api.change_discussion_status("team/m", 4, "open")  # published
    api.merge_pull_request("team/m", 4)  # nothing in it: main stays where it is
    with pytest.raises(HfHubHTTPError, match="not a pull request") as e: api.merge_pull_request("team/m", 3)
    assert _status(e) == 400
    with pytest.raises(HfHubHTTPError, match="no discussion or pull request #9") as e:
        api.get_discussion_details("team/m", 9)
    assert _status(e) == 404


def test_comments_titles_and_closing(api):
    d = api.create_discussion("team/m", "Broken tokenizer")
    c = api.comment_discussion("team/m", d.num, "It splits **emoji** <badly>")
    assert (c.type, c.content, c.author, c.edited, c.hidden) == ("comment", "It splits **emoji** <badly>", USER,
                                                                 False, False)
    assert c.rendered == "It splits **emoji** &lt;badly&gt;"  # escaped, not rendered Markdown
    edited = api.edit_discussion_comment("team/m", d.num, c.id, "It splits emoji")
    assert (edited.id, edited.content, edited.edited, edited.number_of_edits) == (c.id, "It splits emoji", True, 2)
    renamed = api.rename_discussion("team/m", d.num, "Tokenizer splits emoji")
    assert (renamed.old_title, renamed.new_title) == ("Broken tokenizer", "Tokenizer splits emoji")
    closed = api.change_discussion_status("team/m", d.num, "closed", comment="fixed in v2")
    assert closed.new_status == "closed"
    with pytest.warns(UserWarning): hidden = api.hide_discussion_comment("team/m", d.num, c.id)
    assert hidden.hidden and hidden.content == ""
    details = api.get_discussion_details("team/m", d.num)
    assert (details.title, details.status) == ("Tokenizer splits emoji", "closed")
    assert [e.type for e in details.events] == ["comment", "comment", "title-change", "comment", "status-change"]
    assert [e.id for e in details.events][1:3] == [c.id, renamed.id] and details.events[3].content == "fixed in v2"
    assert api.change_discussion_status("team/m", d.num, "open").new_status == "open"  # reopened
    for bad, status in [(lambda: api.comment_discussion("team/m", d.num, "   "), 400),
                        (lambda: api.rename_discussion("team/m", d.num, "ab"), 400),
                        (lambda: api.create_discussion("team/m", "no"), 400),
                        (lambda: api.edit_discussion_comment("team/m", d.num, "0" * 24, "x"), 404),
                        (lambda: api.comment_discussion("team/none", 1, "x"), 404)]:
        with pytest.raises(HfHubHTTPError) as e: bad()
        assert _status(e) == status


def test_pull_requests_against_another_branch_or_from_a_parent_commit_and_on_a_dataset(api, hub):
    first = api.model_info("team/m").sha
    api.upload_file(path_or_fileobj=b"1", path_in_repo="v.txt", repo_id="team/m")
    api.create_branch("team/m", branch="dev")
    pr = api.create_commit("team/m", [_add("dev.txt", b"d")], commit_message="to dev", revision="dev", create_pr=True)
    assert api.get_discussion_details("team/m", pr.pr_num).target_branch == "refs/heads/dev"
    old = api.create_commit("team/m", [_add("w.txt", b"w")], commit_message="from the start", create_pr=True,
                            parent_commit=first)
    assert api.list_repo_files("team/m", revision=old.pr_revision) == [".gitattributes", "w.txt"]  # no v.txt
    api.merge_pull_request("team/m", pr.pr_num)
    assert "dev.txt" in api.list_repo_files("team/m", revision="dev") and not api.file_exists("team/m", "dev.txt")
    api.merge_pull_request("team/m", old.pr_num)  # main moved since: a merge commit keeps v.txt
    assert api.list_repo_files("team/m") == [".gitattributes", "v.txt", "w.txt"]
    for bad in (lambda: api.create_commit("team/m", [_add("z", b"z")], commit_message="z", revision=first,
                                          create_pr=True),
                lambda: api.create_commit("team/m", [_add("z", b"z")], commit_message="z", create_pr=True,
                                          parent_commit="0" * 40)):
        with pytest.raises(RevisionNotFoundError): bad()
    api.create_repo("team/d", repo_type="dataset")
    ds = api.upload_file(path_or_fileobj=b"{}", path_in_repo="d.json", repo_id="team/d", repo_type="dataset",
                         create_pr=True)
    assert ds.pr_url == f"{hub.endpoint}/datasets/team/d/discussions/1" and ds.pr_revision == "refs/pr/1"
    assert [d.repo_type for d in api.get_repo_discussions("team/d", repo_type="dataset")] == ["dataset"]


def test_who_may_do_what_with_and_without_a_token(api, hub, tmp_path):
    anon = HfApi(endpoint=hub.endpoint, token=False)
    api.create_discussion("team/m", "Readable by anyone")
    assert [d.title for d in anon.get_repo_discussions("team/m")] == ["Readable by anyone"]  # reading a public repo
    for write in (lambda: anon.create_discussion("team/m", "Anonymous"),
                  lambda: anon.comment_discussion("team/m", 1, "x"),
                  lambda: anon.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="team/m", create_pr=True)):
        with pytest.raises(HfHubHTTPError) as e: write()
        assert _status(e) == 401
    api.create_repo("team/secret", private=True)
    api.create_discussion("team/secret", "Hidden")
    with pytest.raises(RepositoryNotFoundError): list(anon.get_repo_discussions("team/secret"))
    with LocalHub(tmp_path / "open") as open_hub:  # no token: anyone may do everything, as for commits
        anyone = HfApi(endpoint=open_hub.endpoint, token=False)
        anyone.create_repo("team/o")
        pr = anyone.upload_file(path_or_fileobj=b"o", path_in_repo="o.txt", repo_id="team/o", create_pr=True)
        anyone.merge_pull_request("team/o", pr.pr_num)  # no comment: a POST without a body
        assert anyone.file_exists("team/o", "o.txt")


def test_a_mirrored_repo_refuses_pull_requests_and_discussions(tmp_path):
    with LocalHub(tmp_path / "up") as up:
        HfApi(endpoint=up.endpoint, token=False).create_repo("team/tiny")
        with LocalHub(tmp_path / "mirror", upstream=up.endpoint, upstream_token=False) as mirror:
            api = HfApi(endpoint=mirror.endpoint, token=False)
            api.model_info("team/tiny")  # fetched and held
            for write in (lambda: api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/tiny",
                                                  create_pr=True),
                          lambda: api.create_pull_request("team/tiny", "Please"),
                          lambda: api.create_discussion("team/tiny", "Hello there")):
                with pytest.raises(HfHubHTTPError, match="read-only: push to the upstream") as e: write()
                assert _status(e) == 403
            assert list(api.get_repo_discussions("team/tiny")) == []
            api.create_repo("team/own")  # the mirror's own repos take pull requests
            assert api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="team/own",
                                   create_pr=True).pr_num == 1


def test_a_damaged_discussions_file_is_named_and_other_repos_are_served(api, hub, tmp_path):
    api.create_discussion("team/m", "Will be damaged")
    api.create_repo("team/ok")
    api.create_discussion("team/ok", "Still fine")
    damaged = tmp_path / "hub" / "repos" / "model" / "team" / "m" / "discussions.json"
    damaged.write_text('{"discussions": [{"num": 1')  # cut short
    with pytest.raises(HfHubHTTPError, match="discussions.json is damaged") as e:
        list(api.get_repo_discussions("team/m"))
    assert _status(e) == 500 and str(damaged) in str(e.value)
    with pytest.raises(HfHubHTTPError) as e: api.model_info("team/m", revision="refs/pr/1")
    assert _status(e) == 500
    assert api.model_info("team/m").id == "team/m"  # the repo itself is served
    assert [d.title for d in api.get_repo_discussions("team/ok")] == ["Still fine"]


def test_transformers_push_to_hub_with_create_pr(api, hub, tiny_tok, monkeypatch, token):
    "transformers' `push_to_hub(create_pr=True)` in-process: its HfApi and the card's download pointed at the hub."
    import transformers.utils.hub as tf_hub

    from adaptkit.models import tiny_causal_lm
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(tf_hub, "_hf_api", HfApi(endpoint=hub.endpoint, library_name="transformers"))
    info = tiny_causal_lm(tiny_tok).push_to_hub("team/m", create_pr=True, token=token)
    assert info.pr_revision == "refs/pr/1" and api.list_repo_files("team/m") == [".gitattributes"]
    files = api.list_repo_files("team/m", revision="refs/pr/1")
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    api.merge_pull_request("team/m", info.pr_num)
    assert api.list_repo_files("team/m") == files


def test_pull_requests_and_discussions_survive_a_restart(tmp_path, token):
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("team/m")
        pr = api.upload_file(path_or_fileobj=b"kept", path_in_repo="k.txt", repo_id="team/m", create_pr=True)
        api.create_discussion("team/m", "Still here?")
    with LocalHub(tmp_path / "hub", token=token) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        assert [(d.num, d.status) for d in api.get_repo_discussions("team/m")] == [(2, "open"), (1, "open")]
        assert api.model_info("team/m", revision="refs/pr/1").sha == pr.oid
        assert api.create_pull_request("team/m", "Numbered on").num == 3
