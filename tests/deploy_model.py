"""The deployment files as tests read them: the compose file with its variables interpolated, the Kubernetes
kustomizations rendered by a small kustomize of the features they use (json and strategic-merge patches),
the containers either defines with their environment, and every `silod` call in their commands and `sh -c`
scripts. tests/test_deploy_model.py tests these readers themselves; `kubectl kustomize` checks the renderer
in tests/test_deploy.py."""

from __future__ import annotations

import argparse
import copy
import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from silodcli.config import ConfigError
from silodcli.main import parse_args

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
K8S_BASE = K8S / "base"
EXAMPLES = K8S / "examples"
SECURE = K8S / "overlays" / "secure"
SECURE_JOB = K8S / "overlays" / "secure-training-job"
KUSTOMIZATIONS = (K8S_BASE, SECURE, EXAMPLES, SECURE_JOB)
OVERLAID = {SECURE: K8S_BASE, SECURE_JOB: EXAMPLES}  # overlay -> the kustomization it patches
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
TRAINING_JOB = EXAMPLES / "training-job.yaml"
DEPLOY_DOC = REPO / "docs" / "deploy.md"

PORT = 7420
METRICS_PORTS = {"datamgr serve": 7421, "node": 7422}  # each daemon's --metrics-port
SERVICE_DNS = "silod-datamgr.silod.svc"
NAMESPACE = "silod"
# Third-party images the compose file may use; everything else must be the silod image.
STORAGE_IMAGES = ("minio/minio:", "minio/mc:", "mcr.microsoft.com/azure-storage/azurite:")
SHELLS = ("sh", "/bin/sh", "bash", "/bin/bash")
# What the placeholders of downward-API variables stand for in the parsed command lines.
FIELD_PLACEHOLDERS = {"spec.nodeName": "node-a", "metadata.name": "pod-a"}
# Containers of the silod image that run something else (the compose demo's data seeding).
RUN_NO_SILOD_COMMAND = {"compose service seed"}
# Every subcommand the deployment relies on must be found somewhere, so that a parse test that finds nothing
# (a broken extraction) cannot pass unnoticed.
EXPECTED_SUBCOMMANDS = {
    "datamgr serve",
    "node",
    "umount",
    "status",
    "dataset add",
    "job add",
    "job finish",
    "alloc cache",
    "alloc io",
}


def load_yaml_documents(path: Path) -> list[Any]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


SILOD_IMAGE = f"silod:{project_version()}"


# ---- the Dockerfile ----


@dataclass(frozen=True)
class Stage:
    name: str
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments), continuation lines joined

    def values(self, instruction: str) -> list[str]:
        return [rest for name, rest in self.instructions if name == instruction]

    def apt_packages(self) -> set[str]:
        packages: set[str] = set()
        for command in self.values("RUN"):
            for part in re.split(r"&&|;", command):
                words = part.split()
                if "apt-get" in words and "install" in words:
                    packages.update(w for w in words[words.index("install") + 1 :] if not w.startswith("-"))
        return packages


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction, rest = instruction.upper(), " ".join(rest.split())
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else words[0]
            stages.append(Stage(name, []))
        elif stages:
            stages[-1].instructions.append((instruction, rest))
    return stages


def image_entrypoint() -> list[str]:
    entrypoint: list[str] = json.loads(dockerfile_stages()[-1].values("ENTRYPOINT")[-1])
    return entrypoint


def image_uid() -> int:
    return int(dockerfile_stages()[-1].values("USER")[-1].split(":")[0])


# ---- containers and the command lines they run ----


@dataclass(frozen=True)
class Container:
    """A compose service or a Kubernetes container: its image, every argv it runs and its environment."""

    origin: str
    image: str
    main: list[str]  # the process: entrypoint or command, then command or args
    extra: list[list[str]]  # exec-form hooks, probes and health checks
    env: Mapping[str, str]  # literal values, or placeholders for values Kubernetes fills in
    spec: Mapping[str, Any]  # the raw service or container definition
    pod: Mapping[str, Any] = field(default_factory=dict)  # Kubernetes: the pod spec it runs in

    @property
    def is_silod(self) -> bool:
        return self.image == SILOD_IMAGE


