import pytest
import torch

from pitstop.compress import digits


@pytest.fixture(autouse=True)
def _one_thread():
    # The 2 cores are shared with other test runs; one thread keeps these tests from fighting them.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def trained_mlp() -> torch.nn.Module:
    return digits.trained_mlp()


@pytest.fixture(scope="session")
def trained_cnn() -> torch.nn.Module:
    return digits.trained_cnn()


@pytest.fixture(scope="session")
def test_loader():
    return digits.test_loader()
