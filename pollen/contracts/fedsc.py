"""FedSC's record names, shared by its server (strategies.fedsc) and its clients (client.fedsc)."""

CORRELATION = "correlation"  # record of the correlation reply: {"r": (H, H) float32}
OTHERS = "others"  # record of a train instruction: {"r": Rbar_{-j}}
