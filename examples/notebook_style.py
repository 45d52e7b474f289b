"""Notebook-style: a training function profiled in the running process with ``pitstop.Profiler``.

The cells of a notebook, in order: build data and model (a JPEG ImageFolder decoded and augmented with
``num_workers=0``: the planted problem), profile ``train()`` in a ``with`` block, read the report. The top
finding should be ``dataloader.workers``; training runs all its steps, only the first ones are measured.

    python examples/notebook_style.py [--images 96] [--steps 60] [--json report.json]
"""

import argparse
import tempfile
from pathlib import Path

import torch
from slow_loader import make_image_folder
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import pitstop

ap = argparse.ArgumentParser()
ap.add_argument("--images", type=int, default=96)
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--json", help="also write the report here")
args = ap.parse_args()

# --- cell 1: data and model
tmp = tempfile.TemporaryDirectory(prefix="notebook-style-")
make_image_folder(Path(tmp.name), args.images)
tf = transforms.Compose(
    [
        transforms.RandomResizedCrop(128, scale=(0.5, 1.0)),
        transforms.ColorJitter(0.4, 0.4, 0.4, 0.1),
        transforms.GaussianBlur(7, sigma=(0.1, 2.0)),
        transforms.ToTensor(),
    ]
)
loader = DataLoader(datasets.ImageFolder(tmp.name, transform=tf), batch_size=16, shuffle=True, drop_last=True)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, stride=2, padding=1),
    nn.ReLU(),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(16, 4),
)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)


def train(steps: int) -> int:
    done = 0
    while done < steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done >= steps:
                break
    return done


# --- cell 2: profile the training function where it runs
# 12 measured steps: 4 blocks of 3 give the data wait's saving an interval (pitstop.profile.analyze.wait_confirm)
with pitstop.Profiler(steps=12, warmup=2) as prof:
    ran = train(args.steps)

# --- cell 3: the report (in Jupyter, `prof` alone shows the HTML report)
top = prof.ranked()[0]
print(f"trained {ran} steps; measured {prof.report().meta['measured_steps']}")
print(f"top finding: {top.id} at {top.location}: {top.title}")
if args.json:
    prof.to_json(args.json)
tmp.cleanup()
