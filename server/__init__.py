"""Server side: the ServerApp, the round engine, results and checkpoints."""
