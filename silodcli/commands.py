"""Client commands of `silod`: each turns parsed arguments into one or a few data manager calls and prints
what an operator needs to see. `run_client_command` connects and runs the one parsed, and turns a
rejection (`ClientError`) or a bad argument into the exit code."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from datamgr.client import ClientError, DataManagerClient
from datamgr.convert import JOB_CLASS_MESSAGES, PRIORITY_MESSAGES
from silodcli.args import CommandLineError
from silodcli.exits import EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE
from silodcli.security_flags import client_flags
from silodcli.tables import (
    class_phrase,
    controller_line,
    datasets_table,
    estimate_line,
    failed_reads_text,
    jobs_table,
    nodes_table,
    render_table,
    stale_options_lines,
    summary_line,
    suspending_line,
    tenant_phrase,
    tenants_table,
    training_text,
    unopened_lines,
    usage_problem,
    vc_text,
)
from silodcli.vc_file import read_vc
from silodlib.credentials import SecurityConfigError
from silodlib.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb

CLEAR_SCREEN = "\033[H\033[2J"


def run_client_command(args: argparse.Namespace) -> int:
    """Connect to the data manager with the security flags and run `args.client_command` on it."""
    try:
        flags = client_flags(args)
        client = DataManagerClient(
            args.datamgr, tls_ca=flags.tls_ca, tls_cert=flags.tls_cert, tls_key=flags.tls_key, token=flags.token
        )
    except SecurityConfigError as exc:
        print(f"silod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with client:
        try:
            args.client_command(args, client)
        except ClientError as exc:
            print(f"silod: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE if exc.unreachable else EXIT_REJECTED
        except CommandLineError as exc:
            print(f"silod: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return 0


def _as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def alloc_cache(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.allocate_cache_size(args.dataset_uri, args.size)
    print(f"cache quota of {reply.dataset_uri} = {format_size(reply.cache_size_bytes)} (revision {reply.revision})")


def alloc_io(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.allocate_remote_io(args.job_id, args.rate)
    shares = ", ".join(f"{r.node_id} {format_rate(r.io_bytes_per_sec)}" for r in reply.node_rates)
    print(f"remote IO of {reply.job_id} = {format_rate(reply.io_bytes_per_sec)} [{shares}] (revision {reply.revision})")


def dataset_add(args: argparse.Namespace, client: DataManagerClient) -> None:
    options = dict(args.option + args.option_env)
    print(f"listing {args.uri} ...", flush=True)
    reply = client.register_dataset(args.uri, options, args.chunk_size or 0)
    d = reply.dataset
    verb = "registered" if reply.created else "already registered"
    print(
        f"{verb} {d.uri}: {d.file_count} files, {d.item_count} items of up to "
        f"{format_size(d.chunk_size_bytes)}, {format_size(d.size_bytes)} (revision {reply.revision})"
    )


def dataset_set_options(args: argparse.Namespace, client: DataManagerClient) -> None:
    options = dict(args.option + args.option_env)
    if not options and not args.remove_option:
        raise CommandLineError("dataset set-options: give the options to set (--option, --option-env) or remove")
    print(f"reading {args.uri} with the new options ...", flush=True)
    reply = client.update_dataset_options(args.uri, options, args.remove_option)
    d = reply.dataset
    shown = ", ".join(f"{key}={value}" for key, value in sorted(d.options.items())) or "none"
    if reply.changed:
        print(f"options of {d.uri} replaced: {shown} (revision {reply.revision})")
        print("the nodes that mount it read with them once the change reaches them")
    else:
        print(f"options of {d.uri} unchanged: it has these already: {shown} (revision {reply.revision})")


def dataset_remove(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.call(client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=args.uri))
    print(f"unregistered {args.uri} (revision {reply.revision})")


def dataset_show(args: argparse.Namespace, client: DataManagerClient) -> None:
    dataset = client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=args.uri))
    if args.json:
        _print_json(_as_dict(dataset))
        return
    print(datasets_table([dataset]))
    usage = [(u.node_id, format_size(u.cached_bytes), u.cached_items, usage_problem(u)) for u in dataset.usage]
    print("\n" + render_table(("NODE", "CACHED", "CACHED ITEMS", "PROBLEM"), usage))


def job_add(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.register_job(
        args.job_id,
        args.dataset,
        args.ideal_rate,
        args.worker or [],
        epochs=args.epochs,
        irregular=args.irregular,
        gpus=args.gpus or 0,
        job_class=JOB_CLASS_MESSAGES[args.job_class],
        grace_seconds=args.grace_seconds,
        tenant=args.tenant,
        priority=PRIORITY_MESSAGES[args.priority],
    )
    job = reply.job
    verb = "registered" if reply.created else "already registered"
    default_class = job.job_class != pb.JOB_CLASS_TRIAL_AND_ERROR and not job.grace_seconds
    described = training_text(job) if default_class else f"{training_text(job)}; {class_phrase(job)}"
    if job.tenant or job.priority == pb.JOB_PRIORITY_LOW:
        described += f"; {tenant_phrase(job)}"
    _refuse_if_dropped(args, job, client.address)
    print(f"{verb} job {job.job_id} on {job.dataset_uri} ({described}) (revision {reply.revision})")
    if job.gpus:
        _warn_if_no_room(client, job)


def _refuse_if_dropped(args: argparse.Namespace, job: pb.Job, address: str) -> None:
    """A data manager older than a field of RegisterJob ignores it (protobuf drops fields it does not know) and
    registers another job than the one asked for: a low-priority job as a regular one, a tenant's job as nobody's.
    Say so (exit 1) rather than print success."""
    asked = {
        "--tenant": bool(args.tenant) and job.tenant != args.tenant,
        "--priority low": PRIORITY_MESSAGES[args.priority] == pb.JOB_PRIORITY_LOW
        and job.priority != pb.JOB_PRIORITY_LOW,
        "--class te": JOB_CLASS_MESSAGES[args.job_class] == pb.JOB_CLASS_TRIAL_AND_ERROR
        and job.job_class != pb.JOB_CLASS_TRIAL_AND_ERROR,
        "--grace-period": bool(args.grace_seconds) and not job.grace_seconds,
        "--epochs": bool(args.epochs) and not job.epochs,
        "--irregular": args.irregular and not job.irregular,
        "--gpus": bool(args.gpus) and not job.gpus,
    }
    dropped = [flag for flag, lost in asked.items() if lost]
    if dropped:
        raise ClientError(
            f"the data manager at {address} registered job {job.job_id} without {', '.join(dropped)}: it is older "
            f"than {'that option' if len(dropped) == 1 else 'those options'} and ignored them. Finish the job "
            f"(`silod job finish {job.job_id}`) unless it should run as registered, and upgrade the data manager",
            grpc.StatusCode.FAILED_PRECONDITION,
        )


def _warn_if_no_room(client: DataManagerClient, job: pb.Job) -> None:
    """A job the policy places waits, silently, while the nodes offer fewer GPUs than it asks for in all: say
    so, as a node agent offers none unless started with --gpus. Not refused: nodes may register later."""
    nodes = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
    offered = sum(node.gpus for node in nodes)
    if offered < job.gpus:
        print(
            f"warning: the registered nodes offer {offered} GPUs in all; job {job.job_id} waits for its {job.gpus} "
            "until nodes with enough GPUs register (`silod node --gpus N`; `silod status` shows each node's)",
            file=sys.stderr,
        )


def job_finish(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id=args.job_id))
    print(f"finished job {args.job_id} (revision {reply.revision})")


def job_show(args: argparse.Namespace, client: DataManagerClient) -> None:
    job = client.call(client.stub.GetJob, pb.GetJobRequest(job_id=args.job_id))
    if args.json:
        _print_json(_as_dict(job))
        return
    print(jobs_table([job]))
    print(f"class: {class_phrase(job)}")
    print(f"tenant: {tenant_phrase(job)}")
    suspending = suspending_line(job)
    if suspending is not None:
        print(suspending)
    if job.HasField("estimate"):
        print(estimate_line(job))
    rates = {r.node_id: r.io_bytes_per_sec for r in job.node_rates}
    rows = [(w.node_id, w.count, format_rate(rates.get(w.node_id, 0))) for w in job.workers]
    print("\n" + render_table(("NODE", "WORKERS", "REMOTE IO SHARE"), rows))
    usage = [
        (
            u.node_id,
            u.epoch,
            f"{u.epoch_progress:.0%}",
            format_size(u.bytes_read),
            format_size(u.bytes_from_remote),
            failed_reads_text(u),
        )
        for u in job.usage
    ]
    print("\n" + render_table(("NODE", "EPOCH", "PROGRESS", "READ", "FROM REMOTE", "FAILED READS"), usage))


def tenant_add(args: argparse.Namespace, client: DataManagerClient) -> None:
    if args.vc is not None:
        cells, cache, remote_io = read_vc(args.vc, args.name)
    else:
        cells, cache, remote_io = args.cells, 0, 0
    cache = cache if args.cache is None else args.cache  # a flag wins over the file
    remote_io = remote_io if args.remote_io is None else args.remote_io
    reply = client.register_tenant(args.name, cells, cache, remote_io)
    verb = "registered" if reply.created else "already registered"
    print(f"{verb} tenant {reply.tenant.name}: {vc_text(reply.tenant)} (revision {reply.revision})")


def tenant_list(args: argparse.Namespace, client: DataManagerClient) -> None:
    tenants = client.call(client.stub.ListTenants, pb.ListTenantsRequest()).tenants
    if args.json:
        _print_json([_as_dict(t) for t in tenants])
        return
    print(tenants_table(tenants))


def tenant_remove(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.call(client.stub.UnregisterTenant, pb.UnregisterTenantRequest(name=args.name))
    print(f"unregistered tenant {args.name} (revision {reply.revision})")


def node_remove(args: argparse.Namespace, client: DataManagerClient) -> None:
    """Unregister a node whose agent is gone. The data manager refuses it, naming why and what to do, while jobs
    use it, unless `--force` when the tenants' VCs need it, and while the node counts as live (its agent reported
    within --node-timeout, or the data manager restarted that recently), whatever `--force`: the rules are the data
    manager's, for every client of `UnregisterNode`."""
    reply = client.unregister_node(args.node_id, force=args.force)
    print(f"unregistered node {args.node_id} (revision {reply.revision})")


