"""Bad input to the `silod` command line, its `SILOD_*` variables and its config file, as an operator types it:
exit 2 naming the argument, variable or key (and the file and section) and what is wrong, one line and no
traceback, before anything is sent, registered, mounted or made."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from silodcli.config import ConfigError
from silodcli.main import parse_args
from tests.datamgr_fixtures import SILOD, RunningDataManager, full_state, make_local_dataset, silod_cli
from tests.test_cli_startup import heavy_modules_loaded_by

NOT_UTF8 = "\udcff"  # how Python holds the byte 0xff of an argument or variable that is not UTF-8


def silod(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`silod ARGS` with `env` added to this environment (without this one's SILOD_* variables)."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SILOD_")}
    return subprocess.run(
        [*SILOD, *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",  # a path that is not UTF-8 is printed as its bytes
        env={**environ, **(env or {})},
        cwd=cwd,
        timeout=60,
    )


def refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    """`result` exited 2 saying `message`, in its last line, without a traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr.splitlines()[-1], result.stderr


# ---- arguments and variables that are not UTF-8 ----


@pytest.mark.parametrize(
    ("args", "named", "value"),
    [
        (("dataset", "add", "file:///tmp/dX"), "URI", "file:///tmp/dX"),
        (("dataset", "add", "DATA", "--option", "a=X"), "--option", "a=X"),
        (("dataset", "set-options", "DATA", "--remove-option", "kX"), "--remove-option", "kX"),
        (("job", "show", "jX"), "JOB_ID", "jX"),
        (("job", "add", "jX", "--dataset", "DATA", "--ideal-rate", "1MB/s", "--gpus", "1"), "JOB_ID", "jX"),
        (("job", "finish", "jX"), "JOB_ID", "jX"),
        (("tenant", "add", "tX", "--cells", "node=1"), "NAME", "tX"),
        (("tenant", "remove", "tX"), "NAME", "tX"),
        (("node", "remove", "nX"), "NODE_ID", "nX"),
        (("alloc", "io", "jX", "1MB/s"), "JOB_ID", "jX"),
        (("alloc", "cache", "DATAX", "1GiB"), "DATASET_URI", "DATAX"),
        (("status", "--datamgr", "127.0.0.1X:34233"), "--datamgr", "127.0.0.1X:34233"),
    ],
)
def test_an_argument_that_is_not_utf8_exits_2_naming_it_and_sends_nothing(
    datamgr: RunningDataManager, tmp_path: Path, args: tuple[str, ...], named: str, value: str
) -> None:
    # It crashed every data manager command with a traceback, building the request (UnicodeEncodeError).
    uri = make_local_dataset(tmp_path / "data")
    silod_cli("dataset", "add", uri, datamgr=datamgr.address)
    before = full_state(datamgr.client)
    argv = [arg.replace("DATA", uri).replace("X", NOT_UTF8) for arg in args]
    result = silod(*argv, env={"SILOD_DATAMGR": datamgr.address})
    shown = repr(value.replace("DATA", uri).replace("X", NOT_UTF8))
    refused(result, f"argument {named}: {shown} is not valid UTF-8")
    assert "\\udcff" in shown  # the value escaped, as a terminal cannot show it
    assert full_state(datamgr.client) == before


def test_a_variable_that_is_not_utf8_exits_2_naming_it(datamgr: RunningDataManager, tmp_path: Path) -> None:
    result = silod("status", env={"SILOD_DATAMGR": f"l{NOT_UTF8}ocalhost:1"})
    refused(result, "silod: SILOD_DATAMGR: 'l\\udcffocalhost:1' is not valid UTF-8")
    # A backend option's value from the environment (a secret: not shown) is sent to the data manager too.
    secret = f"s3cr3t{NOT_UTF8}"
    uri = make_local_dataset(tmp_path / "data")
    env = {"SILOD_DATAMGR": datamgr.address, "THE_KEY": secret}
    result = silod("dataset", "add", uri, "--option-env", "account_key=THE_KEY", env=env)
    refused(result, "argument --option-env: option account_key: environment variable THE_KEY is not valid UTF-8")
    assert "s3cr3t" not in result.stderr
    assert silod("dataset", "show", uri, env=env).returncode == 1  # not registered


