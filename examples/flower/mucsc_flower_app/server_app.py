"""ServerApp: FedAvg wrapped in MucscStrategy (uplink MUCSC Z=16, downlink updates at Z=64)."""

from __future__ import annotations

import json
import os
from logging import INFO
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from mucsc.flower import MucscStrategy
from mucsc_flower_app import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    down_z = int(cfg["downlink-z"])
    strategy = MucscStrategy(FedAvg(fraction_train=float(cfg["fraction-train"]),
                                    fraction_evaluate=float(cfg["fraction-evaluate"])),
                             codec=str(cfg["codec"]), z=int(cfg["z"]),
                             downlink="mucsc" if down_z else None, downlink_params={"z": down_z} if down_z else None)
    _, _, x, y = task.data(0, 1)

    def central_eval(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = task.model()
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = task.evaluate(net, x, y)
        return MetricRecord({"loss": loss, "accuracy": acc})

    strategy.start(grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()),
                   train_config=ConfigRecord({"lr": float(cfg["lr"])}), num_rounds=int(cfg["num-server-rounds"]),
                   evaluate_fn=central_eval)
    log(INFO, "%s", strategy.traffic.summary())
    if str(cfg.get("traffic-json", "")):  # deploy_local.py: the rounds' bytes, for its report
        out = Path(str(cfg["traffic-json"]))
        out.with_suffix(".part").write_text(json.dumps(strategy.traffic.rounds()), encoding="utf-8")
        os.replace(out.with_suffix(".part"), out)
