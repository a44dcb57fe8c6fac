"""Settings from the command line, SILOD_* variables and the `--config` TOML file, in that order of precedence,
and config mistakes that exit 2 naming the file, section, key or line."""

from __future__ import annotations

from pathlib import Path

import pytest

from silodcli.config import ConfigError
from silodcli.main import main, parse_args
from tests.datamgr_fixtures import silod_cli


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "silod.toml"
    path.write_text(text)
    return path


SERVE_FILE = """
[datamgr]
state-dir = "/from/file"
remote-io-limit = "1GB/s"
node-timeout = 12
listen = "127.0.0.1:1111"
log-level = "DEBUG"
log-json = true

[client]
datamgr = "file-host:1"
"""


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, SERVE_FILE))
    serve = ["--config", config, "datamgr", "serve"]

    from_file = parse_args(serve, {})
    assert from_file.state_dir == Path("/from/file")
    assert from_file.remote_io_limit == 1_000_000_000
    assert from_file.node_timeout == 12.0
    assert from_file.listen == "127.0.0.1:1111"
    assert (from_file.log_level, from_file.default_log_level) == (None, "DEBUG")
    assert from_file.default_log_json is True
    assert parse_args(["datamgr", "serve", "--state-dir", "s"], {}).node_timeout == 30.0  # the default

    environ = {"SILOD_REMOTE_IO_LIMIT": "2GB/s", "SILOD_STATE_DIR": "/from/env", "SILOD_LOG_LEVEL": "ERROR"}
    from_env = parse_args(serve, environ)
    assert (from_env.remote_io_limit, from_env.state_dir, from_env.log_level) == (2e9, Path("/from/env"), "ERROR")
    assert from_env.node_timeout == 12.0  # the file still fills what the environment leaves

    from_flags = parse_args(
        ["--config", config, "--log-level", "WARNING", "datamgr", "serve", "--remote-io-limit", "3GB/s"], environ
    )
    assert (from_flags.remote_io_limit, from_flags.log_level) == (3_000_000_000, "WARNING")

    # SILOD_CONFIG names the file when --config does not.
    assert parse_args(["datamgr", "serve"], {"SILOD_CONFIG": config}).state_dir == Path("/from/file")


def test_client_datamgr_address_precedence(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, SERVE_FILE))
    assert parse_args(["status"], {}).datamgr == "127.0.0.1:7420"
    assert parse_args(["--config", config, "status"], {}).datamgr == "file-host:1"
    environ = {"SILOD_DATAMGR": "env-host:2"}
    assert parse_args(["--config", config, "status"], environ).datamgr == "env-host:2"
    assert parse_args(["--config", config, "status", "--datamgr", "flag-host:3"], environ).datamgr == "flag-host:3"
    assert parse_args(["--config", config, "status"], {"SILOD_DATAMGR": ""}).datamgr == "file-host:1"  # empty: unset


def test_required_node_flags_come_from_the_file(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        '[node]\nnode-id = "n7"\nmountpoint = "/mnt/silod"\ncache-dir = "/cache"\ncache-capacity = "500GiB"\n'
        "allow-other = true\nreport-interval = 2.5\n",
    )
    args = parse_args(["--config", str(config), "node"], {"SILOD_CACHE_CAPACITY": "1TB"})
    assert (args.node_id, args.mountpoint, args.cache_dir) == ("n7", Path("/mnt/silod"), Path("/cache"))
    assert (args.cache_capacity, args.allow_other, args.report_interval) == (10**12, True, 2.5)
    with pytest.raises(SystemExit):  # still required when nothing supplies it
        parse_args(["node", "--mountpoint", "/m", "--cache-dir", "/c"], {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[datamgr]\nstat-dir = "x"\n',
            "unknown key 'stat-dir' in [datamgr]; accepted keys: auth-token-file, cell-levels, listen",
        ),
        ("[dm]\nlisten = 1\n", "unknown section [dm]; the sections are [client], [datamgr], [node]"),
        ('[node]\ncache-capacity = "5G"\n', "[node] cache-capacity: "),
        ('[client]\nfoo = 1\n[datamgr]\nremote-io-limit = "1GB"\n', "unknown key 'foo' in [client]"),
        ("[node]\nallow-other = 1\n", "[node] allow-other: expected true or false"),
    ],
)
def test_config_mistakes_exit_2_naming_them(tmp_path: Path, text: str, expected: str) -> None:
    config = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        parse_args(["--config", str(config), "status"], {})
    assert str(config) in str(raised.value) and expected in str(raised.value)


def test_the_command_line_reports_config_mistakes(tmp_path: Path) -> None:
    bad_value = write_config(tmp_path, '[datamgr]\nremote-io-limit = "200MB"\n')
    result = silod_cli("--config", str(bad_value), "status")
    assert result.returncode == 2
    assert f"{bad_value}: [datamgr] remote-io-limit: rate '200MB' has no time unit" in result.stderr

    unknown = write_config(tmp_path, '[datamgr]\nstate_dir = "/s"\n')
    result = silod_cli("--config", str(unknown), "datamgr", "serve")
    assert result.returncode == 2 and "unknown key 'state_dir' in [datamgr]" in result.stderr
    assert "state-dir" in result.stderr

    not_toml = write_config(tmp_path, '[datamgr]\nlisten = "a"\nnode-timeout = \n')
    result = silod_cli("--config", str(not_toml), "status")
    assert result.returncode == 2 and str(not_toml) in result.stderr and "line 3" in result.stderr

    missing = tmp_path / "missing.toml"
    result = silod_cli("--config", str(missing), "status")
    assert result.returncode == 2 and f"cannot read config file {missing}" in result.stderr


def test_a_bad_variable_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["datamgr", "serve"], {"SILOD_NODE_TIMEOUT": "-1", "SILOD_STATE_DIR": "/s"}) == 2
    assert "SILOD_NODE_TIMEOUT: '-1' must be a positive number of seconds" in capsys.readouterr().err
