"""Published bandwidth ceilings per interconnect, each row with its sources (data only).

Figures are GB/s in one direction (1 GB = 1e9 bytes, as nccl-tests and the smoke report
count them). `link_gbps` bounds one rank pair's point-to-point figure: NVLink per GPU, or a
GPU's share of the node's network; `node_gbps` bounds an all-reduce's bus bandwidth: NVLink
per GPU within one node, the node's whole network across nodes. Measured busbw can exceed a
network ceiling on two nodes (NCCL's tree and NVLS algorithms cross the network less than
the ring formula counts: NVIDIA/nccl-tests#22, #196), so a grade over 100 % is no error.

`typical` quotes published measurements to read a grade against; the ceiling is the line
rate. Sources were found with public search (issue 59): the NVIDIA and AWS figures from their
pages and docs, the measurements from nccl-tests and NCCL issue threads. Rows marked
"source pending" carry issue 59's figure without a public source found yet.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Ceiling:
    name: str  # what --fabric names
    fabric: str
    link_gbps: float
    node_gbps: float
    typical: str
    sources: tuple[str, ...]


NVLINK = {
    "nvlink3": Ceiling(
        "nvlink3",
        "NVLink 3 (A100 SXM, NVSwitch): 600 GB/s per GPU both ways",
        300.0,
        300.0,
        "8x A100 all-reduce busbw ~208-231 GB/s (1 GiB)",
        (
            "https://gist.github.com/shashankprasanna/10ebe6dc1ba1d8d93db17da4e2cc890e "
            "(AWS GPU instance table: p4d.24xlarge, NVLink gen 3 600 GB/s)",
            "https://github.com/NVIDIA/nccl/issues/527 (1x p4d: busbw 230.8 GB/s at 1 GiB)",
            "https://github.com/NVIDIA/nccl-tests/issues/178 (8x A100: busbw 208 GB/s)",
        ),
    ),
    "nvlink4": Ceiling(
        "nvlink4",
        "NVLink 4 (H100/H200 SXM, NVSwitch): 900 GB/s per GPU both ways",
        450.0,
        450.0,
        "8x H100 all-reduce busbw ~370 GB/s ring, ~480 GB/s NVLS; 8x H200 ~475 GB/s "
        "(H200: source pending)",
        (
            "https://www.nvidia.com/en-us/data-center/h200/ (fourth-generation NVLink 900 GB/s "
            "bidirectional per GPU; text seen in a mirror of the page, not fetched)",
            "https://github.com/NVIDIA/nccl-tests/issues/212 (sjeaugey: 450 GB/s line rate, "
            "~370 GB/s effective ring busbw, ~480 GB/s with NVLS on 8 GPUs)",
            "https://astra-sim.github.io/astra-sim-docs/validation/hardware/gpu-validation-hgx-"
            "h100.html (HGX H100: each GPU 900 GB/s bidirectional over 4 NVSwitches)",
        ),
    ),
    "nvlink5": Ceiling(
        "nvlink5",
        "NVLink 5 (B200, NVSwitch): 1.8 TB/s per GPU both ways",
        900.0,
        900.0,
        "no published 8x B200 busbw found yet",
        ("https://glennklockwood.com/garden/processors/B200 (B200: 2x 900 GB/s NVLink 5)",),
    ),
}

_EFA_NOTE = "https://github.com/NVIDIA/nccl-tests/issues/22 (busbw above the network on 2 nodes)"
# Across nodes: the instance's EFA total (Gbps / 8 = GB/s) bounds all-reduce busbw; one GPU
# pair's point-to-point gets the GPU's share (total / 8 GPUs).
EFA = {
    "p4d.24xlarge": Ceiling(
        "efa-p4d",
        "EFA 4x 100 Gbps (p4d/p4de, 8x A100)",
        50.0 / 8,
        50.0,
        "2x p4d all-reduce busbw ~57 GB/s at 1 GiB",
        (
            "https://github.com/aws-samples/aws-efa-eks (p4d: GPUDirect RDMA with 4x100 Gbps EFA)",
            "https://github.com/NVIDIA/nccl/issues/527 (2x p4d: busbw 57.2 GB/s at 1 GiB)",
            _EFA_NOTE,
        ),
    ),
    "p5.48xlarge": Ceiling(
        "efa-p5",
        "EFA 3200 Gbps (p5/p5e: 32 EFA interfaces, 8x H100/H200)",
        400.0 / 8,
        400.0,
        "2x p5 all-reduce busbw ~289 GB/s at 128 MB, ~487 GB/s at 16 GB (source pending)",
        (
            "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html "
            "(p5: 32 EFA network interfaces, configured for maximum bandwidth)",
            "https://agenticdaily.ai/articles/aws-maps-open-source-ml-stack-to-its-accelerated-"
            "instances (Hugging Face's AWS guide, summarised: p5.48xlarge 400 GB/s EFA)",
            "https://vuink.com/post/yr-d-ddha-d-dpu/en/blog/2024/12/25/libfabric-efa-0-intro "
            "(a mirror of a libfabric/EFA blog post: p5's 3200 Gbps between servers, 97 % of it "
            "reached)",
            "https://github.com/crazyguitar/aws-gpu-communication-benchmark (p5.48xlarge: four "
            "EFA interfaces per GPU, i.e. 400 Gbps a GPU)",
            _EFA_NOTE,
        ),
    ),
    "p5en.48xlarge": Ceiling(
        "efa-p5en",
        "EFA 3200 Gbps (p5en: 16 EFAv3 interfaces, 8x H200)",
        400.0 / 8,
        400.0,
        "as p5 (source pending)",
        (
            "https://github.com/meta-pytorch/torchx/pull/995 (p5en.48xlarge: 8 GPUs, 16 EFA "
            "devices)",
            "issue 59: 3200 Gbps total (AWS P5 page, not fetched: source pending)",
            _EFA_NOTE,
        ),
    ),
}
EFA["p4de.24xlarge"] = EFA["p4d.24xlarge"]
EFA["p5e.48xlarge"] = EFA["p5.48xlarge"]

# InfiniBand per HCA port, one HCA per GPU (the HGX layout): chosen only with --fabric, as
# the recorded facts do not hold the link rate. node_gbps is per GPU here; grading
# multiplies it by the node's GPUs.
IB = {
    "ib-hdr": Ceiling(
        "ib-hdr",
        "InfiniBand HDR 200 Gbps per GPU",
        25.0,
        25.0,
        "3 nodes 8x A100 with 4 HDR: ~85-96 GB/s busbw of a 100 GB/s line",
        ("https://github.com/NVIDIA/nccl-tests/issues/119 (200G x 4 / 8 = 100 GB/s theoretical)",),
    ),
    "ib-ndr": Ceiling(
        "ib-ndr",
        "InfiniBand NDR 400 Gbps per GPU",
        50.0,
        50.0,
        "no published figure recorded here",
        ("https://github.com/NVIDIA/nccl-tests/issues/389 (2x 8x B200 with ConnectX-7 NDR 400)",),
    ),
}

TCP = Ceiling(
    "tcp",
    "raw TCP between the nodes, measured by the smoke job",
    0.0,
    0.0,
    "gloo/NCCL sockets over the same path",
    ("measured: jobs/smoke_device.py tcp_pass, plain sockets, best of 3 messages",),
)


def by_name() -> dict[str, Ceiling]:
    """Every row by the name --fabric takes."""
    rows = {c.name: c for c in (*NVLINK.values(), *EFA.values(), *IB.values(), TCP)}
    return dict(sorted(rows.items()))


def nvlink_for(model: str) -> Ceiling | None:
    """The NVLink row of a GPU model name as nvidia-smi prints it; None for PCIe and NVL
    cards (bridged pairs, no NVSwitch) and models not in the table."""
    low = model.lower()
    if "pcie" in low or low.rstrip().endswith(" nvl"):
        return None
    for key, row in (("a100", "nvlink3"), ("h100", "nvlink4"), ("h200", "nvlink4")):
        if key in low:
            return NVLINK[row]
    if "b200" in low:
        return NVLINK["nvlink5"]
    return None
