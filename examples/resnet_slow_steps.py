"""Planted problem on slow steps: an ImageNet-shaped ResNet-18 trained in fp32, NCHW, about 1 s a step.

torchvision's ResNet-18 built from its config (no download), 224 px images, a batch sized so a step takes
about a second on 2 cores in fp32. On a CPU with AVX512_BF16/AMX, bf16 autocast roughly halves the step
and channels_last takes ~10% more; on one without, neither has a fast path. The steps are so slow that a
probe's fixed budget holds one round at most: pitstop scales the budgets with the step (capped) and must
still decide, so `pitstop profile -- python examples/resnet_slow_steps.py` should head the report with
`precision.amp` as a warning with an interval on an AMX CPU.

    python examples/resnet_slow_steps.py [--steps 20] [--batch-size 12] [--image-size 224]
"""

import argparse
import time

import torch
import torch.nn.functional as F
import torchvision


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=100)
    args = ap.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torchvision.models.resnet18(num_classes=args.classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    # a few fixed random batches, cycled: the data costs nothing next to the step
    batches = [
        (
            torch.randn(args.batch_size, 3, args.image_size, args.image_size),
            torch.randint(0, args.classes, (args.batch_size,)),
        )
        for _ in range(4)
    ]

    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        images, target = (t.to(device) for t in batches[step % len(batches)])
        loss = F.cross_entropy(model(images), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
