"""Everything a script may do with its model, optimizer and loaders that instrumentation must not change.

Trains a few steps, then prints one line per check. Run it plainly and under ``pitstop profile --full``:
the printed lines must be identical (tests/profile/test_profile_invisible.py).
"""

import copy
import hashlib
import inspect
import io
import pickle
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Squares(Dataset):
    """Defined in the script: spawn/forkserver workers unpickle it from ``__main__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i * i)])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        return self.fc2(torch.relu(self.fc1(x)))


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def pickled_names(blob: bytes) -> list[str]:
    """The globals a pickle refers to (its bytes differ from run to run: storages are keyed by address)."""
    names: set[str] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            names.add(f"{module}.{name}")
            return super().find_class(module, name)

    Recorder(io.BytesIO(blob)).load()
    return sorted(names)


def saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def out(name: str, value: object) -> None:
    print(f"{name}: {value}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(ds, batch_size=8, shuffle=False)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i, (x, y) in enumerate(loader):
        # a direct call (no module hooks run for it) keeps the global hooks; `--calls-only`: after the
        # warm-up pitstop times the forwards from Net.__call__ instead
        logits = model(x) if i % 2 or "--calls-only" in sys.argv else model.forward(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = torch.randn(3, 4)
    ref = model(x)

    # the model: pickle, torch.save, deepcopy
    blob = pickle.dumps(model)
    out("pickle", pickled_names(blob))
    back = pickle.loads(blob)
    out("pickle_roundtrip", torch.equal(back(x), ref))
    out("pickled_hooks", [len(back._forward_pre_hooks), len(back._forward_hooks)])
    out("torch_save_model", digest(saved(model)))
    loaded = torch.load(io.BytesIO(saved(model)), weights_only=False)
    out("torch_load_model", torch.equal(loaded(x), ref))
    twin = copy.deepcopy(model)
    out("deepcopy", [torch.equal(twin(x), ref), len(twin._forward_pre_hooks), len(twin._forward_hooks)])
    out("module_dict", sorted(k for k in vars(model) if not k.startswith("__")))

    # the optimizer: torch.save and state_dict
    out("torch_save_optimizer", digest(saved(opt)))
    sd = opt.state_dict()
    out("optimizer_param_groups", sd["param_groups"])
    out("optimizer_state", {k: sorted(v) for k, v in sd["state"].items()})
    out("optimizer_state_bytes", digest(saved(sd)))
    out("optimizer_dict", sorted(vars(opt)))

    # types, signatures, attributes
    out("signature_dataloader", inspect.signature(DataLoader))
    out("signature_dataloader_init", inspect.signature(DataLoader.__init__))
    out("signature_sgd", inspect.signature(torch.optim.SGD))
    out("signature_backward", inspect.signature(torch.Tensor.backward))
    out("signature_autograd_backward", inspect.signature(torch.autograd.backward))
    out("dataloader_init_names", [DataLoader.__init__.__name__, DataLoader.__init__.__qualname__])
    out("isinstance", [isinstance(loader, DataLoader), isinstance(opt, torch.optim.Optimizer)])
    out("types", [type(loader).__name__, type(opt).__name__, type(model).__name__, type(ref).__name__])
    out("loader_dict", sorted(vars(loader)))
    out("iterator_dict", sorted(vars(iter(loader))))
    out("loader_pickle", pickled_names(pickle.dumps(DataLoader(ds, batch_size=4))))

    # worker processes that unpickle the dataset in a fresh interpreter
    for ctx in ("spawn", "forkserver"):
        dl = DataLoader(Squares(12), batch_size=4, num_workers=1, multiprocessing_context=ctx)
        out(f"workers_{ctx}", [b.flatten().tolist() for b in dl])

    # compilers and exporters on the instrumented model
    import torch._dynamo as dynamo

    explained = dynamo.explain(model)(x)
    out("dynamo_graphs", [explained.graph_count, explained.graph_break_count])
    out("dynamo_break_reasons", [str(r.reason) for r in explained.break_reasons])
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="eager")
    out("compiled", torch.allclose(compiled(x), ref))
    out("compiled_graph_breaks", dict(dynamo.utils.counters["graph_break"]))
    scripted = torch.jit.script(model)
    out("jit_script", torch.allclose(scripted(x), ref))
    exported = torch.export.export(model, (x,))
    out("export_ops", [str(n.target) for n in exported.graph.nodes if n.op == "call_function"])
    out("export", torch.allclose(exported.module()(x), ref))
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
