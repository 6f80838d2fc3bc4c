"""Pollen: federated learning algorithms on Flower, run as real networked processes."""

__version__ = "0.1.0"
