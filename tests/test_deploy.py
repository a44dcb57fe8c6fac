"""The deployment files stay in step with the code.

Every `silod` command line in deploy/ (compose services, Kubernetes containers, hooks, probes, and the `silod`
calls inside their `sh -c` scripts) is parsed by the real CLI parser, so a renamed or removed flag fails here.
The rest pins what the deployment depends on: one port, one image, the privileges and mount propagation the
node agent needs, volumes where the state and cache live, and a Dockerfile that builds what they run.
No network, no docker, no cluster: only the files.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from datamgr.cli.main import build_parser
from datamgr.client import DATAMGR_ENV, DEFAULT_DATAMGR
from datamgr.server import DEFAULT_LISTEN

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
TRAINING_JOB = K8S / "examples" / "training-job.yaml"

PORT = 7420
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
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)  # --option-env reads the container's environment
        try:
            return build_parser().parse_args(self.argv)
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


def kustomization() -> dict[str, Any]:
    (document,) = load_yaml_documents(K8S / "kustomization.yaml")
    assert isinstance(document, dict)
    return document


def kustomize_resources() -> list[dict[str, Any]]:
    return k8s_resources(*(K8S / name for name in kustomization()["resources"]))


def all_k8s_resources() -> list[dict[str, Any]]:
    return [*kustomize_resources(), *k8s_resources(TRAINING_JOB)]


def k8s_containers(resources: list[dict[str, Any]] | None = None) -> list[Container]:
    containers = []
    for resource in resources if resources is not None else all_k8s_resources():
        spec = pod_spec(resource)
        if spec is None:
            continue
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            origin = f"{resource['kind']}/{resource['metadata']['name']} container {container['name']}"
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
            containers.append(Container(origin, container["image"], main, extra, env, container))
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


def under(path: str, directory: str) -> bool:
    return posixpath.normpath(path) == posixpath.normpath(directory) or path.startswith(directory.rstrip("/") + "/")


# ---- every file parses, every command line parses ----


def test_every_yaml_file_parses_and_the_kustomization_lists_existing_files() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert COMPOSE_FILE in files and TRAINING_JOB in files
    for path in files:
        for document in load_yaml_documents(path):
            assert isinstance(document, dict), f"{path}: every document is a mapping"
            if path.parent.is_relative_to(K8S) and path.name != "kustomization.yaml":
                assert {"apiVersion", "kind", "metadata"} <= document.keys(), path

    listed = kustomization()["resources"]
    assert kustomization()["namespace"] == NAMESPACE
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization lists {name}, which does not exist"
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == manifests, "every manifest in deploy/k8s/ is in the kustomization, and nothing else"
    assert not any(name.startswith("examples") for name in listed)


def test_the_silod_commands_found_cover_every_subcommand_the_deployment_uses() -> None:
    found = {call.subcommand for container in all_containers() for call in silod_calls(container)}
    assert found >= EXPECTED_SUBCOMMANDS, f"missing: {EXPECTED_SUBCOMMANDS - found}"


@pytest.mark.parametrize("container", [c for c in all_containers() if c.is_silod], ids=lambda c: c.origin)
def test_every_silod_command_line_parses(
    container: Container, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = silod_calls(container)
    if container.origin in RUN_NO_SILOD_COMMAND:
        assert not calls
        return
    assert calls, f"{container.origin}: runs no silod command that this test can find"
    for call in calls:
        unexpanded = [word for word in call.argv if "$" in word]
        assert not unexpanded, f"{call.origin}: {unexpanded} name no env var of the container (or are not plain $VAR)"
        call.parse(monkeypatch, capsys)
        for flag, value in zip(call.argv, call.argv[1:], strict=False):
            if flag == "--option-env":
                variable = value.split("=", 1)[1]
                assert variable in container.env, f"{call.origin}: --option-env reads {variable}, which is not set"
        if call.subcommand in ("node", "datamgr serve"):
            # The daemon is the container's main process (exec), so that it receives SIGTERM and unmounts.
            script = container.main[2] if container.main[0] in SHELLS else ""
            assert container.main == ["silod", *call.argv] or f"exec silod {call.subcommand} " in script, call.origin


# ---- one port ----


def test_the_data_manager_port_is_the_same_everywhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert host_port(DEFAULT_LISTEN)[1] == PORT and host_port(DEFAULT_DATAMGR)[1] == PORT
    assert str(PORT) in dockerfile_stages()[-1].values("EXPOSE")

    compose = compose_containers()
    compose_serve = [c for c in compose if calls_of([c], "datamgr serve")]
    assert len(compose_serve) == 1
    datamgr_service = compose_serve[0].origin.removeprefix("compose service ")
    (serve_args,) = parsed(calls_of(compose_serve, "datamgr serve"), monkeypatch, capsys)
    assert host_port(serve_args.listen) == ("0.0.0.0", PORT)
    published = [str(p).rsplit(":", 1)[-1] for p in compose_serve[0].spec.get("ports", [])]
    assert published == [str(PORT)]

    k8s = k8s_containers(kustomize_resources())
    (serve_call,) = calls_of(k8s, "datamgr serve")
    assert host_port(serve_call.parse(monkeypatch, capsys).listen)[1] == PORT
    (statefulset,) = [r for r in kustomize_resources() if r["kind"] == "StatefulSet"]
    datamgr = the_container(statefulset)
    named_ports = {p["name"]: p["containerPort"] for p in datamgr["ports"]}
    assert list(named_ports.values()) == [PORT]

    def resolve(port: int | str) -> int:
        return named_ports[port] if isinstance(port, str) else port

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert resolve(datamgr[probe]["tcpSocket"]["port"]) == PORT, probe
    (service,) = [r for r in kustomize_resources() if r["kind"] == "Service"]
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" == SERVICE_DNS
    assert [(p["port"], resolve(p["targetPort"])) for p in service["spec"]["ports"]] == [(PORT, PORT)]
    (policy,) = [r for r in kustomize_resources() if r["kind"] == "NetworkPolicy"]
    assert [resolve(p["port"]) for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [PORT]

    # Every client: --datamgr flags and SILOD_DATAMGR, in compose and Kubernetes.
    loopback = {"127.0.0.1", "localhost", "[::1]"}
    for containers, reachable in ((compose, {datamgr_service} | loopback), (k8s_containers(), {SERVICE_DNS})):
        addresses = [c.env[DATAMGR_ENV] for c in containers if DATAMGR_ENV in c.env]
        for call in [call for c in containers for call in silod_calls(c)]:
            if "--datamgr" in call.argv:
                addresses.append(call.argv[call.argv.index("--datamgr") + 1])
        assert addresses
        for address in addresses:
            host, port = host_port(address)
            assert port == PORT and host in reachable, f"clients must use {reachable} port {PORT}, not {address}"


# ---- where state and cache live ----


def test_state_and_cache_directories_are_on_volumes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    image_volumes = [v for rest in dockerfile_stages()[-1].values("VOLUME") for v in json.loads(rest)]
    for container in compose_containers():
        targets = [
            str(v).split(":")[1] if isinstance(v, str) else v["target"] for v in container.spec.get("volumes", [])
        ]
        for call in silod_calls(container):
            args = call.parse(monkeypatch, capsys)
            for directory in [getattr(args, "state_dir", None), getattr(args, "cache_dir", None)]:
                if directory is not None:
                    assert any(under(str(directory), t) for t in targets), f"{call.origin}: {directory} on no volume"
                    if args.command == "datamgr":
                        assert any(under(str(directory), v) for v in image_volumes)

    for container in k8s_containers(kustomize_resources()):
        mounts = [m["mountPath"] for m in container.spec.get("volumeMounts", [])]
        for call in silod_calls(container):
            args = call.parse(monkeypatch, capsys)
            for directory in [getattr(args, "state_dir", None), getattr(args, "cache_dir", None)]:
                if directory is not None:
                    assert any(under(str(directory), m) for m in mounts), f"{call.origin}: {directory} on no volume"
    (statefulset,) = [r for r in kustomize_resources() if r["kind"] == "StatefulSet"]
    claims = {t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]}
    datamgr = the_container(statefulset)
    (serve_call,) = silod_calls(k8s_containers([statefulset])[0])
    state_dir = str(serve_call.parse(monkeypatch, capsys).state_dir)
    assert any(m["name"] in claims and under(state_dir, m["mountPath"]) for m in datamgr["volumeMounts"])


# ---- the node agent and the pods that read its mount ----


def _node_agent(containers: list[Container]) -> tuple[Container, SilodCall]:
    (agent,) = [c for c in containers if calls_of([c], "node")]
    (call,) = calls_of([agent], "node")
    return agent, call


def test_the_daemonset_is_privileged_and_propagates_its_mount_to_the_host(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    resources = kustomize_resources()
    (daemonset,) = [r for r in resources if r["kind"] == "DaemonSet"]
    spec = pod_spec(daemonset)
    assert spec is not None
    agent, call = _node_agent(k8s_containers([daemonset]))
    args = call.parse(monkeypatch, capsys)
    assert args.allow_other and args.foreground
    assert agent.spec["securityContext"]["privileged"] is True
    assert agent.spec["securityContext"]["runAsUser"] == 0

    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in agent.spec["volumeMounts"]}
    fuse = volumes[mounts["/dev/fuse"]["name"]]["hostPath"]
    assert fuse == {"path": "/dev/fuse", "type": "CharDevice"}

    mountpoint = str(args.mountpoint)
    (holder,) = [m for path, m in mounts.items() if under(mountpoint, path)]
    assert holder["mountPropagation"] == "Bidirectional"
    host_mountpoint = posixpath.join(
        volumes[holder["name"]]["hostPath"]["path"], posixpath.relpath(mountpoint, holder["mountPath"])
    )

    # --node-id is the node's name from the downward API; the preStop hook detaches the same mountpoint.
    node_name = [e for e in agent.spec["env"] if e.get("valueFrom", {}).get("fieldRef")]
    assert [(e["name"], e["valueFrom"]["fieldRef"]["fieldPath"]) for e in node_name] == [("NODE_NAME", "spec.nodeName")]
    assert args.node_id == FIELD_PLACEHOLDERS["spec.nodeName"]
    assert '--node-id "$(NODE_NAME)"' in " ".join(agent.spec["args"])
    assert [c.argv for c in calls_of([agent], "umount") if "--lazy" in c.argv] == [
        ["umount", "--lazy", mountpoint],
        ["umount", "--lazy", mountpoint],
    ], "the start-up script and the preStop hook both detach the mountpoint"
    assert agent.spec["lifecycle"]["preStop"]["exec"]["command"] == ["silod", "umount", "--lazy", mountpoint]
    assert host_mountpoint == "/var/lib/silod/mnt"

    # The example training job reads that mountpoint from the host, read-only, seeing new mounts.
    (job,) = k8s_resources(TRAINING_JOB)
    job_spec = pod_spec(job)
    assert job_spec is not None
    job_volumes = {v["name"]: v for v in job_spec["volumes"]}
    (trainer,) = job_spec["containers"]
    (data,) = [m for m in trainer["volumeMounts"] if "hostPath" in job_volumes[m["name"]]]
    assert data["mountPropagation"] == "HostToContainer" and data["readOnly"] is True
    assert under(job_volumes[data["name"]]["hostPath"]["path"], host_mountpoint)


def test_the_training_job_registers_on_its_node_and_finishes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (job,) = k8s_resources(TRAINING_JOB)
    assert job["kind"] == "Job" and "namespace" not in job["metadata"]
    init, trainer = k8s_containers([job])
    (add,) = calls_of([init], "job add")
    args = add.parse(monkeypatch, capsys)
    assert args.worker == [(FIELD_PLACEHOLDERS["spec.nodeName"], 1)], "--worker is this pod's node"
    assert calls_of([init], "alloc io")
    finish = silod_calls(trainer)[-1]
    assert finish.subcommand == "job finish", "the trainer's last silod call finishes the job"
    assert finish.parse(monkeypatch, capsys).job_id == args.job_id
    assert "/data/$(JOB_ID)" in trainer.spec["args"][0], "the trainer reads MOUNTPOINT/JOB_ID"
    labels = job["spec"]["template"]["metadata"]["labels"]
    (policy,) = [r for r in kustomize_resources() if r["kind"] == "NetworkPolicy"]
    client_selectors = [
        p["podSelector"]["matchLabels"] for p in policy["spec"]["ingress"][0]["from"] if "namespaceSelector" in p
    ]
    assert any(selector.items() <= labels.items() for selector in client_selectors), "the NetworkPolicy admits it"


def test_the_compose_node_agent_can_mount_and_share_its_mount(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    containers = compose_containers()
    agent, call = _node_agent(containers)
    args = call.parse(monkeypatch, capsys)
    assert args.allow_other and args.foreground
    spec = agent.spec
    assert spec["user"] == "root"
    assert spec["devices"] == ["/dev/fuse"] and spec["cap_add"] == ["SYS_ADMIN"]
    assert "apparmor:unconfined" in spec["security_opt"]
    mountpoint = str(args.mountpoint)
    (holder,) = [v for v in spec["volumes"] if isinstance(v, dict) and under(mountpoint, v["target"])]
    assert holder["type"] == "bind" and holder["bind"]["propagation"] == "rshared"
    host_mountpoint = posixpath.join(holder["source"], posixpath.relpath(mountpoint, holder["target"]))

    trainers = [c for c in containers if calls_of([c], "job finish")]
    assert len(trainers) == 2
    for trainer in trainers:
        (data,) = [v for v in trainer.spec["volumes"] if isinstance(v, dict) and v["source"] == host_mountpoint]
        assert data["read_only"] is True and data["bind"]["propagation"] == "rslave"
        assert trainer.spec["depends_on"]["node"]["condition"] == "service_healthy"
        assert f"/{data['target'].strip('/')}/$JOB_ID" in trainer.main[-1]

    # The setup service registers the jobs the trainers read, on the agent's node.
    (setup,) = [c for c in containers if calls_of([c], "job add")]
    jobs = {a.job_id: a for a in parsed(calls_of([setup], "job add"), monkeypatch, capsys)}
    assert {t.env["JOB_ID"] for t in trainers} == set(jobs)
    datasets = {a.uri for a in parsed(calls_of([setup], "dataset add"), monkeypatch, capsys)}
    for job in jobs.values():
        assert job.worker == [(args.node_id, 1)] and job.dataset in datasets
    assert {a.job_id for a in parsed(calls_of([setup], "alloc io"), monkeypatch, capsys)} == set(jobs)
    assert {a.dataset_uri for a in parsed(calls_of([setup], "alloc cache"), monkeypatch, capsys)} == datasets


# ---- images ----


def test_one_pinned_silod_image_everywhere() -> None:
    images = [(c.origin, c.image) for c in all_containers()]
    for origin, image in images:
        if origin.startswith("compose") and image.startswith(STORAGE_IMAGES):
            assert ":" in image and not image.endswith(":latest"), f"{origin}: pin {image}"
        else:
            assert image == SILOD_IMAGE, f"{origin} uses {image}, not {SILOD_IMAGE}"
    # The Azurite in compose is the version the test suite runs.
    lock = json.loads((REPO / "package-lock.json").read_text())
    azurite_version = lock["packages"]["node_modules/azurite"]["version"]
    assert any(image.endswith(f"/azurite:{azurite_version}") for _, image in images)

    # Only the data manager service builds it; the others never try to pull an image that is not published.
    services = compose_file()["services"]
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["datamgr"]
    build = services["datamgr"]["build"]
    assert (COMPOSE_FILE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    for name, service in services.items():
        if service["image"] == SILOD_IMAGE and name not in builders:
            assert service["pull_policy"] == "never", name
    assert dockerfile_stages()[-1].values("LABEL")[0].count(f'version="{project_version()}"') == 1


# ---- the Dockerfile and its build context ----


def test_the_dockerfile_builds_wheels_and_runs_silod_as_non_root() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: build tools stay out of the runtime image"
    build, runtime = stages[0], stages[-1]
    assert {"gcc", "libfuse3-dev", "pkg-config"} <= build.apt_packages()
    assert "fuse3" in runtime.apt_packages()
    assert not {p for p in runtime.apt_packages() if p.endswith("-dev") or p in ("gcc", "build-essential")}
    assert any("pip wheel" in run for run in build.values("RUN"))
    assert any(f"from={build.name}" in run and "--no-index" in run for run in runtime.values("RUN"))

    assert image_entrypoint() == ["silod"]
    user = runtime.values("USER")[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, "a numeric non-root USER, so that runAsNonRoot can verify it"
    assert not runtime.values("HEALTHCHECK"), "one image runs several roles: probes are per role"

    # Pods that run as the image's user say so with the same uid.
    for resource in all_k8s_resources():
        spec = pod_spec(resource)
        if spec is not None and spec.get("securityContext", {}).get("runAsNonRoot"):
            assert spec["securityContext"]["runAsUser"] == image_uid(), resource["metadata"]["name"]


def _dockerignore_excludes(patterns: list[str]) -> Callable[[str], bool]:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""

    def regex(pattern: str) -> re.Pattern[str]:
        parts = re.split(r"(\*\*|\*|\?)", pattern.strip("/"))
        wildcards = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
        return re.compile("".join(wildcards.get(p, re.escape(p)) for p in parts))

    rules = [(p.startswith("!"), regex(p.removeprefix("!"))) for p in patterns]

    def excluded(path: str) -> bool:
        parts = path.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        verdict = False
        for negated, rule in rules:
            if any(rule.fullmatch(c) for c in candidates):
                verdict = not negated
        return verdict

    return excluded


def test_the_build_context_sends_the_sources_and_nothing_else() -> None:
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    excluded = _dockerignore_excludes(patterns)
    copied = [src for rest in dockerfile_stages()[0].values("COPY") for src in rest.split()[:-1]]
    assert copied
    for source in copied:
        path = source.rstrip("/")
        assert (REPO / path).exists(), f"COPY {source}: not in the repository"
        assert not excluded(path), f"COPY {source} is excluded by {ignore.name}"
    for kept in ["datamgr/cli/main.py", "fuseclient/agent.py", "silodpb/v1/datamgr_pb2.py"]:
        assert not excluded(kept), kept
    for dropped in [".venv/bin/python", "node_modules/azurite/package.json", ".git/HEAD", ".mypy_cache/x",
                    "datamgr/__pycache__/main.cpython-311.pyc", "tests/test_deploy.py"]:  # fmt: skip
        assert excluded(dropped), dropped


# ---- references inside the files ----


def test_compose_host_variables_have_defaults() -> None:
    """The compose file runs as is: every ${VAR} it takes from the host has a default."""

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, str):
            yield value.replace("$$", "")

    values = list(strings(load_yaml_documents(COMPOSE_FILE)))
    assert not [v for v in values if re.search(r"\$\{[A-Za-z_]\w*\}|\$[A-Za-z_]\w*", v)]
    assert [v for v in values if re.search(r"\$\{[A-Za-z_]\w*:-[^}]+\}", v)]


def test_compose_references_resolve() -> None:
    compose = compose_file()
    services, volumes = compose["services"], set(compose["volumes"])
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith("."):
                assert (COMPOSE_FILE.parent / source).exists(), f"{name}: bind source {source} does not exist"
            elif not source.startswith("/"):
                assert source in volumes, f"{name}: volume {source} is not declared"


def test_kubernetes_references_resolve() -> None:
    resources = kustomize_resources()
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for resource in resources:
        by_kind.setdefault(resource["kind"], []).append(resource)
        assert resource["metadata"].get("namespace", NAMESPACE) == NAMESPACE
    service_accounts = {r["metadata"]["name"] for r in by_kind["ServiceAccount"]}
    assert not by_kind.keys() & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}, "nothing needs RBAC"

    for resource in [*resources, *k8s_resources(TRAINING_JOB)]:
        spec = pod_spec(resource)
        if spec is None:
            continue
        name = resource["metadata"]["name"]
        labels = resource["spec"]["template"]["metadata"]["labels"]
        selector = resource["spec"].get("selector", {}).get("matchLabels", {})
        assert selector.items() <= labels.items(), f"{name}: the selector matches the pod template"
        assert spec.get("serviceAccountName", "silod") in service_accounts
        assert spec.get("automountServiceAccountToken") is False, f"{name}: no API access, so no token"
        volumes = {v["name"] for v in spec.get("volumes", [])}
        volumes |= {t["metadata"]["name"] for t in resource["spec"].get("volumeClaimTemplates", [])}
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert "requests" in container["resources"] and "memory" in container["resources"]["limits"], name
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}/{container['name']}: volume {mount['name']} is undeclared"

    (service,) = by_kind["Service"]
    (statefulset,) = by_kind["StatefulSet"]
    datamgr_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= datamgr_labels.items()
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert statefulset["spec"]["replicas"] == 1, "one data manager per cluster"
    (policy,) = by_kind["NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= datamgr_labels.items()
    (daemonset,) = by_kind["DaemonSet"]
    node_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    same_namespace = [p["podSelector"]["matchLabels"] for p in policy["spec"]["ingress"][0]["from"] if len(p) == 1]
    assert any(selector.items() <= node_labels.items() for selector in same_namespace), "agents may connect"
