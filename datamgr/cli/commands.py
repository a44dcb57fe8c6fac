"""Client commands of `silod`: each turns parsed arguments into one or a few data manager calls and prints
what an operator needs to see. They raise `ClientError` on rejection; `main` turns that into the exit code."""

from __future__ import annotations

import argparse
import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from datamgr.cli.tables import datasets_table, jobs_table, nodes_table, render_table, summary_line
from datamgr.client import DataManagerClient
from datamgr.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb


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


def dataset_remove(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.call(client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=args.uri))
    print(f"unregistered {args.uri} (revision {reply.revision})")


def dataset_show(args: argparse.Namespace, client: DataManagerClient) -> None:
    dataset = client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=args.uri))
    if args.json:
        _print_json(_as_dict(dataset))
        return
    print(datasets_table([dataset]))
    usage = [(u.node_id, format_size(u.cached_bytes), u.cached_items) for u in dataset.usage]
    print("\n" + render_table(("NODE", "CACHED", "CACHED ITEMS"), usage))


def job_add(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.register_job(args.job_id, args.dataset, args.ideal_rate, args.worker)
    verb = "registered" if reply.created else "already registered"
    print(f"{verb} job {reply.job.job_id} on {reply.job.dataset_uri} (revision {reply.revision})")


def job_finish(args: argparse.Namespace, client: DataManagerClient) -> None:
    reply = client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id=args.job_id))
    print(f"finished job {args.job_id} (revision {reply.revision})")


def job_show(args: argparse.Namespace, client: DataManagerClient) -> None:
    job = client.call(client.stub.GetJob, pb.GetJobRequest(job_id=args.job_id))
    if args.json:
        _print_json(_as_dict(job))
        return
    print(jobs_table([job]))
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
        )
        for u in job.usage
    ]
    print("\n" + render_table(("NODE", "EPOCH", "PROGRESS", "READ", "FROM REMOTE"), usage))


def status(args: argparse.Namespace, client: DataManagerClient) -> None:
    summary = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
    datasets = client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets
    jobs = client.call(client.stub.ListJobs, pb.ListJobsRequest()).jobs
    nodes = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
    if args.json:
        _print_json(
            {
                "summary": _as_dict(summary),
                "datasets": [_as_dict(d) for d in datasets],
                "jobs": [_as_dict(j) for j in jobs],
                "nodes": [_as_dict(n) for n in nodes],
            }
        )
        return
    print(f"data manager {client.address}: {summary_line(summary)}\n")
    print(datasets_table(datasets) + "\n")
    print(jobs_table(jobs) + "\n")
    print(nodes_table(nodes))
