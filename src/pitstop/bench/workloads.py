"""Reference workloads for `pitstop bench`, with their data made on the fly.

vision:   torchvision ResNet on a generated JPEG ImageFolder on disk, so decoding and augmentation are real.
language: a GPT-style decoder (nanoGPT shape) on random tokens.
tabular:  an MLP on random features with learnable labels.
A user model (``--model pkg.mod:factory``) runs on the chosen workload's data.

Everything here is rebuildable from a ``WorkloadSpec`` so a subprocess (DDP, compile) builds the same thing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

WORKLOADS = ("vision", "language", "tabular")
SIZES = ("tiny", "small", "medium", "large")

# name -> size -> parameters. "tiny" exists for tests and smoke runs.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "vision": {
        "tiny": {"arch": "resnet18", "resolution": 32, "batch_size": 8, "images": 32, "classes": 4},
        "small": {"arch": "resnet18", "resolution": 64, "batch_size": 16, "images": 256, "classes": 10},
        "medium": {"arch": "resnet50", "resolution": 128, "batch_size": 32, "images": 512, "classes": 10},
        "large": {"arch": "resnet50", "resolution": 224, "batch_size": 64, "images": 1024, "classes": 100},
    },
    "language": {
        "tiny": {"layers": 2, "d_model": 64, "heads": 2, "seq_len": 32, "vocab": 256, "batch_size": 8},
        "small": {"layers": 4, "d_model": 256, "heads": 4, "seq_len": 128, "vocab": 4096, "batch_size": 16},
        "medium": {"layers": 8, "d_model": 512, "heads": 8, "seq_len": 256, "vocab": 16384, "batch_size": 16},
        "large": {
            "layers": 12,
            "d_model": 768,
            "heads": 12,
            "seq_len": 512,
            "vocab": 32768,
            "batch_size": 16,
        },
    },
    "tabular": {
        "tiny": {"features": 32, "hidden": 64, "blocks": 2, "classes": 4, "batch_size": 64},
        "small": {"features": 128, "hidden": 512, "blocks": 4, "classes": 10, "batch_size": 512},
        "medium": {"features": 256, "hidden": 2048, "blocks": 6, "classes": 10, "batch_size": 1024},
        "large": {"features": 512, "hidden": 4096, "blocks": 8, "classes": 100, "batch_size": 2048},
    },
}


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything needed to rebuild a workload in another process (JSON-able)."""

    name: str
    size: str = "small"
    model: str | None = None  # user factory 'pkg.mod:attr' returning an nn.Module
    data_dir: str | None = None  # vision: where the JPEG folder lives (made once by the parent)
    batch_size: int | None = None  # overrides the preset

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Workload:
    spec: WorkloadSpec
    params: dict[str, Any]
    batch_size: int
    sample_unit: str  # what one sample is: image, sequence, row
    image_input: bool  # 4-D NCHW input: channels_last applies

    def describe(self) -> str:
        p = ", ".join(f"{k}={v}" for k, v in self.params.items())
        model = self.spec.model or self.params.get("arch", self.spec.name)
        return f"{self.spec.name}/{self.spec.size}: {model} ({p}), batch {self.batch_size}"

    # -- model ---------------------------------------------------------------------------------
    def make_model(self) -> nn.Module:
        if self.spec.model:
            from pitstop.factory import load_object

            obj = load_object(self.spec.model)
            model = obj() if callable(obj) and not isinstance(obj, nn.Module) else obj
            if not isinstance(model, nn.Module):
                raise TypeError(f"{self.spec.model} returned {type(model).__name__}, not an nn.Module")
            return model
        p = self.params
        if self.spec.name == "vision":
            import torchvision

            return getattr(torchvision.models, p["arch"])(num_classes=p["classes"])
        if self.spec.name == "language":
            return GPT(p["vocab"], p["seq_len"], p["layers"], p["d_model"], p["heads"])
        return MLP(p["features"], p["hidden"], p["blocks"], p["classes"])

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if output.dim() == 3:  # language model logits (B, T, V)
            return F.cross_entropy(output.flatten(0, 1).float(), target.flatten())
        return F.cross_entropy(output.float(), target)

    # -- data ----------------------------------------------------------------------------------
    def make_dataset(self, train_transform: bool = True) -> torch.utils.data.Dataset:
        p = self.params
        if self.spec.name == "vision":
            import torchvision
            from torchvision import transforms as T

            if not self.spec.data_dir:
                raise ValueError("vision workload needs data_dir (call make_image_folder first)")
            tf = T.Compose(
                [
                    T.RandomResizedCrop(p["resolution"], scale=(0.5, 1.0), antialias=True),
                    T.RandomHorizontalFlip(),
                    T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                ]
            )
            return torchvision.datasets.ImageFolder(self.spec.data_dir, transform=tf)
        if self.spec.name == "language":
            return RandomTokens(4096 if self.spec.size != "tiny" else 256, p["seq_len"], p["vocab"])
        return TeacherRows(8192 if self.spec.size != "tiny" else 512, p["features"], p["classes"])

    def example_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch straight from the dataset (for FLOP counting and memory probes)."""
        ds = self.make_dataset()
        items = [ds[i % len(ds)] for i in range(self.batch_size)]
        return torch.utils.data.default_collate(items)


def build_workload(spec: WorkloadSpec) -> Workload:
    if spec.name not in PRESETS:
        raise ValueError(f"unknown workload {spec.name!r}; choose from {', '.join(WORKLOADS)}")
    if spec.size not in PRESETS[spec.name]:
        raise ValueError(f"unknown size {spec.size!r}; choose from {', '.join(SIZES)}")
    params = dict(PRESETS[spec.name][spec.size])
    batch = spec.batch_size or params.pop("batch_size")
    params.pop("batch_size", None)
    unit = {"vision": "image", "language": "sequence", "tabular": "row"}[spec.name]
    return Workload(spec, params, batch, unit, image_input=spec.name == "vision")


def make_image_folder(
    root: str | os.PathLike[str], images: int, classes: int, side: int, seed: int = 0
) -> Path:
    """Write ``images`` random-texture JPEGs into ``root/class_k/`` (an ImageFolder). Idempotent."""
    import numpy as np
    from PIL import Image

    root = Path(root)
    marker = root / ".complete"
    if marker.exists():
        return root
    rng = np.random.default_rng(seed)
    for i in range(images):
        d = root / f"class_{i % classes:03d}"
        d.mkdir(parents=True, exist_ok=True)
        # Smooth random texture (low-res noise upsampled) so JPEG sizes look like photos', not pure noise.
        low = rng.integers(0, 256, size=(side // 8 + 1, side // 8 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(low).resize((side, side), Image.BILINEAR)
        img.save(d / f"{i:05d}.jpg", quality=90)
    marker.touch()
    return root


def image_side(workload: Workload) -> int:
    """Stored JPEG side: larger than the crop so RandomResizedCrop really resizes."""
    return math.ceil(workload.params["resolution"] * 1.25)


# -- datasets (module level so DataLoader workers can pickle them) ----------------------------------
class RandomTokens(torch.utils.data.Dataset):
    """Random token sequences; target is the input shifted by one (language-model shape)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[i]
        return row[:-1], row[1:]


