"""FedAvg with partial participation and compressed uplink/downlink (paper sections III, IV-B, VI-A).

One round (E local iterations per selected client):
  1. select K clients: uniform without replacement, or by weight p_i with replacement (Assumption 4);
  2. each starts from the shared model w and runs E SGD steps (eq. 3), U_i = w - w_i (eq. 5);
  3. U_i is encoded with the client's uplink codec; the server decodes every message;
  4. D = sum_i q_i U~_i with q_i = |S_i| / sum_K |S_j| (eq. 4 / 11), or 1/K under weighted sampling;
  5. D is encoded with the downlink codec and sent to all N clients (or next round's participants);
     every client decodes the same bytes and applies w <- w - D~ (eq. 12), so all stay in sync.
Because every client applies the same D~, one shared model stands for all N clients.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from mucsc.fedsim import network, partition
from mucsc.fedsim.config import SimConfig
from mucsc.fedsim.datasets import Dataset, load_dataset
from mucsc.fedsim.models import build_model, num_params
from mucsc.fedsim.transport import Sender, check_codec, receive

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


def _evaluate(model: torch.nn.Module, data: Dataset, x_test: torch.Tensor, y_test: torch.Tensor) -> tuple[float, float]:
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y_test), 1024):
            out = model(x_test[i:i + 1024])
            loss_sum += float(F.cross_entropy(out, y_test[i:i + 1024], reduction="sum"))
            correct += int((out.argmax(1) == y_test[i:i + 1024]).sum())
    model.train()
    return correct / len(y_test), loss_sum / len(y_test)


def local_train(model: torch.nn.Module, params: list[torch.nn.Parameter], x: torch.Tensor, y: torch.Tensor,
                batches: np.ndarray, lrs: list[float]) -> None:
    """E plain SGD steps w <- w - eta_t grad F_i(w, B_t) (eq. 3) on the given batches."""
    for idx, lr in zip(batches, lrs):
        bi = torch.from_numpy(idx)
        loss = F.cross_entropy(model(x[bi]), y[bi])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g, alpha=lr)


def run(cfg: SimConfig, codec: str, setup: Setup,
        on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
    """One FedAvg run with experiment preset ``codec``; calls ``on_round`` after every round."""
    torch.set_num_threads(cfg.threads)
    data = setup.data
    ups, down = cfg.links(codec, cfg.clients, list(setup.groups))
    for link in {*ups, down}:
        check_codec(link)
    model = build_model(setup.model_name, data.input_shape, data.num_classes, cfg.seed)
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    x_tr, y_tr = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    x_te, y_te = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    client_x = [x_tr[torch.from_numpy(p)] for p in setup.parts]
    client_y = [y_tr[torch.from_numpy(p)] for p in setup.parts]
    sizes = setup.sizes.astype(np.float64)
    weights = sizes / sizes.sum()
    senders: dict[int, Sender] = {}
    server = Sender(down)
    net_cfg = network.NetworkConfig(cfg.up_mbps, cfg.down_mbps, cfg.speed_sd)
    rounds, target, every = cfg.resolved("rounds"), cfg.resolved("target"), cfg.resolved("eval_every")
    E = cfg.local_iters
    records: list[RoundRecord] = []
    reached = None
    global_w = [p.detach().clone() for p in params]
    selected = select_clients(cfg, 0, weights)
    for rnd in range(rounds):
        t0 = rnd * E
        lrs = [learning_rate(t0 + j, cfg) for j in range(E)]
        updates, up_bytes, per_client_time = [], [], []
        train_s = enc_s = dec_s = 0.0
        server_dec = 0.0
        for slot, c in enumerate(selected.tolist()):
            t_start = time.perf_counter()
            with torch.no_grad():
                for p, g in zip(params, global_w):
                    p.copy_(g)
            batches = client_batches(cfg.seed, rnd, slot, len(setup.parts[c]), E, cfg.batch_size)
            local_train(model, params, client_x[c], client_y[c], batches, lrs)
            update = {n: (g - p.detach()).numpy() for n, g, p in zip(names, global_w, params)}  # eq. 5
            t_train = time.perf_counter() - t_start
            sender = senders.get(c)
            if sender is None:
                sender = senders[c] = Sender(ups[c])
            blob, t_enc = sender.send(update, codec_seed(cfg.seed, _S_UP, rnd, slot), rnd)
            decoded, t_dec = receive(blob)
            updates.append(decoded)
            up_bytes.append(len(blob))
            per_client_time.append(t_train + t_enc)
            train_s += t_train; enc_s += t_enc; server_dec += t_dec
        if cfg.sampling == "weighted":
            q = np.full(len(selected), 1.0 / len(selected))         # unbiased under Assumption 4
        else:
            q = sizes[selected] / sizes[selected].sum()               # eq. 4: weights by local data size
        agg = {n: sum(float(qi) * u[n].astype(np.float64) for qi, u in zip(q, updates)).astype(np.float32)
               for n in names}
        down_blob, t_senc = server.send(agg, codec_seed(cfg.seed, _S_DOWN, rnd), rnd)
        applied, t_cdec = receive(down_blob)
        with torch.no_grad():
            for n, g in zip(names, global_w):
                g.sub_(torch.from_numpy(np.ascontiguousarray(applied[n], dtype=np.float32)))  # eq. 12
        enc_s += t_senc
        dec_s = server_dec + t_cdec
        next_sel = select_clients(cfg, rnd + 1, weights)
        recipients = cfg.clients if cfg.downlink == "all" else len(np.unique(next_sel))
        net_rng = stream(cfg.seed, _S_NET, rnd)
        up_speeds = network.draw_speeds(net_rng, cfg.clients, cfg.up_mbps, net_cfg)
        down_speeds = network.draw_speeds(net_rng, cfg.clients, cfg.down_mbps, net_cfg)
        down_ids = np.arange(cfg.clients) if cfg.downlink == "all" else np.unique(next_sel)
        rec = RoundRecord(
            round=rnd + 1, iteration=t0 + E, lr=lrs[0], participants=selected.tolist(), up_bytes=up_bytes,
            down_msg_bytes=len(down_blob), down_recipients=recipients,
            comm_up_s=network.transfer_time(np.array(up_bytes), up_speeds[selected]),
            comm_down_s=network.transfer_time(np.full(len(down_ids), len(down_blob)), down_speeds[down_ids]),
            train_s=train_s, encode_s=enc_s, decode_s=dec_s,
            comp_s=max(per_client_time) + server_dec + t_senc + t_cdec)
        last = rnd + 1 == rounds
        if (rnd + 1) % every == 0 or last:
            with torch.no_grad():
                for p, g in zip(params, global_w):
                    p.copy_(g)
            rec.accuracy, rec.loss = _evaluate(model, data, x_te, y_te)
            if not np.isfinite(rec.loss):
                rec.loss = float("nan")
        records.append(rec)
        if on_round is not None:
            on_round(rec)
        if rec.accuracy is not None and target and rec.accuracy >= target:
            reached = rnd + 1
            break
        selected = next_sel
    labels = sorted({u.label() for u in ups})
    final = {n: g.numpy().copy() for n, g in zip(names, global_w)}
    return RunResult(codec, labels, down.label(), setup.d, records, reached, final)