@dataclass(frozen=True)
class SilodCall:
    origin: str
    argv: list[str]  # after `silod`, variables replaced
    env: Mapping[str, str]

    @property
    def subcommand(self) -> str:
        words = [w for w in self.argv if not w.startswith("-")]
        return " ".join(words[:2]) if words[:1] in (["datamgr"], ["dataset"], ["job"], ["alloc"]) else words[0]

    def parse(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> argparse.Namespace:
        """The arguments as `silod` sees them in the container: its SILOD_* variables applied under the flags."""
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)  # --option-env reads the container's environment
        try:
            return parse_args(self.argv, self.env)
        except ConfigError as exc:
            pytest.fail(f"{self.origin}: the environment of `silod {shlex.join(self.argv)}` is refused: {exc}")
        except SystemExit:
            pytest.fail(f"{self.origin}: `silod {shlex.join(self.argv)}` does not parse: {capsys.readouterr().err}")


_COMPOSE_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_]\w*)(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")


def compose_interpolate(value: Any) -> Any:
    """What compose does to the file before use: `$$` is a literal `$`, `${VAR:-default}` its default (the
    tests run without the operator's environment, and every host variable must have a default)."""
    if isinstance(value, dict):
        return {k: compose_interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compose_interpolate(v) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return match.group(2) or ""  # unset, as here; test_compose_host_variables_have_defaults

    return _COMPOSE_VARIABLE.sub(substitute, value)


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def compose_file() -> dict[str, Any]:
    documents = load_yaml_documents(COMPOSE_FILE)
    assert len(documents) == 1
    interpolated: dict[str, Any] = compose_interpolate(documents[0])
    return interpolated


def compose_env(service: Mapping[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return {str(k): str(v) for k, v in environment.items()}


def compose_containers() -> list[Container]:
    containers = []
    for name, service in compose_file()["services"].items():
        image = service["image"]
        if "entrypoint" in service:
            main = _argv(service["entrypoint"]) + _argv(service.get("command"))
        elif image == SILOD_IMAGE:
            main = image_entrypoint() + _argv(service.get("command"))
        else:
            main = _argv(service.get("command"))
        extra = []
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test[0] == "CMD":
            extra.append([str(v) for v in test[1:]])
        elif isinstance(test, list) and test[0] == "CMD-SHELL":
            extra.append(["/bin/sh", "-c", str(test[1])])
        containers.append(Container(f"compose service {name}", image, main, extra, compose_env(service), service))
    return containers


_K8S_VARIABLE = re.compile(r"\$\(([A-Za-z_]\w*)\)")


def k8s_expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args: a VAR that is not an env var is left as is."""
    return _K8S_VARIABLE.sub(lambda match: env.get(match.group(1), match.group(0)), text)


def k8s_env(container: Mapping[str, Any]) -> dict[str, str]:
    env = {}
    for variable in container.get("env") or []:
        if "value" in variable:
            env[variable["name"]] = str(variable["value"])
        else:
            field = variable["valueFrom"].get("fieldRef", {}).get("fieldPath", "")
            env[variable["name"]] = FIELD_PLACEHOLDERS.get(field, "placeholder")
    return env


def pod_spec(resource: Mapping[str, Any]) -> Mapping[str, Any] | None:
    template = resource.get("spec", {}).get("template")
    return template["spec"] if template else None


def the_container(resource: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod_spec(resource)
    assert spec is not None
    (container,) = spec["containers"]
    assert isinstance(container, dict)
    return container


def k8s_resources(*paths: Path) -> list[dict[str, Any]]:
    """The resources in `paths`; a missing file is the kustomization test's failure, not a collection error."""
    return [doc for path in paths if path.is_file() for doc in load_yaml_documents(path)]


# ---- kustomize, for the features deploy/k8s uses ----

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "resources", "patches"}
# Strategic merge: a list under one of these keys merges its items by the named field; other lists replace.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
UNORDERED = {"volumes", "volumeMounts", "env"}  # env only while no variable refers to another: $(VAR) is ordered


def kustomization(directory: Path) -> dict[str, Any]:
    (document,) = load_yaml_documents(directory / "kustomization.yaml")
    assert isinstance(document, dict)
    unknown = document.keys() - KUSTOMIZATION_KEYS
    assert not unknown, f"{directory}: this test renders only {sorted(KUSTOMIZATION_KEYS)}, not {sorted(unknown)}"
    return document


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """What `kustomize build DIRECTORY` gives for the features used here: resources (files, and directories
    holding a kustomization), patches aimed at one resource by kind and name (a JSON patch, RFC 6902, with
    `add` and `test`; or a strategic merge patch), and the namespace. Fails naming whatever does not resolve."""
    spec = kustomization(directory)
    resources: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        assert path.exists(), f"{directory}: resource {entry} does not exist"
        resources += kustomize_build(path) if path.is_dir() else load_yaml_documents(path)
    for patch in spec.get("patches", []):
        assert patch.keys() == {"path", "target"} and patch["target"].keys() == {"kind", "name"}, patch
        kind, name = patch["target"]["kind"], patch["target"]["name"]
        targets = [i for i, r in enumerate(resources) if (r["kind"], r["metadata"]["name"]) == (kind, name)]
        assert len(targets) == 1, f"{directory}: patch {patch['path']} targets {kind}/{name}, which is not one resource"
        (document,) = load_yaml_documents(directory / patch["path"])
        target = resources[targets[0]]
        if isinstance(document, list):
            resources[targets[0]] = json_patch(target, document, f"{directory / patch['path']}")
        else:
            assert (document["kind"], document["metadata"]["name"]) == (kind, name), f"{patch['path']}: not its target"
            resources[targets[0]] = strategic_merge(target, document, f"{directory / patch['path']}")
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] != "Namespace":
                resource["metadata"]["namespace"] = spec["namespace"]
    return resources


def json_patch(document: dict[str, Any], operations: list[dict[str, Any]], origin: str) -> dict[str, Any]:
    patched = copy.deepcopy(document)
    for operation in operations:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        node: Any = patched
        try:
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            pytest.fail(f"{origin}: {operation['path']} does not resolve")
        if operation["op"] == "test":
            found = node[int(last)] if isinstance(node, list) else node.get(last)
            assert found == operation["value"], f"{origin}: {operation['path']} is {found!r}"
        elif operation["op"] == "add":
            value = copy.deepcopy(operation["value"])
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), value)
            else:
                node[last] = value
        else:
            pytest.fail(f"{origin}: this test renders only the add and test operations, not {operation['op']}")
    return patched


