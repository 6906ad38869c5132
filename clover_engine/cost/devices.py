"""Devices for the roofline: datasheet bandwidth and dense BF16 peak of GPUs, and this
machine measured.

Dense (no 2:4 sparsity) BF16 tensor-core peaks and memory bandwidth come from NVIDIA's
datasheets; each `Device` carries its source. ``this-machine`` is measured
(`measure_this_machine`): a streaming read of a large fp32 tensor and an fp32
``torch.matmul`` on the CPU. The roofline (Williams, Waterman & Patterson, "Roofline",
CACM 2009) bounds a kernel's time by ``max(bytes / bandwidth, flops / peak)``.

Wing: ``cost``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

@dataclass(frozen=True)
class Device:
    """A device for the roofline.

    Attributes:
        name: table key (``h800`` ...) or ``this-machine``.
        bandwidth_bytes_per_s: peak memory bandwidth, bytes per second.
        peak_flops: the peak the roofline uses, FLOP per second: the dense BF16
            tensor-core peak for a GPU of the table, the measured fp32 matmul rate
            for ``this-machine``.
        source: where the two numbers come from.
    """

    name: str
    bandwidth_bytes_per_s: float
    peak_flops: float
    source: str


DEFAULT_DEVICE = "h800"

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "h800", 3.35e12, 989.4e12,
            "NVIDIA H800 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s; BF16 tensor 1,979 TFLOPS with "
            "2:4 sparsity -> 989.4 dense (same SM configuration as H100 SXM)",
        ),
        Device(
            "h100-sxm", 3.35e12, 989.4e12,
            "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB HBM3, 3.35 TB/s; BF16 tensor "
            "1,979 TFLOPS with sparsity -> 989.4 dense",
        ),
        Device(
            "h200", 4.8e12, 989.4e12,
            "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e, 4.8 TB/s; BF16 tensor "
            "1,979 TFLOPS with sparsity -> 989.4 dense",
        ),
        Device(
            "a100-80gb", 2.039e12, 312e12,
            "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: HBM2e 2,039 GB/s; BF16 tensor "
            "312 TFLOPS dense (624 with sparsity)",
        ),
        Device(
            "b200", 8.0e12, 2.25e15,
            "NVIDIA B200 (Blackwell) specifications: HBM3e 8 TB/s (HGX B200 datasheet lists 7.7 TB/s "
            "for the 180 GB part); HGX B200 FP16/BF16 tensor 4.5 PFLOPS with sparsity -> 2.25 dense",
        ),
        Device(
            "rtx-4090", 1.008e12, 165.2e12,
            "NVIDIA Ada Lovelace architecture whitepaper, appendix A, GeForce RTX 4090: GDDR6X "
            "21 Gbps x 384-bit = 1,008 GB/s; peak BF16 tensor with FP32 accumulate 165.2 TFLOPS "
            "dense (330.4 sparse). BF16 always accumulates in FP32 (FP16 with FP16 accumulate is "
            "330.3 dense; 82.6 is the non-tensor FP32 rate)",
        ),
    )
}


def _default_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clover-explorer" / "this-machine.json"


def measure_this_machine(
    cache_path: str | Path | None = None,
    *,
    size_bytes: int = 64 * 2**20,
    matmul_n: int = 512,
    refresh: bool = False,
    budget_s: float = 0.8,
) -> Device:
    """Measure this machine's memory bandwidth and matmul throughput once, and cache them.

    Probe (about 1 s with the defaults, plus importing torch): bandwidth = the best over repeats of
    ``x.sum()`` (bytes read) and ``y.copy_(x)`` (read + write) on an fp32
    tensor of ``size_bytes`` (larger than a CPU's last-level cache); throughput =
    the best ``2 n^3 / t`` of an fp32 ``torch.matmul`` of two ``n x n``
    matrices. Each probe repeats for about ``budget_s / 2``. The result is
    written as JSON to ``cache_path`` (default
    ``$XDG_CACHE_HOME/clover-explorer/this-machine.json``, i.e. under
    ``~/.cache``) and reused while the probe settings and torch thread count
    match; ``refresh=True`` measures again.

    Returns:
        ``Device("this-machine", ...)`` -- its ``peak_flops`` holds the
        measured fp32 matmul rate (a CPU's usable matmul peak).
    """
    import torch  # local: the rest of the cost model needs no torch

    path = Path(cache_path) if cache_path is not None else _default_cache_path()
    settings = {"size_bytes": int(size_bytes), "matmul_n": int(matmul_n), "threads": torch.get_num_threads()}
    if not refresh and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("settings") == settings and data["bandwidth_bytes_per_s"] > 0 and data["peak_flops"] > 0:
                return Device("this-machine", float(data["bandwidth_bytes_per_s"]), float(data["peak_flops"]),
                              data["source"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable cache: measure again

    def best_time(fn: Any, seconds: float) -> float:
        fn()  # warm-up
        best, end = math.inf, time.perf_counter() + seconds
        reps = 0
        while reps < 5 or time.perf_counter() < end:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
            reps += 1
            if reps >= 500:
                break
        return max(best, 1e-9)

    n = max(int(size_bytes) // 4, 1024)
    x = torch.ones(n, dtype=torch.float32)
    y = torch.empty_like(x)
    t_sum = best_time(lambda: x.sum(), budget_s / 4)
    t_copy = best_time(lambda: y.copy_(x), budget_s / 4)
    bandwidth = max(4 * n / t_sum, 8 * n / t_copy)
    del x, y
    m = max(int(matmul_n), 16)
    a, bm = torch.randn(m, m), torch.randn(m, m)
    t_mm = best_time(lambda: torch.matmul(a, bm), budget_s / 2)
    peak = 2 * m**3 / t_mm
    source = (
        f"measured by clover_engine.cost.measure_this_machine on {platform.node() or 'this host'} "
        f"({platform.processor() or platform.machine()}, {settings['threads']} torch threads), "
        f"{time.strftime('%Y-%m-%d')}: best of x.sum()/y.copy_(x) over a {size_bytes / 2**20:.0f} MiB "
        f"fp32 tensor; fp32 torch.matmul {m}x{m}"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(
            {"bandwidth_bytes_per_s": bandwidth, "peak_flops": peak, "source": source, "settings": settings},
            indent=2,
        ))
    except OSError:
        pass  # a read-only home is not an error; the numbers are still returned
    return Device("this-machine", float(bandwidth), float(peak), source)


def get_device(device: "Device | str") -> Device:
    """A `Device` from the table by name (case-insensitive), ``this-machine``, or a `Device` as is.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(device, Device):
        return device
    name = str(device).strip().lower()
    if name in DEVICES:
        return DEVICES[name]
    if name in ("this-machine", "this", "cpu", "this-cpu"):
        return measure_this_machine()
    raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}, this-machine")


def roofline_time_s(bytes_read: float, flops: float, device: Device | str) -> float:
    """Roofline lower bound on the time of a kernel: ``max(bytes / BW, flops / peak)``.

    Williams, Waterman & Patterson, "Roofline: an insightful visual performance
    model for multicore architectures", CACM 52(4), 2009.
    """
    d = get_device(device)
    return max(bytes_read / d.bandwidth_bytes_per_s, flops / d.peak_flops)


def ridge_point(device: Device | str) -> float:
    """Arithmetic intensity (FLOP/byte) where the roofline turns: ``peak / BW``.

    Below it a forward is bandwidth bound (H800: 295 FLOP/byte; a 32-token
    Clover forward sits near 16).
    """
    d = get_device(device)
    return d.peak_flops / d.bandwidth_bytes_per_s
