"""A small GPT trained on random tokens in the style of karpathy/nanoGPT's train.py (CPU, no planted problem).

The model is nanoGPT's (token and position embeddings, pre-norm blocks of causal self-attention through
``scaled_dot_product_attention`` and a GELU MLP, tied output head); the loop is its loop without the
distributed and checkpoint parts: ``get_batch`` slices random windows of a token array (nanoGPT reads a
``np.memmap`` of the encoded corpus; here the tokens are random, so nothing is downloaded), AdamW with
weight decay on the 2-D parameters, warm-up then cosine learning rate set by hand each iteration,
gradient clipping, and an ``estimate_loss`` pass every ``--eval-interval`` iterations. The default shape
is the small CPU one from nanoGPT's README: 4 layers, 4 heads, 128 wide, batch 12, block 64.

    python examples/nanogpt_style.py [--iters 200] [--n-layer 4] [--n-embd 128] [--batch-size 12]
"""

import argparse
import math
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int, dropout: float):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as in nanoGPT
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", "--steps", type=int, default=200, dest="iters")
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--vocab", type=int, default=65)  # shakespeare_char's vocabulary size
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-interval", type=int, default=2000)
    ap.add_argument("--eval-iters", type=int, default=20)
    ap.add_argument("--log-interval", type=int, default=10)
    args = ap.parse_args()

    torch.manual_seed(1337)
    data = np.random.default_rng(0).integers(0, args.vocab, 200_000, dtype=np.uint16)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
        x = torch.stack([torch.from_numpy(data[i : i + args.block_size].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + args.block_size].astype(np.int64)) for i in ix]
        )
        return x, y

    model = GPT(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd, args.dropout)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99))
    warmup_iters, min_lr = max(1, args.iters // 20), args.lr / 10

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return args.lr * (it + 1) / (warmup_iters + 1)
        ratio = min(1.0, (it - warmup_iters) / max(1, args.iters - warmup_iters))
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - min_lr)

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            losses[k] = model(*get_batch())[1].item()
        model.train()
        return losses.mean().item()

    X, Y = get_batch()
    t0 = time.time()
    for it in range(args.iters):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        if it % args.eval_interval == 0 and it > 0:
            print(f"step {it}: val loss {estimate_loss():.4f}")
        _, loss = model(X, Y)
        X, Y = get_batch()  # prefetch the next batch, as nanoGPT does
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % args.log_interval == 0:
            t1 = time.time()
            print(
                f"iter {it}: loss {loss.item():.4f}, time {(t1 - t0) * 1000 / max(1, args.log_interval):.2f}ms"
            )
            t0 = t1


if __name__ == "__main__":
    main()
