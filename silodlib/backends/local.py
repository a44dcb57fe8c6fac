"""A local (or network-mounted) directory as a dataset: the embedded default and the test reference."""

from __future__ import annotations

import errno
import os
import stat as statmod
from collections.abc import Generator, Iterator, Mapping
from typing import ClassVar

from silodlib.backends.base import (
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    NoSuchObject,
    ObjectInfo,
    changed_object,
)
from silodlib.backends.uri import DatasetURI

# Failures a network filesystem (NFS, SMB) can recover from; local disks do not produce them.
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.ESTALE,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ECONNRESET,
    }
)
_NOT_FOUND_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


class LocalBackend(Backend):
    """`file:///absolute/path`: the regular files below a directory. Takes no options.

    Symbolic links are not part of the dataset: `list` skips them (so it never leaves the tree), and
    `stat`/`read` refuse any key whose path goes through one, so a key always names the same bytes
    the listing described. Other non-regular files (FIFOs, sockets, devices) are skipped too. A name that is not
    valid UTF-8 is listed as Python holds it (with surrogate escapes): keys travel as UTF-8 strings, so the
    manifest skips it and counts it (`silodlib.manifest.build_manifest`).

    A directory is listed as an explicit folder (`is_dir=True`) only when nothing is listed below it,
    i.e. when it would otherwise be invisible; other directories are implied by the keys below them,
    exactly as for object stores. Versions are `f"{size}-{mtime_ns}"`.
    """

    scheme: ClassVar[str] = "file"

    def __init__(self, uri: DatasetURI, options: Mapping[str, str]) -> None:
        super().__init__(uri, options)
        with self._translated_errors(str(uri)):
            is_dir = statmod.S_ISDIR(os.stat(uri.prefix).st_mode)
        if not is_dir:
            raise NoSuchObject(f"{uri}: not a directory")
        self._root = os.path.realpath(uri.prefix)

    def list(self) -> Iterator[ObjectInfo]:
        with self._translated_errors(str(self.uri)):
            yield from self._walk(self._root, "")

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with self._translated_errors(self.object_uri(key)):
            st = os.stat(path, follow_symlinks=False)
        if not statmod.S_ISREG(st.st_mode):
            raise NoSuchObject(f"{self.object_uri(key)}: not a regular file")
        return _object_info(key, st)

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        """See `Backend.read`. The version (size and mtime) is checked on the opened file, before reading:
        a rewrite that keeps both (same size, within one tick of the file system's clock) goes unnoticed."""
        if not self._wants_bytes(key, offset, length):
            return b""
        path = self._path(key)
        with self._translated_errors(self.object_uri(key)):
            # O_NONBLOCK: opening a FIFO planted in the tree must not hang; no effect on regular files.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if not statmod.S_ISREG(st.st_mode):
                    raise NoSuchObject(f"{self.object_uri(key)}: not a regular file")
                if version is not None and _version(st) != version:
                    raise changed_object(self.object_uri(key), version, _version(st))
                chunks: list[bytes] = []
                while length > 0 and (chunk := os.pread(fd, length, offset)):
                    chunks.append(chunk)
                    offset += len(chunk)
                    length -= len(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Nothing to release: every call opens and closes what it uses."""

    def _translate(self, exc: Exception, what: str) -> BackendError:
        if not isinstance(exc, OSError) or exc.errno is None:
            return super()._translate(exc, what)
        message = f"{what}: {os.strerror(exc.errno)}"
        if exc.errno in _NOT_FOUND_ERRNOS:
            return NoSuchObject(message)
        if exc.errno in (errno.EACCES, errno.EPERM):
            return AccessDenied(message)
        if exc.errno in _TRANSIENT_ERRNOS:
            return BackendUnavailable(message)
        return BackendError(message)

    def _path(self, key: str) -> str:
        """The path of `key`, refusing keys that go through a symlink (see the class docstring)."""
        self._check_key(key)
        path = os.path.join(self._root, key)
        if os.path.realpath(path) != path:
            raise NoSuchObject(f"{self.object_uri(key)}: path has a symbolic link, not part of the dataset")
        return path

    def _walk(self, directory: str, key_prefix: str) -> Generator[ObjectInfo, None, bool]:
        """Yield what is listed below `directory`; return whether anything was."""
        found = False
        with os.scandir(directory) as entries:
            for entry in entries:
                key = key_prefix + entry.name
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if not (yield from self._walk(entry.path, key + "/")):
                        yield _object_info(key, entry.stat(follow_symlinks=False))
                    found = True
                elif entry.is_file(follow_symlinks=False):
                    yield _object_info(key, entry.stat(follow_symlinks=False))
                    found = True
        return found


def _object_info(key: str, st: os.stat_result) -> ObjectInfo:
    is_dir = statmod.S_ISDIR(st.st_mode)
    size = 0 if is_dir else st.st_size
    return ObjectInfo(key, size, _version(st), st.st_mtime_ns, is_dir)


def _version(st: os.stat_result) -> str:
    return f"{st.st_size}-{st.st_mtime_ns}"
