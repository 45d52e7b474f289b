"""A small training script whose every output is deterministic: what it prints, writes and exits with.

    python faithful.py EXIT_CODE

Run plainly and under ``pitstop profile --full``, the two runs must match byte for byte
(tests/profile/test_profile_invisible.py).
"""

import atexit
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def at_exit() -> None:
    Path("atexit.txt").write_text("ran\n")
    print("atexit handler ran")


def main() -> int:
    atexit.register(at_exit)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TensorDataset(torch.randn(96, 6), torch.randint(0, 3, (96,)))
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    log = open("train.log", "w")  # noqa: SIM115 - a log kept open over the run, as scripts do
    for epoch in range(2):
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"epoch {epoch} step {i} loss {loss.item():.6f}")
            log.write(f"{epoch},{i},{loss.item():.8f}\n")
        print(f"epoch {epoch} done", file=sys.stderr)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"ckpt{epoch}.pt")
    log.close()
    torch.save(model, "model.pt")
    with torch.no_grad():
        print("final", [round(v, 6) for v in model(ds.tensors[0][:2]).flatten().tolist()])
    return int(sys.argv[1]) if len(sys.argv) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
