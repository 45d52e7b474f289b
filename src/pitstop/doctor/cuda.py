"""CUDA stack probes: the torch build vs the hardware and driver, cuDNN, NCCL, TF32/cudnn.benchmark
hints, and environment variables that slow CUDA down."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

from pitstop.doctor.gpu import GpuInventory
from pitstop.doctor.torchinfo import TorchBuild
from pitstop.doctor.wheels import cpu_install_command, parse_version, pick_cuda_wheel
from pitstop.findings import Finding, Severity
from pitstop.host.precision import gpu_supports_bf16
from pitstop.recipes import recipe
from pitstop.units import GiB


def cuda_libs_bytes(paths: list[str] | None = None, limit_files: int = 20000) -> int | None:
    """Bytes of the pip-installed CUDA libraries (site-packages/nvidia*) a CPU-only machine carries for nothing."""
    import site
    import sys

    if paths is None:  # site-packages folders only: never the cwd a user's data may be in
        paths = [
            p for p in [*site.getsitepackages(), *sys.path] if p.endswith(("site-packages", "dist-packages"))
        ]
    roots = paths
    seen, total, files = set(), 0, 0
    for root in roots:
        base = Path(root)
        if not base.is_dir():
            continue
        for d in base.glob("nvidia*"):
            key = str(d.resolve())
            if key in seen or not d.is_dir():
                continue
            seen.add(key)
            for dirpath, _, names in os.walk(d):
                for n in names:
                    files += 1
                    if files > limit_files:
                        return total
                    with contextlib.suppress(OSError):
                        total += os.lstat(os.path.join(dirpath, n)).st_size
    return total if seen else None


def check_build(
    inv: GpuInventory, build: TorchBuild, cuda_libs: int | str | None = "measure"
) -> list[Finding]:
    """torch built for CUDA, ROCm or CPU vs whether this machine has an NVIDIA GPU; the install command."""
    has_gpu = bool(inv.gpus or inv.pci_gpus)
    kind = f"CUDA {build.cuda}" if build.cuda else (f"ROCm {build.hip}" if build.hip else "CPU only")
    data = {
        "torch": build.version,
        "build": kind,
        "cuda_runtime": build.cuda,
        "driver_cuda": inv.cuda_driver_version,
        "nvidia_gpu": has_gpu,
    }
    evidence = (
        f"torch {build.version} built for {kind}; NVIDIA GPU on this machine: {'yes' if has_gpu else 'no'}"
    )
    if has_gpu and not build.cuda:
        choice = pick_cuda_wheel(inv.cuda_driver_version, build.version, build.torchvision_version)
        data["wheel_tag"] = choice.tag
        return [
            Finding(
                "cuda.build",
                Severity.ERROR,
                f"NVIDIA GPU present but torch is not a CUDA build ({kind}): training will not use the GPU",
                evidence + f"; {choice.note}",
                data,
                fix=f"Install the CUDA build ({choice.tag})." if choice.tag else choice.note,
                fix_code=choice.command or None,
            )
        ]
    if build.cuda and not has_gpu:
        size = cuda_libs_bytes() if cuda_libs == "measure" else cuda_libs
        data["cuda_libs_bytes"] = size
        saved = (
            f" and frees the {size / GiB:.1f} GiB of CUDA libraries measured in site-packages" if size else ""
        )
        return [
            Finding(
                "cuda.build",
                Severity.INFO,
                "CUDA build of torch on a machine without an NVIDIA GPU",
                evidence
                + (f"; pip-installed CUDA libraries (nvidia*): {size / GiB:.2f} GiB" if size else ""),
                data,
                fix="Nothing runs slower because of this, but the CPU wheel is the matching build: it installs "
                f"faster{saved}.",
                fix_code=cpu_install_command(build.version, build.torchvision_version),
            )
        ]
    if build.cuda and has_gpu:
        return [Finding("cuda.build", Severity.PASS, f"torch built for CUDA {build.cuda}", evidence, data)]
    return [
        Finding("cuda.build", Severity.PASS, f"torch build ({kind}) matches this machine", evidence, data)
    ]


def check_driver_compat(inv: GpuInventory, build: TorchBuild) -> list[Finding]:
    """The CUDA runtime in the wheel must not be newer than what the driver supports."""
    if not build.cuda or not inv.nvml_ok or not inv.cuda_driver_version:
        return []
    rt, drv = parse_version(build.cuda), parse_version(inv.cuda_driver_version)
    if rt is None or drv is None:
        return []
    data = {"cuda_runtime": build.cuda, "driver_cuda": inv.cuda_driver_version, "driver": inv.driver_version}
    evidence = (
        f"torch wheel's CUDA runtime {build.cuda}; driver {inv.driver_version} supports up to CUDA "
        f"{inv.cuda_driver_version}"
    )
    if rt[:2] <= drv[:2]:
        return [
            Finding(
                "cuda.driver_compat",
                Severity.PASS,
                "Driver supports the build's CUDA runtime",
                evidence,
                data,
            )
        ]
    choice = pick_cuda_wheel(inv.cuda_driver_version, build.version, build.torchvision_version)
    same_major = rt[0] == drv[0]
    return [
        Finding(
            "cuda.driver_compat",
            Severity.WARN if same_major else Severity.ERROR,
            "Driver older than the build's CUDA runtime"
            + (
                " (minor-version compatibility: most things work, PTX JIT and new features may fail)"
                if same_major
                else ": CUDA will fail to initialise"
            ),
            evidence + f"; {choice.note}",
            {**data, "wheel_tag": choice.tag},
            fix=(
                f"Install the {choice.tag} build of this torch, or upgrade the driver."
                if choice.tag
                else choice.note
            ),
            fix_code=choice.command or None,
        )
    ]


def check_cuda_usable(inv: GpuInventory, build: TorchBuild, env: Mapping[str, str]) -> list[Finding]:
    """NVML sees GPUs but torch.cuda does not: CUDA_VISIBLE_DEVICES, a driver/runtime mismatch, or a broken install."""
    if not build.cuda or not inv.gpus:
        return []
    visible = env.get("CUDA_VISIBLE_DEVICES")
    data = {
        "cuda_available": build.cuda_available,
        "error": build.cuda_error,
        "CUDA_VISIBLE_DEVICES": visible,
    }
    evidence = (
        f"NVML sees {len(inv.gpus)} GPU(s); torch.cuda.is_available()={build.cuda_available}, "
        f"device_count={build.device_count}; CUDA_VISIBLE_DEVICES={visible!r}"
        + (f"; torch said: {build.cuda_error}" if build.cuda_error else "")
    )
    if build.cuda_available:
        if build.device_count < len(inv.gpus):
            return [
                Finding(
                    "cuda.visible",
                    Severity.INFO,
                    f"torch sees {build.device_count} of {len(inv.gpus)} GPUs",
                    evidence,
                    data,
                    fix="Intended if CUDA_VISIBLE_DEVICES restricts this job; otherwise unset it.",
                )
            ]
        return [Finding("cuda.visible", Severity.PASS, "torch sees every GPU", evidence, data)]
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        fix = "CUDA_VISIBLE_DEVICES hides every GPU: unset it or list the GPUs to use."
    else:
        fix = (
            "See cuda.driver_compat; then check that `python -c 'import torch; torch.zeros(1).cuda()'` works."
        )
    return [
        Finding(
            "cuda.visible",
            Severity.ERROR,
            "GPU present but torch.cuda is not available",
            evidence,
            data,
            fix=fix,
        )
    ]


_SM = re.compile(r"sm_(\d+?)(\d)(a?)")


def check_arch(build: TorchBuild) -> list[Finding]:
    """Each GPU's compute capability needs kernels (sm_XY) in the build, else 'no kernel image is available'."""
    if not build.devices or not build.arch_list:
        return []
    # sm_XY cubins run on the same major with an equal or higher minor; "sm_90a"-style ones only on 9.0.
    built = [
        (int(m.group(1)), int(m.group(2)), bool(m.group(3))) for m in map(_SM.fullmatch, build.arch_list) if m
    ]
    missing, rows = [], []
    for i, (name, cc) in enumerate(build.devices):
        ok = any(
            mj == cc[0] and (mn == cc[1] or (not specific and mn <= cc[1])) for mj, mn, specific in built
        )
        rows.append(
            f"GPU {i} {name} sm_{cc[0]}{cc[1]}: {'kernels in build' if ok else 'NO kernels in build'}"
        )
        if not ok:
            missing.append(i)
    data = {"arch_list": build.arch_list, "missing": missing}
    evidence = "; ".join(rows) + f"; build has {' '.join(build.arch_list)}"
    if missing:
        return [
            Finding(
                "cuda.arch",
                Severity.ERROR,
                "torch build has no kernels for this GPU's architecture",
                evidence,
                data,
                fix="Install a torch build that lists this sm_XY (newer release or a newer CUDA wheel).",
            )
        ]
    return [Finding("cuda.arch", Severity.PASS, "torch build has kernels for every GPU", evidence, data)]


