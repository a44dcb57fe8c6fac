"""Scrubbing secrets from log records: every shape in which the storage SDKs and gRPC log a secret, and what
silod's log handler writes of a record (its message, arguments, traceback and `extra=` fields). The end-to-end
check, real servers logging at DEBUG, is in test_security.py."""

from __future__ import annotations

import io
import json
import logging
import secrets
from urllib.parse import quote

import pytest

from datamgr.logs import HUMAN_FORMAT, JsonFormatter, ScrubSecrets
from silodlib.scrub import REDACTED, register_secret, scrub


def _logged_through_the_handler(
    formatter: logging.Formatter, secret: str, sas_url: str
) -> tuple[str, tuple[object, ...]]:
    """What silod's handler writes of a few records holding secrets, and the arguments of one that holds none."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(ScrubSecrets())
    log = logging.getLogger("silod.test.scrub")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        headers = {"Authorization": b"Bearer abc.def", "X-Amz-Security-Token": b"T0k"}
        log.debug("Sending http request: headers=%s", headers)
        log.info("opened with %s", secret, extra={"detail": f"key {secret}"})
        try:
            raise RuntimeError(f"GET {sas_url} failed")
        except RuntimeError:
            log.exception("read failed")
        plain = log.makeRecord(log.name, logging.INFO, __file__, 0, "listed %d objects", (3,), None)
        log.handle(plain)
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
        log.propagate = True
    assert isinstance(plain.args, tuple)
    return stream.getvalue(), plain.args


def test_the_log_handler_scrubs_messages_arguments_tracebacks_and_fields() -> None:
    # What a record holds besides its message (its arguments, an exception's traceback, `extra=` fields) is
    # written too, in both formats; a record without secrets is left as logged.
    secret = f"registered-{secrets.token_hex(8)}"
    register_secret(secret)
    sas_url = f"https://a.blob.core.windows.net/c/k?sv=2024-05-04&sr=c&sp=rl&sig={secrets.token_hex(8)}"
    for formatter in (logging.Formatter(HUMAN_FORMAT), JsonFormatter()):
        text, plain_args = _logged_through_the_handler(formatter, secret, sas_url)
        for leaked in (secret, "abc.def", "T0k", sas_url.split("?")[1]):
            assert leaked not in text
        assert "'Authorization': b'<redacted>'" in text and "https://a.blob.core.windows.net/c/k?<redacted>" in text
        assert "listed 3 objects" in text and plain_args == (3,)


@pytest.mark.parametrize(
    ("logged", "scrubbed"),
    [
        ("x-amz-security-token:bSess0/+=", "x-amz-security-token:<redacted>"),  # botocore.auth's CanonicalRequest
        ("Signature:\nb0c1d2", "Signature:\n<redacted>"),  # a signature starting with "b" is no bytes literal
        (
            "{'X-Amz-Security-Token': b'tok', 'Authorization': b'AWS4-HMAC-SHA256 Credential=id/x, Signature=f0'}",
            "{'X-Amz-Security-Token': b'<redacted>', 'Authorization': b'<redacted>'}",
        ),
        (
            "GET /b/k?X-Amz-Credential=id%2Fx&X-Amz-Security-Token=t%2B&X-Amz-Signature=f0 HTTP/1.1",
            "GET /b/k?X-Amz-Credential=id%2Fx&X-Amz-Security-Token=<redacted>&X-Amz-Signature=<redacted> HTTP/1.1",
        ),
        (
            '"GET /acct/c/k?se=2030-01-01T00%3A00Z&sp=rl&sv=2024&sr=c&sig=a%2Bb%3D HTTP/1.1" 206',
            '"GET /acct/c/k?<redacted> HTTP/1.1" 206',
        ),  # the whole query of a SAS URL
        ("Authorization: SharedKey acct:a+b/c==", "Authorization: SharedKey acct:<redacted>"),
        ("[('authorization', 'Bearer t!k')]", "[('authorization', '<redacted>')]"),
        ("authorization: Bearer eyJ0.eXAi-_x", "authorization: Bearer <redacted>"),
        (
            "AccountName=acct;AccountKey=a+b/c==;BlobEndpoint=http://h/",
            "AccountName=acct;AccountKey=<redacted>;BlobEndpoint=http://h/",
        ),
        (
            "<SecretAccessKey>wJ/K</SecretAccessKey><SessionToken>FQo</SessionToken>",
            "<SecretAccessKey><redacted></SecretAccessKey><SessionToken><redacted></SessionToken>",
        ),
        ('{"access_token": "eyJ0", "expires_in": 3599}', '{"access_token": "<redacted>", "expires_in": 3599}'),
        # What is no secret stays readable, refusal advice included.
        ("send 'authorization: Bearer <token>' with the token", "send 'authorization: Bearer <token>' with the token"),
        ("SignatureDoesNotMatch: the bearer token is wrong", "SignatureDoesNotMatch: the bearer token is wrong"),
    ],
)
def test_secrets_are_scrubbed_in_every_shape_the_sdks_log_them(logged: str, scrubbed: str) -> None:
    assert scrub(logged) == scrubbed


def test_a_registered_value_is_scrubbed_in_its_escaped_and_stripped_forms() -> None:
    # A value read from a file keeps its trailing newline, and an SDK refusing it as a header value prints its repr
    # ("Invalid header value b'...\\n'"); JSON and URL encodings escape it too, and the value may be shown stripped.
    token = f'FwoGZXIvYXdz{secrets.token_hex(8)}"é'
    register_secret(token + "\n")
    for shown in (
        f"Invalid header value {(token + chr(10)).encode()!r}",
        f"options {{'session_token': {token + chr(10)!r}}}",
        f'"session_token": {json.dumps(token + chr(10))}',
        f'"session_token": {json.dumps(token + chr(10), ensure_ascii=False)}',
        f"token={quote(token + chr(10), safe='')}",
        f"token {token}.",
    ):
        assert "FwoGZXIvYXdz" not in scrub(shown) and REDACTED in scrub(shown), shown


def test_a_value_that_was_not_utf8_registers_and_is_scrubbed_as_its_bytes() -> None:
    # os.environ holds bytes that are not UTF-8 as escaped surrogates ("--option-env" values come from it).
    raw = b"env-secret-" + secrets.token_hex(4).encode() + b"\xff"
    value = raw.decode("utf-8", "surrogateescape")
    register_secret(value)
    assert scrub(f"header {raw!r}") == f"header b'{REDACTED}'"
    assert scrub(f"sent {value}") == f"sent {REDACTED}"
