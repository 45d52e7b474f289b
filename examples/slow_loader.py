"""Planted problem: the input pipeline. JPEGs decoded and augmented in the training process.

A small image classifier trained on a JPEG ImageFolder (generated once into the temp folder) with
heavy augmentation and ``num_workers=0``: every step waits for the main process to decode and augment
its batch. `pitstop profile -- python examples/slow_loader.py` should rank `dataloader.workers` first.

    python examples/slow_loader.py [--steps 40] [--batch-size 16] [--images 192]
"""

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def make_image_folder(root: Path, n_images: int, classes: int = 4, size: int = 160) -> None:
    rng = np.random.default_rng(0)
    for i in range(n_images):
        d = root / f"class{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        # smooth noise: compresses like a photo, decodes in real time
        small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((size, size), Image.BICUBIC)
        img.save(d / f"{i}.jpg", quality=90)


def image_folder(n_images: int) -> Path:
    """The generated JPEGs, made once per image count and kept in the temp folder like a dataset on disk
    (so they are still there after the training loop, e.g. for pitstop's exit probes)."""
    root = Path(tempfile.gettempdir()) / f"pitstop-slow-loader-{n_images}"
    if not root.is_dir():
        fresh = Path(tempfile.mkdtemp(prefix="pitstop-slow-loader-"))
        make_image_folder(fresh, n_images)
        try:
            fresh.rename(root)  # atomic: a run started alongside sees all of it or none
        except OSError:  # another run made it first
            shutil.rmtree(fresh, ignore_errors=True)
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--images", type=int, default=192)
    ap.add_argument("--epochs", type=int, default=100)
    args = ap.parse_args()

    root = image_folder(args.images)
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(128, scale=(0.5, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.4, 0.4, 0.4, 0.1),
            transforms.GaussianBlur(7, sigma=(0.1, 2.0)),
            transforms.RandomRotation(10),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    dataset = datasets.ImageFolder(str(root), transform=train_tf)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0, drop_last=True)

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, len(dataset.classes)),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    loss_fn = nn.CrossEntropyLoss()

    step, t_start = 0, None
    for _epoch in range(args.epochs):
        for x, y in loader:
            if step == args.warmup:
                t_start = time.perf_counter()
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
        if step >= args.steps:
            break
    if t_start is not None:
        n = step - args.warmup
        dt = time.perf_counter() - t_start
        print(
            f"throughput: {n * args.batch_size / dt:.1f} samples/s over {n} steps ({1000 * dt / n:.2f} ms/step)"
        )


if __name__ == "__main__":
    main()
