"""The data manager's start-up check of the backend options its state dir holds: datasets an older silod registered
may hold option values this one refuses (a control character, such as a Secret file's trailing newline; a URL with
`user:password@`). Node agents of this version refuse to open such a dataset, so its jobs get no directory there;
the operator learns it from the data manager's start, with the command that fixes it, rather than from a node.

Nothing is refused and nothing is changed: the dataset keeps being served as stored until `silod dataset
set-options` replaces the options (which a start must not do on its own: the right value is the operator's)."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable

from datamgr.entities import Dataset
from silodlib.backends import backend_class, parse_dataset_uri
from silodlib.logfields import log_ids

log = logging.getLogger(__name__)


def _warning(dataset: Dataset) -> str | None:
    """The warning for a stored dataset whose options this version's backends refuse (`Backend.option_refusals`, the
    check an open makes, which opens nothing), or None when they take them all. It names the dataset, each option
    refused and why, never a value (they may be secrets), and one `silod dataset set-options` command fixing them
    all together: set-options tries the whole result, so fixing one option while another is still refused fails."""
    uri = parse_dataset_uri(dataset.uri)
    backend = backend_class(uri.scheme)
    refusals = backend.option_refusals(uri, dataset.options)
    if not refusals:
        return None
    prefix = f"{uri}: "
    reasons = "; ".join(str(exc).removeprefix(prefix) for exc in refusals.values())
    replaced = [name for name in refusals if name in backend.option_names]
    flags = [f"--option {name}=..." for name in replaced]
    flags += [f"--remove-option {name}" for name in refusals if name not in backend.option_names]
    how = (
        " (each given a value without the fault, or --remove-option NAME instead where the dataset can do without "
        "it; --option-env NAME=VAR keeps a secret off the command line)"
        if replaced
        else ""
    )
    return (
        f"dataset {uri} holds options this version refuses (an older silod stored them): {reasons}. Node agents of "
        "this version cannot open the dataset, so its jobs get no directory on them, until they are replaced: "
        f"silod dataset set-options {shlex.quote(str(uri))} {' '.join(flags)}{how}"
    )


def warn_of_refused_options(datasets: Iterable[Dataset]) -> None:
    """Log one WARNING per dataset of `datasets` (the state dir's, at the start) whose stored options this version
    refuses (`_warning`), in URI order."""
    for dataset in sorted(datasets, key=lambda dataset: dataset.uri):
        try:
            warning = _warning(dataset)
        except (ValueError, ImportError) as exc:  # advice only: a check that cannot run must not stop the start
            warning = f"dataset {dataset.uri}: its stored options could not be checked at the start: {exc}"
        if warning is not None:
            log.warning("%s", warning, extra=log_ids(dataset_uri=dataset.uri))