def strategic_merge(base: Mapping[str, Any], patch: Mapping[str, Any], origin: str) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = strategic_merge(merged[key], value, origin)
        elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
            assert key in MERGE_KEYS, f"{origin}: this test knows no merge key for the list {key}"
            items = merged.setdefault(key, [])
            for item in value:
                same = [i for i, old in enumerate(items) if old[MERGE_KEYS[key]] == item[MERGE_KEYS[key]]]
                if same:
                    items[same[0]] = strategic_merge(items[same[0]], item, origin)
                else:
                    items.append(copy.deepcopy(item))
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def unordered(value: Any) -> Any:
    """`value` with its UNORDERED lists sorted, to compare renderings: kustomize puts merged items first or last."""
    if isinstance(value, list):
        return [unordered(item) for item in value]
    if not isinstance(value, dict):
        return value
    return {
        key: sorted(map(unordered, item), key=lambda v: json.dumps(v, sort_keys=True))
        if key in UNORDERED
        else unordered(item)
        for key, item in value.items()
    }


def kustomize_resources() -> list[dict[str, Any]]:
    return kustomize_build(K8S_BASE)


def all_k8s_resources() -> list[dict[str, Any]]:
    return [resource for directory in KUSTOMIZATIONS for resource in kustomize_build(directory)]


