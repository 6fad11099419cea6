"""`t1 eval submit|watch|list|cancel|report`: eval jobs on a running coordinator, over gRPC."""

from __future__ import annotations

import argparse
import sys

import grpc

from t1.cli.common import add_config_args, config_or_exit
from t1.cli.eval_render import as_csv, as_json, as_markdown, as_table, state_name, summary_lines
from t1.rpc.client import CallOptions, call_options, make_sync_channel
from t1.rpc.options import STREAM_DEADLINE_S
from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc

_FORMATS = {"tool_calls": pb.AGENT_FORMAT_TOOL_CALLS, "terminus2": pb.AGENT_FORMAT_TERMINUS2}
_TERMINAL = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="Submit, watch and report eval jobs on a coordinator.")
    cmds = parser.add_subparsers(dest="eval_command", metavar="ACTION", required=True)

    def add(name: str, help_text: str, func: object) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help_text)
        add_config_args(p)
        p.add_argument("--address", metavar="HOST:PORT", help="Coordinator address (default: coordinator.server).")
        p.set_defaults(func=func)
        return p

    submit = add("submit", "Submit an eval job; prints its id (or waits with --wait).", _submit)
    submit.add_argument("--tasks", required=True, metavar="DIR|NAME", help="Task folder or a name in tasks.sets.")
    submit.add_argument("--attempts", type=int, default=1, metavar="K", help="Attempts per task.")
    submit.add_argument("--concurrency", type=int, default=0, help="Concurrent attempts (0: the coordinator's "
                                                                   "default).")
    submit.add_argument("--name", default="", help="A name for the job.")
    submit.add_argument("--task-id", dest="task_ids", action="append", default=[], help="Only this task (repeatable).")
    submit.add_argument("--agent-format", choices=sorted(_FORMATS), help="Agent action format.")
    submit.add_argument("--timeout-multiplier", type=float, default=0.0, help="Scale every task timeout.")
    submit.add_argument("--endpoint", dest="endpoints", action="append", default=[],
                        help="Inference host:port (repeatable), or the URL of one OpenAI-compatible server "
                             "(http[s]://HOST/v1, with --model).")
    submit.add_argument("--model", default="", help="With an endpoint URL: the served model's name.")
    submit.add_argument("--api", choices=("chat", "completions"), default="chat",
                        help="With an endpoint URL: chat (text-level) or completions (token ids).")
    submit.add_argument("--api-key-env", default="", metavar="VAR",
                        help="With an endpoint URL: the coordinator's environment variable holding the API key.")
    submit.add_argument("--tool-calls", action="store_true",
                        help="With an endpoint URL: the server takes tools (the tool_calls format).")
    submit.add_argument("--wait", action="store_true", help="Watch the job to its end and print the report.")
    watch = add("watch", "Follow a job with a live progress bar until it ends.", _watch)
    watch.add_argument("job_id", metavar="JOB")
    listing = add("list", "List jobs, newest first, one page at a time.", _list)
    listing.add_argument("--limit", type=int, default=0, help="Jobs per page (0: the server's page size).")
    listing.add_argument("--page-token", default="", help="The token printed after the previous page.")
    add("cancel", "Cancel a job.", _cancel).add_argument("job_id", metavar="JOB")
    report = add("report", "Print a job's results.", _report)
    report.add_argument("job_id", metavar="JOB")
    report.add_argument("--format", choices=("table", "json", "csv", "md"), default="table")


def _client(args: argparse.Namespace) -> tuple[pb_grpc.CoordinatorServiceStub, CallOptions, grpc.Channel]:
    cfg = config_or_exit(args)
    server = cfg.coordinator.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    address = args.address or f"{host}:{server.port}"
    channel = make_sync_channel(address, cfg.auth)
    return pb_grpc.CoordinatorServiceStub(channel), call_options(cfg.auth), channel


def _rpc_failed(err: grpc.RpcError) -> int:
    print(f"error: {err.code().name}: {err.details()}", file=sys.stderr)
    return 1


