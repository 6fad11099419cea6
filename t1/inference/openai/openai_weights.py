"""Loading a weights folder on a vLLM OpenAI-compatible server, through its documented dev-mode endpoints.

vLLM 0.32 serves these at the server's root when started with VLLM_SERVER_DEV_MODE=1
(vllm/entrypoints/rl/online/api_router.py and serve/dev/):

    POST /pause?mode=wait                      finish in-flight requests, hold new ones
    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
    POST /collective_rpc {"method": "t1_refresh_moe_kernels"}     (T1's worker extension, CPU MoE)
    POST /reset_prefix_cache                   cached prefixes were computed by the old weights
    POST /update_weight_version {"new_version": "V"}
    POST /resume

The same steps T1's own vLLM backend runs in-process (t1.inference.server.vllm_backend). The HTTP transport
(t1.inference.openai.openai_transport) runs them once it has drained the endpoint, so every result carries
the version that sampled it. A server without the dev-mode endpoints answers 404: refused, with the
fix in the error.
"""

from __future__ import annotations

from typing import Any

import httpx

from t1.inference.openai.openai_wire import EndpointRefused


def server_root(base_url: str) -> str:
    """The server's root URL: the OpenAI base URL without its trailing /v1."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


async def _admin(client: httpx.AsyncClient, url: str, timeout_s: float, *, body: dict[str, Any] | None = None,
                 params: dict[str, str] | None = None) -> None:
    try:
        reply = await client.post(url, json=body, params=params, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EndpointRefused(f"{url}: {type(exc).__name__}: {exc}") from exc
    if reply.status_code == 404:
        raise EndpointRefused(f"{url}: 404: the server has no weight-update endpoints (start vLLM with "
                              "VLLM_SERVER_DEV_MODE=1, or set weight_updates: none and do not train against it)")
    if reply.status_code >= 400:
        raise EndpointRefused(f"{url}: {reply.status_code}: {reply.text[:300]}")


async def reload_weights(client: httpx.AsyncClient, base_url: str, path: str, version: int, timeout_s: float,
                         refresh_moe_kernels: bool) -> None:
    """Pause the server, reload `path`, drop its prefix cache, stamp `version`, and resume it (always)."""
    root = server_root(base_url)
    await _admin(client, root + "/pause", timeout_s, params={"mode": "wait"})
    try:
        await _admin(client, root + "/collective_rpc", timeout_s,
                     body={"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        if refresh_moe_kernels:
            await _admin(client, root + "/collective_rpc", timeout_s, body={"method": "t1_refresh_moe_kernels"})
        await _admin(client, root + "/reset_prefix_cache", timeout_s)
        await _admin(client, root + "/update_weight_version", timeout_s, body={"new_version": str(version)})
    finally:
        await _admin(client, root + "/resume", timeout_s)