class _Status(NamedTuple):
    summary: pb.ClusterSummary
    datasets: Sequence[pb.Dataset]
    jobs: Sequence[pb.Job]
    nodes: Sequence[pb.Node]
    tenants: Sequence[pb.Tenant]


def _fetch_status(client: DataManagerClient) -> _Status:
    return _Status(
        client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()),
        client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets,
        client.list_jobs(),
        client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes,
        _fetch_tenants(client),
    )


def _fetch_tenants(client: DataManagerClient) -> Sequence[pb.Tenant]:
    """The tenants; none from a data manager older than tenants (it does not know the call)."""
    try:
        return client.call(client.stub.ListTenants, pb.ListTenantsRequest()).tenants
    except ClientError as exc:
        if exc.code == grpc.StatusCode.UNIMPLEMENTED:
            return []
        raise


def _status_json(status: _Status, indent: int | None, **frame: str) -> str:
    """The status as one JSON document; a watch's `frame` keys (its time, since when the data manager was down)
    beside the tables."""
    document: dict[str, object] = {
        "summary": _as_dict(status.summary),
        "datasets": [_as_dict(d) for d in status.datasets],
        "jobs": [_as_dict(j) for j in status.jobs],
        "nodes": [_as_dict(n) for n in status.nodes],
        "tenants": [_as_dict(t) for t in status.tenants],
        **frame,
    }
    return json.dumps(document, indent=indent, sort_keys=True)


