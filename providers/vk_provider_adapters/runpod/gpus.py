"""RunPod's GPU type ids: which ones create accepts, and their canonical model names.

``CREATE_GPU_TYPE_IDS`` is the enum of ``PodCreateInput.gpuTypeIds`` in RunPod's REST v1
document (``tests/fixtures/provider-apis/runpod-rest-v1-openapi.json``; a test keeps the two
equal): the GraphQL offers query lists more types than create accepts, and an offer create
would refuse is worse than none (``vk_provider_adapters.runpod.offers`` drops them).

Invariants: pure; every input gets a name (unknown types a normalised one), never an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

CREATE_GPU_TYPE_IDS: Final = frozenset(
    {
        "AMD Instinct MI300X OAM",
        "NVIDIA  A30",
        "NVIDIA  RTX A4500",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A30",
        "NVIDIA A40",
        "NVIDIA A5000 Ada",
        "NVIDIA B200",
        "NVIDIA GeForce RTX 3070",
        "NVIDIA GeForce RTX 3080",
        "NVIDIA GeForce RTX 3080 Ti",
        "NVIDIA GeForce RTX 3080TI",
        "NVIDIA GeForce RTX 3090",
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA GeForce RTX 4070 Ti",
        "NVIDIA GeForce RTX 4080",
        "NVIDIA GeForce RTX 4080 SUPER",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA GeForce RTX 5080",
        "NVIDIA GeForce RTX 5090",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 NVL",
        "NVIDIA H100 PCIe",
        "NVIDIA H200",
        "NVIDIA H200 NVL",
        "NVIDIA L4",
        "NVIDIA L40",
        "NVIDIA L40S",
        "NVIDIA RTX 2000 Ada Generation",
        "NVIDIA RTX 4000 Ada Generation",
        "NVIDIA RTX 4000 SFF Ada Generation",
        "NVIDIA RTX 5000 Ada Generation",
        "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA RTX A2000",
        "NVIDIA RTX A30",
        "NVIDIA RTX A4000",
        "NVIDIA RTX A4500",
        "NVIDIA RTX A5000",
        "NVIDIA RTX A6000",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "Tesla T4",
        "Tesla V100-FHHL-16GB",
        "Tesla V100-PCIE-16GB",
        "Tesla V100-PCIE-32GB",
        "Tesla V100-SXM2-16GB",
        "Tesla V100-SXM2-32GB",
    }
)

_KNOWN_GPUS: Mapping[str, str] = {
    "nvidia h100 80gb hbm3": "H100-SXM",
    "nvidia h100 pcie": "H100-PCIE",
    "nvidia h100 nvl": "H100-NVL",
    "nvidia h200": "H200-SXM",
    "nvidia h200 nvl": "H200-NVL",
    "nvidia b200": "B200",
    "nvidia a100 80gb pcie": "A100-80GB",
    "nvidia a100-sxm4-80gb": "A100-80GB",
    "nvidia l40s": "L40S",
    "nvidia l40": "L40",
    "nvidia l4": "L4",
    "nvidia a40": "A40",
    "nvidia a30": "A30",
    "nvidia rtx a30": "A30",
    "nvidia rtx a6000": "RTXA6000",
    "nvidia rtx a5000": "RTXA5000",
    "nvidia rtx a4500": "RTXA4500",
    "nvidia rtx a4000": "RTXA4000",
    "nvidia rtx a2000": "RTXA2000",
    "nvidia rtx 6000 ada generation": "RTX6000-ADA",
    "nvidia rtx 5000 ada generation": "RTX5000-ADA",
    "nvidia a5000 ada": "RTX5000-ADA",
    "nvidia rtx 4000 ada generation": "RTX4000-ADA",
    "nvidia rtx 4000 sff ada generation": "RTX4000-ADA-SFF",
    "nvidia rtx 2000 ada generation": "RTX2000-ADA",
    "nvidia rtx pro 6000 blackwell server edition": "RTXPRO6000-SERVER",
    "nvidia rtx pro 6000 blackwell workstation edition": "RTXPRO6000-WS",
    "nvidia rtx pro 6000 blackwell max-q workstation edition": "RTXPRO6000-WS-MAXQ",
    "nvidia geforce rtx 5090": "RTX5090",
    "nvidia geforce rtx 5080": "RTX5080",
    "nvidia geforce rtx 4090": "RTX4090",
    "nvidia geforce rtx 4080 super": "RTX4080-SUPER",
    "nvidia geforce rtx 4080": "RTX4080",
    "nvidia geforce rtx 4070 ti": "RTX4070TI",
    "nvidia geforce rtx 3090 ti": "RTX3090TI",
    "nvidia geforce rtx 3090": "RTX3090",
    "nvidia geforce rtx 3080 ti": "RTX3080TI",
    "nvidia geforce rtx 3080ti": "RTX3080TI",
    "nvidia geforce rtx 3080": "RTX3080",
    "nvidia geforce rtx 3070": "RTX3070",
    "tesla v100-pcie-16gb": "V100-16GB-PCIE",
    "tesla v100-pcie-32gb": "V100-32GB-PCIE",
    "tesla v100-sxm2-16gb": "V100-16GB-SXM2",
    "tesla v100-sxm2-32gb": "V100-32GB-SXM2",
    "tesla v100-fhhl-16gb": "V100-16GB-FHHL",
    "tesla t4": "T4",
    "amd instinct mi300x oam": "MI300X",
}
_VENDOR_WORDS = frozenset({"NVIDIA", "GEFORCE", "TESLA", "AMD", "INSTINCT"})


def canonical_gpu_name(runpod_name: str) -> str:
    """RunPod's GPU type id (or display name) as a canonical model name.

    Known types map to names shared by every adapter (``H100-SXM``, ``A100-80GB``, ``RTX4090``:
    the family first, the variant after a dash, so ``H100`` matches every H100). Unknown ones
    keep a normalised form — vendor words dropped, upper case, words joined by dashes, ``RTX``
    glued to its number — so a new GPU is offered under a stable name instead of failing.
    """
    key = " ".join(runpod_name.split()).lower()
    known = _KNOWN_GPUS.get(key)
    if known is not None:
        return known
    words = [w for w in re.split(r"[\s_]+", runpod_name.upper()) if w and w not in _VENDOR_WORDS]
    merged: list[str] = []
    for word in words:
        if merged and merged[-1] == "RTX":
            merged[-1] = "RTX" + word
        else:
            merged.append(word)
    name = re.sub(r"[^A-Z0-9.-]", "", "-".join(merged)).strip("-")
    return name or "UNKNOWN"