def check_cudnn_nccl(inv: GpuInventory, build: TorchBuild) -> list[Finding]:
    if not build.cuda:
        return []
    has_gpu = bool(inv.gpus)
    out: list[Finding] = []
    v = build.cudnn_version
    ver = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v and v >= 10000 else str(v)
    if build.cudnn_available:
        out.append(
            Finding(
                "cuda.cudnn",
                Severity.PASS if has_gpu else Severity.INFO,
                f"cuDNN {ver} enabled" if has_gpu else f"cuDNN {ver} in the build (unused without a GPU)",
                f"torch.backends.cudnn.is_available()=True, version {v}",
                {"version": v, "version_text": ver},
            )
        )
    else:
        out.append(
            Finding(
                "cuda.cudnn",
                Severity.WARN if has_gpu else Severity.INFO,
                "cuDNN not available: convolutions and RNNs fall back to slow kernels",
                "torch.backends.cudnn.is_available()=False",
                {"version": None},
                fix="Reinstall torch from the official wheel (it bundles cuDNN via nvidia-cudnn-cu*).",
            )
        )
    n = build.nccl_version
    gpus = max(len(inv.gpus), build.device_count)
    if n:
        out.append(
            Finding(
                "cuda.nccl",
                Severity.PASS if has_gpu else Severity.INFO,
                f"NCCL {'.'.join(map(str, n))} in the build" + ("" if has_gpu else " (unused without a GPU)"),
                f"torch.cuda.nccl.version()={n}",
                {"version": list(n)},
            )
        )
    else:
        out.append(
            Finding(
                "cuda.nccl",
                Severity.WARN if gpus > 1 else Severity.INFO,
                "No NCCL: multi-GPU DistributedDataParallel cannot use the nccl backend",
                f"torch.cuda.nccl.version() failed; {gpus} GPU(s)",
                {"version": None},
                fix="Use the official Linux CUDA wheel, which ships NCCL (nvidia-nccl-cu*).",
            )
        )
    return out


