"""The Flower app that ``mucsc sim --engine flower`` runs with ``flwr run``: a ServerApp and a ClientApp
that read one run's job directory (written by :mod:`mucsc.fedsim.engines.flower`) and write its results
back there.

Flower runs them in its own processes (the SuperLink's simulation process and Ray actors), so
everything a run needs travels as files named by the run config key ``mucsc-job``: ``job.json``
(the SimConfig, codec, device, the setup's small fields) and ``.npy`` arrays (the data and the
client partition, loaded without pickle); the server appends each round's record to
``rounds.jsonl`` and ends with ``final.npz`` and ``result.json``.

The same data, partition, model, client selection, batches, learning rates and codec seeds as the
built-in engine (:mod:`mucsc.fedsim.simulation`, reused through its functions), the same local SGD and
evaluation (:mod:`mucsc.fedsim.training`), but every round is real Flower Messages between the ServerApp
and N supernodes' ClientApps: uplink updates go through :func:`mucsc.flower.mucsc_mod` and the
downlink through :class:`mucsc.flower.MucscStrategy`, and the byte counts are the payloads of those
Messages.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mucsc.fedsim import network, training
from mucsc.fedsim import simulation as fs
from mucsc.fedsim.config import SimConfig
from mucsc.fedsim.datasets import Dataset
from mucsc.fedsim.models import build_model
from mucsc.fedsim.simulation import RoundRecord, Setup
from mucsc.flower import K_SEED, CodecSpec, MucscStrategy, mucsc_mod

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
except ImportError as exc:
    raise ImportError("mucsc sim --engine flower needs Flower with its simulation engine: "
                      "pip install 'mucsc[flower]'") from exc

JOB_KEY = "mucsc-job"      # run config key: the job directory
_ARRAYS = ("x_train", "y_train", "x_test", "y_test")


class FlowerRoundRecord(RoundRecord):
    """A RoundRecord whose downlink total is the sum of the real messages (compressed updates and
    full models differ in size), not one message size times the recipients."""

    down_total: int = 0

    @property
    def bytes_down(self) -> int:
        return self.down_total

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "down_total": self.down_total}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FlowerRoundRecord:
        rec = cls(**{f.name: d[f.name] for f in dataclasses.fields(RoundRecord) if f.name in d})
        rec.down_total = int(d["down_total"])
        return rec


# ---- the job directory: what the engine hands the app, and what the app hands back ------------------

@dataclasses.dataclass(frozen=True)
class Job:
    """One run as the app sees it."""

    cfg: SimConfig
    codec: str
    device: str
    setup: Setup
    path: Path


def write_job(path: Path, cfg: SimConfig, codec: str, setup: Setup, device: str) -> None:
    """The engine's side: ``setup`` and the run's settings into the (new, empty) directory ``path``."""
    data = setup.data
    for name in _ARRAYS:
        np.save(path / f"{name}.npy", np.ascontiguousarray(getattr(data, name)), allow_pickle=False)
    if data.writers is not None:
        np.save(path / "writers.npy", np.asarray(data.writers), allow_pickle=False)
    np.save(path / "parts.npy", np.concatenate([np.asarray(p, dtype=np.int64) for p in setup.parts]),
            allow_pickle=False)
    meta = {"cfg": dataclasses.asdict(cfg), "codec": codec, "device": device,
            "dataset": {"name": data.name, "num_classes": data.num_classes, "transform": data.transform},
            "part_sizes": [len(p) for p in setup.parts], "groups": list(setup.groups),
            "model_name": setup.model_name, "d": setup.d}
    (path / "job.json").write_text(json.dumps(meta), encoding="utf-8")


def _tuples(v: Any) -> Any:
    """JSON lists back to the tuples a SimConfig holds (``params`` is a tuple of 4-tuples)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


@functools.lru_cache(maxsize=2)
def load_job(path: str) -> Job:
    """The app's side (once per process: Ray actors keep theirs across rounds)."""
    p = Path(path)
    meta = json.loads((p / "job.json").read_text(encoding="utf-8"))
    cfg = SimConfig(**{k: _tuples(v) for k, v in meta["cfg"].items()})
    arrays = {name: np.load(p / f"{name}.npy", allow_pickle=False) for name in _ARRAYS}
    writers = np.load(p / "writers.npy", allow_pickle=False) if (p / "writers.npy").exists() else None
    data = Dataset(meta["dataset"]["name"], **arrays, num_classes=int(meta["dataset"]["num_classes"]),
                   writers=writers, transform=meta["dataset"]["transform"])
    flat = np.load(p / "parts.npy", allow_pickle=False)
    parts = tuple(np.split(flat, np.cumsum(meta["part_sizes"])[:-1]))
    setup = Setup(data, parts, tuple(meta["groups"]), meta["model_name"], int(meta["d"]))
    return Job(cfg, meta["codec"], meta["device"], setup, p)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---- the strategy ---------------------------------------------------------------------------------

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
        cfg, rnd = self.cfg, server_round - 1
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


# ---- the ClientApp --------------------------------------------------------------------------------

client = ClientApp(mods=[mucsc_mod])


@client.query()
def query(msg: Message, context: Any) -> Message:
    """This supernode's partition id (the server maps partitions to node ids once per run)."""
    return Message(RecordDict({"node": ConfigRecord({"partition-id": int(context.node_config["partition-id"])})}),
                   reply_to=msg)


