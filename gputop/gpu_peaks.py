"""Dense peak throughput per GPU model and dtype: the denominator of MFU. One home, no imports.

Every number is a DENSE peak in TFLOP/s (10^12 FLOP/s) at the boost clock, from the source named
beside it. NVIDIA's datasheets print tensor-core peaks "with sparsity" (2:4 structured
sparsity, marked with an asterisk): those are halved here, never used as they stand — dividing
by a sparse peak halves the MFU (Lightning #21677). ``fp32`` is the non-tensor-core FP32 rate;
``tf32``, ``bf16``, ``fp16``, ``fp8`` are tensor-core rates with FP32 accumulation where the
part has two rates (GeForce Ada: half the FP16-accumulate rate, which PyTorch does not use).

A model is matched from the NVML / torch device name (e.g. "NVIDIA H200", "NVIDIA H100 80GB
HBM3", "NVIDIA A100-SXM4-80GB") by ``MATCH`` rules, first match wins; an unknown name gives n/a
with the reason, never a guess.
"""

from __future__ import annotations

import re

# model -> (dtype -> dense TFLOP/s, source). Sparse datasheet values are noted and halved.
PEAKS: dict[str, tuple[dict[str, float], str]] = {
    "H100 SXM": ({"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
                 "NVIDIA H100 Tensor Core GPU Architecture whitepaper (v1.02), table 'NVIDIA H100 SXM5' dense "
                 "columns, https://resources.nvidia.com/en-us-tensor-core; datasheet "
                 "https://www.nvidia.com/en-us/data-center/h100/ prints 989/1979/3958 TFLOPS with sparsity"),
    "H100 PCIe": ({"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
                  "NVIDIA H100 Tensor Core GPU Architecture whitepaper (v1.02), table 'NVIDIA H100 PCIe' "
                  "dense columns; datasheet https://www.nvidia.com/en-us/data-center/h100/ prints 756/1513/3026 "
                  "with sparsity"),
    "H100 NVL": ({"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
                 "https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL column: TF32 835, BF16 1671, FP8 3341 "
                 "TFLOPS with sparsity; halved)"),
    "H200 SXM": ({"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
                 "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM column: FP32 67, TF32 989, BF16 1979, "
                 "FP8 3958 TFLOPS, the tensor values with sparsity; halved)"),
    "H200 NVL": ({"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
                 "https://www.nvidia.com/en-us/data-center/h200/ (H200 NVL column: FP32 60, TF32 835, BF16 1671, "
                 "FP8 3341 TFLOPS, the tensor values with sparsity; halved)"),
    "GH200": ({"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
              "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (GPU: FP32 67, TF32 989, "
              "BF16 1979, FP8 3958 TFLOPS, the tensor values with sparsity; halved)"),
    "A100": ({"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
             "NVIDIA A100 datasheet https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (same for SXM and PCIe, 40 and 80 GB: FP32 19.5, "
             "TF32 156, BF16/FP16 312 dense; 312/624 with sparsity)"),
    "L40S": ({"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5, "fp8": 733.0},
             "https://www.nvidia.com/en-us/data-center/l40s/ (FP32 91.6; TF32 366, BF16 733, FP16 733, FP8 1466 "
             "TFLOPS with sparsity; halved)"),
    "L40": ({"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0, "fp8": 362.0},
            "NVIDIA L40 datasheet https://images.nvidia.com/content/Solutions/data-center/"
            "vgpu-L40-datasheet.pdf (FP32 90.5; TF32 181, BF16/FP16 362, FP8 724 with sparsity; halved)"),
    "L4": ({"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
           "https://www.nvidia.com/en-us/data-center/l4/ (FP32 30.3; TF32 120, BF16/FP16 242, FP8 485 TFLOPS "
           "with sparsity; halved)"),
    "A10": ({"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
            "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (FP32 31.2; TF32 62.5, BF16/FP16 125 "
            "dense; 125/250 with sparsity)"),
    "RTX 4090": ({"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
                 "NVIDIA Ada GPU Architecture whitepaper v2.02, appendix table 'GeForce RTX 4090': FP16/BF16 tensor "
                 "with FP32 accumulate 165.2 dense (330.4 sparse), TF32 82.6, FP8 with FP32 accumulate 330.3, "
                 "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    "V100 SXM2": ({"fp32": 15.7, "fp16": 125.0},
                  "NVIDIA V100 datasheet https://images.nvidia.com/content/technologies/volta/pdf/"
                  "volta-v100-datasheet-update-us-1165301-r5.pdf (SXM2: FP32 15.7, tensor 125; no sparsity on Volta)"),
    "T4": ({"fp32": 8.1, "fp16": 65.0},
           "NVIDIA T4 datasheet https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
           "t4-tensor-core-datasheet-951643.pdf (FP32 8.1, mixed FP16/FP32 65; no sparsity on Turing)"),
}

# (regex on the normalised name, model), first match wins: specific variants before the family.
MATCH: tuple[tuple[str, str], ...] = (
    (r"\bgh200\b", "GH200"),
    (r"\bh200\b.*\bnvl\b", "H200 NVL"),
    (r"\bh200\b", "H200 SXM"),
    (r"\bh100\b.*\bnvl\b", "H100 NVL"),
    (r"\bh100\b.*\bpcie\b", "H100 PCIe"),
    (r"\bh100\b", "H100 SXM"),                    # "H100 80GB HBM3", "H100 SXM5 80GB"
    (r"\ba100\b", "A100"),                        # "A100-SXM4-80GB", "A100-PCIE-40GB", "A100 80GB PCIe"
    (r"\bl40s\b", "L40S"),
    (r"\bl40\b", "L40"),
    (r"\bl4\b", "L4"),
    (r"\ba10\b", "A10"),                          # not A10G (AWS; no datasheet), not A100 (above)
    (r"\brtx 4090\b", "RTX 4090"),
    (r"\bv100\b.*\bsxm2\b", "V100 SXM2"),
    (r"\bt4\b", "T4"),
)

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


def normalise(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'a100 sxm4 80gb': lower case, vendor words dropped, - and _ as spaces."""
    n = re.sub(r"[-_/]+", " ", str(name).lower())
    n = re.sub(r"\b(nvidia|tesla|geforce|graphics device)\b", " ", n)
    return " ".join(n.split())


def model_of(name: str | None) -> str | None:
    """The table's model for a device name, or None."""
    if not name:
        return None
    n = normalise(name)
    for pat, model in MATCH:
        if re.search(pat, n):
            return model
    return None


def dense_peak(name: str | None, dtype: str | None) -> tuple[float | None, str]:
    """(dense TFLOP/s, source) for a device name and dtype class; (None, why) when not known."""
    if not name:
        return None, "GPU model not known (no NVML or CUDA device name)"
    model = model_of(name)
    if model is None:
        return None, f"{name!r} is not in gputop's table of dense peaks (gputop/gpu_peaks.py)"
    if not dtype:
        return None, "compute dtype not known"
    peaks, source = PEAKS[model]
    v = peaks.get(dtype)
    if v is None:
        return None, f"{model} has no published {dtype} peak"
    return v, f"{model} {dtype} dense {v:g} TFLOP/s: {source}"
