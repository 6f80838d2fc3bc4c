"""models.modes.set_training against torch's Module.train."""

from __future__ import annotations

import pytest
from torch import nn

from models.modes import set_training


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.ReLU(), nn.Dropout()))


@pytest.mark.parametrize("mode", [True, False])
def test_sets_every_module_as_module_train_does(mode: bool) -> None:
    ours, theirs = _model(), _model()
    ours[2].train(not mode)  # a submodule in the other mode first
    theirs[2].train(not mode)
    assert set_training(ours, mode) is ours
    theirs.train(mode)
    assert [m.training for m in ours.modules()] == [m.training for m in theirs.modules()]
    assert all(m.training is mode for m in ours.modules())


def test_a_module_that_overrides_train_has_its_override_called() -> None:
    calls: list[bool] = []

    class Frozen(nn.Linear):
        def train(self, mode: bool = True) -> Frozen:
            calls.append(mode)
            return super().train(False)  # always evaluates

    model = nn.Sequential(nn.Linear(2, 2), Frozen(2, 2))
    set_training(model, True)
    assert calls == [True]
    assert model.training and model[0].training and not model[1].training
