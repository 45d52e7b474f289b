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
    return calls
