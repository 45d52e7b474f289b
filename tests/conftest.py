import os
import signal
import tempfile

import pytest

# Tests must not fight over the 2 cores, nor pick up a user's thread settings.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# `pitstop fix` keeps its verdicts in the user's cache directory; tests keep theirs in a temporary one.
os.environ.setdefault("PITSTOP_CACHE_DIR", tempfile.mkdtemp(prefix="pitstop-test-cache-"))
# A shell without job control starts a background command (`pytest ... &`) with SIGINT ignored, and the
# children inherit it: the Ctrl-C tests would then time out. Tests press Ctrl-C, so it must work here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# A CPU without bf16 hardware, made to order: AVX2-only flags and a torch.mm timer that reports fp32 at
# 89 GFLOP/s and bf16 at the rate of an AVX2-only EPYC (one 2048x2048 bf16 mm: 57 s). No mm is run
# and no time passes: the measurement code must keep its bounds from the times it is told.
AVX2_FLAGS = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
FAKE_MM_FLOPS = {"float32": 89e9, "bfloat16": 2 * 2048**3 / 57.0, "float16": 2 * 2048**3 / 57.0}


@pytest.fixture
def bf16less_cpu(monkeypatch):
    """Fakes a bf16-less CPU (flags and mm speed); returns the list of (dtype, n, calls) timed."""
    from pitstop import matmul
    from pitstop.host import cpu as hardware

    calls: list[tuple[str, int, int]] = []

    def fake_timed(a, b, number):
        dtype = str(a.dtype).removeprefix("torch.")
        calls.append((dtype, a.shape[0], number))
        return 2 * a.shape[0] ** 3 / FAKE_MM_FLOPS[dtype]

    monkeypatch.setattr(hardware, "_host_flags", lambda: AVX2_FLAGS)
    monkeypatch.setattr(matmul, "_timed", fake_timed)
    monkeypatch.setattr(matmul, "cpu_bf16_check", matmul.cpu_bf16_check.__wrapped__)  # measure, not cached
    return calls


class FakeWandbRun:
    """What pitstop calls on a W&B run, recorded."""

    def __init__(self) -> None:
        self.name, self.logged, self.defined, self.summary = "fake-run", [], [], {}

    def log(self, values: dict) -> None:
        self.logged.append(values)

    def define_metric(self, name: str, **kw) -> None:
        self.defined.append((name, kw))


class FakeWandbTable:
    def __init__(self, columns: list, data: list) -> None:
        self.columns, self.data = columns, data


class FakeMlflowClient:
    """What pitstop calls on an MLflow client, recorded: (method, run_id, payload)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object]] = []

    def log_batch(self, run_id: str, metrics: list) -> None:
        self.calls.append(("log_batch", run_id, list(metrics)))

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.calls.append(("log_text", run_id, (artifact_file, text)))

    def log_table(self, run_id: str, data: dict, artifact_file: str) -> None:
        self.calls.append(("log_table", run_id, (artifact_file, data)))


@pytest.fixture
def fake_wandb(monkeypatch):
    """A ``wandb`` module with an active run (``wandb.run``), installed in sys.modules; returns it."""
    import sys
    import types

    mod = types.ModuleType("wandb")
    mod.run = FakeWandbRun()
    mod.Table = FakeWandbTable
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return mod


@pytest.fixture
def fake_mlflow(monkeypatch):
    """``mlflow`` and ``mlflow.entities`` modules with an active run ``run-1``; returns mlflow, whose
    ``client`` is the one ``MlflowClient()`` gives."""
    import collections
    import sys
    import types

    mod, entities = types.ModuleType("mlflow"), types.ModuleType("mlflow.entities")
    entities.Metric = collections.namedtuple("Metric", "key value timestamp step")
    mod.entities, mod.client = entities, FakeMlflowClient()
    mod.MlflowClient = lambda: mod.client
    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="run-1"))
    mod.active_run = lambda: run
    monkeypatch.setitem(sys.modules, "mlflow", mod)
    monkeypatch.setitem(sys.modules, "mlflow.entities", entities)
    return mod
