"""A hostile harness: from inside its sandbox it tries every door besides its own episode's generation.

Two episodes' gateways run at once, each on the loopback of its own sandbox. From sandbox A, as a
harness would: no key, a wrong key and episode B's key are refused; every path but generation
(weights, gRPC services, metrics, completions) is 404; T1's listeners on the host's loopback (a
gRPC-like port, the Prometheus endpoint) cannot be reached at all; and A's own key gets A's
generation, recorded in A's session only.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from prometheus_client import start_http_server

from t1.config.rollout import HarnessConfig
from t1.gateway.server import GatewayServer
from t1.gateway.session import GatewaySession
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams, collect
from t1.sandbox.types import SandboxRequest

PROBE = r'''
import json, socket, sys, urllib.request, urllib.error
port, own, other = int(sys.argv[1]), sys.argv[2], sys.argv[3]
host_ports = [int(p) for p in sys.argv[4].split(",")]
out = {}
def call(method, path, key=None, body=None, header="authorization"):
    headers = {"content-type": "application/json"}
    if key is not None:
        headers[header] = ("Bearer " + key) if header == "authorization" else key
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
chat = {"model": "t1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
out["no_key"] = call("POST", "/v1/chat/completions", None, chat)
out["wrong_key"] = call("POST", "/v1/chat/completions", "x" * 43, chat)
out["other_episode_key"] = call("POST", "/v1/chat/completions", other, chat)
out["other_key_anthropic"] = call("POST", "/v1/messages", other, {"max_tokens": 4, **chat}, header="x-api-key")
for path in ("/metrics", "/v1/completions", "/t1.v1.InferenceService/UpdateWeights",
             "/t1.v1.TrainerService/Submit", "/t1.v1.CoordinatorService/ListJobs", "/v1/sessions/ep-b",
             "/../ep-b/v1/chat/completions", "/v1/models/../../metrics"):
    out["path " + path] = call("POST", path, own, {})
out["get_models"] = call("GET", "/v1/models", own)
out["own_generation"] = call("POST", "/v1/chat/completions", own, chat)
reach = {}
for p in host_ports:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", p))
        reach[p] = "connected"
    except OSError as e:
        reach[p] = type(e).__name__
    finally:
        s.close()
out["host_ports"] = reach
print(json.dumps(out))
'''


async def probe_from_sandbox(provider, renderer, generate) -> tuple[dict, list[GatewaySession], list[GatewayServer]]:
    """Two episodes' gateways in two sandboxes of `provider`; PROBE run from the first: what it got, the
    sessions and the servers (closed)."""
    cfg = HarnessConfig(command="x")
    sessions, servers, keys, boxes = [], [], [], []
    # T1's own listeners on the host's loopback: a service port and the metrics endpoint.
    service = socket.create_server(("127.0.0.1", 0))
    metrics, _ = start_http_server(0, addr="127.0.0.1")
    host_ports = [service.getsockname()[1], metrics.server_port]
    try:
        for name in ("ep-a", "ep-b"):
            box = await provider.create(SandboxRequest())
            boxes.append(box)
            session = GatewaySession(name, generate, renderer, SamplingParams(max_tokens=4), cfg, 2048, 0)
            key = f"{name}-key-" + "k" * 32
            server = GatewayServer(session, key, "t1")
            await server.serve(await provider.listen_inside(box.id, cfg.port))
            sessions.append(session), servers.append(server), keys.append(key)
        # Nothing on the host's own loopback answers at the gateway's port.
        with socket.socket() as s:
            s.settimeout(3)
            host_side = s.connect_ex(("127.0.0.1", cfg.port))
        shell = await boxes[0].open_shell()
        await shell.write_file("/tmp/probe.py", PROBE.encode())
        res = await shell.run(f"python3 /tmp/probe.py {cfg.port} {keys[0]} {keys[1]} "
                              f"{','.join(map(str, host_ports))}", 200)
        await shell.close()
        out = json.loads(res.output.strip().splitlines()[-1])
        out["host_side"] = host_side
    finally:
        service.close()
        metrics.shutdown()
        for server in servers:
            await server.close()
        for box in boxes:
            await provider.destroy(box)
    return out, sessions, servers


def assert_only_own_generation(out: dict, sessions: list[GatewaySession], servers: list[GatewayServer]) -> None:
    assert out["no_key"] == out["wrong_key"] == out["other_episode_key"] == out["other_key_anthropic"] == 401, out
    assert all(code == 404 for k, code in out.items() if k.startswith("path ")), out
    assert out["get_models"] == 200 and out["own_generation"] == 200
    assert all(v != "connected" for v in out["host_ports"].values()), out["host_ports"]
    assert out["host_side"] != 0, "the gateway's port answers on the host's loopback"
    # Only A's own call was generated, and only in A's session; B's saw nothing.
    assert sessions[0].calls == 1 and sessions[1].calls == 0
    assert servers[0].refused == {"key": 4, "path": 8}


async def test_hostile_harness_reaches_only_its_own_generation(tmp_path: Path, provider, renderers, backend) -> None:
    async def generate(req: GenerateRequest) -> GenerateResult:
        return await collect(backend.stream(req))

    assert_only_own_generation(*await probe_from_sandbox(provider, next(iter(renderers.values())), generate))
