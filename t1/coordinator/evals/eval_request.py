"""An eval job's request as a value (EvalRequest), its protobuf form, and its checks against config limits.

The gRPC edge (service.py) turns a SubmitEvalRequest into an EvalRequest (`request_of`); the run's
own evals build one. The jobs database stores the request as SubmitEvalRequest bytes (`request_bytes`,
`stored_request`), as it always has. The checks are pure functions over the request and the limits
section, each failure a RequestError naming the field; EvalJobs calls them before it reads a task
folder or writes a row, so an oversized request costs nothing but its parse.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from t1.config.inference import OpenAIEndpointConfig
from t1.config.limits import RequestLimits
from t1.config.shared import host_port
from t1.rpc.errors import RequestError
from t1.tasks.spec import TaskSpec
from t1.v1 import coordinator_pb2 as pb

AGENT_FORMATS = {pb.AGENT_FORMAT_UNSPECIFIED: "", pb.AGENT_FORMAT_TOOL_CALLS: "tool_calls",
                 pb.AGENT_FORMAT_TERMINUS2: "terminus2"}
PB_AGENT_FORMATS = {name: value for value, name in AGENT_FORMATS.items()}


@dataclass(frozen=True, slots=True)
class OpenAIEndpointRequest:
    """An OpenAI-compatible server as the request names it (`openai_endpoint` checks it into a config section)."""

    base_url: str
    model: str
    api: str = ""            # chat | completions; "" is chat
    api_key_env: str = ""    # the coordinator's environment variable holding the key; "" for none
    tool_calls: bool = False


@dataclass(frozen=True, slots=True)
class EvalRequest:
    """One eval job as asked: the fields of SubmitEvalRequest (protos/t1/v1/coordinator.proto says each)."""

    tasks: str                                  # a folder of task folders, or a name in tasks.sets
    attempts: int
    name: str = ""
    task_ids: tuple[str, ...] = ()              # only these task ids (empty: all)
    concurrency: int = 0                        # 0: the coordinator's default
    timeout_multiplier: float = 0.0             # scales every task timeout; 0 is read as 1
    agent_format: str = ""                      # tool_calls | terminus2; "" is the config's
    inference_endpoints: tuple[str, ...] = ()   # host:port of inference servers; empty: the coordinator's pool
    openai_endpoint: OpenAIEndpointRequest | None = None  # instead of inference_endpoints


def request_of(msg: pb.SubmitEvalRequest) -> EvalRequest:
    """The request a SubmitEvalRequest carries; RequestError for an agent format this coordinator does not know."""
    if msg.agent_format not in AGENT_FORMATS:
        raise RequestError(f"agent_format: unknown value {msg.agent_format}")
    ep = msg.openai_endpoint
    endpoint = OpenAIEndpointRequest(ep.base_url, ep.model, ep.api, ep.api_key_env, ep.tool_calls) \
        if msg.HasField("openai_endpoint") else None
    return EvalRequest(tasks=msg.tasks, attempts=msg.attempts, name=msg.name, task_ids=tuple(msg.task_ids),
                       concurrency=msg.concurrency, timeout_multiplier=msg.timeout_multiplier,
                       agent_format=AGENT_FORMATS[msg.agent_format],
                       inference_endpoints=tuple(msg.inference_endpoints), openai_endpoint=endpoint)


def request_pb(req: EvalRequest) -> pb.SubmitEvalRequest:
    """The SubmitEvalRequest of a checked request (`check_submit`: its agent format is a known one)."""
    msg = pb.SubmitEvalRequest(tasks=req.tasks, attempts=req.attempts, concurrency=req.concurrency,
                               inference_endpoints=req.inference_endpoints, timeout_multiplier=req.timeout_multiplier,
                               agent_format=PB_AGENT_FORMATS[req.agent_format], name=req.name, task_ids=req.task_ids)
    ep = req.openai_endpoint
    if ep is not None:
        msg.openai_endpoint.CopyFrom(pb.OpenAIEndpoint(base_url=ep.base_url, model=ep.model, api=ep.api,
                                                       api_key_env=ep.api_key_env, tool_calls=ep.tool_calls))
    return msg


def request_bytes(req: EvalRequest) -> bytes:
    """What the jobs database stores of a request: its SubmitEvalRequest, serialized."""
    return request_pb(req).SerializeToString()


def stored_request(data: bytes) -> EvalRequest:
    """The request a job row stores (DecodeError when the bytes do not parse, RequestError when they say too much)."""
    return request_of(pb.SubmitEvalRequest.FromString(data))


def check_text(field: str, value: str, max_chars: int) -> None:
    if len(value) > max_chars:
        raise RequestError(f"{field}: {len(value)} characters, at most {max_chars} (limits)")


def check_items(field: str, values: Sequence[str], max_items: int, max_chars: int) -> None:
    if len(values) > max_items:
        raise RequestError(f"{field}: {len(values)} entries, at most {max_items} (limits.max_list_items)")
    for i, v in enumerate(values):
        check_text(f"{field}[{i}]", v, max_chars)


def check_submit(req: EvalRequest, limits: RequestLimits) -> None:
    """Every field of the request within its bound (the task count is checked once tasks are resolved)."""
    if not req.tasks:
        raise RequestError("tasks: required (a task folder or a name in tasks.sets)")
    check_text("tasks", req.tasks, limits.max_path_chars)
    check_text("name", req.name, limits.max_name_chars)
    check_items("task_ids", req.task_ids, limits.max_list_items, limits.max_name_chars)
    check_items("inference_endpoints", req.inference_endpoints, limits.max_list_items, limits.max_name_chars)
    for i, address in enumerate(req.inference_endpoints):
        try:
            host_port(address)
        except ValueError as exc:
            raise RequestError(f"inference_endpoints[{i}]: {exc}") from None
    if not 1 <= req.attempts <= limits.max_attempts_per_task:
        raise RequestError(f"attempts: must be in [1, {limits.max_attempts_per_task}] "
                           f"(limits.max_attempts_per_task), got {req.attempts}")
    if not 0 <= req.concurrency <= limits.max_job_concurrency:
        raise RequestError(f"concurrency: must be in [0, {limits.max_job_concurrency}] "
                           f"(limits.max_job_concurrency), got {req.concurrency}")
    tm = req.timeout_multiplier
    if not math.isfinite(tm) or not 0 <= tm <= limits.max_timeout_multiplier:
        raise RequestError(f"timeout_multiplier: must be finite and in [0, {limits.max_timeout_multiplier}] "
                           f"(limits.max_timeout_multiplier), got {tm}")
    if req.agent_format not in PB_AGENT_FORMATS:
        raise RequestError(f"agent_format: unknown value {req.agent_format!r}")
    ep = req.openai_endpoint
    if ep is not None:
        for name in ("base_url", "model", "api", "api_key_env"):
            check_text(f"openai_endpoint.{name}", getattr(ep, name), limits.max_path_chars)
        endpoint = openai_endpoint(req)
        assert endpoint is not None
        if endpoint.api_key_env and not os.environ.get(endpoint.api_key_env):
            raise RequestError(f"openai_endpoint.api_key_env: {endpoint.api_key_env} is not set in the "
                               "coordinator's environment")
        agent_format_of(req, endpoint)


def openai_endpoint(req: EvalRequest) -> OpenAIEndpointConfig | None:
    """The job's OpenAI-compatible endpoint as a config section (api defaults to chat); None without one."""
    ep = req.openai_endpoint
    if ep is None:
        return None
    if req.inference_endpoints:
        raise RequestError("openai_endpoint: give it or inference_endpoints, not both")
    try:
        return OpenAIEndpointConfig.model_validate({"base_url": ep.base_url, "model": ep.model, "api": ep.api or "chat",
                                                    "api_key_env": ep.api_key_env, "tool_calls": ep.tool_calls})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise RequestError(f"openai_endpoint.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def agent_format_of(req: EvalRequest, endpoint: OpenAIEndpointConfig | None) -> str:
    """The job's agent format ("" for the config's default); a chat endpoint without tools gets Terminus-2."""
    fmt = req.agent_format
    if endpoint is None or endpoint.api != "chat" or endpoint.tool_calls:
        return fmt
    if fmt == "tool_calls":
        raise RequestError("agent_format: tool_calls over a chat endpoint needs openai_endpoint.tool_calls "
                           "(a server that takes tools); use terminus2")
    return "terminus2"


def check_tasks(tasks: Sequence[TaskSpec], limits: RequestLimits) -> None:
    """Resolved tasks an eval job may run: instructions within their bound (each is tokenized per turn)."""
    for t in tasks:
        if len(t.instruction) > limits.max_instruction_chars:
            raise RequestError(f"tasks: task {t.id} has an instruction of {len(t.instruction)} characters, at most "
                               f"{limits.max_instruction_chars} (limits.max_instruction_chars)")


def check_job_size(num_tasks: int, attempts: int, limits: RequestLimits) -> None:
    total = num_tasks * attempts
    if total > limits.max_attempts_per_job:
        raise RequestError(f"attempts: {num_tasks} tasks x {attempts} attempts = {total}, at most "
                           f"{limits.max_attempts_per_job} per job (limits.max_attempts_per_job)")
