"""A word-level LSTM language model in the style of pytorch/examples' word_language_model.

No ``torch.optim``: the update is the manual ``p.data.add_(p.grad, alpha=-lr)``, the loss is read with
``loss.item()`` every step, and the model is saved whole with ``torch.save(model, f)`` after each epoch.
The corpus is made up (Zipf-distributed token ids), so nothing is downloaded.
`pitstop profile -- python examples/word_lm.py` delimits its steps by ``backward()`` and finds the
per-step ``loss.item()``.

    python examples/word_lm.py [--epochs 40] [--batches-per-epoch 12] [--save model.pt]
"""

import argparse
import math
import os
import tempfile
import time

import torch
from torch import nn


class RNNModel(nn.Module):
    """Encoder, LSTM, decoder (tied weights optional), as in the public example."""

    def __init__(
        self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.2, tie: bool = True
    ):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie and nhid == ninp:
            self.decoder.weight = self.encoder.weight
        self.nhid, self.nlayers = nhid, nlayers
        self.encoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.zero_()

    def forward(self, input: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return (
            weight.new_zeros(self.nlayers, bsz, self.nhid),
            weight.new_zeros(self.nlayers, bsz, self.nhid),
        )


def made_up_corpus(n_tokens: int, ntoken: int, seed: int = 0) -> torch.Tensor:
    """Token ids with a Zipf-like frequency, like words in text."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, ntoken + 1, dtype=torch.float64)
    return torch.multinomial(1.0 / ranks, n_tokens, replacement=True, generator=g)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ntoken", type=int, default=2000)
    ap.add_argument("--emsize", type=int, default=128)
    ap.add_argument("--nhid", type=int, default=128)
    ap.add_argument("--nlayers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--bptt", type=int, default=20)
    ap.add_argument("--batches-per-epoch", type=int, default=12)
    ap.add_argument("--log-interval", type=int, default=5)
    ap.add_argument("--save", default=os.path.join(tempfile.gettempdir(), f"word_lm_{os.getpid()}.pt"))
    args = ap.parse_args()
    torch.manual_seed(1111)

    n_train = args.batches_per_epoch * args.bptt * args.batch_size + args.batch_size
    train_data = batchify(made_up_corpus(n_train, args.ntoken, seed=0), args.batch_size)
    val_data = batchify(made_up_corpus(n_train // 4, args.ntoken, seed=1), 10)
    model = RNNModel(args.ntoken, args.emsize, args.nhid, args.nlayers)
    criterion = nn.NLLLoss()

    def evaluate(data_source: torch.Tensor) -> float:
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(10)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, args.bptt):
                data, targets = get_batch(data_source, i, args.bptt)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    def train(epoch: int, lr: float) -> None:
        model.train()
        total_loss = 0.0
        start_time = time.time()
        hidden = model.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            total_loss += loss.item()
            if batch % args.log_interval == 0 and batch > 0:
                cur_loss = total_loss / args.log_interval
                ms = (time.time() - start_time) * 1000 / args.log_interval
                print(
                    f"| epoch {epoch:3d} | {batch:5d} batches | lr {lr:5.2f} | ms/batch {ms:6.2f} | "
                    f"loss {cur_loss:5.2f} | ppl {math.exp(min(cur_loss, 50)):8.2f}"
                )
                total_loss = 0.0
                start_time = time.time()

    lr = args.lr
    best_val_loss = None
    for epoch in range(1, args.epochs + 1):
        train(epoch, lr)
        val_loss = evaluate(val_data)
        print(
            f"| end of epoch {epoch:3d} | valid loss {val_loss:5.2f} | valid ppl {math.exp(min(val_loss, 50)):8.2f}"
        )
        if not best_val_loss or val_loss < best_val_loss:
            with open(args.save, "wb") as f:
                torch.save(model, f)
            best_val_loss = val_loss
        else:
            lr /= 4.0
    with open(args.save, "rb") as f:
        model = torch.load(f, weights_only=False)
    print(f"| end of training | test loss {evaluate(val_data):5.2f}")


if __name__ == "__main__":
    main()
