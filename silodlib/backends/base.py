"""The storage backend interface: list a dataset, stat and read byte ranges of its objects.

Callers never see SDK exceptions: every backend turns them into `NoSuchObject`, `AccessDenied`,
`BackendUnavailable` (worth retrying) or plain `BackendError`, with a message that names the object's
full URI and the cause and never contains a credential. Retrying is the caller's job (one shared retry
wrapper keyed on `is_transient`), so SDK-level retries are kept short and bounded.
"""

from __future__ import annotations

import abc
import contextlib
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import ClassVar
from urllib.parse import urlsplit

from silodlib.backends.uri import DatasetURI
from silodlib.control_chars import CONTROL_CHARS, escape_control_chars
from silodlib.scrub import register_secret, scrub
from silodlib.units import UnitError, parse_rate

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The userinfo of a URL ('user:password@' after '//', before the host ends at '/', '?' or '#'): where urlsplit finds
# it, and in text urlsplit refuses too (a malformed IPv6 host), so that no form of it is shown. Leading whitespace and
# control characters are skipped, as urlsplit skips them.
_URL_USERINFO = re.compile(r"(?P<head>[\x00-\x20]*(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)(?P<userinfo>[^/?#]*)@")
_MASK = "***"

READ_TIMEOUT_OPTION = "read_timeout"
DEFAULT_READ_TIMEOUT = 30.0
"""Seconds a remote backend waits for the next bytes of an answer (headers or body) before the try fails as
transient; each retry waits as long again."""
_MAX_READ_TIMEOUT = 3600.0

MAX_OPTION_CHARS = 8192
"""The longest option value taken: longer than any credential, endpoint or setting (S3 refuses a request whose headers
together pass 8 KiB), so a longer one is a mistake (a file's whole content), refused before anything uses it."""
MAX_SHOWN_CHARS = 40
"""The most of a value a message shows (`shown_value`): enough to recognise it (a region, a host name, a duration)."""

MIN_READ_RATE_OPTION = "min_read_rate"
DEFAULT_MIN_READ_RATE = 64 * 1024
"""Bytes/s: a try of a read of n bytes from a remote backend may take `read_timeout + n / min_read_rate` seconds in
all (`deadline`), so a 4 MiB item gets 94 s by default. Far below what a storage service sends on one connection:
only an answer that trickles, or a node link under 1 MiB/s shared by a dataset's 16 fetches, trips it; 0 turns
the deadline off."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object (or explicit folder, `is_dir=True`) of a dataset.

    `key` is the object's name relative to the dataset prefix, '/'-separated, as stored: a listing also yields
    names that cannot be paths (see `is_valid_key`), which the manifest skips and counts. `version`
    changes whenever the content does (ETag for S3/Azure, size and mtime for local files); a read given
    the version fails with `ChangedObject` once it no longer holds, so a changed object is reported
    instead of being served as a mix of old and new bytes.
    """

    key: str
    size: int
    version: str
    mtime_ns: int
    is_dir: bool = False


class BackendError(Exception):
    """A storage operation failed; the message names the object or dataset URI and the cause."""


class NoSuchObject(BackendError):
    """The object, or the bucket, container or directory holding the dataset, does not exist."""


class AccessDenied(BackendError):
    """The credentials are missing, wrong, or lack permission for the object."""


class BackendUnavailable(BackendError):
    """A transient failure (unreachable endpoint, timeout, throttling, 5xx); retrying may succeed."""


class ChangedObject(BackendError):
    """The object is not the version the dataset's manifest froze: it changed after registration."""


def changed_object(uri: str, version: str, current: str | None = None) -> ChangedObject:
    """The error for an object at `uri` that no longer has the manifest's `version` (`current` if known)."""
    now = f", now {current}" if current else ""
    return ChangedObject(
        f"{uri}: changed after the dataset was registered (registered version {version}{now}); "
        "a registered dataset must not change: register the new content as a new dataset"
    )


class InvalidBackendOption(BackendError, ValueError):
    """A backend option is unknown or has an invalid value; the message names the option, never the value of one
    that may hold a secret, and another's only as `shown_value` shows it (short, escaped)."""


