"""What the request log and the server's DEBUG log never show (issue 38, items 10 and 18): a token, found by its shape
(`hf_...`, a bearer value, a JWT) under any query key or none, or by a key that names a secret anywhere in it
(`access_token`, not only `token`); and no raw control character from the request."""
import io
import logging
import socket
import time

import pytest

from adaptkit.localhub.server import LocalHub

pytestmark = pytest.mark.hub(guarded=True)  # the `hub` fixture (tests/conftest.py) requires `token`
SECRETS = ["hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "s3cr3tvalue", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig"]


def _send(hub, raw: bytes) -> bytes:
    "Send raw bytes on a new connection; the answer's first line."
    with socket.create_connection(("127.0.0.1", hub.port), timeout=10) as s:
        s.sendall(raw)
        return s.makefile("rb").readline()


def _logged(hub, targets, method=b"GET") -> str:
    "The request log's text after one request per target."
    hub.server.request_log = log = io.StringIO()
    for t in targets:
        _send(hub, method + b" " + t.encode() + f" HTTP/1.1\r\nHost: 127.0.0.1:{hub.port}\r\nConnection: close\r\n\r\n"
              .encode())
    for _ in range(200):
        if len(log.getvalue().splitlines()) >= len(targets): break
        time.sleep(0.01)
    assert len(log.getvalue().splitlines()) == len(targets), log.getvalue()
    return log.getvalue()


@pytest.mark.parametrize("target", [
    f"/api/models?{SECRETS[0]}",  # a bare query
    f"/api/models?foo={SECRETS[0]}",  # a key the log does not know
    f"/api/models?x=1&q=Bearer%20{SECRETS[1]}",  # a bearer value
    f"/api/models?jwt_like={SECRETS[2]}",  # a JWT's shape
    f"/api/models?access_token={SECRETS[1]}",  # a secret's name inside a longer key (search, not fullmatch)
    f"/api/models?X-Api-Key={SECRETS[1]}",
    f"/api/models?my_password={SECRETS[1]}&limit=1",
    f"/api/models?{SECRETS[0]}=1",  # a token as a key
])
def test_the_request_log_masks_tokens_by_their_shape_and_secret_names_anywhere_in_a_key(hub, target):
    text = _logged(hub, [target])
    assert not any(s in text for s in SECRETS) and "<hidden>" in text, text
    assert " /api/models?" in text  # the rest of the target is there


def test_the_request_log_keeps_what_is_not_a_secret(hub):
    text = _logged(hub, ["/api/models?search=team&limit=2&author=me"])
    assert "/api/models?search=team&limit=2&author=me 200 " in text


def test_control_characters_from_the_request_are_escaped_in_the_log(hub):
    text = _logged(hub, ["/api/models?q=\x1b[31mred"], method=b"G\x1b[2JET")
    assert "\x1b" not in text and "%1B" in text and len(text.splitlines()) == 1


def test_the_debug_log_never_shows_a_token(hub, caplog):
    caplog.set_level(logging.DEBUG, logger="adaptkit.localhub")
    _logged(hub, [f"/api/models?token={SECRETS[1]}", f"/api/models?{SECRETS[0]}", "/api/models?q=\x1bx"])
    debug = "\n".join(r.getMessage() for r in caplog.records)
    assert "/api/models?" in debug, debug  # the requests are there, their secrets are not
    assert not any(s in debug for s in SECRETS) and "\x1b" not in debug, debug


def test_a_token_never_reaches_the_request_log_from_a_real_client(tmp_path, token):
    from huggingface_hub import HfApi
    with LocalHub(tmp_path / "hub", token=token) as hub:
        hub.server.request_log = log = io.StringIO()
        HfApi(endpoint=hub.endpoint, token=token).create_repo("team/r")
        assert token not in log.getvalue()
