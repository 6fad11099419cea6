"""Ask a running T1 server what it is: its health per service and its services by reflection.

Used by operators (and the tests) to check that a process serves what it should, the same way a
Kubernetes gRPC probe or grpcurl does.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from t1.rpc.client import make_sync_channel


def health_status(address: str, service: str = "", timeout_s: float = 10.0) -> str:
    """SERVING, NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN for `service` ("" = the whole server)."""
    with make_sync_channel(address) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def list_services(address: str, timeout_s: float = 10.0) -> list[str]:
    """Full names of the services the server lists through gRPC reflection."""
    with make_sync_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=timeout_s)
        for resp in responses:
            if resp.HasField("error_response"):
                raise grpc.RpcError(resp.error_response.error_message)
            return sorted(s.name for s in resp.list_services_response.service)
    return []
