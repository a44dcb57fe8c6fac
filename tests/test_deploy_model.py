"""The readers of the deployment files (tests/deploy_model.py) on small inputs whose reading is known: what
tests/test_deploy.py concludes about deploy/ is only as right as these."""

from __future__ import annotations

import pytest

from tests.deploy_model import compose_interpolate, json_patch, script_calls, shell_expand, strategic_merge


def test_compose_interpolation_unescapes_dollars_and_takes_defaults_everywhere_in_the_file() -> None:
    file = {"services": {"a": {"command": ["sh", "-c", "echo $$HOME ${PORT:-7420} ${UNSET} ${MODE-x}"], "n": 3}}}
    assert compose_interpolate(file) == {"services": {"a": {"command": ["sh", "-c", "echo $HOME 7420  x"], "n": 3}}}


def test_a_json_patch_adds_into_maps_and_lists_and_its_tests_must_hold() -> None:
    document = {"spec": {"args": ["serve"], "labels": {"a/b": "1"}}}
    operations = [
        {"op": "test", "path": "/spec/args/0", "value": "serve"},
        {"op": "add", "path": "/spec/args/-", "value": "--tls"},
        {"op": "add", "path": "/spec/args/0", "value": "datamgr"},
        {"op": "add", "path": "/spec/labels/c~1d", "value": "2"},
    ]
    patched = json_patch(document, operations, "here")
    assert patched == {"spec": {"args": ["datamgr", "serve", "--tls"], "labels": {"a/b": "1", "c/d": "2"}}}
    assert document == {"spec": {"args": ["serve"], "labels": {"a/b": "1"}}}  # the input is left alone
    with pytest.raises(AssertionError, match="here: /spec/args/0 is 'serve'"):
        json_patch(document, [{"op": "test", "path": "/spec/args/0", "value": "node"}], "here")
    with pytest.raises(pytest.fail.Exception, match="does not resolve"):
        json_patch(document, [{"op": "add", "path": "/spec/missing/x", "value": 1}], "here")
    with pytest.raises(pytest.fail.Exception, match="not remove"):
        json_patch(document, [{"op": "remove", "path": "/spec/args/0"}], "here")


def test_a_strategic_merge_merges_maps_and_keyed_lists_and_replaces_the_rest() -> None:
    base = {
        "containers": [{"name": "node", "args": ["node"], "env": [{"name": "A", "value": "1"}]}],
        "volumes": [{"name": "cache", "hostPath": {"path": "/x"}}],
        "replicas": 1,
    }
    patch = {
        "containers": [{"name": "node", "args": ["node", "--tls"], "env": [{"name": "B", "value": "2"}]}],
        "volumes": [{"name": "tls", "secret": {"secretName": "t"}}],
        "replicas": 2,
    }
    assert strategic_merge(base, patch, "here") == {
        "containers": [
            {
                "name": "node",
                "args": ["node", "--tls"],
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
            }
        ],
        "volumes": [{"name": "cache", "hostPath": {"path": "/x"}}, {"name": "tls", "secret": {"secretName": "t"}}],
        "replicas": 2,
    }
    with pytest.raises(AssertionError, match="no merge key for the list ports"):
        strategic_merge({"ports": []}, {"ports": [{"containerPort": 1}]}, "here")


def test_the_silod_calls_in_a_script_end_where_their_shell_command_ends() -> None:
    script = (
        "set -e\n"
        "silod dataset register s3://b/p --option region=x && silod job register j1 \\\n  --dataset s3://b/p; echo ok\n"
        "exec silod node --cache-dir /c 2>&1 | tee log  # a comment\n"
        "echo done\n"
    )
    assert list(script_calls(script)) == [
        ["dataset", "register", "s3://b/p", "--option", "region=x"],
        ["job", "register", "j1", "--dataset", "s3://b/p"],
        ["node", "--cache-dir", "/c"],
    ]


def test_shell_expansion_takes_the_containers_environment_and_leaves_the_rest() -> None:
    environment = {"NODE": "n1", "PORT": "7420"}
    assert shell_expand("--node-id=$NODE --listen=:${PORT} $MISSING", environment) == (
        "--node-id=n1 --listen=:7420 $MISSING"
    )
