"""FedAvg with partial participation and compressed uplink/downlink (paper sections III, IV-B, VI-A).

One round (E local iterations per selected client):
  1. select K clients: uniform without replacement, or by weight p_i with replacement (Assumption 4);
  2. each starts from the shared model w and runs E SGD steps (eq. 3), U_i = w - w_i (eq. 5);
  3. U_i is encoded with the client's uplink codec; the server decodes every message;
  4. D = sum_i q_i U~_i with q_i = |S_i| / sum_K |S_j| (eq. 4 / 11), or 1/K under weighted sampling;
  5. D is encoded with the downlink codec and sent to all N clients (or next round's participants);
     every client decodes the same bytes and applies w <- w - D~ (eq. 12), so all stay in sync.
Because every client applies the same D~, one shared model stands for all N clients.

Step 2 is ``client_step``'s first half (``training.LocalTrainer.train``, on ``--device``, possibly in a
worker process: module ``parallel``), step 3 its second; a sweep's runs are state machines
(``_Run``) advanced by ``sweep`` as their training and evaluation futures complete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait
from typing import Any

import numpy as np
import torch

from mucsc.errors import InputError
from mucsc.fedsim import network, partition
from mucsc.fedsim.config import SimConfig
from mucsc.fedsim.datasets import Dataset, load_dataset
from mucsc.fedsim.models import build_model, macs_per_sample, num_params
from mucsc.fedsim.training import ClientTask, LocalTrainer
from mucsc.fedsim.transport import Authenticator, LinkCodec, Sender, ServerSum, check_codec, receive, seal
from mucsc.fedsim.updates import UpdateSaver

# Independent random streams, so that e.g. a codec's randomness never shifts the batches.
_S_PARTITION, _S_GROUPS, _S_SELECT, _S_BATCH, _S_NET, _S_UP, _S_DOWN = range(7)


def stream(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def codec_seed(seed: int, *keys: int) -> int:
    """A non-negative 63-bit seed for one message, derived from the run seed and the message's ids."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def learning_rate(t: int, cfg: SimConfig) -> float:
    """eta_t at global iteration index t: the paper's max(lr0 / (1 + t / lr_decay), lr_min) (section
    VI-A) or a constant, with the data set's preset constants unless set (``SimConfig.lr_settings``)."""
    return cfg.learning_rate(t)


def client_batches(seed: int, rnd: int, slot: int, n: int, iters: int, batch: int) -> np.ndarray:
    """Indices (iters x batch) into a client's n samples for one round; without replacement per batch."""
    rng = stream(seed, _S_BATCH, rnd, slot)
    if n >= batch:
        return np.stack([rng.choice(n, batch, replace=False) for _ in range(iters)])
    return rng.integers(0, n, (iters, batch))


