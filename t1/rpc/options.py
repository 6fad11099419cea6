"""Named gRPC channel and server options shared by every T1 service and client."""

from __future__ import annotations

MB = 1024 * 1024

# Trajectories with routing and long prompts are large; both directions get the same cap.
MAX_MESSAGE_BYTES = 256 * MB

# Keepalive: detect dead peers (a killed inference replica) within seconds, not minutes.
KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000

DEFAULT_DEADLINE_S = 30.0
STREAM_DEADLINE_S = 3600.0


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),  # retries are explicit in the callers (InferencePool, spool)
    ]


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.so_reuseport", 0),
    ]
