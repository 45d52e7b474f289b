"""Planted problem: the input pipeline, in a Hugging Face Transformers ``Trainer`` run.

A tiny BERT-style classifier built from a config (no download; ``HF_HUB_OFFLINE=1`` is set) trained by
``transformers.Trainer`` on made-up sentences that the dataset tokenizes per item in Python, with the
Trainer's default ``dataloader_num_workers=0``. `pitstop profile -- python examples/hf_trainer.py`
should rank `dataloader.workers` first, with forward and backward where the Trainer runs them.

    python examples/hf_trainer.py [--max-steps 200] [--batch-size 16]
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

VOCAB, SEQ = 1000, 64


class Sentences(Dataset):
    """Made-up sentences, tokenized word by word in ``__getitem__`` (a Python tokenizer's job)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.texts = [
            " ".join(f"tok{int(v)}" for v in torch.randint(0, 5000, (400,), generator=g)) for _ in range(n)
        ]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = [hash(w) % (VOCAB - 2) + 2 for w in self.texts[i].split()]
        ids = sorted(ids, key=lambda v: (v * 2654435761) % 4096)[:SEQ]  # "normalisation" in Python
        return {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": torch.tensor(ids[0] % 2),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--records", type=int, default=512)
    args = ap.parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as out:
        targs = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch_size,
            max_steps=args.max_steps,
            learning_rate=1e-3,
            logging_steps=10_000,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        Trainer(model=model, args=targs, train_dataset=Sentences(args.records)).train()


if __name__ == "__main__":
    main()