def k8s_containers(resources: list[dict[str, Any]] | None = None, source: str = "") -> list[Container]:
    if resources is None:
        return [c for d in KUSTOMIZATIONS for c in k8s_containers(kustomize_build(d), str(d.relative_to(K8S)))]
    containers = []
    for resource in resources:
        spec = pod_spec(resource)
        if spec is None:
            continue
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            origin = f"{resource['kind']}/{resource['metadata']['name']} container {container['name']}"
            origin = f"{source}: {origin}" if source else origin
            env = k8s_env(container)
            command = container.get("command") or image_entrypoint()
            main = [k8s_expand(str(word), env) for word in [*command, *container.get("args", [])]]
            extra = []
            for hook in (container.get("lifecycle") or {}).values():
                if "exec" in hook:
                    extra.append([str(w) for w in hook["exec"]["command"]])
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if "exec" in container.get(probe, {}):
                    extra.append([str(w) for w in container[probe]["exec"]["command"]])
            containers.append(Container(origin, container["image"], main, extra, env, container, spec))
    return containers


def all_containers() -> list[Container]:
    return [*compose_containers(), *k8s_containers()]


_SHELL_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")
_END_OF_COMMAND = {"&&", "||", "|", ";", "&", ")", "}"}


def shell_expand(word: str, env: Mapping[str, str]) -> str:
    """$VAR and ${VAR} from the container's environment; anything else is left for the test to reject."""
    return _SHELL_VARIABLE.sub(lambda match: env.get(match.group(1) or match.group(2), match.group(0)), word)


def script_calls(script: str) -> Iterator[list[str]]:
    """The words of each `silod ...` command in a shell script, up to the end of that command."""
    for line in script.replace("\\\n", " ").splitlines():
        if not re.search(r"(^|[\s;&|(])silod\s", line):
            continue
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word != "silod":
                continue
            call = []
            for following in words[i + 1 :]:
                if following in _END_OF_COMMAND or re.match(r"\d*[<>]", following):
                    break
                call.append(following.removesuffix(";"))
                if following.endswith(";"):
                    break
            yield call


def silod_calls(container: Container) -> list[SilodCall]:
    calls = []
    for argv in [container.main, *container.extra]:
        if argv[:1] == ["silod"]:
            found = [argv[1:]]
        elif argv[:1] and argv[0] in SHELLS and argv[1:2] == ["-c"]:
            found = list(script_calls(argv[2]))
        else:
            found = []
        for words in found:
            expanded = [shell_expand(word, container.env) for word in words]
            calls.append(SilodCall(container.origin, expanded, container.env))
    return calls


def calls_of(containers: list[Container], subcommand: str) -> list[SilodCall]:
    return [call for c in containers for call in silod_calls(c) if call.subcommand == subcommand]


def parsed(
    calls: list[SilodCall], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> list[argparse.Namespace]:
    return [call.parse(monkeypatch, capsys) for call in calls]


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def named_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def resolve_port(container: Mapping[str, Any], port: int | str) -> int:
    """A port given by number or by the name of one of the container's ports."""
    return named_ports(container)[port] if isinstance(port, str) else port


def published_ports(service: Mapping[str, Any]) -> dict[int, str]:
    """A compose service's published container ports, each with the host address it is published on."""
    published = {}
    for entry in service.get("ports", []):
        host_ip, on_host, in_container = str(entry).split(":")
        assert on_host == in_container, f"{entry}: publish each port as the same port on the host"
        published[int(in_container)] = host_ip
    return published


def under(path: str, directory: str) -> bool:
    return posixpath.normpath(path) == posixpath.normpath(directory) or path.startswith(directory.rstrip("/") + "/")


# ---- every file parses, every command line parses ----
