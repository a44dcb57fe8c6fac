"""Dataset URIs: the one spelling of "where a dataset lives" shared by the CLI, the data manager and nodes.

Every accepted URI has exactly one canonical form (`str(DatasetURI)`), so two spellings of the same
dataset compare equal and the data manager can key datasets by it. Parsing is strict on purpose: an
unusual URI is rejected with a message naming the rule instead of being guessed at, because a guess
made on one node and not on another would make nodes disagree about what a dataset contains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUPPORTED_FORMS = ("s3://bucket[/prefix]", "az://account/container[/prefix]", "file:///absolute/path")

_S3_BUCKET = re.compile(r"[a-z0-9.-]{3,63}")
_AZ_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_AZ_CONTAINER = re.compile(r"[a-z0-9-]{3,63}")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class InvalidDatasetURI(ValueError):
    """A dataset URI that does not follow the rules; the message names the URI, the fault and the rule."""


@dataclass(frozen=True)
class DatasetURI:
    """A parsed, canonical dataset location. Build it with `parse_dataset_uri`, which validates.

    `location` is `(bucket,)` for s3, `(account, container)` for az and `()` for file. `prefix` is a
    '/'-separated directory path without leading or trailing '/' ("" is the whole bucket or container);
    for file it is the absolute directory path without a trailing '/'.
    """

    scheme: str
    location: tuple[str, ...]
    prefix: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.prefix}"
        parts = [*self.location, self.prefix] if self.prefix else list(self.location)
        return f"{self.scheme}://" + "/".join(parts)


# Object keys and blob names stop at 1,024 bytes and local paths at PATH_MAX (4,096): a longer URI is a mistake.
MAX_URI_CHARS = 4096


def parse_dataset_uri(text: str) -> DatasetURI:
    """Parse and canonicalise a dataset URI (one trailing '/' is dropped), or raise `InvalidDatasetURI`."""
    if not text.strip():
        raise InvalidDatasetURI(f"{text!r}: dataset URI is empty")
    shown = _without_query(text)
    if len(text) > MAX_URI_CHARS:  # refused before anything echoes it into a log line or an error trailer
        raise InvalidDatasetURI(
            f"dataset URI of {len(text):,} characters (starting {shown[:60]!r}) is longer than the {MAX_URI_CHARS:,} "
            "accepted"
        )
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in _PARSERS:
        raise InvalidDatasetURI(
            f"{shown}: unknown or missing scheme; supported forms are " + ", ".join(SUPPORTED_FORMS)
        )
    if "?" in rest or "#" in rest:
        raise InvalidDatasetURI(
            f"{shown}: query strings and fragments ('?', '#') are not allowed (a SAS token or other credential goes "
            "in the dataset's options)"
        )
    if _CONTROL_CHARS.search(rest):
        raise InvalidDatasetURI(f"{text!r}: control characters are not allowed")
    if rest.endswith("/") and rest != "/":
        rest = rest[:-1]
    return _PARSERS[scheme](text, rest)


def _without_query(text: str) -> str:
    """`text` cut at its first '?' or '#', with '?...' or '#...' in place of what followed: a refusal names the URI
    without its query or fragment, which may hold a credential (a SAS token, a presigned URL's signature)."""
    cut = min((index for index in (text.find("?"), text.find("#")) if index >= 0), default=-1)
    return text if cut < 0 else f"{text[: cut + 1]}..."


def _parse_s3(text: str, rest: str) -> DatasetURI:
    parts = _components(text, rest, "bucket name")
    bucket = parts[0]
    if not _S3_BUCKET.fullmatch(bucket):
        raise InvalidDatasetURI(f"{text}: bucket name must be 3-63 characters of a-z, 0-9, '.', '-'")
    return DatasetURI("s3", (bucket,), "/".join(parts[1:]))


def _parse_az(text: str, rest: str) -> DatasetURI:
    parts = _components(text, rest, "storage account name")
    if len(parts) < 2:
        raise InvalidDatasetURI(f"{text}: missing container; expected az://account/container[/prefix]")
    account, container = parts[0], parts[1]
    if not _AZ_ACCOUNT.fullmatch(account):
        raise InvalidDatasetURI(f"{text}: storage account name must be 3-24 characters of a-z, 0-9")
    if not _AZ_CONTAINER.fullmatch(container):
        raise InvalidDatasetURI(f"{text}: container name must be 3-63 characters of a-z, 0-9, '-'")
    return DatasetURI("az", (account, container), "/".join(parts[2:]))


def _parse_file(text: str, rest: str) -> DatasetURI:
    if not rest.startswith("/"):
        raise InvalidDatasetURI(
            f"{text}: file URIs take no host and need an absolute path; expected file:///absolute/path"
        )
    parts = _components(text, rest[1:], "directory path")
    return DatasetURI("file", (), "/" + "/".join(parts))


def _components(text: str, path: str, first: str) -> list[str]:
    """Split a path into '/'-separated components, rejecting empty, '.', '..' and whitespace-only ones.

    `first` names what the first component is, for the message when the path is empty.
    """
    parts = path.split("/")
    if not parts[0]:
        raise InvalidDatasetURI(f"{text}: missing {first}")
    for part in parts:
        if not part:
            raise InvalidDatasetURI(f"{text}: empty path component ('//') is not allowed")
        if part in (".", ".."):
            raise InvalidDatasetURI(f"{text}: '.' and '..' path components are not allowed")
        if not part.strip():
            raise InvalidDatasetURI(f"{text}: whitespace-only path components are not allowed")
    return parts


_PARSERS = {"s3": _parse_s3, "az": _parse_az, "file": _parse_file}
