"""Where a benchmark's numbers were measured: the one `machine()` every baseline records."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil


def cpu_name() -> str:
    """The CPU model name, from /proc/cpuinfo where it exists."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict[str, object]:
    """CPU model, cores visible to this process, memory, the GPU of `device` (a torch device), OS, Python, host."""
    gpu = "none"
    if device.startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name()
    return {"cpu_model": cpu_name(), "cores": len(os.sched_getaffinity(0)),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "gpu": gpu, "os": platform.platform(),
            "python": platform.python_version(), "host": platform.node()}


def describe(m: dict[str, object]) -> str:
    """One line for a printed table."""
    gpu = f", GPU {m['gpu']}" if m.get("gpu") not in (None, "none") else ""
    return f"{m['cpu_model']}, {m['cores']} cores, {m['memory_gb']} GB{gpu} ({m['host']})"
