"""What the Azure SDK takes of an `az://` dataset's options and fails on later, checked when they are given: keys that
are not base64, connection strings the SDK's own parse refuses or misreads, and endpoints its HTTP client cannot
connect to. The SDK takes those and fails at the first request, as a transient "endpoint unreachable" that a mount
retried before failing. No message shows a credential."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from urllib.parse import SplitResult, urlsplit

import requests

from silodlib.backends.base import InvalidBackendOption, shown_value
from silodlib.backends.uri import DatasetURI

# The settings of a connection string the SDK reads for the blob service (`parse_connection_str`), by the upper-case
# name it looks them up by.
_SDK_SETTINGS = {
    name.upper(): name
    for name in (
        "AccountName", "AccountKey", "SharedAccessSignature", "BlobEndpoint", "BlobSecondaryEndpoint",
        "DefaultEndpointsProtocol", "EndpointSuffix", "UseDevelopmentStorage",
    )
}  # fmt: skip
# Those that say where the client connects: BlobEndpoint, or else https (DefaultEndpointsProtocol, with an
# EndpointSuffix)://AccountName.blob.EndpointSuffix (core.windows.net).
_ENDPOINT_SETTINGS = ("BLOBENDPOINT", "DEFAULTENDPOINTSPROTOCOL", "ACCOUNTNAME", "ENDPOINTSUFFIX")
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def check_base64(uri: DatasetURI, what: str, key: str) -> None:
    """Refuse an account key that is not base64: the SDK would fail to sign the first request with it."""
    try:
        base64.b64decode(key, validate=True)
    except binascii.Error:
        raise InvalidBackendOption(f"{uri}: {what} must be base64") from None


def check_connection_string(uri: DatasetURI, value: str) -> None:
    """Refuse what the SDK's `parse_connection_str` refuses for the blob service (`Name=value` pairs separated by
    ';', naming a BlobEndpoint or an AccountName, or UseDevelopmentStorage=true), a setting it would not recognise
    for a space around its name, an AccountKey that is not base64, and settings that make an endpoint the client
    cannot connect to (`_check_connection_endpoint`), without showing a credential."""
    pairs = [pair.split("=", 1) for pair in value.rstrip(";").split(";")]
    if any(len(pair) != 2 for pair in pairs):
        raise InvalidBackendOption(
            f"{uri}: option 'connection_string' is malformed: it must be Name=value settings separated by ';'"
        )
    for name, _ in pairs:  # the SDK looks names up as they are: " AccountKey" is none of its settings
        known = _SDK_SETTINGS.get(name.strip().upper())
        if known is not None and name != name.strip():
            raise InvalidBackendOption(
                f"{uri}: option 'connection_string' has a space around the name of its {known} setting (after a "
                "';'?): the Azure SDK would not recognise it"
            )
    settings = {name.upper(): setting for name, setting in pairs}
    if settings.get("USEDEVELOPMENTSTORAGE") == "true":
        return
    if "BLOBENDPOINT" not in settings and "ACCOUNTNAME" not in settings:
        raise InvalidBackendOption(
            f"{uri}: option 'connection_string' names neither a BlobEndpoint nor an AccountName"
            + (" (it has a BlobSecondaryEndpoint only)" if "BLOBSECONDARYENDPOINT" in settings else "")
        )
    if "ACCOUNTKEY" in settings:
        check_base64(uri, "the AccountKey of option 'connection_string'", settings["ACCOUNTKEY"])
    _check_connection_endpoint(uri, settings)


def _check_connection_endpoint(uri: DatasetURI, settings: Mapping[str, str]) -> None:
    """Refuse connection string settings (by upper-case name) that make an endpoint the SDK's HTTP client cannot
    connect to, as `parse_connection_str` makes it: the BlobEndpoint, taken as https:// when it has no scheme, or
    else `https://AccountName.blob.EndpointSuffix` (core.windows.net by default), DefaultEndpointsProtocol in place
    of https when an EndpointSuffix is given. Each setting of these given must hold a value without a space around
    it (an empty BlobEndpoint is silently replaced by the AccountName's endpoint), and DefaultEndpointsProtocol be
    http or https. A query of the BlobEndpoint, which the SDK takes as a SAS, is neither refused nor shown."""
    for key in _ENDPOINT_SETTINGS:
        setting = settings.get(key)
        part = f"the {_SDK_SETTINGS[key]} of option 'connection_string'"
        if setting is not None and not setting.strip():
            raise InvalidBackendOption(f"{uri}: {part} is empty")
        if setting is not None and setting != setting.strip():
            raise InvalidBackendOption(f"{uri}: {part} has a space at its start or end: remove it")
    protocol = settings.get("DEFAULTENDPOINTSPROTOCOL")
    if protocol is not None and protocol.lower() not in ("http", "https"):
        raise InvalidBackendOption(
            f"{uri}: the DefaultEndpointsProtocol of option 'connection_string' must be http or https, got "
            f"{shown_value(protocol)}"
        )
    endpoint = settings.get("BLOBENDPOINT")
    if endpoint is not None:
        _check_endpoint_url(uri, "the BlobEndpoint of option 'connection_string'", endpoint)
        return
    suffix = settings.get("ENDPOINTSUFFIX")
    host = f"{settings['ACCOUNTNAME']}.blob.{suffix or 'core.windows.net'}"
    what = "the endpoint option 'connection_string' makes of its AccountName and EndpointSuffix"
    parts = urlsplit(f"{protocol if protocol and suffix else 'https'}://{host}")
    if any(mark in host for mark in "/?#@"):
        raise InvalidBackendOption(
            f"{uri}: {what} is not a host name: {shown_value(host)} (an EndpointSuffix is a DNS suffix such as "
            "core.windows.net)"
        )
    _check_port(uri, what, parts)
    check_host(uri, what, parts)


def _check_endpoint_url(uri: DatasetURI, what: str, value: str) -> None:
    """Refuse an endpoint URL (`what`, a BlobEndpoint) that the SDK would make a URL the client cannot connect to
    (`_parse_url`: https:// put before one that does not start with "http"): a scheme other than http or https, no
    host, a user name or password (`requests` would send them in place of the account's credentials), a port that is
    no port, a host `requests` refuses. Only the scheme, host and port are ever shown, never a query (a SAS)."""
    if _URL_SCHEME.match(value) is None and not value.lower().startswith("http"):
        value = f"https://{value}"
    try:
        parts = urlsplit(value)
    except ValueError:  # a malformed IPv6 host ("http://[::1")
        raise InvalidBackendOption(f"{uri}: {what} is not a URL") from None
    if parts.scheme not in ("http", "https") or not _URL_SCHEME.match(value):
        scheme = f", not {shown_value(parts.scheme)}" if parts.scheme else ""
        raise InvalidBackendOption(f"{uri}: {what} must be an http:// or https:// URL{scheme}")
    if "@" in parts.netloc:
        raise InvalidBackendOption(
            f"{uri}: {what} must not hold a user name or password ('user:password@' before the host): the "
            "connection string's AccountKey or SharedAccessSignature is the credential"
        )
    if not parts.hostname:
        raise InvalidBackendOption(f"{uri}: {what} must be an http:// or https:// URL with a host")
    _check_port(uri, what, parts)
    check_host(uri, what, parts)


def _check_port(uri: DatasetURI, what: str, parts: SplitResult) -> None:
    try:
        parts.port  # noqa: B018 -- reading it is the check: urlsplit parses the port only when asked
    except ValueError:
        port = shown_value(parts.netloc.rpartition(":")[2])
        raise InvalidBackendOption(f"{uri}: {what} has a port that is not a number from 0 to 65535: {port}") from None


def check_host(uri: DatasetURI, what: str, parts: SplitResult) -> None:
    """Refuse the host (and port) of an endpoint that `requests`, the SDK's HTTP client, refuses to send to (a space
    or another character no host holds, an IDNA label it cannot encode), showing it; its port is checked before."""
    host = parts.netloc.rpartition("@")[2]
    try:
        requests.models.PreparedRequest().prepare_url(f"{parts.scheme}://{host}/", None)
    except requests.exceptions.RequestException:
        raise InvalidBackendOption(
            f"{uri}: {what} has a host the Azure SDK's HTTP client refuses: {shown_value(host)} (a host is a DNS name "
            "or an IP address)"
        ) from None
