"""What a client presents to the data manager: the CA to verify it with, a client certificate, a bearer token.

The files are read and checked when a command starts, so a wrong file is reported by name rather than as a
failed handshake later; the token and the key never appear in a repr, a log line or a message. No gRPC here
(`grpc_channel` turns these into channels): `silod`'s command line names the environment variables in its
help without loading gRPC.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from silodlib.scrub import register_secret

TLS_CA_ENV = "SILOD_TLS_CA"
TLS_CERT_ENV = "SILOD_TLS_CERT"
TLS_KEY_ENV = "SILOD_TLS_KEY"
TOKEN_FILE_ENV = "SILOD_AUTH_TOKEN_FILE"


# The longest token file: gRPC refuses calls at random once their headers together pass its default metadata
# soft limit of 8 KiB (and all of them past its hard limit). A token of up to 4 KiB leaves the other headers
# room, and reading no more than that stops a wrong file (a log, /dev/zero) from being read whole, or forever.
MAX_TOKEN_BYTES = 4096


class SecurityConfigError(ValueError):
    """Security flags combined wrongly, or a TLS or token file missing, unreadable or malformed; the message
    names the flag and the file."""


def read_token(path: Path) -> str:
    """The bearer token in `path` (--auth-token-file), a file of at most MAX_TOKEN_BYTES, without surrounding
    whitespace (so a trailing newline does not count)."""
    data = _read(path, "--auth-token-file", MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise SecurityConfigError(
            f"--auth-token-file {path} is longer than {MAX_TOKEN_BYTES:,} bytes, more than a token gRPC can carry "
            "in every call's headers; give a shorter token"
        )
    token = data.decode("ascii", errors="replace").strip()
    if not token:
        raise SecurityConfigError(f"--auth-token-file {path} is empty")
    if not all("!" <= char <= "~" for char in token):  # what an HTTP/2 header value can carry unescaped
        raise SecurityConfigError(f"--auth-token-file {path}: the token must be printable ASCII without spaces")
    register_secret(token)  # gRPC's own DEBUG logs of a call's metadata may show it (silodlib.scrub)
    return token


def read_certificates(path: Path, flag: str) -> bytes:
    """One or more PEM certificates (a CA bundle or a certificate chain), checked by OpenSSL."""
    data = _read(path, flag)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise SecurityConfigError(f"{flag} {path} is not a PEM certificate file ({_reason(exc)})") from None
    return data


def read_key_pair(cert: Path, key: Path) -> tuple[bytes, bytes]:
    """(private key, certificate chain) from --tls-cert and --tls-key: PEM, the key unencrypted (gRPC cannot
    decrypt one) and the one the certificate is for."""
    chain = read_certificates(cert, "--tls-cert")
    private_key = _read(key, "--tls-key")

    def refuse_encrypted() -> bytes:
        raise SecurityConfigError(f"--tls-key {key} is encrypted; gRPC needs an unencrypted private key")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=refuse_encrypted)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise SecurityConfigError(f"--tls-key {key} is not the private key of --tls-cert {cert}") from None
        raise SecurityConfigError(f"--tls-key {key} is not a PEM private key") from None
    return private_key, chain


def _read(path: Path, flag: str, most: int = -1) -> bytes:
    """The file's bytes, at most `most` of them (-1: all)."""
    try:
        with path.open("rb") as file:
            return file.read(most)
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not text"
    return str(exc).split(" (_ssl.c")[0]  # OpenSSL's reason without the source location


@dataclass(frozen=True, repr=False)
class ChannelSecurity:
    """What a client presents: the CA to verify the data manager with, a client certificate, a token."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    token: str | None = None

    def __repr__(self) -> str:  # says what is configured, never the key or the token
        client_cert, token = self.certificate_chain is not None, self.token is not None
        return f"ChannelSecurity(tls={self.tls}, client_cert={client_cert}, token={token})"

    @classmethod
    def load(
        cls,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        token: str | None = None,
    ) -> ChannelSecurity:
        """TLS when a CA or a client certificate is given (without a CA, the system's roots verify the data
        manager); raises SecurityConfigError naming the flag and file."""
        if (tls_cert is None) != (tls_key is None):
            raise SecurityConfigError("--tls-cert and --tls-key must be given together")
        private_key = chain = None
        if tls_cert is not None and tls_key is not None:
            private_key, chain = read_key_pair(tls_cert, tls_key)
        roots = read_certificates(tls_ca, "--tls-ca") if tls_ca is not None else None
        return cls(roots, chain, private_key, token)

    @property
    def tls(self) -> bool:
        return self.root_certificates is not None or self.certificate_chain is not None