def check_precision_hints(inv: GpuInventory, build: TorchBuild) -> list[Finding]:
    """TF32 and cudnn.benchmark are per-script settings: say what to put in the script for this GPU."""
    caps = [g.compute_capability for g in inv.gpus if g.compute_capability] or [c for _, c in build.devices]
    if not caps or not build.cuda:
        return []
    ampere = all(gpu_supports_bf16(c) for c in caps)
    out = []
    if ampere:
        out.append(
            Finding(
                "cuda.tf32",
                Severity.INFO,
                "TF32 tensor cores available: fp32 matmuls can run several times faster",
                f"compute capability {', '.join('.'.join(map(str, c)) for c in caps)} (>= 8.0); torch default "
                f"float32 matmul precision is {build.matmul_precision!r}",
                {"capabilities": caps, "matmul_precision": build.matmul_precision},
                fix="At the top of the training script (TF32 keeps a 10-bit mantissa, fine for training):",
                fix_code=recipe("tf32").snippet,
            )
        )
    out.append(
        Finding(
            "cuda.cudnn_benchmark",
            Severity.INFO,
            "cudnn.benchmark picks the fastest convolution algorithm for fixed input shapes",
            f"torch.backends.cudnn.benchmark={build.cudnn_benchmark} (default off)",
            {"cudnn_benchmark": build.cudnn_benchmark},
            fix="For conv nets with fixed input sizes set it in the script; leave it off if shapes vary every step.",
            fix_code=recipe("cudnn_benchmark").snippet,
        )
    )
    return out


# Environment variables that make CUDA training slower, left over from debugging.
SLOW_CUDA_ENV = {
    "CUDA_LAUNCH_BLOCKING": ("1", "every kernel launch waits for the GPU: no CPU/GPU overlap"),
    "PYTORCH_NO_CUDA_MEMORY_CACHING": (
        "1",
        "every allocation goes to cudaMalloc: the caching allocator is off",
    ),
    "TORCH_USE_CUDA_DSA": ("1", "device-side assertions add checks to kernels"),
    "CUDA_DEVICE_MAX_CONNECTIONS": ("1", "one hardware work queue: kernels on different streams serialise"),
    "NCCL_BLOCKING_WAIT": ("1", "collectives block the host thread"),
}


def check_env(env: Mapping[str, str]) -> list[Finding]:
    bad = {k: env[k] for k, (v, _) in SLOW_CUDA_ENV.items() if env.get(k, "").strip() == v}
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF")
    data = {"slow": bad, "PYTORCH_CUDA_ALLOC_CONF": alloc}
    checked = ", ".join(SLOW_CUDA_ENV)
    if bad:
        why = "; ".join(f"{k}={v}: {SLOW_CUDA_ENV[k][1]}" for k, v in bad.items())
        return [
            Finding(
                "cuda.env",
                Severity.WARN,
                "Debug environment variables slow CUDA down",
                why,
                data,
                fix="Unset them for training runs (they are for debugging).",
                fix_code="unset " + " ".join(bad),
            )
        ]
    return [
        Finding(
            "cuda.env",
            Severity.PASS,
            "No CUDA debug variables set",
            f"checked {checked}: none set to its slow value; PYTORCH_CUDA_ALLOC_CONF={alloc!r}",
            data,
        )
    ]
