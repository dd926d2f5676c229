"""``mucsc sim --engine flower``: the simulator's experiment on Flower's simulation engine (Ray backend).

The same data, partition, model, client selection, batches, learning rates and codec seeds as the
built-in engine (:mod:`mucsc.fedsim.simulation`, reused through its functions), the same local SGD and
evaluation (:mod:`mucsc.fedsim.training`), but every round is
real Flower Messages between a ServerApp and N supernodes' ClientApps: uplink updates go through
:func:`mucsc.flower.mucsc_mod` and the downlink through :class:`mucsc.flower.MucscStrategy`, and the
byte counts are the payloads of those Messages.  Each ClientApp runs in a Ray actor with
``client_resources`` num_cpus 1; with ``RAY_ADDRESS`` set (after ``ray start --head`` on a cluster)
the actors run on that cluster instead of a local one.

Where it differs from the built-in engine (docs/integrations.md): the server aggregates client
*models* (FedAvg over ``global + update``) instead of updates, so the float rounding differs; and the
downlink reaches only the round's participants, as a compressed update when the node holds the
previous model version and as the full model otherwise (the built-in engine counts one compressed
update per recipient, assuming every client stays in sync).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import mucsc
from mucsc.fedsim import network, training
from mucsc.fedsim import simulation as fs
from mucsc.fedsim.models import build_model
from mucsc.fedsim.simulation import RoundRecord, RunFailed, RunResult
from mucsc.flower import (
    K_CODEC,
    K_SEED,
    CodecSpec,
    MucscStrategy,
    mucsc_mod,
)

try:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation
except ImportError as exc:
    raise ImportError("mucsc sim --engine flower needs Flower with its simulation engine: "
                      "pip install 'mucsc[flower]'") from exc


class FlowerRoundRecord(RoundRecord):
    """A RoundRecord whose downlink total is the sum of the real messages (compressed updates and
    full models differ in size), not one message size times the recipients."""

    down_total: int = 0

    @property
    def bytes_down(self) -> int:
        return self.down_total


def _spec(link: Any) -> CodecSpec:
    """The codec spec a fedsim link (codec, params, error feedback, compress) sends to a client."""
    return CodecSpec(link.codec, tuple(sorted(dict(link.params).items())), link.error_feedback, link.compress)


class FedsimStrategy(FedAvg):
    """FedAvg that samples, seeds and configures clients exactly as the built-in engine does.

    ``configure_train`` sends round r's participants (``select_clients``) one message each with its
    slot, learning rates, uplink codec and message seed; ``aggregate_train`` is FedAvg weighted by
    the clients' data sizes (eq. 4).  Once ``stop`` is set (target accuracy reached) no node is asked.
    """

    def __init__(self, cfg: Any, setup: Any, ups: list[Any], node_of: dict[int, int]) -> None:
        super().__init__(min_available_nodes=cfg.clients)  # evaluation is the server's (configure_evaluate)
        self.cfg, self.setup, self.ups, self.node_of = cfg, setup, ups, node_of
        sizes = setup.sizes.astype(np.float64)
        self.weights = sizes / sizes.sum()
        self.fs = fs
        self.stop = False
        self.selected: dict[int, list[int]] = {}      # round -> partition ids in slot order
        self.train_s: dict[int, list[float]] = {}

    def summary(self) -> None:  # Flower's banner lists FedAvg's sampling fractions, which do not apply
        pass

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> list[Message]:
        return []  # the server evaluates the global model on the test set, as the built-in engine does

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        if self.stop:
            return []
        cfg, fs, rnd = self.cfg, self.fs, server_round - 1
        E = cfg.local_iters
        lrs = [float(fs.learning_rate(rnd * E + j, cfg)) for j in range(E)]
        selected = [int(c) for c in fs.select_clients(cfg, rnd, self.weights).tolist()]
        self.selected[server_round] = selected
        messages = []
        for slot, c in enumerate(selected):
            conf = ConfigRecord({"server-round": server_round, "round": rnd, "slot": slot, "lrs": lrs,
                                 K_SEED: fs.codec_seed(cfg.seed, fs._S_UP, rnd, slot),
                                 **_spec(self.ups[c]).to_config()})
            messages.append(Message(RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: conf}),
                                    dst_node_id=self.node_of[c], message_type=MessageType.TRAIN))
        return messages

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[Any, Any]:
        slot = {self.node_of[c]: i for i, c in enumerate(self.selected[server_round])}
        replies = sorted(replies, key=lambda m: slot.get(m.metadata.src_node_id, len(slot)))  # slot order
        self.train_s[server_round] = [float(r.content["metrics"]["train-s"]) for r in replies if not r.has_error()]
        return super().aggregate_train(server_round, replies)


def client_app(cfg: Any, setup: Any, device: str = "cpu") -> ClientApp:
    """N supernodes' ClientApp: answers its partition id; trains like the built-in engine's client."""
    app = ClientApp(mods=[mucsc_mod])

    @app.query()
    def query(msg: Message, context: Any) -> Message:
        return Message(RecordDict({"node": ConfigRecord({"partition-id": int(context.node_config["partition-id"])})}),
                       reply_to=msg)

    @app.train()
    def train(msg: Message, context: Any) -> Message:
        t0 = time.perf_counter()
        torch.set_num_threads(cfg.threads)
        c = int(context.node_config["partition-id"])
        conf = msg.content["config"]
        model, named = _model(setup, cfg, msg.content["arrays"])
        dev = torch.device(device)
        model.to(dev)
        named = list(model.named_parameters())
        part = np.asarray(setup.parts[c])
        x = torch.from_numpy(setup.data.x_train[part]).to(dev)  # copies: Ray hands actors read-only arrays
        y = torch.from_numpy(setup.data.y_train[part]).to(dev)
        batches = fs.client_batches(cfg.seed, int(conf["round"]), int(conf["slot"]), len(part),
                                    cfg.local_iters, cfg.batch_size)
        training.sgd(model, [p for _, p in named], x, y, batches, [float(v) for v in conf["lrs"]])
        trained = ArrayRecord({name: _array(p.detach().cpu().numpy()) for name, p in named})
        metrics = MetricRecord({"num-examples": len(part), "train-s": time.perf_counter() - t0})
        return Message(RecordDict({"arrays": trained, "metrics": metrics}), reply_to=msg)

    return app


def _model(setup: Any, cfg: Any, arrays: ArrayRecord) -> tuple[Any, list[tuple[str, Any]]]:
    """The simulator's model with the given global arrays loaded."""
    data = setup.data
    model = build_model(setup.model_name, data.input_shape, data.num_classes, cfg.seed)
    named = list(model.named_parameters())
    with torch.no_grad():
        for name, p in named:
            p.copy_(torch.from_numpy(arrays[name].numpy()))
    return model, named


