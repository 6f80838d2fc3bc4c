"""What a deployed ClientApp process does for one message, timed from a fresh interpreter:
`python benchmarks/startup_probe.py hello|train|train-no-compute` (used by messaging.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(kind: str) -> None:
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client.app import app
    from pollen.core import protocol
    from pollen.core.runconfig import resolve

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    cfg = resolve({"dataset": "mnist-5k", "num-clients": 2, "run-name": "probe"})
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config=dict(cfg),
    )
    if kind == "hello":
        content = protocol.instruction(1, "query.hello")
        message_type = "query.hello"
    else:
        from strategies.classifier import initial_weights

        content = protocol.instruction(1, "train", arrays=initial_weights(cfg, 0))
        message_type = "train"
    if kind == "train-no-compute":  # all a training message does but the training and testing
        import client.fedavg

        client.fedavg.train_locally = lambda *args, **kwargs: 0.0  # type: ignore[assignment]
        client.fedavg.test_metrics = lambda model, data, split="test": {}  # type: ignore[assignment]
    app(Message(content, dst_node_id=1, message_type=message_type), ctx)


if __name__ == "__main__":
    main(sys.argv[1])
