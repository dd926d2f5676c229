"""Flower (>= 1.42, Message API) integration: compressed model updates between ClientApps and a ServerApp.

- :func:`mucsc_mod`, a client mod (the pattern of Flower's ``fixedclipping_mod``): keeps the global
  arrays it received, calls the train function, encodes the update ``trained - global``
  (:func:`mucsc.update.make_update`: the one convention, ``new = base + update``) with a stateful
  :class:`mucsc.Compressor` (error feedback for biased codecs) and replaces the reply's ArrayRecord
  (same key) with one ``Array(dtype="uint8", shape=(len(blob),), stype="mucsc/2", data=blob)``.
  Codec and parameters come from the ConfigRecord the server sends; the compressor's state and the
  model version the node holds persist in ``context.state`` (ClientApps are ephemeral).
- :class:`MucscStrategy`, a wrapper around any Flower strategy (FedAvg, FedAdam, ...): injects the codec
  config in ``configure_train``, and in ``aggregate_train`` sums the ``mucsc/2`` replies' updates in O(d)
  memory when the wrapped strategy aggregates as FedAvg does, else decodes every reply into
  ``global + update`` under the same key and delegates; with ``downlink=`` it also sends the next global model as a
  compressed update to nodes holding the previous version (the full model otherwise), for train and
  evaluate messages alike.  It counts the bytes of the real Messages (:class:`Traffic`) and returns
  each round's bytes and ratios in the aggregated MetricRecord (Flower logs them and keeps them in
  the run's result); a client without the mod stops the run with an error naming it.

Authentication (optional): a client signs its messages (``make_mucsc_mod(key=, key_id=)``, or the node
config keys ``mucsc-key-file`` / ``mucsc-key-id``, or ``mucsc-key-dir`` in the node or run config) with a context naming the run, round and node, and
``MucscStrategy(keys=...)`` (a key map or lookup, as :func:`mucsc.decode` takes) refuses every reply
whose tag does not verify, so a message cannot be forged, altered or replayed into another round.

Flower's built-in aggregation calls ``Array.numpy()``, which refuses any stype but numpy's, so replies
from :func:`mucsc_mod` must go through :class:`MucscStrategy`.

May import: the public API (``import mucsc``, never ``mucsc.codec``) and :mod:`mucsc.update`; the
deprecated ``mucsc.flower.sim`` is an alias of the simulator's Flower engine
(:mod:`mucsc.fedsim.engines.flower`), imported only by name.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

try:
    from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord,
                          RecordDict)
    from flwr.clientapp.typing import ClientAppCallable
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import FedAvg, Strategy
except ImportError as exc:  # an optional extra: say how to get it
    raise ImportError("mucsc.flower needs Flower >= 1.42: pip install 'mucsc[flower]'") from exc

import mucsc
from mucsc.update import apply_update, make_update

STYPE = "mucsc/2"           # Array.stype of a compressed ArrayRecord's single Array (update = new - base)
LEGACY_STYPE = "mucsc/1"    # earlier releases sent base - new under this stype: refused, never mis-applied
ARRAY_KEY = "mucsc"         # the key of that Array inside its ArrayRecord
ERROR_CODE = 6              # flwr ErrorCode.MOD_FAILED_PRECONDITION

# ConfigRecord keys the server sends (train messages)
K_CODEC, K_PARAMS, K_EF, K_COMPRESS, K_SHARED, K_SEED = (
    "mucsc.codec", "mucsc.params", "mucsc.error-feedback", "mucsc.compress", "mucsc.shared", "mucsc.seed")
K_VERSION, K_BASE, K_ROUND = "mucsc.version", "mucsc.base", "mucsc.round"  # downlink: version of the model sent, and its base
R_INFO = "mucsc.info"       # ConfigRecord a mod adds to its reply (encode seconds); the strategy removes it
# context.state keys on the client
S_MODEL, S_META, S_MEMORY = "mucsc.model", "mucsc.meta", "mucsc.memory"


LOG = logging.getLogger("flwr")  # Flower's logger: shown by `flwr run --stream` and `flwr log`


class FlowerIntegrationError(mucsc.InputError):
    """A Message that does not fit the mucsc protocol (missing base version, key mismatch, a client
    without :func:`mucsc_mod`, ...)."""


# ---------------------------------------------------------------------------------------------- helpers

def compressed_record(blob: bytes) -> ArrayRecord:
    """An ArrayRecord holding one mucsc message (a non-empty uint8 shape: Flower's ``arrays_size_mod``
    calls ``.numpy()`` on empty shapes)."""
    return ArrayRecord({ARRAY_KEY: Array(dtype="uint8", shape=(len(blob),), stype=STYPE, data=bytes(blob))})


def is_compressed(record: ArrayRecord) -> bool:
    """True for an ArrayRecord made by :func:`compressed_record`; FlowerIntegrationError for one made by
    an earlier mucsc, whose update had the opposite sign (never to be taken for a model or applied)."""
    stype = record[ARRAY_KEY].stype if len(record) == 1 and ARRAY_KEY in record else None
    if stype == LEGACY_STYPE:
        raise FlowerIntegrationError(f"a {LEGACY_STYPE} update (base - new, from an earlier mucsc): this mucsc "
                                     f"sends and reads {STYPE} (new - base); upgrade every node together")
    return stype == STYPE


def record_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """{key: ndarray} of an ordinary (numpy-stype) ArrayRecord, in its order."""
    return {k: a.numpy() for k, a in record.items()}


def numpy_to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def model_update(new: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``new - base`` (:func:`mucsc.update.make_update`) with ``new`` first cast to the base model's
    dtypes: FedAvg returns integer arrays (step counters) as float64 averages, and a train function may
    hand back other float widths; the model keeps the dtypes the server gave it."""
    cast = {k: np.asarray(v).astype(base[k].dtype, copy=False) if k in base else v for k, v in new.items()}
    return make_update(cast, base)


