"""Where `silod sim` and its actions put their files: all of a run's, or none.

A command writes its files into a fresh hidden directory inside `--out` (`.silod-partial-XXXXXXXX`) and, only once
it has written every one, moves them into `--out`, replacing an earlier run's, and removes the files an earlier run
left that this one does not write (a decision log, a plot by class), and for a comparison the directories of an
earlier comparison's runs that this one does not make: every file in `--out` describes one run. A directory is
taken for a run's only when it holds nothing but files a run writes: one with anything else in it stays. A
run that is interrupted (Ctrl-C), stops (exit 1) or cannot write leaves `--out` as it was, its hidden directory
removed; the moves are renames within one file system, and Ctrl-C waits for them to end. Only a process killed
outright (SIGKILL, a power cut) can leave a hidden directory behind, never a mix of two runs' files.

The alternative, removing an earlier run's files before a run starts, would lose a complete earlier run to a
Ctrl-C and still leave a half-written one; writing aside costs nothing but the rename.

Before anything runs, a command whose outputs include one of its input files (the same file by any name: a hard
link, a symlink) is refused (`refuse_overwriting_inputs`): `silod sim --trace jobs.csv --out .` would replace the
trace with the run's own `jobs.csv`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from types import FrameType

from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.fields import SimInputError
from silodlib.directories import make_directory

STAGING_PREFIX = ".silod-partial-"


@contextlib.contextmanager
def staged_outputs(out: Path, names: Collection[str], run_files: Collection[str] = ()) -> Iterator[Path]:
    """A fresh directory inside `out` to write the files `names` (paths relative to `out`, `fifo-silod/jobs.csv`)
    into. When the block ends without an exception, the files written there replace those in `out`, and each of
    `names` not written is removed from `out`; on an exception, Ctrl-C included, `out` is left as it was (a
    KeyboardInterrupt comes out saying so): if this made it, it is removed again. Ctrl-C while the files move into
    `out` waits until they are all there, and then comes out saying that.

    A command that writes a directory per run (a comparison) gives the files such a directory may hold as
    `run_files`: then a directory of `out` that this command does not write and that holds only some of those
    files is an earlier command's run, and is removed with them (`_earlier_runs`), so that `out` does not list
    runs this command did not make."""
    made = not out.is_dir()
    make_directory(out)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    committed = False
    try:
        try:
            yield staging
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"nothing of this run was written to {out}/") from None
        except OSError as exc:  # a full disk: named by the file the run was writing, as it would be in `out`
            if isinstance(exc.filename, str) and Path(exc.filename).is_relative_to(staging):
                exc.filename = str(out / Path(exc.filename).relative_to(staging))
            raise
        try:
            _commit(staging, out, names, run_files)
        except KeyboardInterrupt:  # Ctrl-C waited for the files to be in place (`_interrupts_deferred`)
            raise KeyboardInterrupt(f"the run was written to {out}/ whole before it stopped") from None
        committed = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made and not committed:
            with contextlib.suppress(OSError):  # another process's file in it since: it stays
                out.rmdir()


def _commit(staging: Path, out: Path, names: Collection[str], run_files: Collection[str]) -> None:
    """Move every file under `staging` to the same place under `out`, and remove each of `names` from `out` that
    `staging` lacks, and each of `out`'s earlier runs (`_earlier_runs`) that `staging` has no directory for."""
    with _interrupts_deferred():
        earlier = _earlier_runs(out, staging, run_files)
        for name in names:
            if not (staging / name).exists():
                (out / name).unlink(missing_ok=True)
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                target = out / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        for directory in earlier:  # into `staging`, removed once this ends: one rename, the run whole or gone
            with contextlib.suppress(OSError):  # one that cannot move (its permissions) stays, as it was
                os.replace(directory, staging / directory.name)


def _earlier_runs(out: Path, staging: Path, run_files: Collection[str]) -> list[Path]:
    """The directories of `out` that hold an earlier command's run and that `staging` does not replace: each holds
    one or more regular files, every one named in `run_files`, and nothing else. One with any other file, a
    directory or a link in it is not recognisably silod's, and stays; so do hidden ones (a staging directory, this
    command's or another's)."""
    if not run_files:
        return []
    earlier = []
    for directory in out.iterdir():
        if directory.name.startswith(".") or directory.is_symlink() or not directory.is_dir():
            continue
        if (staging / directory.name).exists():
            continue
        entries = list(directory.iterdir())
        if entries and all(entry.name in run_files and _is_plain_file(entry) for entry in entries):
            earlier.append(directory)
    return earlier


def _is_plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Within, Ctrl-C (SIGINT) waits: it is raised, as it would have been, when the block ends. Only the main
    thread receives signals; elsewhere, or where SIGINT is ignored, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[FrameType | None] = []
    previous = signal.signal(signal.SIGINT, lambda _signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received and callable(previous):
        previous(signal.SIGINT, received[0])  # Python's own handler raises KeyboardInterrupt
    elif received and previous == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)


def input_files(args: argparse.Namespace) -> dict[str, Path | None]:
    """The input files a `silod sim` command line reads, by what names them (None for one not given): the `--trace`,
    `--cluster` and `--tenants` files, and the tenants file a cluster file names (`tenants = "vcs.toml"`, read from
    beside it), which a run reads as much as the others. A shipped scenario's files are left out: they sit in the
    package, under names no output has."""
    files: dict[str, Path | None] = {
        option: getattr(args, option.removeprefix("--"), None) for option in ("--trace", "--cluster", "--tenants")
    }
    cluster: Path | None = files["--cluster"]
    if cluster is not None:
        named = fields.load_toml(cluster).get("tenants")  # the run's inputs have read it: a SimInputError if not
        files["--cluster file's tenants"] = cluster.parent / named if isinstance(named, str) else None
    return files


def refuse_overwriting_inputs(out: Path, names: Iterable[str], inputs: Mapping[str, Path | None]) -> None:
    """Raise SimInputError, naming both, when one of the files `names` in `out` is one of the `inputs` (option ->
    file): the run would replace or remove its own input."""
    for name in names:
        output = out / name
        for option, path in inputs.items():
            if path is not None and _same_file(output, path):
                raise SimInputError(
                    f"--out {out}: the run would replace {output}, which is the {option} file {path}; give another "
                    "--out, or move the input elsewhere"
                )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (or cannot be looked at): not one file
        return False
