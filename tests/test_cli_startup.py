"""What a `silod` command loads before it runs: only what parsing needs, then what the command itself runs.

Every command builds the whole command line, so a parser module that imported its command's code made each
command load all of them (the simulator with numpy, the FUSE client with trio, the server, gRPC): a second
before `silod status` printed anything. These tests run commands in fresh interpreters and look at what
they imported (`sys.modules`), which is what the start-up time follows; `silodcli.deferred` is what keeps it so.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from silodcli.deferred import Deferred
from silodcli.main import build_parser
from tests.datamgr_fixtures import RunningDataManager

REPO = Path(__file__).resolve().parent.parent
# What only some commands need: the simulator (numpy, its engine, matplotlib), the FUSE client (trio and the
# agent), the data manager itself (its server and controller), gRPC, and the worker processes of sim compare.
HEAVY = (
    "numpy",
    "matplotlib",
    "datamgr.scheduler.sim.engine",
    "trio",
    "fuseclient.agent",
    "datamgr.server",
    "datamgr.controller",
    "grpc",
    "silodcli.processes",
)
_LOADED = "import sys\n{code}\nprint(sorted(name for name in {heavy!r} if name in sys.modules))"


def heavy_modules_loaded_by(code: str) -> list[str]:
    """The `HEAVY` modules a fresh interpreter has loaded after running `code`."""
    result = subprocess.run(
        [sys.executable, "-c", _LOADED.format(code=code, heavy=HEAVY)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    return loaded


def test_building_the_whole_command_line_loads_none_of_what_the_commands_run() -> None:
    assert heavy_modules_loaded_by("from silodcli.main import build_parser\nbuild_parser()") == []


def test_a_client_command_loads_grpc_to_run_and_nothing_the_other_commands_run(
    datamgr: RunningDataManager,
) -> None:
    code = f"from silodcli.main import main\nassert main(['status', '--datamgr', {datamgr.address!r}]) == 0"
    assert heavy_modules_loaded_by(code) == ["grpc"]


def test_sim_generate_loads_neither_the_fuse_client_nor_grpc_nor_the_plotting(tmp_path: Path) -> None:
    out = tmp_path / "trace.csv"
    command = ["sim", "generate", "--out", str(out), "--jobs", "3"]
    loaded = heavy_modules_loaded_by(f"from silodcli.main import main\nassert main({command!r}) == 0")
    assert out.read_text().count("\n") == 4  # the header and three jobs: it ran
    assert not {"trio", "fuseclient.agent", "grpc", "datamgr.server", "matplotlib"} & set(loaded)


def test_umount_loads_none_of_the_code_that_serves_a_mount(tmp_path: Path) -> None:
    code = f"from silodcli.main import main\nassert main(['umount', {str(tmp_path)!r}]) == 1"  # not a mount: refused
    assert heavy_modules_loaded_by(code) == []


def _command_parsers(parser: argparse.ArgumentParser, words: str = "silod") -> Iterator[tuple[str, dict[str, object]]]:
    """Each parser under `parser` that runs something, by its words on the command line, with its defaults."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if "run" in parser._defaults:
        yield words, parser._defaults
    for action in subcommands:
        for name, child in action.choices.items():
            yield from _command_parsers(child, f"{words} {name}")


def test_every_command_runs_a_deferred_function_that_its_module_has() -> None:
    commands = dict(_command_parsers(build_parser()))
    assert {"silod status", "silod sim", "silod sim sweep sharing", "silod mount", "silod datamgr serve"} <= set(
        commands
    )
    for words, defaults in commands.items():
        for key in ("run", "client_command"):
            target = defaults.get(key)
            if target is None:
                continue
            assert isinstance(target, Deferred), f"{words}: {key} {target!r} is imported with the parser"
            assert callable(target.resolve()), f"{words}: {key} {target!r}"


def test_a_deferred_target_without_its_module_or_function_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'run_sim' must be module:function"):
        Deferred("run_sim")
    with pytest.raises(AttributeError, match="no_such_command"):
        Deferred("silodcli.commands:no_such_command").resolve()