def decode_record(record: ArrayRecord, keys: Any = None, context: str | None = None) -> dict[str, np.ndarray]:
    """The arrays of a compressed ArrayRecord's message, as a dict (a single array is keyed "").
    With ``keys`` the message must carry a valid tag over ``context`` (:class:`mucsc.AuthError`)."""
    blob = record[ARRAY_KEY].data
    out = mucsc.decode(blob) if keys is None else mucsc.decode(blob, keys=keys, context=context)
    return out if isinstance(out, dict) else {"": out}


def message_sizes(msg: Message) -> tuple[int, int]:
    """(payload, serialised) bytes of a Message: the sum of ``len(Array.data)`` over its ArrayRecords,
    and the sum of the deflated sizes of the Message and every object it contains (what Flower's
    object store transfers for it)."""
    payload = 0
    if msg.has_content():
        payload = sum(len(a.data) for rec in msg.content.array_records.values() for a in rec.values())
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    serialised = sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())
    return payload, serialised


def _config_of(msg: Message) -> tuple[str, ConfigRecord] | None:
    """The (key, ConfigRecord) that carries the mucsc codec config, or None."""
    for key, rec in msg.content.config_records.items():
        if K_CODEC in rec:
            return key, rec
    return None


def _single_array_record(content: RecordDict, what: str) -> tuple[str, ArrayRecord]:
    recs = content.array_records
    if len(recs) != 1:
        raise FlowerIntegrationError(f"{what} must hold exactly one ArrayRecord, it holds {len(recs)}")
    return next(iter(recs.items()))