def _openai_endpoint(args: argparse.Namespace) -> pb.OpenAIEndpoint | None:
    """The endpoint of `--endpoint URL --model NAME`; None for host:port endpoints. Exits on a bad mix."""
    urls = [e for e in args.endpoints if e.startswith(("http://", "https://"))]
    if not urls:
        if args.model:
            sys.exit("error: --model goes with an OpenAI-compatible --endpoint URL (http[s]://HOST/v1)")
        return None
    if len(args.endpoints) != 1:
        sys.exit("error: give one --endpoint URL, or host:port endpoints, not several URLs or a mix")
    if not args.model:
        sys.exit(f"error: --endpoint {urls[0]} needs --model NAME (the served model's name)")
    return pb.OpenAIEndpoint(base_url=urls[0], model=args.model, api=args.api, api_key_env=args.api_key_env,
                             tool_calls=args.tool_calls)


def _submit(args: argparse.Namespace) -> int:
    openai = _openai_endpoint(args)
    stub, opts, channel = _client(args)
    req = pb.SubmitEvalRequest(tasks=args.tasks, attempts=args.attempts, concurrency=args.concurrency, name=args.name,
                               task_ids=args.task_ids, timeout_multiplier=args.timeout_multiplier,
                               inference_endpoints=[] if openai is not None else args.endpoints,
                               agent_format=_FORMATS.get(args.agent_format or "", pb.AGENT_FORMAT_UNSPECIFIED),
                               openai_endpoint=openai)
    with channel:
        try:
            job = stub.SubmitEval(req, **opts.kw())
        except grpc.RpcError as err:
            return _rpc_failed(err)
        print(job.job_id, flush=True)
        if not args.wait:
            return 0
        return _follow(stub, opts, job.job_id, show_report=True)


def _follow(stub: pb_grpc.CoordinatorServiceStub, opts: CallOptions, job_id: str, show_report: bool) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task(job_id, total=None, info="")
            resolved = scored = 0
            for ev in stub.WatchJob(pb.WatchJobRequest(job_id=job_id), **opts.kw(STREAM_DEADLINE_S)):
                if ev.HasField("attempt_finished"):
                    a = ev.attempt_finished
                    scored += a.status != "infra_error"
                    resolved += a.resolved
                    progress.console.print(f"  {a.task_id}#{a.attempt}: {a.status} reward {a.reward:g} "
                                           f"({a.passed}/{a.total}) {a.turns} turns")
                info = f"{state_name(ev.state)}, running {ev.running_attempts}, resolved {resolved}/{scored}"
                progress.update(bar, total=ev.total_attempts, completed=ev.finished_attempts, info=info)
        job = stub.GetJob(pb.GetJobRequest(job_id=job_id, include_attempts=True), **opts.kw())
    except grpc.RpcError as err:
        return _rpc_failed(err)
    if show_report:
        Console(width=160).print(as_table(job))
    else:
        print("\n".join(summary_lines(job)))
    return 0 if job.state == pb.JOB_STATE_SUCCEEDED else 1


def _watch(args: argparse.Namespace) -> int:
    stub, opts, channel = _client(args)
    with channel:
        return _follow(stub, opts, args.job_id, show_report=False)


def _list(args: argparse.Namespace) -> int:
    stub, opts, channel = _client(args)
    with channel:
        try:
            resp = stub.ListJobs(pb.ListJobsRequest(limit=args.limit, page_token=args.page_token), **opts.kw())
        except grpc.RpcError as err:
            return _rpc_failed(err)
    for job in resp.jobs:
        print(f"{job.job_id}  {state_name(job.state):10s} {job.finished_attempts:>4}/{job.total_attempts:<4} "
              f"resolve {job.summary.resolve_rate:.3f}  {job.request.name or job.request.tasks}")
    if resp.next_page_token:
        print(f"more: --page-token {resp.next_page_token}", file=sys.stderr)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    stub, opts, channel = _client(args)
    with channel:
        try:
            job = stub.CancelJob(pb.CancelJobRequest(job_id=args.job_id), **opts.kw())
        except grpc.RpcError as err:
            return _rpc_failed(err)
    print(f"{job.job_id}: {state_name(job.state)}")
    return 0


def _report(args: argparse.Namespace) -> int:
    stub, opts, channel = _client(args)
    with channel:
        try:
            job = stub.GetJob(pb.GetJobRequest(job_id=args.job_id, include_attempts=True), **opts.kw())
        except grpc.RpcError as err:
            return _rpc_failed(err)
    if args.format == "table":
        from rich.console import Console

        Console(width=160).print(as_table(job))
    else:
        sys.stdout.write({"json": as_json, "csv": as_csv, "md": as_markdown}[args.format](job))
    return 0