def _array(a: np.ndarray) -> Any:
    from flwr.app import Array

    return Array(np.ascontiguousarray(a))


def _node_map(grid: Grid, clients: int, timeout: float = 600.0) -> dict[int, int]:
    """partition id -> node id, asked of every supernode once (not counted as training traffic)."""
    t0 = time.monotonic()
    while len(nodes := list(grid.get_node_ids())) < clients:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"only {len(nodes)} of {clients} supernodes connected")
        time.sleep(0.2)
    queries = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
    out = {}
    for r in grid.send_and_receive(queries, timeout=timeout):
        if r.has_error():
            raise RuntimeError(f"supernode {r.metadata.src_node_id} failed: {r.error.reason}")
        out[int(r.content["node"]["partition-id"])] = r.metadata.src_node_id
    return out


class FlowerEngine:
    """:class:`mucsc.fedsim.engines.Engine` on Flower: one run after the other, Ray's actors train."""

    name = "flower"
    workers, reason, concurrent = 1, "--engine flower", 1

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def sweep_runs(self, specs: Any, **callbacks: Any) -> list[Any]:
        return sweep_runs(specs, self.device, **callbacks)

    def close(self) -> None:
        pass


def sweep_runs(specs: Any, device: str = "cpu", *,
               on_start: Callable[[int, str], None] | None = None,
               on_round: Callable[[int, Any], None] | None = None,
               on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """The built-in engine's ``sweep_runs`` (same run specs, callbacks and ``RunFailed``) on Flower,
    one run after the other: each run is a Flower simulation of its own."""
    results = []
    for i, spec in enumerate(specs):
        if on_start is not None:
            on_start(i, spec.codec)
        done: list[Any] = []

        def each(rec: Any, i: int = i) -> None:
            done.append(rec)
            if on_round is not None:
                on_round(i, rec)
        try:
            res = run(spec.cfg, spec.codec, spec.setup, each, device=device)
        except (Exception, KeyboardInterrupt) as exc:
            raise RunFailed(spec.codec, len(done), exc) from exc
        if on_done is not None:
            on_done(i, res)
        results.append(res)
    return results


def run(cfg: Any, codec: str, setup: Any, on_round: Callable[[Any], None] | None = None,
        device: str = "cpu") -> Any:
    """One FedAvg run of preset ``codec`` on Flower's simulation engine; the built-in engine's
    result (:class:`mucsc.fedsim.simulation.RunResult`).  ``device="cuda"``: clients train on the GPU,
    sharing it (fractional ``num_gpus`` per ClientApp)."""
    if cfg.sampling != "uniform":
        raise mucsc.InputError("--engine flower needs --sampling uniform: weighted sampling repeats a client "
                               "within a round, and a Flower round sends one message per supernode")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # Ray's FutureWarning about num_gpus=0
    data = setup.data
    ups, down = cfg.links(codec, cfg.clients, list(setup.groups))
    for link in {*ups, down}:
        _spec(link).compressor()  # every codec checked before Ray starts
    rounds, target, every = cfg.resolved("rounds"), cfg.resolved("target"), cfg.resolved("eval_every")
    E = cfg.local_iters
    model = build_model(setup.model_name, data.input_shape, data.num_classes, cfg.seed)
    names = [n for n, _ in model.named_parameters()]
    initial = ArrayRecord({n: _array(p.detach().numpy().copy()) for n, p in model.named_parameters()})
    x_te, y_te = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    net_cfg = network.NetworkConfig(cfg.up_mbps, cfg.down_mbps, cfg.speed_sd)
    records: list[Any] = []
    state: dict[str, Any] = {"reached": None, "final": None, "error": None}

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Any) -> None:
        try:
            node_of = _node_map(grid, cfg.clients)
            inner = FedsimStrategy(cfg, setup, ups, node_of)
            strategy = MucscStrategy(
                inner, codec=ups[0].codec, downlink=down.codec, downlink_params=dict(down.params),
                downlink_error_feedback=down.error_feedback, compress=down.compress,
                downlink_seed=lambda r: fs.codec_seed(cfg.seed, fs._S_DOWN, r - 1))
            partition_of = {v: k for k, v in node_of.items()}

            def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
                if server_round == 0 or inner.stop:
                    return None
                rec = _round_record(server_round, strategy, inner, partition_of, net_cfg, E, cfg)
                last = server_round == rounds
                if server_round % every == 0 or last:
                    rec.accuracy, rec.loss = training.evaluate(_model(setup, cfg, arrays)[0], x_te, y_te)
                    if not np.isfinite(rec.loss):
                        rec.loss = float("nan")
                records.append(rec)
                if on_round is not None:
                    on_round(rec)
                state["final"] = {n: arrays[n].numpy().copy() for n in names}
                if rec.accuracy is not None and target and rec.accuracy >= target:
                    state["reached"] = server_round
                    inner.stop = True
                return None

            strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, evaluate_fn=evaluate)
        except BaseException as exc:  # reported by run() below, not lost in Flower's server thread
            state["error"] = exc

    cpus = max(1, min(cfg.clients, os.cpu_count() or 1))
    gpus = 1.0 / cpus if device == "cuda" else 0.0  # every concurrent ClientApp gets a share of one GPU
    backend: dict[str, Any] = {"client_resources": {"num_cpus": 1, "num_gpus": gpus}, "init_args": {}}
    if not os.environ.get("RAY_ADDRESS"):
        backend["init_args"]["num_cpus"] = cpus
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.WARNING)
    try:
        run_simulation(server, client_app(cfg, setup, device), num_supernodes=cfg.clients, backend_config=backend)
    finally:
        flwr_log.setLevel(level)
        _shutdown_local_ray()
    if state["error"] is not None:
        exc = state["error"]
        raise exc if isinstance(exc, mucsc.MucscError) else RuntimeError(f"Flower run failed: {exc}") from exc
    labels = sorted({u.label() for u in ups})
    return RunResult(codec, labels, down.label(), setup.d, records, state["reached"], state["final"] or {})