def select_clients(cfg: SimConfig, rnd: int, weights: np.ndarray) -> np.ndarray:
    """The K participants of round ``rnd`` (a client may repeat under weighted sampling)."""
    rng = stream(cfg.seed, _S_SELECT, rnd)
    if cfg.sampling == "weighted":
        return rng.choice(cfg.clients, cfg.per_round, replace=True, p=weights)
    return np.sort(rng.choice(cfg.clients, cfg.per_round, replace=False))


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every run of a sweep shares: data, client partition, per-client Z group."""

    data: Dataset
    parts: tuple[np.ndarray, ...]
    groups: tuple[int, ...]     # index into cfg.z_up per client (random thirds in the paper)
    model_name: str
    d: int                      # number of model parameters

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(p) for p in self.parts], dtype=np.int64)


def prepare(cfg: SimConfig, data: Dataset | None = None) -> Setup:
    """Load the data (unless given, which is then used as is), normalise it per ``cfg.normalize``,
    partition it, split clients into Z_U groups, size the model."""
    if data is None:
        data = load_dataset(cfg.dataset, data_dir=cfg.data_dir, download=cfg.download, seed=cfg.seed,
                            clients=cfg.clients, synthetic_alpha=cfg.synthetic_alpha,
                            synthetic_beta=cfg.synthetic_beta, normalized=cfg.normalize == "auto")
    parts = partition.make_partition(
        cfg.resolved("partition"), data.y_train, cfg.clients, stream(cfg.seed, _S_PARTITION),
        writers=data.writers, size=cfg.samples_per_client, min_size=cfg.noniid_min,
        max_size=cfg.noniid_max, classes_per_client=cfg.classes_per_client, alpha=cfg.dirichlet_alpha)
    perm = stream(cfg.seed, _S_GROUPS).permutation(cfg.clients)
    groups = np.empty(cfg.clients, dtype=np.int64)
    groups[perm] = np.arange(cfg.clients) * len(cfg.z_up) // cfg.clients
    model_name = cfg.resolved("model")
    d = num_params(build_model(model_name, data.input_shape, data.num_classes, cfg.seed))
    return Setup(data, tuple(parts), tuple(int(g) for g in groups), model_name, d)


@dataclasses.dataclass
class RoundRecord:
    """Everything measured in one round.  Bytes are len() of real messages."""

    round: int
    iteration: int                 # global iteration index t at the end of the round
    lr: float
    participants: list[int]
    up_bytes: list[int]            # one uplink message per participant, in order
    down_msg_bytes: int            # the one downlink message
    down_recipients: int
    comm_up_s: float
    comm_down_s: float
    train_s: float                 # sum of local training wall time over participants
    encode_s: float                # clients' + server's encode wall time
    decode_s: float                # server's decodes + one client's downlink decode
    comp_s: float                  # critical path: max_i(train_i + enc_i) + server dec/enc + client dec
    accuracy: float | None = None
    loss: float | None = None
    auth_up_bytes: int = 0         # bytes the authentication trailers add to this round's uplink
    auth_down_msg_bytes: int = 0   # ... and to the downlink message (0 without --auth)

    @property
    def bytes_up(self) -> int:
        return int(sum(self.up_bytes))

    @property
    def bytes_down(self) -> int:
        return self.down_msg_bytes * self.down_recipients

    @property
    def comm_s(self) -> float:
        return self.comm_up_s + self.comm_down_s


@dataclasses.dataclass
class RunResult:
    codec: str
    uplinks: list[str]            # distinct uplink codec labels
    downlink: str
    d: int
    records: list[RoundRecord]
    reached_round: int | None     # first evaluated round with accuracy >= target
    weights: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # final shared model
    up_links: list[LinkCodec] = dataclasses.field(default_factory=list)  # every client's uplink codec
    down_link: LinkCodec | None = None


# ---- one client's local work -------------------------------------------------------------------------

def client_task(cfg: SimConfig, setup: Setup, rnd: int, slot: int, client: int) -> ClientTask:
    """The round's work for participant ``slot``: batches from the (seed, round, slot) stream, eta_t."""
    E = cfg.local_iters
    batches = client_batches(cfg.seed, rnd, slot, len(setup.parts[client]), E, cfg.batch_size)
    return ClientTask(rnd, slot, client, batches, tuple(learning_rate(rnd * E + j, cfg) for j in range(E)))


#: ``--device auto`` trains on CUDA only for models of at least this many multiply-accumulates per
#: sample: below it a small batch's step is a few dozen kernel launches doing almost nothing, and the
#: CPU wins.  Measured on both sides: the digits CNN (0.34 M) ran its default sweep in 62 s on an H100
#: against 38 s with ``--device cpu`` on the same machine; FEMNIST's LeNet (11.9 M) trained a round in
#: 0.105 s on an H200 against 0.477 s on its host's CPU.  The threshold sits between them.
CUDA_MIN_MACS = 2_000_000


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """Where a sweep trains, and why (printed in the run header and kept in summary.json)."""

    device: str
    reason: str
    gpu_unused: bool = False  # auto trains on the CPU although a CUDA device is there: the header says why


def choose_device(name: str, setups: Sequence[Setup] = ()) -> DeviceChoice:
    """``cpu`` and ``cuda`` as given (``cuda`` without a GPU is an error).  ``auto``: ``cpu`` without a
    CUDA device; with one, ``cuda`` unless every setup's model is below :data:`CUDA_MIN_MACS` per sample
    (a rule on the model, not a timing, so the same command trains on the same device every time)."""
    if name == "auto":
        if not torch.cuda.is_available():
            return DeviceChoice("cpu", "auto: no CUDA device")
        if not setups:
            return DeviceChoice("cuda", "auto: a CUDA device")
        macs = max(macs_per_sample(s.model_name, s.data.input_shape, s.data.num_classes) for s in setups)
        if macs < CUDA_MIN_MACS:
            return DeviceChoice("cpu", f"auto: the model's {macs / 1e6:.2g} M multiply-accumulates per sample "
                                       f"are below {CUDA_MIN_MACS / 1e6:.2g} M, where the CPU trains faster",
                                gpu_unused=True)
        return DeviceChoice("cuda", f"auto: {macs / 1e6:.3g} M multiply-accumulates per sample")
    return DeviceChoice(resolve_device(name), f"--device {name}")


