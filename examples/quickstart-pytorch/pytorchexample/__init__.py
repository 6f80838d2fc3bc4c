"""pytorchexample: Flower's PyTorch quickstart, to switch to Pollen's algorithms."""