class Backend(abc.ABC):
    """A read-only view of one dataset: the objects under a URI's prefix.

    Methods block (callers run them in worker threads) and must be safe to call from several threads
    at once. Subclasses declare their `scheme`, the `option_names` they accept and which of those are
    `secret_options`; the constructor rejects anything else before a subclass sees the options.
    """

    scheme: ClassVar[str]
    option_names: ClassVar[frozenset[str]] = frozenset()
    secret_options: ClassVar[frozenset[str]] = frozenset()
    url_options: ClassVar[frozenset[str]] = frozenset()
    """Those of `option_names` whose value is a URL (`parse_url_option`)."""

    def __init__(self, uri: DatasetURI, options: Mapping[str, str]) -> None:
        if uri.scheme != self.scheme:
            raise ValueError(f"{uri}: {type(self).__name__} serves {self.scheme}:// URIs only")
        refusals = self.option_refusals(uri, options)
        if refusals:
            raise next(iter(refusals.values()))
        self.uri = uri
        for name in self.secret_options & options.keys():  # the SDK's DEBUG logs may show them (silodlib.scrub)
            register_secret(options[name])

    @classmethod
    def option_refusals(cls, uri: DatasetURI, options: Mapping[str, str]) -> dict[str, InvalidBackendOption]:
        """Why the backend refuses each of `options` it refuses on its own, by name in name order: an unknown name, a
        blank value, one over `MAX_OPTION_CHARS`, a control character, a URL option that is no plain http(s) URL
        (`parse_url_option`), a `read_timeout` or `min_read_rate` that does not parse, and what a subclass checks of
        its own options (`_check_option`: what its SDK would refuse when the client is made). Messages name the
        option; they never show a secret option's value, and another's only as `shown_value` shows it.

        The one check of option values both an open and the data manager's start make (`datamgr.stored_options`,
        for options an older silod stored): it opens nothing (no SDK client, no credential chain, no request), so
        it is fast and offline. What depends on options together (credentials that exclude each other, a profile
        that must exist) is left to the constructor."""
        refusals: dict[str, InvalidBackendOption] = {}
        for name in sorted(options):
            try:
                cls._check_option(uri, name, options[name])
            except InvalidBackendOption as exc:
                refusals[name] = exc
        return refusals

    @classmethod
    def _check_option(cls, uri: DatasetURI, name: str, value: str) -> None:
        """Refuse the option `name` with `value` on its own (see `option_refusals`); subclasses extend it with the
        checks of their own options, made as their SDK makes them."""
        if name not in cls.option_names:
            accepted = ", ".join(sorted(cls.option_names)) or "none"
            raise InvalidBackendOption(
                f"{uri}: unknown option {shown_value(name)} for {cls.scheme}:// (accepted: {accepted})"
            )
        if not value.strip():
            raise InvalidBackendOption(f"{uri}: option {name!r} must not be empty")
        if len(value) > MAX_OPTION_CHARS:
            raise InvalidBackendOption(
                f"{uri}: option {name!r} is {len(value):,} characters long; an option value holds at most "
                f"{MAX_OPTION_CHARS:,} (no credential, URL or setting is longer: a whole file's content?)"
            )
        _check_no_control_chars(uri, name, value)
        if name in cls.url_options:
            parse_url_option(uri, name, value)
        elif name == READ_TIMEOUT_OPTION:
            read_timeout_option(uri, {name: value})
        elif name == MIN_READ_RATE_OPTION:
            min_read_rate_option(uri, {name: value})

    @classmethod
    def open_waits_for(cls, uri: DatasetURI, options: Mapping[str, str]) -> str:
        """What opening a backend with `options` may wait for off this process (a credential lookup: a program it
        runs, a service it asks), in words for an operator told that an open has not returned; "" where nothing is
        known. Never a secret: a program is named by its file name alone, never with its arguments. Reads local
        configuration only, and never raises: it is a hint."""
        return ""

    @abc.abstractmethod
    def list(self) -> Iterator[ObjectInfo]:
        """Yield every object and explicit folder under the dataset prefix, recursively, in any order.

        Names are yielded as stored, including those that cannot be paths below a mount point: the manifest
        decides what a dataset holds (`silodlib.manifest.build_manifest`). Raises `NoSuchObject` if the bucket,
        container or directory does not exist; a prefix with nothing under it lists nothing (object stores cannot
        tell it from an absent one).
        """

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Describe the object `key`, or raise `NoSuchObject`.

        Folders are known from `list` only: a folder's key raises `NoSuchObject`, except on Azure
        hierarchical-namespace accounts, whose folders are blobs and are reported with `is_dir=True`.
        """

    @abc.abstractmethod
    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        """Return up to `length` bytes of `key` from `offset`: short at the end, b"" at or after it.

        With `version` (an `ObjectInfo.version` from `list` or `stat`), raise `ChangedObject` unless the
        object still has that version; the check is the storage's own where it has one (a conditional
        request), so no byte of another version is returned. A zero `length` returns b"" without
        contacting storage.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and credentials; the backend must not be used afterwards."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether retrying the failed operation may succeed: only `BackendUnavailable` failures.

        Accepts raw SDK exceptions too, classified exactly as this backend would translate them.
        """
        if not isinstance(exc, BackendError) and isinstance(exc, Exception):
            exc = self._translate(exc, str(self.uri))
        return isinstance(exc, BackendUnavailable)

    def object_uri(self, key: str) -> str:
        """The full URI of `key`, as used in messages."""
        return f"{self.uri}/{key}"

    def _translate(self, exc: Exception, what: str) -> BackendError:
        """Map an SDK or OS exception raised while accessing `what` (a URI) to one of ours.

        Backends override this, the single place where their SDK's errors are classified; build
        messages with `self._describe(exc)` so no credential leaks into them.
        """
        return BackendError(f"{what}: {self._describe(exc)}")

    @contextlib.contextmanager
    def _translated_errors(self, what: str) -> Iterator[None]:
        """Re-raise any non-BackendError exception from the block as `self._translate(exc, what)`.

        The original is not chained: SDK exception texts can carry signed URLs, and a chained cause
        would print them in tracebacks. Its type and (scrubbed) first line are in our message instead.
        """
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:
            raise self._translate(exc, what) from None

    def _describe(self, exc: BaseException) -> str:
        """The exception's type and first line of text, scrubbed as a log line is (`silodlib.scrub`: the options'
        secrets were registered at the open; one too short to tell from ordinary text is left, as in logs, rather
        than cut out of a bucket name or a path)."""
        text = scrub(str(exc))
        first_line = (text.strip().splitlines() or [""])[0][:300]
        return f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__

    def _check_key(self, key: str) -> None:
        """Raise `NoSuchObject` unless `key` could be a listed key (see `is_valid_key`)."""
        if not is_valid_key(key):
            raise NoSuchObject(
                f"{self.object_uri(key)}: not a valid key (a relative '/'-separated path without "
                "empty, '.' or '..' components)"
            )

    def _wants_bytes(self, key: str, offset: int, length: int) -> bool:
        """Validate `read` arguments; False when the answer is b"" without asking storage (length 0)."""
        self._check_key(key)
        if offset < 0 or length < 0:
            raise ValueError(f"{self.object_uri(key)}: read offset and length must be >= 0")
        return length > 0


def _check_no_control_chars(uri: DatasetURI, name: str, value: str) -> None:
    """Refuse a value holding a control character, naming the option and the character but never the value (it may
    be a secret). Never part of a credential, endpoint or setting, a control character is the common remnant of a
    value read from a file (a Kubernetes Secret made with --from-file ends with "\n"), and an SDK that rejects one (in
    an HTTP header value) prints the whole value's repr in its error."""
    found = CONTROL_CHARS.search(value)
    if found is None:
        return
    if value.endswith(("\n", "\r")) and not CONTROL_CHARS.search(value.rstrip("\r\n")):
        raise InvalidBackendOption(
            f"{uri}: option {name!r} ends with a newline (a file's trailing newline?): remove it; option values "
            "must not hold control characters"
        )
    raise InvalidBackendOption(
        f"{uri}: option {name!r} holds a control character (U+{ord(found.group()):04X}): option values must not "
        "hold control characters"
    )


