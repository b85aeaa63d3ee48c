"""`adaptkit hub serve` as its own process on a free port, the token from a file: the stock huggingface_hub client
creates a repo, uploads a folder and downloads it back; a wrong token is refused; Ctrl-C or SIGTERM stops it cleanly."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError


def _wait(proc: subprocess.Popen, timeout: float = 60) -> int:
    "The stopped server's exit code; one that does not stop in `timeout` s is killed (never left running), then fails."
    try: return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill(); proc.wait()
        raise


def _ctrl_c_reaches_it():
    """In the server's process before it starts: SIGINT as a terminal's Ctrl-C delivers it. A test run started in the
    background (`make test &`) ignores SIGINT, and a child inherits that: the server would never see the stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(root: Path, token_file: Path, *args, lfs="on") -> tuple[subprocess.Popen, str, list]:
    "Start `adaptkit hub serve --port 0 ARGS`, check its `lfs` setting, return the process, its endpoint and lines."
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "adaptkit.cli", "hub", "serve", "--root", str(root), "--port", "0",
                             "--token_file", str(token_file), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, preexec_fn=_ctrl_c_reaches_it)
    watchdog = threading.Timer(120, proc.kill)  # a server that never says where it listens fails the test, not hangs it
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(
                rf"LocalHub serving .* at (http://127\.0\.0\.1:\d+) \(lfs={lfs}, token required to write\)", line
            ):
                return proc, m[1], lines
    finally:
        watchdog.cancel()
    raise AssertionError(f"adaptkit hub serve exited with {proc.wait()} before serving:\n{''.join(lines)}")


@pytest.fixture
def token_file(tmp_path, token):
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def _is_listening(endpoint: str) -> bool:
    host, port = endpoint.removeprefix("http://").split(":")
    try: socket.create_connection((host, int(port)), timeout=2).close()
    except OSError: return False
    return True


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_stock_client_round_trip_against_adaptkit_hub_serve(tmp_path, token_file, stop, token):
    folder = tmp_path / "art"
    (folder / "sub").mkdir(parents=True)
    files = {"config.json": b'{"model_type": "llama"}', "sub/notes.txt": b"nested\n", "w.bin": bytes(range(256)) * 64}
    for name, data in files.items(): (folder / name).write_bytes(data)
    proc, endpoint, lines = _start(tmp_path / "root", token_file)
    try:
        assert token not in " ".join(proc.args)  # the token never sits on the command line
        api = HfApi(endpoint=endpoint, token=token)
        assert api.create_repo("me/served").repo_id == "me/served"
        commit = api.upload_folder(folder_path=folder, repo_id="me/served", commit_message="served").oid
        (info,) = api.get_paths_info("me/served", ["w.bin"])  # by default the Hub's rule: a binary is LFS, by Xet
        assert info.lfs.size == len(files["w.bin"]) and info.xet_hash is not None
        got = Path(snapshot_download("me/served", endpoint=endpoint, token=token, cache_dir=tmp_path / "cache"))
        assert got.name == commit
        assert {p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()
                and p.name != ".gitattributes"} == files
        wrong = HfApi(endpoint=endpoint, token=token[:-1] + "X")
        with pytest.raises(HfHubHTTPError) as refused:
            wrong.create_repo("me/not-created")
        assert refused.value.response.status_code == 401 and token[:-1] + "X" not in str(refused.value)
        with pytest.raises(HfHubHTTPError) as refused:
            wrong.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="me/served")
        assert refused.value.response.status_code == 401
        assert not api.repo_exists("me/not-created") and api.model_info("me/served").sha == commit
    finally:
        proc.send_signal(stop)
        code = _wait(proc)
        rest = proc.stdout.read()
    assert code == 0, "".join(lines) + rest
    assert "Traceback" not in rest and not _is_listening(endpoint)
    # restarted on the same root, with --no_lfs: the repo is still there, and a new binary goes inline
    proc, endpoint, _ = _start(tmp_path / "root", token_file, "--no_lfs", lfs="off")
    try:
        api = HfApi(endpoint=endpoint, token=token)
        assert api.model_info("me/served").sha == commit
        api.upload_file(path_or_fileobj=files["w.bin"][::-1], path_in_repo="inline.bin", repo_id="me/served")
        (info,) = api.get_paths_info("me/served", ["inline.bin"])
        assert info.lfs is None and info.xet_hash is None and info.size == len(files["w.bin"])
    finally:
        proc.send_signal(signal.SIGINT)
        assert _wait(proc) == 0


