"""fedem-example: a Flower ClientApp running Pollen's FedEM client half."""

from flwr.clientapp import ClientApp

from fedem_example.task import Net, load_data
from pollen.flower import register

# Flower ClientApp
app = ClientApp()

# FedEM's client half: each client's mixture weights stay on the client
register(app, "fedem", model_fn=Net, data_fn=load_data)