def resolve_device(name: str, setups: Sequence[Setup] = ()) -> str:
    """The device :func:`choose_device` picks; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return choose_device(name, setups).device
    if name == "cuda" and not torch.cuda.is_available():
        why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise InputError(f"--device cuda: no GPU available ({why}; torch {torch.__version__}); "
                         "use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise InputError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return name


def _on(a: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A host array or a tensor as a tensor of ``dtype`` on ``device``."""
    t = a if torch.is_tensor(a) else torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device, dtype)


@dataclasses.dataclass(frozen=True)
class ClientMessage:
    """One client's uplink for one round: the message bytes and what producing them cost."""

    client: int
    blob: bytes
    train_s: float
    encode_s: float


def client_step(trainer: LocalTrainer, weights: list[np.ndarray], task: ClientTask, sender: Sender,
                seed: int) -> ClientMessage:
    """A client's whole round, as a real client runs it: local training from the received global
    model, then U_i through the client's own stateful uplink encoder (error feedback, DGC momentum).
    The simulator's loop uses exactly these two halves (training possibly in a worker process)."""
    update, train_s = trainer.train(weights, task)
    return encode_update(sender, update, task, seed, train_s)


def encode_update(sender: Sender, update: dict[str, np.ndarray], task: ClientTask, seed: int,
                  train_s: float = 0.0) -> ClientMessage:
    """The client's second half: encode U_i with its own sender in its round."""
    blob, enc_s = sender.send(update, seed, task.round)
    return ClientMessage(task.client, blob, train_s, enc_s)


# ---- one run as a state machine: submit a round's training, finish it, evaluate ------------------