def _launch(args: list) -> tuple[subprocess.Popen, str, list]:
    "Start `adaptkit hub serve --port 0 ARGS` and return the process, its endpoint and its start line."
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "adaptkit.cli", "hub", "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=_ctrl_c_reaches_it)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(r"LocalHub serving .* at (http://127\.0\.0\.1:\d+) ", line): return proc, m[1], line
    finally:
        watchdog.cancel()
    raise AssertionError(f"adaptkit hub serve exited with {proc.wait()} before serving:\n{''.join(lines)}")


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    assert _wait(proc) == 0
    return proc.stdout.read()


def test_hub_serve_upstream_mirrors_then_offline_serves_what_it_kept(tmp_path, token_file, token):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RepositoryNotFoundError

    from adaptkit.localhub.server import LocalHub
    mirror_root, log = tmp_path / "mirror", tmp_path / "requests.log"
    with LocalHub(tmp_path / "upstream", token=token) as up:  # the mirror reads the upstream's token from a file
        api = HfApi(endpoint=up.endpoint, token=token)
        api.create_repo("team/m", private=True)
        sha = api.upload_file(path_or_fileobj=b"hello", path_in_repo="a.txt", repo_id="team/m").oid
        proc, endpoint, start = _launch(["--root", str(mirror_root), "--upstream", up.endpoint, "--upstream_token_file",
                                         str(token_file), "--token_file", str(token_file), "--log", str(log)])
        try:
            assert f"to write); mirror of {up.endpoint} (branches and tags re-checked every 60 s)" in start
            got = Path(hf_hub_download("team/m", "a.txt", endpoint=endpoint, token=token, cache_dir=tmp_path / "c1"))
            assert got.read_bytes() == b"hello" and got.parent.name == sha
        finally:
            rest = _stop(proc)
        assert "Traceback" not in rest and log.is_file()  # the log is opened (appended to) when the server starts
    proc, endpoint, start = _launch(["--root", str(mirror_root), "--offline", "--token_file", str(token_file)])
    try:
        assert "offline mirror: serves only what it holds" in start
        got = Path(hf_hub_download("team/m", "a.txt", endpoint=endpoint, token=token, cache_dir=tmp_path / "c2"))
        assert got.read_bytes() == b"hello" and got.parent.name == sha
        with pytest.raises(RepositoryNotFoundError, match="team/other is not mirrored here"):
            HfApi(endpoint=endpoint, token=token).model_info("team/other")
    finally:
        _stop(proc)


def test_local_hub_log_opens_the_request_log_it_is_given(tmp_path):
    import io

    from adaptkit.localhub.server import LocalHub
    with LocalHub(tmp_path / "a", log=tmp_path / "r.log") as hub:
        f = hub.server.request_log
        assert Path(f.name) == tmp_path / "r.log" and f.mode == "a" and not f.closed
    assert f.closed  # LocalHub opened it, so LocalHub closes it
    given = io.StringIO()
    with LocalHub(tmp_path / "a", log=given) as hub: assert hub.server.request_log is given
    with LocalHub(tmp_path / "a", log="-") as hub: assert hub.server.request_log is sys.stderr
    with LocalHub(tmp_path / "a") as hub: assert hub.server.request_log is None
    assert not given.closed and not sys.stderr.closed


def _http_source() -> str:
    import adaptkit.localhub.http as http
    return Path(http.__file__).read_text()


@pytest.mark.skipif("request_log" not in _http_source(), reason="HubServer writes no request log yet (issue 26, 10)")
def test_request_log_has_one_line_per_request_and_never_the_token(tmp_path, capfd, token):
    from huggingface_hub.errors import RepositoryNotFoundError

    from adaptkit.localhub.server import LocalHub
    log = tmp_path / "requests.log"
    with LocalHub(tmp_path / "hub", token=token, log=log) as hub:
        api = HfApi(endpoint=hub.endpoint, token=token)
        api.create_repo("me/logged")
        with pytest.raises(RepositoryNotFoundError): api.model_info("me/missing")
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and token not in log.read_text()
    assert all(w in lines[0] for w in ("POST", "/api/repos/create", "200"))
    assert all(w in lines[1] for w in ("GET", "/api/models/me/missing", "404"))
    with LocalHub(tmp_path / "hub", log="-") as hub: HfApi(endpoint=hub.endpoint).repo_exists("me/logged")
    assert "/api/models/me/logged" in capfd.readouterr().err
