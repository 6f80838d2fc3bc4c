"""fedem-example: a Flower ServerApp running Pollen's FedEM strategy."""

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedem_example.task import Net
from pollen.flower import FedEM

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    num_rounds = int(context.run_config["num-server-rounds"])

    # Initialize FedEM strategy (its settings as keyword arguments)
    strategy = FedEM(
        model_fn=Net,
        components=int(context.run_config["components"]),
        fraction_train=float(context.run_config["fraction-train"]),
        local_epochs=int(context.run_config["local-epochs"]),
        lr=float(context.run_config["lr"]),
        momentum=float(context.run_config["momentum"]),
        seed=int(context.run_config["seed"]),
    )

    # Start strategy, run FedEM for `num_rounds` (components start apart: its own arrays)
    result = strategy.start(
        grid=grid,
        initial_arrays=strategy.initial_arrays(),
        num_rounds=num_rounds,
    )

    # Save the final components to disk
    print("Final evaluation on every client:", result.evaluate_metrics_clientapp)
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
