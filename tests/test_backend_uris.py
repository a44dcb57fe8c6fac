"""Dataset URIs and backend options: how a URI is canonicalised or refused, which options are secret, and which
scheme loads which SDK (none until a backend is opened)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from silodlib.backends import (
    REDACTED,
    SCHEMES,
    DatasetURI,
    InvalidDatasetURI,
    backend_class,
    parse_dataset_uri,
    redact_options,
)
from silodlib.backends.uri import SUPPORTED_FORMS

# --- URIs and options --------------------------------------------------------------------------------

SECRET_KEY = "silod-never-print-this-secret"  # a value redact_options must hide


@pytest.mark.parametrize(
    ("text", "expected", "canonical"),
    [
        ("s3://bucket", DatasetURI("s3", ("bucket",), ""), "s3://bucket"),
        ("s3://bucket/", DatasetURI("s3", ("bucket",), ""), "s3://bucket"),
        (
            "s3://my.bucket-1/data/train/",
            DatasetURI("s3", ("my.bucket-1",), "data/train"),
            "s3://my.bucket-1/data/train",
        ),
        (
            "s3://bkt/with space/ünï ✓",
            DatasetURI("s3", ("bkt",), "with space/ünï ✓"),
            "s3://bkt/with space/ünï ✓",
        ),
        ("az://acct1/cont-1", DatasetURI("az", ("acct1", "cont-1"), ""), "az://acct1/cont-1"),
        ("az://acct1/cont-1/a/b/", DatasetURI("az", ("acct1", "cont-1"), "a/b"), "az://acct1/cont-1/a/b"),
        ("file:///data/imagenet/", DatasetURI("file", (), "/data/imagenet"), "file:///data/imagenet"),
        ("file:///d", DatasetURI("file", (), "/d"), "file:///d"),
    ],
)
def test_parse_dataset_uri_canonicalises(text: str, expected: DatasetURI, canonical: str) -> None:
    parsed = parse_dataset_uri(text)
    assert parsed == expected
    assert str(parsed) == canonical
    assert parse_dataset_uri(canonical) == parsed


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        (
            "gs://bucket/x",
            "supported forms are s3://bucket[/prefix], az://account/container[/prefix], file:///",
        ),
        ("bucket/x", "supported forms"),
        ("S3://bucket", "supported forms"),
        ("s3://", "missing bucket name"),
        ("s3:///x", "missing bucket name"),
        ("az://", "missing storage account name"),
        ("az://acct", "missing container"),
        ("file:///", "missing directory path"),
        ("s3://bucket/a//b", "empty path component"),
        ("s3://bucket/a/./b", "'.' and '..'"),
        ("az://acct/cont/../b", "'.' and '..'"),
        ("file:///a/b/..", "'.' and '..'"),
        ("s3://bucket/a/ /b", "whitespace-only"),
        ("s3://bucket/x?versionId=1", "query strings and fragments"),
        ("az://acct/cont/x#frag", "query strings and fragments"),
        ("s3://bucket/x\n", "control characters"),
        ("file://host/data", "no host"),
        ("file://data/relative", "no host"),
        ("file:relative", "supported forms"),
        ("s3://Bad_Bucket/x", "s3://Bad_Bucket/x: bucket name must be 3-63 characters of a-z, 0-9, '.', '-'"),
        ("s3://ab/x", "bucket name must be 3-63"),
        ("s3://" + "b" * 64, "bucket name must be 3-63"),
        ("az://Acct/cont", "storage account name must be 3-24 characters of a-z, 0-9"),
        ("az://acct-1/cont", "storage account name must be 3-24"),
        ("az://" + "a" * 25 + "/cont", "storage account name must be 3-24"),
        ("az://acct/con.t", "container name must be 3-63 characters of a-z, 0-9, '-'"),
        ("az://acct/co", "container name must be 3-63"),
    ],
)
def test_parse_dataset_uri_rejects(text: str, fragment: str) -> None:
    with pytest.raises(InvalidDatasetURI, match=re.escape(fragment)):
        parse_dataset_uri(text)


_SIG = "L8UgRdm2pS7nVtqXJ3yA0bcDeFgHiJkLmNoPqRsTuVw%3D"


@pytest.mark.parametrize(
    ("text", "shown", "fragment"),
    [
        (
            f"az://devstoreaccount1/train/d?se=2030-01-01&sp=rl&sv=2024-05-04&sr=c&sig={_SIG}",
            "az://devstoreaccount1/train/d?...",
            "query strings and fragments ('?', '#') are not allowed (a SAS token or other credential goes in",
        ),
        (f"s3://bucket/x#sig={_SIG}", "s3://bucket/x#...", "query strings and fragments"),
        (  # a SAS URL pasted as a dataset URI
            f"https://acct.blob.core.windows.net/cont?sv=2024-05-04&sr=c&sig={_SIG}",
            "https://acct.blob.core.windows.net/cont?...",
            "unknown or missing scheme",
        ),
        (f"s3://bucket/x?sig={_SIG}&pad={'k' * 4096}", "'s3://bucket/x?...'", "is longer than the 4,096 accepted"),
    ],
)
def test_a_refused_uri_is_named_without_its_query_which_may_hold_a_credential(
    text: str, shown: str, fragment: str
) -> None:
    with pytest.raises(InvalidDatasetURI) as raised:
        parse_dataset_uri(text)
    message = str(raised.value)
    assert message.startswith(shown) or f"starting {shown}" in message, message
    assert fragment in message and _SIG not in message and "sig=" not in message, message


def test_redact_options_hides_exactly_the_secrets() -> None:
    s3_options = {
        "endpoint_url": "http://minio:9000",
        "secret_access_key": SECRET_KEY,
        "session_token": "tok",
    }
    assert redact_options("s3", s3_options) == {
        "endpoint_url": "http://minio:9000",
        "secret_access_key": REDACTED,
        "session_token": REDACTED,
    }
    assert s3_options["secret_access_key"] == SECRET_KEY
    az_options = {"account_url": "https://a.blob.core.windows.net", "account_key": "k", "sas_token": "s"}
    assert redact_options("az", az_options) == {**az_options, "account_key": REDACTED, "sas_token": REDACTED}
    assert redact_options("az", {"connection_string": "c"}) == {"connection_string": REDACTED}
    assert redact_options("file", {}) == {}


def test_every_scheme_a_uri_may_name_has_a_backend_class_of_that_scheme() -> None:
    for form in SUPPORTED_FORMS:
        scheme = form.partition("://")[0]
        assert backend_class(scheme).scheme == scheme
    assert set(SCHEMES) == {form.partition("://")[0] for form in SUPPORTED_FORMS}


REPO = Path(__file__).resolve().parent.parent
SDK_PACKAGES = ("boto3", "botocore", "azure")
_IMPORTED_SDKS = "import sys; {imports}; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({packages!r})))"


def sdks_imported_by(imports: str) -> list[str]:
    """The SDK packages a fresh interpreter has imported after running `imports`."""
    code = _IMPORTED_SDKS.format(imports=imports, packages=SDK_PACKAGES)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    found: list[str] = ast.literal_eval(result.stdout.strip())
    return found


def test_the_control_plane_and_the_simulator_never_import_a_storage_sdk_and_opening_a_backend_does() -> None:
    control_plane = "import silodcli.main, datamgr.server, datamgr.client, datamgr.scheduler.sim.engine"
    assert sdks_imported_by(control_plane) == []
    assert sdks_imported_by("from silodlib.backends import open_backend, redact_options") == []
    opened = "from silodlib.backends import open_backend; open_backend('s3://bucket/prefix', {'region': 'x'})"
    assert sdks_imported_by(opened) == ["boto3", "botocore"]
    redacted = "from silodlib.backends import redact_options; redact_options('az', {'account_key': 'k'})"
    assert sdks_imported_by(redacted) == ["azure"]