class _Run:
    """One FedAvg run with experiment preset ``codec``: the server's and the clients' codec state and
    the shared model on the device; training and evaluation are handed to an executor."""

    def __init__(self, cfg: SimConfig, codec: str, setup: Setup, device: str, key: int = 0) -> None:
        self.cfg, self.codec, self.setup, self.key = cfg, codec, setup, key
        self.device = torch.device(device)
        self.ups, self.down = cfg.links(codec, cfg.clients, list(setup.groups))
        for link in {*self.ups, self.down}:
            check_codec(link)
        model = build_model(setup.model_name, setup.data.input_shape, setup.data.num_classes, cfg.seed)
        self.names = [n for n, _ in model.named_parameters()]
        self.global_w = [p.detach().clone().to(self.device) for p in model.parameters()]
        self.sizes = setup.sizes.astype(np.float64)
        self.weights = self.sizes / self.sizes.sum()
        self.senders: dict[int, Sender] = {}
        self.server = Sender(self.down)
        self.net_cfg = network.NetworkConfig(cfg.up_mbps, cfg.down_mbps, cfg.speed_sd)
        self.rounds = cfg.resolved("rounds")
        self.target, self.every = cfg.resolved("target"), cfg.resolved("eval_every")
        self.records: list[RoundRecord] = []
        self.reached: int | None = None
        self.rnd = 0
        self.selected = select_clients(cfg, 0, self.weights)
        self.done = False
        self.auth = Authenticator(cfg.auth, cfg.seed, f"{codec}-seed{cfg.seed}") if cfg.auth != "off" else None
        self.saver = None
        if cfg.save_updates:  # --save-updates: raw U_i of the selected rounds and participants
            self.saver = UpdateSaver(cfg.save_updates, cfg.save_rounds, cfg.save_slots, {
                "codec": codec, "seed": cfg.seed, "dataset": cfg.dataset, "model": setup.model_name, "d": setup.d,
                "names": self.names, "clients": cfg.clients, "per_round": cfg.per_round,
                "local_iters": cfg.local_iters, "batch_size": cfg.batch_size})

    def host_weights(self) -> list[np.ndarray]:
        """The global model as the clients receive it: host float32 arrays (copies)."""
        return [g.detach().cpu().numpy().copy() for g in self.global_w]

    def tasks(self) -> list[ClientTask]:
        return [client_task(self.cfg, self.setup, self.rnd, slot, c) for slot, c in enumerate(self.selected.tolist())]

    def finish_round(self, tasks: list[ClientTask], trained: list[tuple[dict[str, np.ndarray], float]]) -> RoundRecord:
        """Clients encode their updates; the server decodes, aggregates (eq. 4 / 11), encodes D; every
        client decodes D~ and applies w <- w - D~ (eq. 12).  Returns the round's record (not yet evaluated)."""
        cfg, rnd, selected = self.cfg, self.rnd, self.selected
        updates, up_bytes, per_client_time, auth_up = [], [], [], 0
        train_s = enc_s = server_dec = 0.0
        if cfg.sampling == "weighted":
            q = np.full(len(selected), 1.0 / len(selected))           # unbiased under Assumption 4
        else:
            q = self.sizes[selected] / self.sizes[selected].sum()     # eq. 4: weights by local data size
        # host updates are summed as they arrive (O(d) server memory, mucsc.Aggregator); device-resident
        # ones (a GPU client's) are decoded onto the server's device and summed there
        summed = ServerSum() if trained and self._resident_device(trained[0][0]) is None else None
        for i, (task, (update, t_train)) in enumerate(zip(tasks, trained)):
            if self.saver is not None and self.saver.wants(rnd + 1, task.slot):  # before any encoding
                self.saver.save(rnd + 1, task.slot, task.client, update, float(task.lrs[0]),
                                int(self.sizes[task.client]))
            sender = self.senders.get(task.client)
            if sender is None:
                sender = self.senders[task.client] = Sender(self.ups[task.client])
            msg = encode_update(sender, update, task, codec_seed(cfg.seed, _S_UP, rnd, task.slot), t_train)
            sent = seal(self.auth, msg.blob, f"client-{task.client}", rnd, "up")  # --auth: verified first
            if summed is not None:
                t_dec = summed.add(sent.blob, float(q[i]), **sent.check)
            else:
                decoded, t_dec = receive(sent.blob, device=self._resident_device(update), **sent.check)
                updates.append(decoded)
            up_bytes.append(len(sent.blob))
            per_client_time.append(msg.train_s + msg.encode_s + sent.seconds)
            train_s += msg.train_s; enc_s += msg.encode_s + sent.seconds; server_dec += t_dec
            auth_up += sent.added_bytes
        agg = self._aggregate(q, updates) if summed is None else summed.total()
        down_blob, t_senc = self.server.send(agg, codec_seed(cfg.seed, _S_DOWN, rnd), rnd)
        sent_down = seal(self.auth, down_blob, "server", rnd, "down")
        down_blob, t_senc = sent_down.blob, t_senc + sent_down.seconds
        applied, t_cdec = receive(down_blob, device=self._resident_device(agg), **sent_down.check)
        with torch.no_grad():
            for n, g in zip(self.names, self.global_w):
                g.sub_(_on(applied[n], self.device, torch.float32))  # eq. 12
        enc_s += t_senc
        next_sel = select_clients(cfg, rnd + 1, self.weights)
        recipients = cfg.clients if cfg.downlink == "all" else len(np.unique(next_sel))
        net_rng = stream(cfg.seed, _S_NET, rnd)
        up_speeds = network.draw_speeds(net_rng, cfg.clients, cfg.up_mbps, self.net_cfg)
        down_speeds = network.draw_speeds(net_rng, cfg.clients, cfg.down_mbps, self.net_cfg)
        down_ids = np.arange(cfg.clients) if cfg.downlink == "all" else np.unique(next_sel)
        E = cfg.local_iters
        rec = RoundRecord(
            round=rnd + 1, iteration=rnd * E + E, lr=tasks[0].lrs[0], participants=selected.tolist(),
            up_bytes=up_bytes, down_msg_bytes=len(down_blob), down_recipients=recipients,
            comm_up_s=network.transfer_time(np.array(up_bytes), up_speeds[selected]),
            comm_down_s=network.transfer_time(np.full(len(down_ids), len(down_blob)), down_speeds[down_ids]),
            train_s=train_s, encode_s=enc_s, decode_s=server_dec + t_cdec,
            comp_s=max(per_client_time) + server_dec + t_senc + t_cdec,
            auth_up_bytes=auth_up, auth_down_msg_bytes=sent_down.added_bytes)
        self.selected = next_sel
        return rec

    def _resident_device(self, update: dict[str, Any]) -> torch.device | None:
        """The device a message about ``update`` is decoded onto: this run's device when the update
        is a tensor (it stayed on the device), None (host arrays) otherwise."""
        return self.device if torch.is_tensor(next(iter(update.values()))) else None

    def _aggregate(self, q: np.ndarray, updates: list[dict[str, Any]]) -> dict[str, Any]:
        """D = sum_i q_i U~_i on the device, accumulated in float64 (one multiply, then one add per
        client, in participant order), sent as float32: a tensor on the device when the updates
        arrived as tensors (the server's encode then runs there too), else a host array."""
        out = {}
        for n in self.names:
            acc = None
            for qi, u in zip(q, updates):
                term = _on(u[n], self.device, torch.float64) * float(qi)
                acc = term if acc is None else acc + term
            d = acc.to(torch.float32)
            out[n] = d if torch.is_tensor(updates[0][n]) else d.cpu().numpy()
        return out

    def eval_due(self) -> bool:
        return (self.rnd + 1) % self.every == 0 or self.rnd + 1 == self.rounds

    def close_round(self, rec: RoundRecord, evaluation: tuple[float, float] | None) -> None:
        """Record the round (with its evaluation, if any) and decide whether the run goes on."""
        if evaluation is not None:
            rec.accuracy, loss = evaluation
            rec.loss = loss if np.isfinite(loss) else float("nan")
        self.records.append(rec)
        self.rnd += 1
        if rec.accuracy is not None and self.target and rec.accuracy >= self.target:
            self.reached = rec.round
            self.done = True
        elif self.rnd >= self.rounds:
            self.done = True

    def result(self) -> RunResult:
        labels = sorted({u.label() for u in self.ups})
        final = {n: g.detach().cpu().numpy().copy() for n, g in zip(self.names, self.global_w)}
        return RunResult(self.codec, labels, self.down.label(), self.setup.d, self.records, self.reached, final,
                         list(self.ups), self.down)


