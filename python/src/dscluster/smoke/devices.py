"""Slow devices: the per-device benchmark's figures judged against their peers' (pure).

Every rank timed a matmul and a copy at once (jobs/smoke_device.py); devices of the same
kind (the same model name) are compared per metric: one is slow when it is below the median
by more than `k` robust standard deviations (MAD x 1.4826) AND by more than `threshold` of
the median. The first rule keeps the normal spread of a busy machine quiet; the second keeps
a tight group (MAD near 0) from naming a device a few per cent behind.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import DsclusterError

DEFAULT_DEVICE_THRESHOLD = 0.2  # below the median by more than 20 %
DEFAULT_MAD_K = 3.0
MAD_TO_SIGMA = 1.4826  # MAD x this estimates a normal distribution's standard deviation
METRICS = {"matmul_tflops": ("matmul", "TFLOPS"), "copy_gbps": ("copy", "GB/s")}


@dataclasses.dataclass(frozen=True)
class SlowDevice:
    """One device below its peers in one metric."""

    host: str
    rank: int
    local_rank: int
    device: str
    metric: str  # a key of METRICS
    value: float
    median: float
    peers: int  # devices of this kind measured in this metric

    @property
    def message(self) -> str:
        what, unit = METRICS[self.metric]
        share = self.value / self.median if self.median else 0.0
        return (
            f"slow device: {self.host} rank {self.rank} (local {self.local_rank}, "
            f"{self.device}): {what} {self.value:.3g} {unit}, {share:.0%} of the median "
            f"{self.median:.3g} of {self.peers} devices"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "message": self.message}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def median_mad(values: Sequence[float]) -> tuple[float, float]:
    """(median, median absolute deviation) of a non-empty sequence."""
    median = statistics.median(values)
    return median, statistics.median(abs(v - median) for v in values)


def is_low(value: float, median: float, mad: float, *, threshold: float, k: float) -> bool:
    """Below the median by more than k robust standard deviations and by more than
    `threshold` of the median (exactly at either boundary is not low)."""
    return value < median - k * MAD_TO_SIGMA * mad and value < median * (1 - threshold)


def slow_devices(
    devices: Iterable[Mapping[str, Any]],
    *,
    threshold: float = DEFAULT_DEVICE_THRESHOLD,
    k: float = DEFAULT_MAD_K,
) -> list[SlowDevice]:
    """The devices below their peers (same `device` name) in any metric, in rank order.

    A figure that is missing, NaN or infinite is left out of its metric (and cannot be
    named). With one or two devices of a kind nothing is named: one has no peer, and of two
    each is one MAD from their median. Neither is anything named where half a kind is slow
    and half is not (the median falls between them): a cluster of two nodes can not say
    which one is slow, as for stragglers."""
    if not 0 < threshold < 1:
        raise DsclusterError(
            f"--device-bench-threshold {threshold:g} is not a fraction between 0 and 1; "
            "use 0.2 for 'more than 20 % below the median'"
        )
    kinds: dict[str, list[Mapping[str, Any]]] = {}
    for d in devices:
        kinds.setdefault(str(d.get("device", "?")), []).append(d)
    found: list[SlowDevice] = []
    for name, group in kinds.items():
        for metric in METRICS:
            measured = [(d, v) for d in group if (v := _finite(d.get(metric))) is not None]
            if len(measured) < 3:
                continue
            median, mad = median_mad([v for _, v in measured])
            found += [
                SlowDevice(
                    host=str(d.get("host", "?")),
                    rank=int(d.get("rank", -1)),
                    local_rank=int(d.get("local_rank", -1)),
                    device=name,
                    metric=metric,
                    value=v,
                    median=median,
                    peers=len(measured),
                )
                for d, v in measured
                if is_low(v, median, mad, threshold=threshold, k=k)
            ]
    return sorted(found, key=lambda s: (s.rank, s.metric))


def report_slow_devices(report: Mapping[str, Any], threshold: float) -> list[SlowDevice]:
    """What slow_devices names in the report's device_bench section (none without one)."""
    bench = report.get("device_bench") or {}
    return slow_devices(bench.get("devices") or [], threshold=threshold)
