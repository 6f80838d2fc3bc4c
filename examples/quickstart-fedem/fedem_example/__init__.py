"""fedem-example: Flower's quickstart with Pollen's FedEM in place of FedAvg."""