def test_an_empty_backup_file_is_refused_as_empty_and_one_that_is_not_utf8_is_still_a_file(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    # It said "argument FILE:  names a directory". A path is the one argument that may be any bytes.
    refused(
        silod("datamgr", "backup", "--state-dir", str(datamgr.state_dir), ""),
        "argument FILE: an empty path names no file: give the backup's path",
    )
    odd = tmp_path / f"backup{NOT_UTF8}.db"
    result = silod("datamgr", "backup", "--state-dir", str(datamgr.state_dir), str(odd))
    assert result.returncode == 0, result.stderr
    assert os.fsencode(odd.name) in os.listdir(os.fsencode(tmp_path))


# ---- addresses ----


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:7420:9", "'127.0.0.1:7420:9' must be HOST:PORT (no scheme; an IPv6 host in brackets, [::1]:7420)"),
        ("http://127.0.0.1:34233", "'http://127.0.0.1:34233' must be HOST:PORT (no scheme; an IPv6 host in brackets"),
        ("::1:34233", "::1 is an IPv6 address without brackets; write [::1]:34233"),
        ("fe80::1", "fe80::1 is an IPv6 address without brackets; write [fe80::1]:PORT"),
        ("data manager:7420", "'data manager:7420' must be HOST:PORT (no scheme"),
    ],
)
def test_a_malformed_datamgr_address_is_a_usage_error_not_an_unresolvable_name(address: str, message: str) -> None:
    # It was exit 3, "cannot reach the data manager at ...: the name does not resolve".
    refused(silod("status", "--datamgr", address), f"argument --datamgr: {address!r} must be HOST:PORT")
    refused(silod("status", "--datamgr", address), message)
    refused(silod("status", env={"SILOD_DATAMGR": address}), f"silod: SILOD_DATAMGR: {address!r} must be HOST:PORT")


def test_a_malformed_listen_address_is_refused_before_grpc_sees_it_or_the_state_dir_is_made(tmp_path: Path) -> None:
    # gRPC printed a C-core error line of its own, then silod said it could not listen.
    result = silod("datamgr", "serve", "--state-dir", str(tmp_path / "s"), "--listen", "127.0.0.1:7420:9")
    refused(result, "silod: --listen '127.0.0.1:7420:9' must be HOST:PORT (no scheme; an IPv6 host in brackets")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "s").exists()


# ---- settings from variables and the config file, checked as they are read ----


@pytest.mark.parametrize("command", [["status"], ["datamgr", "serve", "--state-dir", "s"]], ids=["status", "serve"])
def test_silod_listen_and_silod_policy_are_checked_naming_the_variable(tmp_path: Path, command: list[str]) -> None:
    # `SILOD_LISTEN=x silod status` ran, and the data manager named --listen, a flag nobody typed.
    result = silod(*command, env={"SILOD_LISTEN": "x"}, cwd=tmp_path)
    refused(result, "silod: SILOD_LISTEN: 'x' must be HOST:PORT")
    assert "--listen" not in result.stderr
    result = silod(*command, env={"SILOD_POLICY": "lottery", "SILOD_REMOTE_IO_LIMIT": "1GB/s"}, cwd=tmp_path)
    refused(result, "silod: SILOD_POLICY: 'lottery' is unknown; known policies: external, best-effort, fifo,")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('listen = "x"', "[datamgr] listen: 'x' must be HOST:PORT with a PORT from 0 to 65535"),
        ('listen = "http://0.0.0.0:7420"', "[datamgr] listen: 'http://0.0.0.0:7420' must be HOST:PORT (no scheme"),
        ('policy = "lottery"', "[datamgr] policy: 'lottery' is unknown; known policies: external, best-effort,"),
        ("state-dir = 5", "[datamgr] state-dir: expected a path, a string, not 5"),
    ],
)
def test_a_config_files_listen_policy_and_paths_are_checked_naming_file_section_and_key(
    tmp_path: Path, line: str, message: str
) -> None:
    (tmp_path / "c1.toml").write_text(f"[datamgr]\n{line}\n")
    for command in (["status"], ["datamgr", "serve"]):
        refused(silod("--config", "c1.toml", *command, cwd=tmp_path), f"silod: c1.toml: {message}")
    assert sorted(os.listdir(tmp_path)) == ["c1.toml"]  # `state-dir = 5` made no ./5


def test_silod_policy_is_checked_as_it_is_read_without_loading_the_scheduler_or_its_plugins() -> None:
    with pytest.raises(ConfigError, match="SILOD_POLICY: 'lottery' is unknown; known policies: external, "):
        parse_args(["status"], {"SILOD_POLICY": "lottery"})
    # A built-in name is checked against the registry's names, which the command line loads anyway: no policy,
    # no plugin's entry point is read, and nothing a light command leaves out is loaded.
    code = (
        "import importlib.metadata\n"
        "importlib.metadata.entry_points = None  # reading them would fail\n"
        "from silodcli.main import parse_args\n"
        "assert parse_args(['status'], {'SILOD_POLICY': 'greedy'}).command == 'status'\n"
        "assert 'datamgr.scheduler.policies.greedy' not in sys.modules"
    )
    assert heavy_modules_loaded_by(code) == []