def _status_tables(address: str, status: _Status) -> str:
    """The summary and the tables; the tenants' only where the data manager has tenants or cell levels."""
    sections = [
        f"data manager {address}: {summary_line(status.summary)}\n{controller_line(status.summary.controller)}",
        datasets_table(status.datasets) + stale_options_lines(status.datasets),
        jobs_table(status.jobs) + unopened_lines(status.datasets, status.jobs),
        nodes_table(status.nodes),
    ]
    if status.tenants or status.summary.cell_levels:
        levels = status.summary.cell_levels or "each node one cell of its GPUs"
        sections.append(f"tenants (cell levels {levels}):\n{tenants_table(status.tenants)}")
    return "\n\n".join(sections)


def status(args: argparse.Namespace, client: DataManagerClient) -> None:
    if args.watch is None:
        current = _fetch_status(client)
        print(_status_json(current, indent=2) if args.json else _status_tables(client.address, current))
        return
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends
        _watch_status(client, args.json, args.watch)


JSON_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # a `--json` watch frame's `time` and `unreachable_since`


def _watch_status(client: DataManagerClient, as_json: bool, interval: float) -> None:
    """Until Ctrl-C: a frame every `interval` seconds, redrawn in place on a terminal. While the data manager
    cannot be reached, each frame is the error, and the first frame after says since when it was down. With
    `as_json` each frame is one line, the status document or the error, with the time it was taken."""
    redraw = sys.stdout.isatty()
    down_since: str | None = None
    first = True
    while True:
        # A JSON frame's times are RFC 3339 in UTC, as a program reading them parses them; a person reads the other.
        now = datetime.now(UTC).strftime(JSON_TIME_FORMAT if as_json else "%Y-%m-%d %H:%M:%S UTC")
        try:
            current = _fetch_status(client)
        except ClientError as exc:
            if not exc.unreachable:
                raise
            down_since = down_since or now
            frame = json.dumps({"time": now, "error": str(exc)}) if as_json else f"silod: {exc}"
        else:
            if as_json:
                since = {} if down_since is None else {"unreachable_since": down_since}
                frame = _status_json(current, indent=None, time=now, **since)
            else:
                frame = _status_tables(client.address, current)
                if down_since is not None:
                    frame = f"reachable again (unreachable since {down_since})\n\n{frame}"
            down_since = None
        if not as_json:
            separator = CLEAR_SCREEN if redraw else "" if first else "\n"
            frame = f"{separator}Every {interval:g}s: silod status    {now}\n\n{frame}"
        print(frame, flush=True)
        first = False
        time.sleep(interval)
