"""Scrubbing secrets out of text bound for a log line or a message: `scrub(text)`.

Two kinds of secret reach text that silod does not write itself (an SDK's DEBUG dump of a request, a urllib3
request line, an exception's text):

- values silod was given: a backend's secret options (`Backend.secret_options`), registered with
  `register_secret` when the backend is opened, are replaced wherever they appear, whatever the SDK wrapped
  them in;
- values derived from them, fetched by an SDK's credential chain, or carried in a header, which silod never
  sees as option values: request signatures (AWS `Signature=`, Azure `SharedKey account:…`, a SAS's `sig=`
  and the rest of its query), session tokens in `x-amz-security-token`, `Authorization` headers, bearer
  tokens (silod's own `authorization: Bearer …` metadata, Azure AD's), a connection string's `AccountKey=`,
  STS answers' keys. They are found by the shapes the SDKs log them in.

The registry is process-wide on purpose: logging is, and the records come from SDK threads that know
nothing of silod's objects. Nothing is ever unregistered: a value that stopped being used is still a secret.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from urllib.parse import quote

REDACTED = "<redacted>"

MIN_SCRUBBED_LENGTH = 8
"""Shorter registered values are not scrubbed by value: they cannot be told from ordinary words in the text
(replacing every "abc" would garble the log). The shape patterns below still apply to them."""

# A quoted Authorization header value, as in a dict or tuple of headers: `'Authorization': b'AWS4-HMAC-…'`,
# `('authorization', 'Bearer …')`. Unquoted ones are caught by the scheme patterns below.
_AUTHORIZATION = re.compile(r"""(?i)(\bauthorization['"]?\s*[:=,]\s*b?)(['"])(?:(?!\2).)*\2""")
# Every key=value of a query (or a bare SAS token) that carries a SAS signature: the whole SAS is the
# credential, not only its `sig`, since its other fields say what it grants and for how long.
_SAS_QUERY = re.compile(r"""(?i)(?:[\w.~%-]+=[^&\s'"#]*&)*\bsig=[^&\s'"#]*(?:&[\w.~%-]+=[^&\s'"#]*)*""")
# Case-sensitive, as HTTP clients write the scheme, so that prose ("a bearer token") is left alone; up to a
# space or quote, as silod's tokens may hold any other printable character. A placeholder ("Bearer <token>",
# in a refusal's advice) is not a token.
_BEARER = re.compile(r"""(\bBearer\s+)[^\s'"<][^\s'"]*""")
_SHARED_KEY = re.compile(r"""(?i)(\bsharedkey(?:lite)?\s+[^\s:'"]+:)[\w+/]+=*""")
# Named fields that hold a secret, as header lines (`x-amz-security-token:…`), query or connection-string
# parts (`X-Amz-Signature=…`, `AccountKey=…;`), dict entries (`'X-Amz-Security-Token': b'…'`), JSON and
# botocore.auth's `Signature:\n…`; and OAuth answers' tokens (`"access_token": "…"`).
_FIELD = re.compile(
    r"""(?ix)
    (\b(?:x-amz-security-token|signature|accountkey|sharedaccesssignature|secretaccesskey|sessiontoken
    |access_token|refresh_token)
    (?>['"]?\s*[:=]\s*(?:b?['"])?))  # atomic: a value already replaced must not match from its `b'` on
    [^\s&;,'"<>]+
    """
)
# STS answers (AssumeRole, GetSessionToken), which botocore.parsers logs as the response body at DEBUG.
_XML_FIELD = re.compile(r"(?i)(<(?:SecretAccessKey|SessionToken)>)[^<]*")

_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_AUTHORIZATION, lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(2)}"),
    (_SAS_QUERY, REDACTED),
    (_BEARER, rf"\g<1>{REDACTED}"),
    (_SHARED_KEY, rf"\g<1>{REDACTED}"),
    (_FIELD, rf"\g<1>{REDACTED}"),
    (_XML_FIELD, rf"\g<1>{REDACTED}"),
)

_lock = threading.Lock()
_registered: set[str] = set()
_known: re.Pattern[str] | None = None  # every registered value, longest first; replaced, never mutated


def _forms(value: str) -> set[str]:
    """The ways `value` appears in text: as given and without surrounding whitespace, each as is, URL-encoded (in a
    query), and escaped as a str's or bytes' repr or a JSON string shows it (an SDK refusing a header value prints
    `b'…\\n'`)."""
    forms: set[str] = set()
    for text in {value, value.strip()}:
        encoded = _utf8(text)
        forms |= {
            text,
            quote(encoded, safe=""),
            repr(text)[1:-1],
            repr(encoded)[2:-1],
            json.dumps(text)[1:-1],
            json.dumps(text, ensure_ascii=False)[1:-1],
        }
    return {form for form in forms if len(form) >= MIN_SCRUBBED_LENGTH}


def _utf8(text: str) -> bytes:
    """`text` in UTF-8, as an SDK sends it; a value from an environment variable that was not UTF-8 holds its bytes
    as escaped surrogates, which go back to those bytes (any other lone surrogate is written as an escape)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def register_secret(value: str) -> None:
    """From now on, `scrub` replaces `value` wherever it appears: as given, without surrounding whitespace,
    URL-encoded (as in a query) and escaped as a repr or JSON string shows it (see `_forms`); values and forms
    shorter than MIN_SCRUBBED_LENGTH are ignored."""
    global _known
    forms = _forms(value)
    with _lock:
        if forms <= _registered:
            return
        _registered.update(forms)
        alternatives = sorted(_registered, key=len, reverse=True)
        _known = re.compile("|".join(map(re.escape, alternatives)))


def scrub(text: str) -> str:
    """`text` with every registered secret value and every secret-shaped field replaced by REDACTED."""
    known = _known
    if known is not None:
        text = known.sub(REDACTED, text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