def shown_value(value: str) -> str:
    """A non-secret value (an option's, or its name) as a message shows it: quoted and escaped as Python's `repr`
    shows a string (a control character or a quote cannot break the line or hide where the value ends), a URL's
    userinfo masked (`shown_option_value`), and cut after `MAX_SHOWN_CHARS` characters, ending '...' and followed
    by the length (values arrive from the wire: a message carries them to gRPC trailers, which hold 16 KiB, and to
    one log line). The one way a value is shown in a refusal; a secret option's value is never shown at all."""
    value = _masked_userinfo(value)
    if len(value) <= MAX_SHOWN_CHARS:
        return repr(value)
    return f"{value[:MAX_SHOWN_CHARS] + '...'!r} ({len(value):,} characters)"


def shown_sdk_text(exc: Exception) -> str:
    """An SDK's refusal as a message shows it: the first line of its text, scrubbed of secrets (`silodlib.scrub`)
    and shown as `shown_value` shows a value ('' for none)."""
    lines = scrub(str(exc)).strip().splitlines()
    return shown_value(lines[0] if lines else "")


def is_valid_key(key: str) -> bool:
    """Whether `key` can be a path below a mount point: no empty, '.' or '..' components, no NUL."""
    return bool(key) and "\0" not in key and all(part not in ("", ".", "..") for part in key.split("/"))


def join_key(prefix: str, key: str) -> str:
    """The object store name of `key` in a dataset whose prefix is `prefix` ("" for a whole bucket)."""
    return f"{prefix}/{key}" if prefix else key


def relative_key(prefix: str, name: str) -> tuple[str, bool] | None:
    """Split an object store name under `prefix` into (key, is_dir), or None for the prefix's own folder marker.

    A name ending in '/' is a folder marker. Every other name is returned as stored, even one that cannot be a
    path below a mount point ('a//b', '/x', '../x'): which names a dataset can hold is the manifest's decision
    (`silodlib.manifest.build_manifest`), which skips those and counts them, so that a listing's skipped keys are
    reported once, with their number, rather than one log line each.
    """
    key = name[len(prefix) + 1 :] if prefix else name
    is_dir = key.endswith("/")
    if is_dir:
        key = key[:-1]
    if not key:
        return None
    return key, is_dir