# ---- smaller refusals ----


@pytest.mark.parametrize(
    ("env", "args"),
    [({}, ["--round", "5"]), ({"SILOD_ROUND": "5"}, [])],
    ids=["flag", "variable"],
)
def test_a_round_without_a_policy_is_refused_as_policy_options_are(
    tmp_path: Path, env: dict[str, str], args: list[str]
) -> None:
    # It was accepted without a word, the operator left believing a policy ran every 5 s.
    result = silod("datamgr", "serve", "--state-dir", str(tmp_path / "s"), "--listen", "127.0.0.1:0", *args, env=env)
    refused(result, "silod: --round 5: --round needs --policy NAME, the policy whose rounds it times")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["dataset", "set-options", "DATA", "--remove-option", ""],
            "argument --remove-option: option '' names no option: give the KEY of the one to remove",
        ),
        (
            ["dataset", "set-options", "DATA", "--option", "a=b", "--option", "a=c"],
            "argument --option: option 'a' is given twice; give each key once",
        ),
        (
            ["dataset", "add", "DATAnew", "--option", "a=b", "--option", "a=c"],
            "argument --option: option 'a' is given twice; give each key once",
        ),
        (
            ["dataset", "add", "DATAnew", "--option", "account_key=b", "--option-env", "account_key=HOME"],
            "argument --option-env: option 'account_key' is given twice (by --option and --option-env); give each",
        ),
    ],
    ids=["empty-remove-option", "set-options-twice", "add-twice", "option-and-option-env"],
)
def test_backend_options_that_name_no_key_or_a_key_twice_are_refused_before_anything_is_sent(
    datamgr: RunningDataManager, tmp_path: Path, args: list[str], message: str
) -> None:
    # The empty key reached the data manager (FAILED_PRECONDITION: remove_options:  not set); of a key given twice
    # the last value counted without a word.
    uri = make_local_dataset(tmp_path / "data")
    silod_cli("dataset", "add", uri, datamgr=datamgr.address)
    before = full_state(datamgr.client)
    result = silod(*[arg.replace("DATA", uri) for arg in args], env={"SILOD_DATAMGR": datamgr.address})
    refused(result, message)
    assert full_state(datamgr.client) == before


# ---- a cache dir the mount would hide ----


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    """A mountpoint, unmounted at the end should a broken check let a daemon mount it."""
    path = tmp_path / "m3"
    path.mkdir()
    yield path
    if os.path.ismount(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], check=False)


def _cache_dir(mountpoint: Path, where: str) -> Path:
    if where == "inside":
        return mountpoint / "cc"
    if where == "equal":
        return mountpoint
    link = mountpoint.parent / "link"  # a symlink to a directory inside it: compared resolved
    link.symlink_to(mountpoint)
    return link / "cc"


@pytest.mark.parametrize("where", ["inside", "equal", "through-a-symlink"])
def test_a_node_whose_cache_dir_the_mount_would_hide_exits_2_registering_and_mounting_nothing(
    datamgr: RunningDataManager, mountpoint: Path, where: str
) -> None:
    # The node registered the free space of the file system the mount then hid, and its cache failed ("Read-only
    # file system", or its directory "is gone ... the cache disk was unmounted").
    cache_dir = _cache_dir(mountpoint, where)
    before = full_state(datamgr.client)
    argv = ["node", "--datamgr", datamgr.address, "--node-id", "n1", "--mountpoint", str(mountpoint)]
    result = silod(*argv, "--cache-dir", str(cache_dir))
    what = "is --mountpoint" if where == "equal" else "is inside --mountpoint"
    hidden = "the mount would hide it; give a directory outside it"
    refused(result, f"silod node: --cache-dir {cache_dir} {what} {mountpoint}: {hidden}")
    assert not os.path.ismount(mountpoint)
    assert full_state(datamgr.client) == before
    assert os.listdir(mountpoint) == []  # no cache dir made in it


@pytest.mark.parametrize("where", ["inside", "equal", "through-a-symlink"])
def test_a_mount_whose_cache_dir_it_would_hide_exits_2_mounting_nothing(
    tmp_path: Path, mountpoint: Path, where: str
) -> None:
    cache_dir = _cache_dir(mountpoint, where)
    uri = make_local_dataset(tmp_path / "data")
    result = silod("mount", str(mountpoint), "--cache-dir", str(cache_dir), "--job", f"j={uri}")
    what = "is MOUNTPOINT" if where == "equal" else "is inside MOUNTPOINT"
    refused(result, f"silod mount: --cache-dir {cache_dir} {what} {mountpoint}: the mount would hide it")
    assert not os.path.ismount(mountpoint)
    assert os.listdir(mountpoint) == []
