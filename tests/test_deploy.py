"""The deployment files stay in step with the code.

Every `silod` command line in deploy/ (compose services, Kubernetes containers, hooks, probes, and the `silod`
calls inside their `sh -c` scripts) is parsed by the real CLI parser with the container's environment applied
as the real command applies it, so a renamed or removed flag or `SILOD_*` variable fails here. The Kubernetes
kustomizations (the base, the secure overlay, the example job and its secure overlay) are rendered by a small
kustomize of the features they use (the readers live in tests/deploy_model.py, with tests of their own),
checked against `kubectl kustomize` by test_deploy_kubectl.py (tier `external`). The rest
pins what the deployment depends on: the gRPC and metrics ports, one image, the privileges and mount
propagation the node agent needs, volumes where the state and cache live, and a Dockerfile that builds what
they run; the secure overlays are test_deploy_security.py's. No docker engine and no cluster: only the files.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from datamgr.defaults import DATAMGR_ENV, DEFAULT_DATAMGR, DEFAULT_LISTEN
from tests.deploy_model import (
    COMPOSE_FILE,
    DEPLOY,
    DOCKERFILE,
    EXAMPLES,
    EXPECTED_SUBCOMMANDS,
    FIELD_PLACEHOLDERS,
    K8S,
    K8S_BASE,
    KUSTOMIZATIONS,
    METRICS_PORTS,
    NAMESPACE,
    OVERLAID,
    PORT,
    REPO,
    RUN_NO_SILOD_COMMAND,
    SECURE,
    SERVICE_DNS,
    SHELLS,
    SILOD_IMAGE,
    STORAGE_IMAGES,
    TRAINING_JOB,
    Container,
    SilodCall,
    all_containers,
    all_k8s_resources,
    calls_of,
    compose_containers,
    compose_file,
    dockerfile_stages,
    host_port,
    image_entrypoint,
    image_uid,
    k8s_containers,
    k8s_resources,
    kustomization,
    kustomize_build,
    kustomize_resources,
    load_yaml_documents,
    named_ports,
    parsed,
    pod_spec,
    project_version,
    published_ports,
    resolve_port,
    silod_calls,
    the_container,
    under,
)


def test_every_yaml_file_parses_and_every_kustomization_uses_all_its_files() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert COMPOSE_FILE in files and TRAINING_JOB in files
    used: set[Path] = set()
    for directory in KUSTOMIZATIONS:
        spec = kustomization(directory)
        used.add(directory / "kustomization.yaml")
        used |= {(directory / entry).resolve() for entry in spec.get("resources", [])}
        used |= {(directory / patch["path"]).resolve() for patch in spec.get("patches", [])}
    assert {p.parent for p in K8S.rglob("kustomization.yaml")} == set(KUSTOMIZATIONS)
    for path in files:
        documents = load_yaml_documents(path)
        if path.is_relative_to(K8S):
            assert path in used, f"{path} is in no kustomization"
        if path.parent.is_relative_to(K8S / "overlays") and path.name != "kustomization.yaml":
            continue  # patches: their targets and operations are checked by rendering
        for document in documents:
            assert isinstance(document, dict), f"{path}: every document is a mapping"
            if path.is_relative_to(K8S) and path.name != "kustomization.yaml":
                assert {"apiVersion", "kind", "metadata"} <= document.keys(), path
    assert kustomization(K8S_BASE)["namespace"] == NAMESPACE
    assert "namespace" not in kustomization(EXAMPLES), "the example job goes to the namespace it is applied in"


@pytest.mark.parametrize("overlay", OVERLAID, ids=lambda d: str(d.relative_to(K8S)))
def test_overlays_patch_their_base_and_add_nothing(overlay: Path) -> None:
    def names(resources: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(r["kind"], r["metadata"]["name"]) for r in resources]

    base, patched = kustomize_build(OVERLAID[overlay]), kustomize_build(overlay)
    assert names(patched) == names(base)
    assert patched != base, "every patch changes something"


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
    exposed = [int(port) for ports in dockerfile_stages()[-1].values("EXPOSE") for port in ports.split()]
    assert exposed == [PORT, *METRICS_PORTS.values()], "the gRPC port, then each daemon's metrics port"

    compose = compose_containers()
    compose_serve = [c for c in compose if calls_of([c], "datamgr serve")]
    assert len(compose_serve) == 1
    datamgr_service = compose_serve[0].origin.removeprefix("compose service ")
    (serve_args,) = parsed(calls_of(compose_serve, "datamgr serve"), monkeypatch, capsys)
    assert host_port(serve_args.listen) == ("0.0.0.0", PORT)
    assert published_ports(compose_serve[0].spec)[PORT] == "127.0.0.1", "plaintext: on the host's loopback only"

    k8s = k8s_containers(kustomize_resources())
    (serve_call,) = calls_of(k8s, "datamgr serve")
    assert host_port(serve_call.parse(monkeypatch, capsys).listen)[1] == PORT
    (statefulset,) = [r for r in kustomize_resources() if r["kind"] == "StatefulSet"]
    datamgr = the_container(statefulset)
    assert named_ports(datamgr)["grpc"] == PORT
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert resolve_port(datamgr, datamgr[probe]["tcpSocket"]["port"]) == PORT, probe
    (service,) = [r for r in kustomize_resources() if r["kind"] == "Service"]
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" == SERVICE_DNS
    service_ports = {p["name"]: (p["port"], resolve_port(datamgr, p["targetPort"])) for p in service["spec"]["ports"]}
    assert service_ports["grpc"] == (PORT, PORT)
    (policy,) = [r for r in kustomize_resources() if r["kind"] == "NetworkPolicy"]
    (grpc_rule,) = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "grpc"]
    assert [resolve_port(datamgr, p["port"]) for p in grpc_rule["ports"]] == [PORT]

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


# ---- metrics ----


def test_both_daemons_serve_metrics_where_prometheus_finds_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each daemon's --metrics-port is a named container port that its pod's scrape annotations announce; the
    data manager's is on a non-loopback host (it follows --listen), a Service port, and open in its
    NetworkPolicy. Compose publishes both on the host's loopback."""
    for directory in (K8S_BASE, SECURE):
        resources = kustomize_build(directory)
        for subcommand, port in METRICS_PORTS.items():
            (workload,) = [r for r in resources if calls_of(k8s_containers([r]), subcommand)]
            (container,) = [c for c in k8s_containers([workload]) if calls_of([c], subcommand)]
            (call,) = calls_of([container], subcommand)
            args = call.parse(monkeypatch, capsys)
            assert args.metrics_port == port and named_ports(container.spec)["metrics"] == port, call.origin
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            assert annotations == {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
            }, call.origin
            if subcommand == "datamgr serve":
                assert host_port(args.listen)[0] not in ("127.0.0.1", "localhost", "::1"), "reachable from the pod IP"
                (service,) = [r for r in resources if r["kind"] == "Service"]
                service_ports = {p["name"]: p for p in service["spec"]["ports"]}
                assert resolve_port(container.spec, service_ports["metrics"]["targetPort"]) == port
                (policy,) = [r for r in resources if r["kind"] == "NetworkPolicy"]
                (rule,) = [rule for rule in policy["spec"]["ingress"] if rule["ports"][0]["port"] == "metrics"]
                assert [resolve_port(container.spec, p["port"]) for p in rule["ports"]] == [port]
                assert rule["from"] == [{"namespaceSelector": {}}], "Prometheus may run in any namespace"

    for subcommand, port in METRICS_PORTS.items():
        (daemon,) = [c for c in compose_containers() if calls_of([c], subcommand)]
        (call,) = calls_of([daemon], subcommand)
        assert call.parse(monkeypatch, capsys).metrics_port == port
        assert published_ports(daemon.spec)[port] == "127.0.0.1", call.origin


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
    for kept in ["silodcli/main.py", "fuseclient/agent.py", "silodpb/v1/datamgr_pb2.py"]:
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
