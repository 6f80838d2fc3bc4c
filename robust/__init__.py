"""Byzantine robustness, Flower-free: aggregation rules (robust.rules) and the attacks that
evaluate them (robust.attacks), in NumPy over clients' updates stacked as rows."""
