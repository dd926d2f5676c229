"""ServerApp: FedAvg wrapped in MucscStrategy (uplink Z=16, downlink updates at Z=64)."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from mucsc.flower import MucscStrategy
from mucsc_flower_app import task

app = ServerApp()
LAST: dict = {}  # the strategy of the last run, for run_simulation.py's report


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config.get("num-server-rounds", 5))
    strategy = MucscStrategy(FedAvg(fraction_train=0.5, fraction_evaluate=0.0), codec="mucsc", z=16,
                             downlink="mucsc", downlink_params={"z": 64})
    LAST["strategy"] = strategy
    _, _, x, y = task.data(0, 1)

    def central_eval(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = task.model()
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = task.evaluate(net, x, y)
        return MetricRecord({"loss": loss, "accuracy": acc})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()),
                            train_config=ConfigRecord({"lr": 0.1}), num_rounds=rounds, evaluate_fn=central_eval)
    LAST["result"] = result