def _round_record(server_round: int, strategy: MucscStrategy, inner: FedsimStrategy, partition_of: dict[int, int],
                  net_cfg: Any, E: int, cfg: Any) -> Any:
    """The built-in engine's RoundRecord, with bytes from this round's real Messages."""
    msgs = strategy.traffic.round(server_round)
    selected = inner.selected[server_round]
    up = {m.node_id: m.payload_bytes for m in msgs if m.direction == "up"}
    down = [m for m in msgs if m.direction == "down"]
    up_bytes = [up.get(inner.node_of[c], 0) for c in selected]
    rnd = server_round - 1
    net_rng = fs.stream(cfg.seed, fs._S_NET, rnd)
    up_speeds = network.draw_speeds(net_rng, cfg.clients, cfg.up_mbps, net_cfg)
    down_speeds = network.draw_speeds(net_rng, cfg.clients, cfg.down_mbps, net_cfg)
    down_ids = np.array([partition_of[m.node_id] for m in down], dtype=np.int64)
    down_sizes = np.array([m.payload_bytes for m in down], dtype=np.int64)
    compressed = [m.payload_bytes for m in down if m.compressed]
    train = inner.train_s.get(server_round, [0.0])
    timing = strategy.timing.get(server_round, {})
    enc = timing.get("encode_s", [])
    client = [t + e for t, e in zip(train, enc)] or train
    rec = FlowerRoundRecord(
        round=server_round, iteration=server_round * E, lr=float(fs.learning_rate(rnd * E, cfg)),
        participants=selected, up_bytes=up_bytes,
        down_msg_bytes=max(compressed) if compressed else (int(down_sizes.max()) if len(down) else 0),
        down_recipients=len(down),
        comm_up_s=network.transfer_time(np.array(up_bytes), up_speeds[np.array(selected)]),
        comm_down_s=network.transfer_time(down_sizes, down_speeds[down_ids]) if len(down) else 0.0,
        train_s=float(sum(train)), encode_s=float(sum(enc) + timing.get("down_encode_s", 0.0)),
        decode_s=float(timing.get("decode_s", 0.0)),
        comp_s=float(max(client) + timing.get("decode_s", 0.0) + timing.get("down_encode_s", 0.0)))
    rec.down_total = int(down_sizes.sum())
    return rec


def _shutdown_local_ray() -> None:
    """Flower leaves the local Ray instance running; stop it so a sweep's next run starts clean."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except ImportError:
        pass