class TeacherRows(torch.utils.data.Dataset):
    """Random features labelled by a fixed random linear teacher: learnable, so loss really falls."""

    def __init__(self, n: int, features: int, classes: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        teacher = torch.randn(features, classes, generator=g)
        self.y = (self.x @ teacher).argmax(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


# -- models ---------------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm transformer block (nanoGPT shape) with causal scaled-dot-product attention."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, layers: int, d: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as in GPT-2

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


class ResidualMLPBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.blocks = nn.Sequential(*[ResidualMLPBlock(hidden) for _ in range(blocks)])
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


def repeated_blocks(model: nn.Module) -> list[str]:
    """Qualified names of the model's repeated blocks: the elements of Sequential/ModuleList containers
    whose elements all share one type and have parameters (ResNet stages' blocks, transformer layers).
    These are where activation checkpointing goes. Outermost containers win."""
    found: list[str] = []

    def visit(m: nn.Module, prefix: str) -> None:
        for name, child in m.named_children():
            qual = f"{prefix}{name}"
            kids = list(child.children()) if isinstance(child, nn.Sequential | nn.ModuleList) else []
            if (
                len(kids) >= 2
                and len({type(k) for k in kids}) == 1
                and any(True for _ in kids[0].parameters())
            ):
                found.extend(f"{qual}.{i}" for i in range(len(kids)))
            else:
                visit(child, qual + ".")

    visit(model, "")
    return found


ModelFactory = Callable[[], nn.Module]