def unquote_etag(etag: str) -> str:
    """An ETag without its surrounding double quotes (servers differ in whether they send them)."""
    return etag.strip('"')


def datetime_to_ns(value: datetime) -> int:
    """Nanoseconds since the Unix epoch of an aware datetime, exactly (no float rounding)."""
    return (value - _EPOCH) // timedelta(microseconds=1) * 1000


def parse_bool_option(uri: DatasetURI, name: str, value: str) -> bool:
    """'true' or 'false' (any case), else `InvalidBackendOption` naming the option."""
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidBackendOption(f"{uri}: option {name!r} must be 'true' or 'false'")
    return lowered == "true"


def parse_seconds_option(uri: DatasetURI, name: str, value: str, maximum: float) -> float:
    """A number of seconds in (0, `maximum`], else `InvalidBackendOption` naming the option and the bad value (a
    duration is never secret; the value is cut short, as options arrive from the wire too)."""
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= maximum:  # NaN fails too
        raise InvalidBackendOption(
            f"{uri}: option {name!r} must be a number of seconds greater than 0 and at most {maximum:g}, "
            f"got {shown_value(value)}"
        )
    return seconds


def read_timeout_option(uri: DatasetURI, options: Mapping[str, str]) -> float:
    """The `read_timeout` option in seconds (`DEFAULT_READ_TIMEOUT` when not given), validated."""
    value = options.get(READ_TIMEOUT_OPTION)
    if value is None:
        return DEFAULT_READ_TIMEOUT
    return parse_seconds_option(uri, READ_TIMEOUT_OPTION, value, _MAX_READ_TIMEOUT)


def min_read_rate_option(uri: DatasetURI, options: Mapping[str, str]) -> int:
    """The `min_read_rate` option in bytes/s (`DEFAULT_MIN_READ_RATE` when not given; 0: no deadline), validated."""
    value = options.get(MIN_READ_RATE_OPTION)
    if value is None:
        return DEFAULT_MIN_READ_RATE
    try:
        return parse_rate(value)
    except UnitError as exc:
        why = str(exc) if len(value) <= MAX_SHOWN_CHARS else f"got {shown_value(value)}"
        raise InvalidBackendOption(
            f"{uri}: option {MIN_READ_RATE_OPTION!r} must be a rate such as 64KiB/s, or 0 for no deadline: {why}"
        ) from None


def parse_url_option(uri: DatasetURI, name: str, value: str) -> str:
    """An http(s) URL with a host, no user name or password and no query or fragment, without a trailing '/'.

    A URL option is not secret (queries show it, logs print it), so it must not carry credentials: userinfo
    ('user:password@host') is refused without echoing it, as is a query (where a SAS would go).
    """
    if _URL_USERINFO.match(value):
        raise InvalidBackendOption(
            f"{uri}: option {name!r} must not hold a user name or password ('user:password@' before the host): "
            "the URL is shown by queries and in logs; credentials go in their own options, which are kept secret"
        )
    try:
        parts = urlsplit(value.strip())
    except ValueError:  # a malformed IPv6 host ("http://[::1"); the refusal below says what is wanted
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise InvalidBackendOption(
            f"{uri}: option {name!r} must be an http:// or https:// URL with a host and no query string"
        )
    try:
        parts.port  # noqa: B018 -- reading it is the check: urlsplit parses the port only when asked
    except ValueError:
        port = parts.netloc.rpartition(":")[2]
        raise InvalidBackendOption(
            f"{uri}: option {name!r} has a port that is not a number from 0 to 65535: {shown_value(port)}"
        ) from None
    return value.strip().rstrip("/")


def shown_option_value(value: str) -> str:
    """A non-secret option's value as it may be shown (a query's answer, a log line): a URL's userinfo masked, its
    user name kept (`https://user:***@host/`, a bare `https://***@host/`, as the user part alone is often a token),
    and control characters escaped (`\\n`, `\\x1b`), so that a value an older silod stored before such values were
    refused neither shows a password nor breaks a line or reaches a terminal raw. A value neither applies to is
    returned as is."""
    return escape_control_chars(_masked_userinfo(value))


def _masked_userinfo(value: str) -> str:
    found = _URL_USERINFO.match(value)
    if found is None:
        return value
    user, colon, _ = found["userinfo"].partition(":")
    masked = f"{user}:{_MASK}" if colon else _MASK
    return f"{found['head']}{masked}@{value[found.end() :]}"
