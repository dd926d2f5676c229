"""Run the example app on Flower's simulation engine (Ray, local, offline) and print the real bytes.

    FLWR_TELEMETRY_ENABLED=0 RAY_USAGE_STATS_ENABLED=0 python examples/flower/run_simulation.py
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")   # nothing may reach the network
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flwr.simulation import run_simulation  # noqa: E402

from mucsc_flower_app import server_app  # noqa: E402
from mucsc_flower_app.client_app import app as client  # noqa: E402

run_simulation(server_app.app, client, num_supernodes=6,
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": 2}})
strategy, result = server_app.LAST["strategy"], server_app.LAST["result"]
print("round  up: messages  payload B  serialised B   down: full  updates  payload B  accuracy")
for row in strategy.traffic.rounds():
    r = row["round"]
    ups = [m for m in strategy.traffic.round(r) if m.direction == "up"]
    acc = result.evaluate_metrics_serverapp[r]["accuracy"]
    print(f"{r:5d}  {len(ups):12d}  {row['bytes_up']:9d}  {row['message_bytes_up']:12d}   "
          f"{row['down_recipients'] - row['down_compressed']:10d}  {row['down_compressed']:7d}  "
          f"{row['bytes_down']:9d}  {acc:.3f}")
strategy.traffic.write_csv("flower_messages.csv")
print("per-message bytes in flower_messages.csv")