@client.train()
def train(msg: Message, context: Any) -> Message:
    """The built-in engine's client: local SGD on this partition from the received global model."""
    t0 = time.perf_counter()
    job = load_job(str(context.run_config[JOB_KEY]))
    cfg, setup = job.cfg, job.setup
    torch.set_num_threads(cfg.threads)
    c = int(context.node_config["partition-id"])
    conf = msg.content["config"]
    model = _model(setup, cfg, msg.content["arrays"])
    dev = torch.device(job.device)
    model.to(dev)
    named = list(model.named_parameters())
    part = np.asarray(setup.parts[c])
    x = torch.from_numpy(setup.data.x_train[part]).to(dev)
    y = torch.from_numpy(setup.data.y_train[part]).to(dev)
    batches = fs.client_batches(cfg.seed, int(conf["round"]), int(conf["slot"]), len(part),
                                cfg.local_iters, cfg.batch_size)
    training.sgd(model, [p for _, p in named], x, y, batches, [float(v) for v in conf["lrs"]])
    trained = ArrayRecord({name: _array(p.detach().cpu().numpy()) for name, p in named})
    metrics = MetricRecord({"num-examples": len(part), "train-s": time.perf_counter() - t0})
    return Message(RecordDict({"arrays": trained, "metrics": metrics}), reply_to=msg)


def _model(setup: Setup, cfg: SimConfig, arrays: ArrayRecord) -> Any:
    """The simulator's model with the given global arrays loaded."""
    data = setup.data
    model = build_model(setup.model_name, data.input_shape, data.num_classes, cfg.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(arrays[name].numpy()))
    return model


def _array(a: np.ndarray) -> Any:
    return Array(np.ascontiguousarray(a))


# ---- the ServerApp --------------------------------------------------------------------------------

server = ServerApp()


@server.main()
def main(grid: Grid, context: Any) -> None:
    """One FedAvg run; every failure is written to ``result.json`` for the engine to raise."""
    path = Path(str(context.run_config[JOB_KEY]))
    try:
        reached, final = _serve(grid, load_job(str(path)))
        np.savez(path / "final.part.npz", **final)
        os.replace(path / "final.part.npz", path / "final.npz")
        _write_atomic(path / "result.json", json.dumps({"reached": reached, "error": None}))
    except BaseException as exc:  # reported by the engine, not lost in Flower's server thread
        _write_atomic(path / "result.json", json.dumps({"reached": None, "error": {
            "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}}))
        raise


def _serve(grid: Grid, job: Job) -> tuple[int | None, dict[str, np.ndarray]]:
    cfg, setup = job.cfg, job.setup
    data = setup.data
    ups, down = cfg.links(job.codec, cfg.clients, list(setup.groups))
    rounds, target, every = cfg.resolved("rounds"), cfg.resolved("target"), cfg.resolved("eval_every")
    model = build_model(setup.model_name, data.input_shape, data.num_classes, cfg.seed)
    names = [n for n, _ in model.named_parameters()]
    initial = ArrayRecord({n: _array(p.detach().numpy().copy()) for n, p in model.named_parameters()})
    x_te, y_te = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    net_cfg = network.NetworkConfig(cfg.up_mbps, cfg.down_mbps, cfg.speed_sd)
    state: dict[str, Any] = {"reached": None, "final": {}}

    node_of = _node_map(grid, cfg.clients)
    inner = FedsimStrategy(cfg, setup, ups, node_of)
    strategy = MucscStrategy(
        inner, codec=ups[0].codec, downlink=down.codec, downlink_params=dict(down.params),
        downlink_error_feedback=down.error_feedback, compress=down.compress,
        downlink_seed=lambda r: fs.codec_seed(cfg.seed, fs._S_DOWN, r - 1))
    partition_of = {v: k for k, v in node_of.items()}

    with open(job.path / "rounds.jsonl", "a", encoding="utf-8") as log:
        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0 or inner.stop:
                return None
            rec = _round_record(server_round, strategy, inner, partition_of, net_cfg, cfg)
            if server_round % every == 0 or server_round == rounds:
                rec.accuracy, rec.loss = training.evaluate(_model(setup, cfg, arrays), x_te, y_te)
                if not np.isfinite(rec.loss):
                    rec.loss = float("nan")
            log.write(json.dumps(rec.to_json()) + "\n")
            log.flush()
            state["final"] = {n: arrays[n].numpy().copy() for n in names}
            if rec.accuracy is not None and target and rec.accuracy >= target:
                state["reached"] = server_round
                inner.stop = True
            return None

        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, evaluate_fn=evaluate)
    return state["reached"], state["final"]


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


def _round_record(server_round: int, strategy: MucscStrategy, inner: FedsimStrategy, partition_of: dict[int, int],
                  net_cfg: Any, cfg: SimConfig) -> FlowerRoundRecord:
    """The built-in engine's RoundRecord, with bytes from this round's real Messages."""
    E = cfg.local_iters
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
    train_s = inner.train_s.get(server_round, [0.0])
    timing = strategy.timing.get(server_round, {})
    enc = timing.get("encode_s", [])
    client_s = [t + e for t, e in zip(train_s, enc)] or train_s
    rec = FlowerRoundRecord(
        round=server_round, iteration=server_round * E, lr=float(fs.learning_rate(rnd * E, cfg)),
        participants=selected, up_bytes=up_bytes,
        down_msg_bytes=max(compressed) if compressed else (int(down_sizes.max()) if len(down) else 0),
        down_recipients=len(down),
        comm_up_s=float(network.transfer_time(np.array(up_bytes), up_speeds[np.array(selected)])),
        comm_down_s=float(network.transfer_time(down_sizes, down_speeds[down_ids])) if len(down) else 0.0,
        train_s=float(sum(train_s)), encode_s=float(sum(enc) + timing.get("down_encode_s", 0.0)),
        decode_s=float(timing.get("decode_s", 0.0)),
        comp_s=float(max(client_s) + timing.get("decode_s", 0.0) + timing.get("down_encode_s", 0.0)))
    rec.down_total = int(down_sizes.sum())
    return rec
