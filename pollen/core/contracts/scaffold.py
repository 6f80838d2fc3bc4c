"""SCAFFOLD's message layout, shared by its server (strategies.scaffold) and its clients
(client.scaffold).

A train instruction carries the global model x in `protocol.ARRAYS` and the server control
variate c in `CONTROL` (one array per trainable parameter of the model). A train reply carries
the model update delta_y = y_i - x in `protocol.ARRAYS` (every entry of the model's state dict)
and the control update delta_c = c_i+ - c_i in `CONTROL_DELTA` (the keys of `CONTROL`). The
client keeps its own c_i in its state store under `STORED_PREFIX` + parameter name.
"""

CONTROL = "control"  # record of a train instruction: the server control variate c
CONTROL_DELTA = "control-delta"  # record of a train reply: delta_c = c_i+ - c_i
STORED_PREFIX = "control."  # client state store: c_i, one array per parameter