class RunFailed(Exception):
    """A run of a sweep raised; ``codec`` and ``index`` name it, ``rounds`` says how many of its rounds
    completed."""

    def __init__(self, codec: str, rounds: int, cause: BaseException, index: int = 0) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.codec, self.rounds, self.cause, self.index = codec, rounds, cause, index


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its settings (seed included), its codec preset, and which of the
    executor's setups (data, partition) it trains on."""

    cfg: SimConfig
    codec: str
    setup: Setup
    key: int = 0                # index of ``setup`` among the executor's setups


def sweep(cfg: SimConfig, setup: Setup, codecs: Sequence[str], executor: Executor, *,
          on_start: Callable[[int, str], None] | None = None,
          on_round: Callable[[int, RoundRecord], None] | None = None,
          on_done: Callable[[int, RunResult], None] | None = None, concurrent: int = 1) -> list[RunResult]:
    """Run experiment presets ``codecs`` on one setup (see :func:`sweep_runs`)."""
    return sweep_runs([RunSpec(cfg, c, setup) for c in codecs], executor, on_start=on_start,
                      on_round=on_round, on_done=on_done, concurrent=concurrent)


def sweep_runs(specs: Sequence[RunSpec], executor: Executor, *,
               on_start: Callable[[int, str], None] | None = None,
               on_round: Callable[[int, RoundRecord], None] | None = None,
               on_done: Callable[[int, RunResult], None] | None = None, concurrent: int = 1) -> list[RunResult]:
    """Run ``specs`` (callbacks get their index), up to ``concurrent`` at a time, training and
    evaluating through ``executor``.  Runs start in order; each run's rounds are strictly
    sequential and depend only on its settings and seed, so the results do not depend on the
    executor or on ``concurrent``.  A failing run raises :class:`RunFailed` after the others were
    stopped."""
    device = executor.device
    queue = list(enumerate(specs))
    active: list[tuple[int, _Run, str, list, Any]] = []   # (index, run, stage, futures, payload)
    results: dict[int, RunResult] = {}

    def launch(i: int, run: _Run) -> None:
        weights = run.host_weights()
        tasks = run.tasks()
        active.append((i, run, "train", executor.train_all(weights, tasks, run.key), tasks))

    def start_next() -> None:
        while queue and len(active) < concurrent:
            i, spec = queue.pop(0)
            if on_start is not None:
                on_start(i, spec.codec)
            try:
                run = _Run(spec.cfg, spec.codec, spec.setup, device, spec.key)
            except BaseException as exc:
                raise RunFailed(spec.codec, 0, exc, i) from exc
            launch(i, run)

    try:
        start_next()
        while active:
            executor.wait([f for *_, futs, _ in active for f in futs])
            for entry in list(active):
                i, run, stage, futs, payload = entry
                if not all(f.done() for f in futs):
                    continue
                active.remove(entry)
                try:
                    if stage == "train":
                        rec = run.finish_round(payload, [r for f in futs for r in f.result()])
                        if run.eval_due():
                            active.append((i, run, "eval", [executor.evaluate(run.host_weights(), run.key)], rec))
                            continue
                        run.close_round(rec, None)
                    else:
                        rec = payload
                        run.close_round(rec, futs[0].result())
                    if on_round is not None:
                        on_round(i, rec)
                    if not run.done:
                        launch(i, run)
                        continue
                except BaseException as exc:
                    raise RunFailed(run.codec, len(run.records), exc, i) from exc
                results[i] = run.result()
                if on_done is not None:
                    on_done(i, results[i])
            start_next()
    except BaseException:
        for *_, futs, _ in active:
            for f in futs:
                f.cancel()
        raise
    return [results[i] for i in sorted(results)]


