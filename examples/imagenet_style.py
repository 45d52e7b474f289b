"""An ImageNet-style training script (argparse, FakeData, torchvision model, meters, validation), written in
the style of pytorch/examples' imagenet/main.py, to show pitstop on a conventional script it knows nothing
about. Synthetic data only, small images by default so it runs on a laptop CPU.

    python examples/imagenet_style.py --dummy -a resnet18 -b 8 --image-size 64 -j 2
    pitstop profile --steps 10 -- python examples/imagenet_style.py --dummy -a resnet18
"""

import argparse
import time

import torch
import torchvision.models as models
import torchvision.transforms as transforms
from torch import nn
from torchvision import datasets

parser = argparse.ArgumentParser(description="ImageNet-style training on synthetic data")
parser.add_argument("--dummy", action="store_true", help="use fake data (the only data this example has)")
parser.add_argument(
    "-a", "--arch", default="resnet18", choices=sorted(n for n in models.list_models(module=models))
)
parser.add_argument("-j", "--workers", default=2, type=int, help="data loading workers")
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float)
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=10, type=int)
parser.add_argument("--image-size", default=64, type=int)
parser.add_argument("--train-images", default=2000, type=int)
parser.add_argument("--classes", default=100, type=int)


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [
            correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0)) for k in topk
        ]


def train(loader, model, criterion, optimizer, epoch, device, args):
    batch_time, data_time = AverageMeter("Time", ":6.3f"), AverageMeter("Data", ":6.3f")
    losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(loader):
        data_time.update(time.time() - end)
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        (acc1,) = accuracy(output, target, topk=(1,))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0:
            print(f"Epoch: [{epoch}][{i}/{len(loader)}]\t{batch_time}\t{data_time}\t{losses}\t{top1}")


def main():
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"=> creating model '{args.arch}' on {device}")
    model = models.__dict__[args.arch](num_classes=args.classes)
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model = model.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    size = (3, args.image_size, args.image_size)
    train_dataset = datasets.FakeData(args.train_images, size, args.classes, transforms.ToTensor())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True
    )
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, epoch, device, args)
        scheduler.step()


if __name__ == "__main__":
    main()
