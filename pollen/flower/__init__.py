"""Pollen's algorithms as Flower building blocks (docs/flower-apps.md).

In a Flower project's ServerApp, a strategy of this module takes the place of Flower's own::

    from pollen.flower import FedEM

    strategy = FedEM(components=3, local_epochs=1)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)

and in its ClientApp one call registers the algorithm's client half, training the app's own
model on its own data::

    from pollen.flower import register

    app = ClientApp()
    register(app, "fedem", model_fn=Net, data_fn=load_data)
"""

from federated_data import ClientData
from pollen.flower.clients import client_data, register
from pollen.flower.strategies import (
    ADEPTAE,
    ADEPTDGM,
    ADEPTPCA,
    SCAFFOLD,
    STRATEGIES,
    Clustered,
    DFedEM,
    FedAvg,
    FedAvgBYOL,
    FedAvgPlus,
    FedAvgSC,
    FedAvgSimCLR,
    FedEM,
    FedLin,
    FeDLRT,
    FedProx,
    FedSC,
    Local,
    NoOp,
    PollenStrategy,
    components,
)
from pollen.flower.wire import SettingsError, keyword_settings

__all__ = [
    "ADEPTAE",
    "ADEPTDGM",
    "ADEPTPCA",
    "SCAFFOLD",
    "STRATEGIES",
    "ClientData",
    "Clustered",
    "DFedEM",
    "FeDLRT",
    "FedAvg",
    "FedAvgBYOL",
    "FedAvgPlus",
    "FedAvgSC",
    "FedAvgSimCLR",
    "FedEM",
    "FedLin",
    "FedProx",
    "FedSC",
    "Local",
    "NoOp",
    "PollenStrategy",
    "SettingsError",
    "client_data",
    "components",
    "keyword_settings",
    "register",
]
