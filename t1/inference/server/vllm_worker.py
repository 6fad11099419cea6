"""A vLLM worker extension (engine arg `worker_extension_cls`) that T1's vLLM backend calls after a reload.

vLLM 0.32's in-place `reload_weights` leaves the CPU fused-MoE kernel's expert weights unpacked:
on a weight update `_setup_kernel` skips the experts' `process_weights_after_loading`, which on CPU
prepacks w13/w2 into the grouped-gemm layout, so the kernel reads fresh weights in the wrong layout
(outputs then differ from a fresh engine's). `t1_refresh_moe_kernels` reruns that step. GPU
kernels copy into their existing storage and are left alone. This module imports no vLLM itself.
"""

from __future__ import annotations

from typing import Any

WORKER_EXTENSION = "t1.inference.server.vllm_worker.T1WorkerExtension"


class T1WorkerExtension:
    """Methods mixed into vLLM's worker; called with `collective_rpc("<name>")`."""

    model_runner: Any

    def t1_refresh_moe_kernels(self) -> int:
        """Re-prepack the CPU MoE experts of every MoE layer; returns how many layers were refreshed."""
        refreshed = 0
        for module in self.model_runner.get_model().modules():
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if experts is not None and type(experts).__module__.endswith(".cpu_moe"):
                experts.process_weights_after_loading(module)
                refreshed += 1
        return refreshed