def run(cfg: SimConfig, codec: str, setup: Setup, on_round: Callable[[RoundRecord], None] | None = None,
        executor: Executor | None = None) -> RunResult:
    """One FedAvg run with experiment preset ``codec``; calls ``on_round`` after every round.
    Trains in this process on ``cfg.device`` unless an executor is given."""
    own = executor is None
    executor = executor or InProcess(cfg, setup)
    try:
        cb = None if on_round is None else (lambda _i, rec: on_round(rec))
        try:
            return sweep(cfg, setup, [codec], executor, on_round=cb)[0]
        except RunFailed as exc:
            raise exc.cause from None
    finally:
        if own:
            executor.close()


# ---- executors: where training and evaluation run -------------------------------------------------

class Executor:
    """Runs ``LocalTrainer.train`` / ``evaluate`` calls on one of its setups (by index) and returns
    futures."""

    device: str

    def train(self, weights: list[np.ndarray], task: ClientTask, key: int = 0) -> Future:
        raise NotImplementedError

    def train_all(self, weights: list[np.ndarray], tasks: list[ClientTask], key: int = 0) -> list[Future]:
        """Train a round's clients from the same weights: futures whose results (lists), concatenated
        in order, are ``train(weights, task)`` for each task."""
        raise NotImplementedError

    def evaluate(self, weights: list[np.ndarray], key: int = 0) -> Future:
        raise NotImplementedError

    def wait(self, futures: list[Future]) -> None:
        futures_wait(futures, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        pass


class InProcess(Executor):
    """Everything in this process, one call at a time (``--workers 1``); one trainer per setup,
    built when first used."""

    def __init__(self, cfg: SimConfig, setups: Setup | Sequence[Setup]) -> None:
        self.cfg = cfg
        self.setups = [setups] if isinstance(setups, Setup) else list(setups)
        self.device = resolve_device(cfg.device, self.setups)
        self._trainers: dict[int, LocalTrainer] = {}

    def trainer(self, key: int = 0) -> LocalTrainer:
        t = self._trainers.get(key)
        if t is None:
            st = self.setups[key]
            t = self._trainers[key] = LocalTrainer(st.model_name, st.data, st.parts, self.cfg.seed, self.device,
                                                   self.cfg.threads)
        return t

    def _call(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # delivered through the future, as a worker's would be
            fut.set_exception(exc)
        return fut

    def train(self, weights, task, key=0):
        return self._call(lambda: self.trainer(key).train(weights, task))

    def train_all(self, weights, tasks, key=0):
        return [self._call(lambda: [self.trainer(key).train(weights, t) for t in tasks])]

    def evaluate(self, weights, key=0):
        return self._call(lambda: self.trainer(key).evaluate(weights))
