"""adaptkit.hub behaviours that mutation testing (`make mutation`, tests/mutation.json) found untested: the bytes of the
pushed adaptkit.json, the symlink rule inside a cache snapshot, write_folder's temporary and aside folders (their
place and names), a failed swap putting the old folder back, removal failures that must not fail a save, and the
per-endpoint cache folder of pull."""
import json
import os
import re
from pathlib import Path

import huggingface_hub.constants
import pytest

import adaptkit.hub.client
from adaptkit.hub import pull, push_folder, write_folder
from adaptkit.hub.client import _folder_files, _metadata_upload

SHA = "0123456789abcdef0123456789abcdef01234567"


def _fill(text):
    return lambda folder: (folder / "adaptkit.json").write_text(text)


# --- the pushed adaptkit.json ----------------------------------------------------------------------------------------

def test_the_uploaded_metadata_is_sorted_two_space_json_without_the_push_record(tmp_path):
    (tmp_path / "adaptkit.json").write_text(json.dumps({"z": 1, "a": {"y": "é", "b": [1]}, "hub": {"commit": SHA}}))
    want = '{\n  "a": {\n    "b": [\n      1\n    ],\n    "y": "\\u00e9"\n  },\n  "z": 1\n}\n'
    assert _metadata_upload(tmp_path) == want.encode("utf-8")
    (tmp_path / "adaptkit.json").write_text(json.dumps({"hub": {"commit": SHA}}))
    assert _metadata_upload(tmp_path) is None  # nothing but the local record: no file is uploaded


# --- symlinks in a pulled snapshot ------------------------------------------------------------------------------------

def test_a_snapshot_may_link_into_its_blobs_but_nowhere_else(tmp_path):
    repo = tmp_path / "models--team--m"
    snapshot, blobs = repo / "snapshots" / SHA, repo / "blobs"
    snapshot.mkdir(parents=True); blobs.mkdir()
    (blobs / "abc").write_text("weights")
    (snapshot / "w.bin").symlink_to(blobs / "abc")
    assert _folder_files(snapshot) == {"w.bin": snapshot / "w.bin"}
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("secret")
    (snapshot / "leak.txt").symlink_to(outside)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{snapshot / 'leak.txt'}: a symlink to {outside}, outside the folder "
            "being pushed; only links inside it are uploaded (copy the file in, "
            "or remove the link)"
        ),
    ):
        _folder_files(snapshot)


# --- write_folder -----------------------------------------------------------------------------------------------------

def test_write_folder_creates_missing_parents(tmp_path):
    out = write_folder(tmp_path / "a" / "b" / "out", _fill("{}"))
    assert out == tmp_path / "a" / "b" / "out" and (out / "adaptkit.json").read_text() == "{}"


def test_write_folder_names_the_folder_it_refuses_to_replace_and_says_what_to_do(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match=re.escape(f"{tmp_path / 'theirs'} exists and was not written by adaptkit "
                                                        "(no adaptkit.json): not replacing it; remove it or choose "
                                                        "another folder")):
        write_folder(tmp_path / "theirs", _fill("{}"))


def test_the_new_folder_is_written_beside_the_target_under_a_name_naming_this_process(tmp_path):
    seen = []
    write_folder(tmp_path / "out", lambda f: seen.append(f) or _fill("{}")(f))
    assert seen[0].parent == tmp_path and seen[0].name.startswith(f".out.tmp-{os.getpid()}-")


def test_a_failed_swap_puts_the_old_folder_back_from_an_aside_folder_beside_it(tmp_path, monkeypatch):
    out = write_folder(tmp_path / "out", _fill('{"v": 1}'))
    renames, real = [], os.rename
    def rename(src, dst):
        renames.append((Path(src), Path(dst)))
        if ".tmp-" in Path(src).name: raise OSError("disk gone")  # moving the new folder in fails
        return real(src, dst)
    monkeypatch.setattr(adaptkit.hub.client.os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        write_folder(out, _fill('{"v": 2}'))
    assert (out / "adaptkit.json").read_text() == '{"v": 1}'
    aside = renames[0][1]
    assert renames[0][0] == out and aside.parent == tmp_path and aside.name.startswith(f".out.old-{os.getpid()}-")
    assert renames[-1] == (aside, out) and not list(tmp_path.glob(".out.*"))


def _failing_rmtree(part, monkeypatch):
    "shutil.rmtree failing on folders whose name holds `part`, but honouring ignore_errors as the real one does."
    real, failed = adaptkit.hub.client.shutil.rmtree, []
    def rmtree(path, ignore_errors=False, **kw):
        if part in Path(path).name:
            failed.append(Path(path))
            if not ignore_errors: raise PermissionError(f"cannot remove {path}")
            return
        return real(path, ignore_errors=ignore_errors, **kw)
    monkeypatch.setattr(adaptkit.hub.client.shutil, "rmtree", rmtree)
    return failed


def test_an_old_folder_that_cannot_be_removed_does_not_fail_the_save(tmp_path, monkeypatch):
    out = write_folder(tmp_path / "out", _fill('{"v": 1}'))
    failed = _failing_rmtree(".old-", monkeypatch)
    assert write_folder(out, _fill('{"v": 2}')) == out and (out / "adaptkit.json").read_text() == '{"v": 2}'
    assert len(failed) == 1 and failed[0].name.startswith(f".out.old-{os.getpid()}-")


def test_a_dead_saves_leftover_that_cannot_be_removed_does_not_fail_the_save(tmp_path, monkeypatch):
    dead = tmp_path / ".out.tmp-999999999-x"
    dead.mkdir()
    failed = _failing_rmtree(".tmp-999999999-", monkeypatch)
    out = write_folder(tmp_path / "out", _fill("{}"))
    assert (out / "adaptkit.json").read_text() == "{}" and failed == [dead]


def test_a_dead_saves_half_written_new_folder_is_never_restored(tmp_path):
    "Only an `.old-` folder (the complete previous save) is put back; a dead `.tmp-` one may be half written."
    half = tmp_path / ".out.tmp-999999999-y"
    half.mkdir()
    (half / "adaptkit.json").write_text('{"half": true}')
    def broken(folder):
        raise RuntimeError("killed again")
    with pytest.raises(RuntimeError, match="killed again"):
        write_folder(tmp_path / "out", broken)
    assert not (tmp_path / "out").exists() and not half.exists()


# --- pull -------------------------------------------------------------------------------------------------------------

def test_pull_from_another_endpoint_uses_a_cache_folder_of_its_own(hub, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.txt").write_text("a")
    push_folder(tmp_path / "m", "team/cached", endpoint=hub.endpoint)
    folder = pull("team/cached", endpoint=hub.endpoint)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", hub.endpoint.split("://", 1)[1]).strip("_")
    assert folder.is_relative_to(Path(huggingface_hub.constants.HF_HUB_CACHE) / "endpoints" / slug)
    assert (folder / "a.txt").read_text() == "a"




def test_pull_checks_access_to_the_revision_it_was_asked_for(request_log):
    from huggingface_hub.errors import HfHubHTTPError
    endpoint, log = request_log
    url = f"{endpoint}/api/datasets/team/x/revision/v1"
    with pytest.raises(HfHubHTTPError, match=re.escape(f"404 Not Found' for url '{url}")):
        pull("team/x", revision="v1", endpoint=endpoint, repo_type="dataset")
    assert log[0] == "GET /api/datasets/team/x/revision/v1"