@dataclasses.dataclass(frozen=True)
class CodecSpec:
    """What the server asks a client to encode with (sent in the train ConfigRecord)."""

    codec: str = "mucsc"
    params: tuple[tuple[str, Any], ...] = ()
    error_feedback: bool | None = None
    compress: str | int = "auto"
    shared: bool = True

    def settings(self) -> mucsc.Settings:
        """These as :class:`mucsc.Settings` (validated: a :class:`mucsc.SettingsError` when bad)."""
        return mucsc.Settings(self.codec, self.params, compress=self.compress, shared=self.shared,
                              error_feedback=self.error_feedback)

    @classmethod
    def from_settings(cls, settings: mucsc.Settings) -> CodecSpec:
        """What a client is asked to encode with, from :class:`mucsc.Settings` (its seed, threads, key
        and limits are not sent: seeds are per message, keys the client's own)."""
        return cls(settings.codec, settings.params, settings.error_feedback, settings.compress, settings.shared)

    def compressor(self) -> Any:
        return mucsc.Compressor(self.settings())

    def to_config(self) -> dict[str, Any]:
        ef = "auto" if self.error_feedback is None else ("on" if self.error_feedback else "off")
        return {K_CODEC: self.codec, K_PARAMS: json.dumps(dict(self.params), sort_keys=True), K_EF: ef,
                K_COMPRESS: str(self.compress), K_SHARED: bool(self.shared)}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> CodecSpec:
        try:
            params = json.loads(str(cfg.get(K_PARAMS, "{}")))
        except json.JSONDecodeError as exc:
            raise FlowerIntegrationError(f"{K_PARAMS} is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise FlowerIntegrationError(f"{K_PARAMS} must be a JSON object")
        ef = {"auto": None, "on": True, "off": False}.get(str(cfg.get(K_EF, "auto")))
        comp = str(cfg.get(K_COMPRESS, "auto"))
        return cls(str(cfg[K_CODEC]), tuple(sorted(params.items())), ef,
                   int(comp) if comp.isdigit() else comp, bool(cfg.get(K_SHARED, True)))

    def key(self) -> str:
        return json.dumps(self.to_config(), sort_keys=True)


def uplink_context(run_id: int, server_round: int, node_id: int) -> str:
    """What an uplink tag covers besides the bytes: the run, round and sending node (no replays)."""
    return f"mucsc/flower/up/run={int(run_id)}/round={int(server_round)}/node={int(node_id)}"


def derived_seed(*keys: int) -> int:
    """A non-negative 63-bit seed from integer keys (SeedSequence), e.g. (seed, round, node)."""
    ss = np.random.SeedSequence([int(k) % (1 << 64) for k in keys])
    return int(ss.generate_state(2, np.uint64)[0] >> np.uint64(1))


# ---------------------------------------------------------------------------------------------- client

def _save_compressor(state: RecordDict, spec: CodecSpec, comp: Any) -> None:
    sd = comp.state_dict()
    arrays = {f"{field}/{name}": np.ascontiguousarray(a)
              for field, table in sd["memory"].items() for name, a in table.items()}
    state[S_MEMORY] = numpy_to_record(arrays)
    meta = state[S_META] if S_META in state.config_records else ConfigRecord()
    meta["rounds"] = int(sd["rounds"])
    meta["spec"] = spec.key()
    meta["fields"] = json.dumps(sorted(sd["memory"]))
    state[S_META] = meta


def _load_compressor(state: RecordDict, spec: CodecSpec) -> Any:
    comp = spec.compressor()
    meta = state.config_records.get(S_META)
    if meta is None or meta.get("spec") != spec.key() or S_MEMORY not in state.array_records:
        return comp  # first round, or the server changed the codec: start without memory
    memory: dict[str, dict[str, np.ndarray]] = {f: {} for f in json.loads(str(meta["fields"]))}
    for key, arr in state.array_records[S_MEMORY].items():
        field, _, name = key.partition("/")
        memory.setdefault(field, {})[name] = arr.numpy()
    comp.load_state_dict({"rounds": int(meta["rounds"]), "memory": memory})
    return comp


def _restore_global(msg: Message, ctxt: Context, cfg: ConfigRecord,
                    keep: bool = True) -> tuple[str, dict[str, np.ndarray]]:
    """The global model the server means (applying a downlink update to the held version), written
    back into the message as ordinary arrays; with ``keep`` the held version is updated when the
    server tracks one (evaluate messages leave it: the next train message brings the same update)."""
    key, rec = _single_array_record(msg.content, "a mucsc message")
    version = cfg.get(K_VERSION)
    if is_compressed(rec):
        base = cfg.get(K_BASE)
        meta = ctxt.state.config_records.get(S_META)
        held = None if meta is None else meta.get("version")
        if base is None or held != base or S_MODEL not in ctxt.state.array_records:
            raise FlowerIntegrationError(f"downlink update against version {base}, this node holds {held}")
        glob = apply_update(record_to_numpy(ctxt.state.array_records[S_MODEL]), decode_record(rec))
        msg.content[key] = numpy_to_record(glob)
    else:
        glob = record_to_numpy(rec)
    if version is not None and keep:
        ctxt.state[S_MODEL] = numpy_to_record(glob)
        meta = ctxt.state[S_META] if S_META in ctxt.state.config_records else ConfigRecord()
        meta["version"] = int(version)
        ctxt.state[S_META] = meta
    return key, glob


def make_mucsc_mod(key: Any = None, key_id: str | None = None) -> Callable[[Message, Context, ClientAppCallable], Message]:
    """A :func:`mucsc_mod` that signs its messages with ``key`` under ``key_id`` (see
    :func:`mucsc.sign`).  Without a key, the node config's ``mucsc-key-file`` (read with
    :func:`mucsc.load_key`) and ``mucsc-key-id`` (default: the partition id or node id) are used when set.
    ``key`` may be a :class:`mucsc.Settings`: its key and key_id (the codec is the server's to choose)."""
    if isinstance(key, mucsc.Settings):  # the node's signing key from its settings (the codec is the server's)
        key, key_id = key.key, key.key_id
    if (key is None) != (key_id is None):
        raise mucsc.SettingsError("give both key and key_id, or neither")

    def mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        return _mod(msg, ctxt, call_next, key, key_id)

    mod.__name__ = mod.__qualname__ = "mucsc_mod"
    return mod


def _node_key(ctxt: Context, key: Any, key_id: str | None) -> tuple[Any, str | None]:
    """This node's signing key and key id: the mod's own, the node config's ``mucsc-key-file``, or
    ``DIR/ID.key`` of a key directory ``mucsc-key-dir`` (node config, else run config: a simulation
    cannot give each supernode its own node config, so there every node picks its key by partition id,
    the rule :func:`mucsc.load_keys` follows on the server)."""
    if key is not None:
        return key, key_id
    kid = str(ctxt.node_config.get("mucsc-key-id", ctxt.node_config.get("partition-id", ctxt.node_id)))
    path = ctxt.node_config.get("mucsc-key-file")
    if path:
        return mucsc.load_key(str(path)), kid
    directory = ctxt.node_config.get("mucsc-key-dir", ctxt.run_config.get("mucsc-key-dir"))
    if not directory:
        return None, None
    found = mucsc.load_keys(str(directory))(kid)
    if found is None:
        raise FlowerIntegrationError(f"no key for key id {kid!r} in {directory} (want {kid}.key)")
    return found, kid


def mucsc_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Client mod: compress the reply's model to a mucsc message of ``trained - global``.

    Acts on train messages whose ConfigRecord holds ``mucsc.codec`` (sent by :class:`MucscStrategy`);
    anything else passes through unchanged.  Errors (a downlink update for a version this node does
    not hold, a reply whose keys differ from the model's) become an error reply naming the problem.
    Signs its messages when the node config names a key (``mucsc-key-file``); see :func:`make_mucsc_mod`.
    """
    return _mod(msg, ctxt, call_next, None, None)


def _mod(msg: Message, ctxt: Context, call_next: ClientAppCallable, key: Any, key_id: str | None) -> Message:
    kind = msg.metadata.message_type.split(".")[0]
    found = _config_of(msg) if msg.has_content() and kind in (MessageType.TRAIN, MessageType.EVALUATE) else None
    if found is None:
        return call_next(msg, ctxt)
    _, cfg = found
    if kind == MessageType.EVALUATE:
        return _evaluate(msg, ctxt, call_next, cfg)
    try:
        spec = CodecSpec.from_config(cfg)
        in_key, glob = _restore_global(msg, ctxt, cfg)
    except mucsc.MucscError as exc:
        return Message(Error(ERROR_CODE, f"mucsc_mod: {exc}"), reply_to=msg)
    out = call_next(msg, ctxt)
    if out.has_error():
        return out
    try:
        out_key, rec = _single_array_record(out.content, "the train reply")
        if out_key != in_key:
            raise FlowerIntegrationError(f"reply ArrayRecord key {out_key!r} differs from {in_key!r}")
        update = model_update(record_to_numpy(rec), glob)
        comp = _load_compressor(ctxt.state, spec)
        seed = int(cfg.get(K_SEED, 0))
        epoch = int(cfg.get(K_ROUND, cfg.get("server-round", 1))) - 1  # DGC's warm-up follows the round
        t0 = time.perf_counter()
        blob = comp.compress(update, seed, epoch=epoch)
        key, key_id = _node_key(ctxt, key, key_id)
        if key is not None:
            blob = mucsc.sign(blob, key, key_id, uplink_context(msg.metadata.run_id, epoch + 1, ctxt.node_id))
        encode_s = time.perf_counter() - t0
        _save_compressor(ctxt.state, spec, comp)
    except mucsc.MucscError as exc:
        return Message(Error(ERROR_CODE, f"mucsc_mod: {exc}"), reply_to=msg)
    out.content[out_key] = compressed_record(blob)
    out.content[R_INFO] = ConfigRecord({"encode-s": encode_s})
    return out


def _evaluate(msg: Message, ctxt: Context, call_next: ClientAppCallable, cfg: ConfigRecord) -> Message:
    """An evaluate message from :class:`MucscStrategy`: rebuild the model it means (a downlink update
    against the held version, or the full model) and call the evaluate function; the node's held
    version and compressor state are left as they are."""
    try:
        _restore_global(msg, ctxt, cfg, keep=False)
    except mucsc.MucscError as exc:
        return Message(Error(ERROR_CODE, f"mucsc_mod: {exc}"), reply_to=msg)
    out = call_next(msg, ctxt)
    if not out.has_error():
        out.content[R_INFO] = ConfigRecord({"encode-s": 0.0})
    return out


# ---------------------------------------------------------------------------------------------- server

@dataclasses.dataclass(frozen=True)
class MessageTraffic:
    """One Message of a training round: who, which way, its payload and serialised bytes."""

    round: int
    node_id: int
    direction: str      # "down" (server -> node) or "up"
    payload_bytes: int  # sum of len(Array.data): the mucsc message, or the numpy arrays when uncompressed
    message_bytes: int  # the Message and all its objects, deflated (what Flower transfers)
    compressed: bool
    kind: str = "train"  # "train" or "evaluate" (the Message's type)
    model_bytes: int = 0  # what the model's arrays take uncompressed (the ratio's numerator)


class Traffic:
    """Bytes of every training Message, per node and round, measured from the real Messages."""

    FIELDS = ("round", "node_id", "direction", "payload_bytes", "message_bytes", "compressed", "kind", "model_bytes")

    def __init__(self) -> None:
        self.messages: list[MessageTraffic] = []

    def add(self, rnd: int, msg: Message, direction: str, node_id: int, kind: str = "train",
            model_bytes: int = 0) -> MessageTraffic:
        payload, serialised = message_sizes(msg)
        compressed = msg.has_content() and any(is_compressed(r) for r in msg.content.array_records.values())
        entry = MessageTraffic(rnd, int(node_id), direction, payload, serialised, bool(compressed), kind,
                               int(model_bytes))
        self.messages.append(entry)
        return entry

    def round(self, rnd: int, kind: str = "train") -> list[MessageTraffic]:
        """This round's Messages of one kind (train or evaluate)."""
        return [m for m in self.messages if m.round == rnd and m.kind == kind]

    def metrics(self, rnd: int, kind: str = "train") -> dict[str, int | float]:
        """A round's bytes as Flower metrics: payload bytes up and down, and how many times smaller
        they are than the same Messages with uncompressed models (1.0: nothing was compressed)."""
        out: dict[str, int | float] = {}
        for direction in ("up", "down"):
            ms = [m for m in self.round(rnd, kind) if m.direction == direction]
            sent, dense = sum(m.payload_bytes for m in ms), sum(m.model_bytes for m in ms)
            if not (sent or dense):
                continue  # e.g. evaluate replies: metrics only, no model
            out[f"mucsc-bytes-{direction}"] = sent
            out[f"mucsc-ratio-{direction}"] = round(dense / sent, 3) if sent and dense else 0.0
        return out

    def summary(self) -> str:
        """One line per kind and direction: payload bytes of all Messages and the ratio to uncompressed."""
        lines = []
        for kind in ("train", "evaluate"):
            for direction in ("up", "down"):
                ms = [m for m in self.messages if m.kind == kind and m.direction == direction]
                sent, dense = sum(m.payload_bytes for m in ms), sum(m.model_bytes for m in ms)
                if not (sent or dense):
                    continue
                ratio = f" ({dense / sent:.1f}x smaller than the {dense:,} B of uncompressed models)" if sent else ""
                lines.append(f"mucsc {kind} {'uplink' if direction == 'up' else 'downlink'}: {sent:,} B in "
                             f"{len(ms)} messages{ratio}")
        return "\n".join(lines) or "mucsc: no messages"

    def rounds(self) -> list[dict[str, int]]:
        """Per round (train Messages): bytes_up / bytes_down (payloads), the same Messages' bytes with
        uncompressed models (bytes_up_uncompressed / bytes_down_uncompressed), their serialised totals,
        down recipients."""
        out = []
        for rnd in sorted({m.round for m in self.messages}):
            ms = self.round(rnd)
            up = [m for m in ms if m.direction == "up"]
            down = [m for m in ms if m.direction == "down"]
            out.append({"round": rnd, "bytes_up": sum(m.payload_bytes for m in up),
                        "bytes_down": sum(m.payload_bytes for m in down),
                        "bytes_up_uncompressed": sum(m.model_bytes for m in up),
                        "bytes_down_uncompressed": sum(m.model_bytes for m in down),
                        "message_bytes_up": sum(m.message_bytes for m in up),
                        "message_bytes_down": sum(m.message_bytes for m in down),
                        "down_recipients": len(down), "down_compressed": sum(m.compressed for m in down)})
        return out

    def write_csv(self, path: str | Path) -> None:
        """One row per Message."""
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, self.FIELDS)
            w.writeheader()
            for m in self.messages:
                w.writerow(dataclasses.asdict(m))


class MucscStrategy(Strategy):
    """Wrap a Flower strategy so that training replies travel as mucsc messages (uplink) and,
    optionally, the global model as a compressed update (downlink).

    ``codec`` / ``params`` / ``error_feedback`` / ``compress`` / ``shared``: the clients' encoder, or
    ``codec`` a :class:`mucsc.Settings` holding them and the seed (a
    train message's ConfigRecord may already name its own ``mucsc.*`` keys, which are kept: per-client
    codecs).  Each uplink message's seed is ``derived_seed(seed, round, node_id)`` unless the message's
    config sets ``mucsc.seed``.  ``downlink``: a codec name for the server's update, with
    ``downlink_params`` and ``downlink_seed(round) -> int``; the aggregate the wrapped strategy returns is
    then replaced by ``previous + decode(encode(aggregate - previous))``, exactly what the clients
    rebuild, and nodes holding the previous version get the compressed update (others the full model).
    ``keys`` (a mapping key id -> key, or a callable): every uplink message must carry a tag that
    verifies over its run, round and node (:func:`uplink_context`); replies that fail are left out of
    the aggregate and listed in ``rejected`` (round, node, reason).  The downlink is not signed.

    Aggregation: when the wrapped strategy aggregates as FedAvg does (FedAvg, or a subclass that does
    not override ``aggregate_train``: ``sums_updates`` is True) the replies' updates are added one by one
    to a :class:`mucsc.Aggregator` weighted by FedAvg's ``weighted_by_key``, and the new model is
    ``global + weighted mean of the updates``: O(d) memory on the server whatever the number of
    replies, the same model as FedAvg over the decoded models up to float rounding.  Any other strategy
    (FedAdam, FedMedian, your own ``aggregate_train``) gets every reply decoded into ``global + update``
    and aggregates them itself (K decoded models in memory at once).
    """

    def __init__(self, strategy: Strategy, codec: Any = "mucsc", *, error_feedback: bool | None = None,
                 compress: str | int = "auto", shared: bool = True, seed: int = 0, downlink: str | None = None,
                 downlink_params: Mapping[str, Any] | None = None, downlink_error_feedback: bool | None = None,
                 downlink_seed: Callable[[int], int] | None = None, keys: Any = None, **params: Any) -> None:
        if not isinstance(strategy, Strategy):
            raise mucsc.ParameterError(f"strategy must be a Flower Strategy, got {type(strategy).__name__}")
        self.strategy = strategy
        if isinstance(codec, mucsc.Settings):  # the clients' whole encoder configuration (and the seed)
            self.spec = CodecSpec.from_settings(codec)
            seed = codec.seed
        else:
            self.spec = CodecSpec(codec, tuple(sorted(params.items())), error_feedback, compress, shared)
        self.spec.compressor()  # validates codec, parameters and memory options now
        self.seed = int(seed)
        self.keys = keys
        self.rejected: list[tuple[int, int, str]] = []
        self.arrayrecord_key = getattr(strategy, "arrayrecord_key", "arrays")
        self.configrecord_key = getattr(strategy, "configrecord_key", "config")
        self.traffic = Traffic()
        # per round: clients' encode seconds (from their replies), server decode and downlink encode seconds
        self.timing: dict[int, dict[str, Any]] = {}
        self._down = None if downlink is None else mucsc.Compressor(
            downlink, error_feedback=downlink_error_feedback, compress=compress, **dict(downlink_params or {}))
        self.downlink = downlink
        self._downlink_seed = downlink_seed or (lambda rnd: derived_seed(self.seed, rnd, 1 << 62))
        self._version = -1
        self._current: dict[str, np.ndarray] | None = None  # the global model of this version
        self._current_record: ArrayRecord | None = None     # the ArrayRecord we handed out for it
        self._down_blob: bytes | None = None                 # update from version - 1 to version
        self._sent: dict[int, int] = {}                      # node -> version sent this round
        self._holds: dict[int, int] = {}                     # node -> version it confirmed holding
        # FedAvg's aggregation (FedAvg, or a subclass that keeps its aggregate_train, e.g. FedProx):
        # the updates are summed as they are read (mucsc.Aggregator), never all decoded at once
        self.sums_updates = (isinstance(strategy, FedAvg)
                             and type(strategy).aggregate_train is FedAvg.aggregate_train)

    def summary(self) -> None:
        self.strategy.summary()

    # -- training --------------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if arrays is not self._current_record:  # a model we did not produce (the initial one)
            self._version += 1
            self._current = record_to_numpy(arrays)
            self._current_record = arrays
            self._down_blob = None
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._sent = {}
        for msg in messages:
            self._address(msg, server_round, "train")
            self._sent[msg.metadata.dst_node_id] = self._version
        return messages

    def _model_bytes(self) -> int:
        return 0 if self._current is None else sum(int(a.nbytes) for a in self._current.values())

    def _address(self, msg: Message, server_round: int, kind: str) -> None:
        """Add the codec config (and, with a downlink codec, the model version) to a train or evaluate
        message, replace its model by the compressed update where the node holds the previous
        version, and count its bytes."""
        node = msg.metadata.dst_node_id
        records = dict(msg.content.items())  # the wrapped strategy may share one RecordDict
        cfg = ConfigRecord(dict(records.get(self.configrecord_key, ConfigRecord())))
        for k, v in self.spec.to_config().items():
            cfg.setdefault(k, v)
        cfg.setdefault(K_SEED, derived_seed(self.seed, server_round, node))
        cfg[K_ROUND] = server_round
        if self._down is not None:
            cfg[K_VERSION] = self._version
            holds = self._holds.get(node)
            if self._down_blob is not None and holds == self._version - 1:
                records[self.arrayrecord_key] = compressed_record(self._down_blob)
                cfg[K_BASE] = holds
            else:
                cfg[K_BASE] = -1
        records[self.configrecord_key] = cfg
        msg.content = RecordDict(records)
        self.traffic.add(server_round, msg, "down", node, kind, self._model_bytes())

    def _received(self, server_round: int, msg: Message, kind: str) -> None:
        """Count a reply's bytes and stop the run, naming the node, when its ClientApp lacks the mod
        (an uncompressed reply, or Flower's "Unsupported serialization type" on a compressed model)."""
        node = msg.metadata.src_node_id
        self.traffic.add(server_round, msg, "up", node, kind, self._model_bytes() if kind == "train" else 0)
        if msg.has_error():
            lacks = f"'{STYPE}'" in msg.error.reason
        else:
            lacks = R_INFO not in msg.content.config_records
        if lacks:
            raise FlowerIntegrationError(
                f"node {node} answered a mucsc {kind} message without mucsc_mod (its reply "
                + (f"is the error {msg.error.reason!r}" if msg.has_error() else "has no mucsc message")
                + "): list it in the ClientApp's mods, ClientApp(mods=[mucsc_mod])")

    def decode_reply(self, msg: Message, server_round: int | None = None) -> Message:
        """Replace a reply's ``mucsc/2`` ArrayRecord by the client's model ``global + update``
        (and remove the mod's info record)."""
        if not msg.has_content():
            return msg
        if R_INFO in msg.content.config_records:
            del msg.content[R_INFO]
        for key, rec in list(msg.content.array_records.items()):
            if is_compressed(rec):
                if self._current is None:
                    raise FlowerIntegrationError("a compressed reply before any model was sent")
                ctx = None if server_round is None else uplink_context(msg.metadata.run_id, server_round,
                                                                         msg.metadata.src_node_id)
                if self.keys is not None and ctx is None:
                    raise mucsc.ParameterError("verifying a signed reply needs its server round")
                decoded = decode_record(rec, self.keys, ctx)
                msg.content[key] = numpy_to_record(apply_update(self._current, decoded))
        return msg

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[Any, Any]:
        # Replies come in the order the nodes finished; sorting makes the float sums of the wrapped
        # strategy, and so the model, independent of timing.
        replies = sorted(replies, key=lambda m: m.metadata.src_node_id)
        for msg in replies:
            node = msg.metadata.src_node_id
            self._received(server_round, msg, "train")
            if msg.has_error():
                self._holds.pop(node, None)  # e.g. lost its state: send the full model next time
            elif node in self._sent:
                self._holds[node] = self._sent[node]
        timing = self.timing.setdefault(server_round, {"encode_s": [], "decode_s": 0.0, "down_encode_s": 0.0})
        timing["encode_s"] = [float(m.content[R_INFO]["encode-s"]) for m in replies
                              if m.has_content() and R_INFO in m.content.config_records]
        if self.sums_updates:
            done = self._aggregate_updates(server_round, replies, timing)
            if done is not None:
                return self._with_downlink(server_round, *done, timing)
        t0 = time.perf_counter()
        decoded = []
        for m in replies:
            try:
                decoded.append(self.decode_reply(m, server_round))
            except mucsc.AuthError as exc:  # forged, altered, replayed or unsigned: not aggregated
                self._reject(server_round, m.metadata.src_node_id, exc)
        timing["decode_s"] = time.perf_counter() - t0
        arrays, metrics = self.strategy.aggregate_train(server_round, decoded)
        return self._with_downlink(server_round, arrays, metrics, timing)

    def _reject(self, server_round: int, node: int, exc: Exception) -> None:
        """A reply whose tag does not verify (forged, altered, replayed or unsigned): not aggregated."""
        self.rejected.append((server_round, node, str(exc)))
        self._holds.pop(node, None)
        LOG.warning("mucsc: round %d: reply of node %d rejected (not aggregated): %s", server_round, node, exc)

    def _aggregate_updates(self, server_round: int, replies: list[Message],
                           timing: dict[str, Any]) -> tuple[ArrayRecord | None, MetricRecord | None] | None:
        """FedAvg's ``aggregate_train`` (its reply checks, weights and metrics) with the model as
        ``global + weighted mean of the updates``, summed by one :class:`mucsc.Aggregator` as the
        replies are read (O(d) memory, not K decoded models); None (the caller decodes every reply
        and asks the wrapped strategy) when a valid reply is not one compressed ArrayRecord."""
        strategy = self.strategy
        check = getattr(strategy, "_check_and_log_replies", None)  # FedAvg's own (Flower 1.42); else decode all
        if check is None:
            return None
        valid, _ = check(replies, is_train=True)
        if not valid:
            return None, None
        if not all(len(m.content.array_records) == 1 and is_compressed(next(iter(m.content.array_records.values())))
                   for m in valid):
            return None
        if self._current is None:
            raise FlowerIntegrationError("a compressed reply before any model was sent")
        t0 = time.perf_counter()
        agg, kept = mucsc.Aggregator(), []
        for m in valid:  # in node order (sorted by the caller): the same sums whatever the timing
            if R_INFO in m.content.config_records:
                del m.content[R_INFO]
            rec = next(iter(m.content.array_records.values()))
            weight = float(next(iter(m.content.metric_records.values()))[strategy.weighted_by_key])
            node = m.metadata.src_node_id
            try:
                if self.keys is None:
                    agg.add(rec[ARRAY_KEY].data, weight=weight)
                else:
                    agg.add(rec[ARRAY_KEY].data, weight=weight, keys=self.keys,
                            context=uplink_context(m.metadata.run_id, server_round, node))
            except mucsc.AuthError as exc:
                self._reject(server_round, node, exc)
                continue
            kept.append(m.content)
        timing["decode_s"] = time.perf_counter() - t0
        if not kept:
            return None, None
        mean = agg.result()
        model = apply_update(self._current, mean if isinstance(mean, dict) else {"": mean})
        return numpy_to_record(model), strategy.train_metrics_aggr_fn(kept, strategy.weighted_by_key)

    def _with_downlink(self, server_round: int, arrays: ArrayRecord | None, metrics: MetricRecord | None,
                       timing: dict[str, Any]) -> tuple[Any, Any]:
        """The round's traffic in the metrics, and with a downlink codec the model the clients rebuild."""
        metrics = self._with_traffic(metrics, server_round, "train")
        if arrays is None:
            return arrays, metrics
        if self._down is None:
            self._current_record = None  # next configure_train takes it as a new version
            return arrays, metrics
        new = record_to_numpy(arrays)
        t0 = time.perf_counter()
        blob = self._down.compress(model_update(new, self._current), self._downlink_seed(server_round),
                                   epoch=server_round - 1)
        applied = apply_update(self._current, decode_record(compressed_record(blob)))
        timing["down_encode_s"] = time.perf_counter() - t0
        self._version += 1
        self._current, self._down_blob = applied, blob
        self._current_record = numpy_to_record(applied)
        return self._current_record, metrics

    def _with_traffic(self, metrics: MetricRecord | None, server_round: int, kind: str) -> MetricRecord:
        """The wrapped strategy's aggregated metrics plus this round's bytes, ratios and rejections
        (Flower logs them per round and keeps them in the run's result)."""
        out = MetricRecord(dict(metrics or {}))
        out.update(self.traffic.metrics(server_round, kind))
        if kind == "train":
            out["mucsc-rejected"] = sum(1 for r in self.rejected if r[0] == server_round)
        return out

    # -- evaluation: the model travels like a train message's (compressed update or full model) -----
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        messages = list(self.strategy.configure_evaluate(server_round, arrays, config, grid))
        if arrays is not self._current_record and self._down is not None:
            return messages  # not the model this strategy produced: send it as the wrapped strategy does
        for msg in messages:
            self._address(msg, server_round, "evaluate")
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        replies = list(replies)
        for msg in replies:
            self._received(server_round, msg, "evaluate")
            if msg.has_content() and R_INFO in msg.content.config_records:
                del msg.content[R_INFO]
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        return self._with_traffic(metrics, server_round, "evaluate")


__all__ = [
    "ARRAY_KEY", "STYPE", "CodecSpec", "FlowerIntegrationError", "MessageTraffic", "MucscStrategy", "Traffic",
    "compressed_record", "decode_record", "derived_seed", "is_compressed", "make_mucsc_mod", "message_sizes",
    "mucsc_mod", "uplink_context",
]
