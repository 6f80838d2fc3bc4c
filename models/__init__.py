"""Neural network models, built by name for a dataset's input shape and number of classes."""

from models.registry import MODEL_NAMES, build_model

__all__ = ["MODEL_NAMES", "build_model"]
