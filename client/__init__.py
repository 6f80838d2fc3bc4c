"""Client side: the ClientApp, per-algorithm handlers, local training and on-disk state."""
