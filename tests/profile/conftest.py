import pytest

from pitstop.profile.capture.hooks import Config, Instrumentation


@pytest.fixture
def instrument():
    """Installs ``Instrumentation`` in this process (no warm-up, full run unless told); undone after."""
    made: list[Instrumentation] = []

    def make(**kw) -> Instrumentation:
        inst = Instrumentation(Config(**{"warmup": 0, "steps": 1000, "full": True, **kw}))
        inst.install()
        made.append(inst)
        return inst

    yield make
    for inst in made:
        inst.uninstall()
