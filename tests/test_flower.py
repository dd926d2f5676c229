"""Flower integration: a ClientApp(mods=[mucsc_mod]) called directly (with Flower's task identity set as
its simulation does), the strategy wrapper's aggregate against FedAvg over decoded updates, persistent
error feedback in context.state, downlink updates against the held version, and real byte counts."""

import json
import logging
import os

import numpy as np
import pytest

import mucsc

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
flwr = pytest.importorskip("flwr", reason="Flower not installed (pip install 'mucsc[flower]')")

from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from mucsc.flower import (  # noqa: E402
    STYPE,
    MucscStrategy,
    compressed_record,
    decode_record,
    is_compressed,
    make_mucsc_mod,
    mucsc_mod,
)

SERVER = 1  # Flower's SuperLink node id


@pytest.fixture(autouse=True)
def task_identity():
    """The ServerApp's identity, as Flower's runtime sets it before a strategy builds Messages."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SERVER
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class FakeGrid:
    """The part of a Grid that Flower's strategies use to sample nodes."""

    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return list(self.nodes)


def _model(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(40, 30)).astype(np.float32), "b": rng.normal(size=30).astype(np.float32),
            "steps": np.array([3], dtype=np.int64)}


def _client_app(lr=0.1, n=10, mod=mucsc_mod):
    app = ClientApp(mods=[mod])

    @app.train()
    def train(msg, context):
        arrays = msg.content["arrays"]
        node = context.node_id
        rng = np.random.default_rng(node)
        out = {}
        for k, a in arrays.items():
            x = a.numpy()
            out[k] = x + 1 if x.dtype.kind != "f" else x - lr * rng.normal(size=x.shape).astype(x.dtype)
        reply = RecordDict({"arrays": ArrayRecord({k: flwr.app.Array(v) for k, v in out.items()}),
                            "metrics": MetricRecord({"num-examples": n + node % 7})})
        return Message(reply, reply_to=msg)

    return app


def _context(node):
    return Context(run_id=7, node_id=node, node_config={"partition-id": node}, state=RecordDict(), run_config={})


def _deliver(messages, contexts, app):
    """What the simulation does: the node's ClientApp handles the message; reply back to the server."""
    return [_wire(app(_wire(m), contexts[m.metadata.dst_node_id])) for m in messages]


def _wire(msg):
    """Deflate a Message into Flower's object contents and inflate a new one, as its transport does."""
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(msg).items()}
    return inflate_object_from_contents(msg.object_id, contents)


def test_mod_replaces_reply_with_one_mucsc_array_and_strategy_matches_fedavg():
    nodes = [11, 12, 13]
    model = _model()
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    inner = FedAvg(fraction_evaluate=0.0, min_train_nodes=3, min_available_nodes=3)
    strategy = MucscStrategy(inner, codec="mucsc", seed=4, z=16)
    contexts = {n: _context(n) for n in nodes}
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    assert len(messages) == 3
    cfg = messages[0].content["config"]
    assert cfg["mucsc.codec"] == "mucsc" and '"z": 16' in cfg["mucsc.params"]
    seeds = {m.content["config"]["mucsc.seed"] for m in messages}
    assert len(seeds) == 3  # one seed per node
    replies = _deliver(messages, contexts, _client_app())
    for r in replies:
        rec = r.content["arrays"]
        assert is_compressed(rec)
        (arr,) = rec.values()
        assert arr.stype == STYPE and arr.dtype == "uint8" and arr.shape == (len(arr.data),) and len(arr.data) > 0
        assert len(arr.data) < sum(v.nbytes for v in model.values()) / 3
    # the wrapper's aggregate equals FedAvg over the decoded client models
    expected_models = []
    for r in replies:
        upd = decode_record(r.content["arrays"])
        expected_models.append({k: (model[k] + upd[k]) if model[k].dtype.kind == "f" else upd[k] for k in model})
    weights = np.array([float(r.content["metrics"]["num-examples"]) for r in replies])
    sizes = {r.metadata.src_node_id: len(r.content["arrays"]["mucsc"].data) for r in replies}
    agg, metrics = strategy.aggregate_train(1, replies)
    got = {k: a.numpy() for k, a in agg.items()}
    for k in model:
        want = sum(w * m[k].astype(np.float64) for w, m in zip(weights, expected_models)) / weights.sum()
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6)
    assert got["steps"][0] == 4  # non-float arrays travel losslessly (FedAvg itself averages them as floats)
    # FedAvg: the updates were summed by a mucsc.Aggregator, no reply was decoded into a model
    assert strategy.sums_updates and all(is_compressed(r.content["arrays"]) for r in replies)
    # bytes from the real messages
    rows = strategy.traffic.rounds()
    assert rows[0]["round"] == 1 and rows[0]["down_recipients"] == 3
    up = [m for m in strategy.traffic.messages if m.direction == "up"]
    assert {m.node_id: m.payload_bytes for m in up} == sizes and all(m.compressed for m in up)
    assert rows[0]["bytes_up"] == sum(sizes.values())
    assert all(m.message_bytes > m.payload_bytes > 0 for m in strategy.traffic.messages)


def test_mod_passes_through_without_mucsc_config_and_on_evaluate():
    app = _client_app()
    ctx = _context(5)
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in _model().items()})
    msg = Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": 0.1})}), dst_node_id=5,
                  message_type=MessageType.TRAIN)
    reply = app(msg, ctx)
    assert not is_compressed(reply.content["arrays"])
    assert len(ctx.state) == 0


def test_error_feedback_state_persists_in_context_across_rounds():
    """Two rounds of a biased codec through the mod equal one stateful Compressor run directly."""
    nodes = [21, 22]
    model = _model(1)
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    strategy = MucscStrategy(FedAvg(fraction_evaluate=0.0), codec="topk", seed=2, keep=0.05)
    contexts = {n: _context(n) for n in nodes}
    app = _client_app()
    ref = mucsc.Compressor("topk", keep=0.05)
    for rnd in (1, 2):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord(), FakeGrid(nodes)))
        msg21 = next(m for m in msgs if m.metadata.dst_node_id == 21)
        glob = {k: a.numpy() for k, a in msg21.content["arrays"].items()}
        seed = msg21.content["config"]["mucsc.seed"]
        replies = _deliver(msgs, contexts, app)
        r21 = next(r for r in replies if r.metadata.src_node_id == 21)
        blob = r21.content["arrays"]["mucsc"].data
        rng = np.random.default_rng(21)   # the train function's draws for node 21
        trained = {k: (v - 0.1 * rng.normal(size=v.shape).astype(v.dtype)) if v.dtype.kind == "f" else v + 1
                   for k, v in glob.items()}
        upd = {k: (trained[k] - glob[k]).astype(glob[k].dtype) if glob[k].dtype.kind == "f" else trained[k]
               for k in glob}  # the update is new - base (mucsc.update)
        assert blob == ref.compress(upd, seed, epoch=rnd - 1)
        assert "mucsc.memory" in contexts[21].state.array_records
        arrays, _ = strategy.aggregate_train(rnd, replies)
    assert np.count_nonzero(ref.residual["w"]) > 0


def test_downlink_update_against_the_held_version():
    nodes = [31, 32, 33]
    model = _model(2)
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    inner = FedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2, fraction_train=0.5)
    strategy = MucscStrategy(inner, codec="mucsc", seed=3, z=16, downlink="mucsc", downlink_params={"z": 64})
    contexts = {n: _context(n) for n in nodes}
    app = _client_app()
    history = {0: model}   # the server's model of each version
    held = {}              # node -> version it was sent and confirmed
    for rnd in range(1, 5):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord(), FakeGrid(nodes)))
        for m in msgs:
            node, cfg = m.metadata.dst_node_id, m.content["config"]
            compressed = is_compressed(m.content["arrays"])
            # compressed exactly when the node holds the previous version
            assert compressed == (held.get(node) == cfg["mucsc.version"] - 1)
            assert cfg["mucsc.base"] == (cfg["mucsc.version"] - 1 if compressed else -1)
        replies = _deliver(msgs, contexts, app)
        for m, r in zip(msgs, replies):
            assert not r.has_error()
            node, version = m.metadata.dst_node_id, m.content["config"]["mucsc.version"]
            held[node] = version
            mine = {k: a.numpy() for k, a in contexts[node].state["mucsc.model"].items()}
            for k in model:   # the node rebuilt exactly the server's model of that version
                np.testing.assert_array_equal(mine[k], history[version][k])
        arrays, _ = strategy.aggregate_train(rnd, replies)
        history[rnd] = {k: a.numpy() for k, a in arrays.items()}
    down = [m for m in strategy.traffic.messages if m.direction == "down"]
    assert any(m.compressed for m in down) and any(not m.compressed for m in down)
    full = max(m.payload_bytes for m in down if not m.compressed)
    assert all(m.payload_bytes < full / 3 for m in down if m.compressed)


def test_node_that_lost_its_state_gets_an_error_and_then_the_full_model():
    nodes = [41, 42]
    model = _model(3)
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    strategy = MucscStrategy(FedAvg(fraction_evaluate=0.0), codec="mucsc", z=8, downlink="mucsc")
    contexts = {n: _context(n) for n in nodes}
    app = _client_app()
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    arrays, _ = strategy.aggregate_train(1, _deliver(msgs, contexts, app))
    contexts[41] = _context(41)   # node 41 restarted: no held model
    msgs = list(strategy.configure_train(2, arrays, ConfigRecord(), FakeGrid(nodes)))
    assert all(is_compressed(m.content["arrays"]) for m in msgs)
    replies = _deliver(msgs, contexts, app)
    r41 = next(r for r in replies if r.metadata.src_node_id == 41)
    assert r41.has_error() and "holds None" in r41.error.reason
    arrays, _ = strategy.aggregate_train(2, replies)
    msgs = list(strategy.configure_train(3, arrays, ConfigRecord(), FakeGrid(nodes)))
    by_node = {m.metadata.dst_node_id: is_compressed(m.content["arrays"]) for m in msgs}
    assert by_node == {41: False, 42: True}


def test_strategy_validates_and_compressed_record_shape():
    with pytest.raises(mucsc.UnknownCodecError):
        MucscStrategy(FedAvg(), codec="nope")
    with pytest.raises(mucsc.ParameterError):
        MucscStrategy(FedAvg(), codec="mucsc", z=0)
    with pytest.raises(mucsc.ParameterError):
        MucscStrategy(object(), codec="mucsc")
    rec = compressed_record(b"\x01\x02\x03")
    assert rec["mucsc"].shape == (3,) and rec["mucsc"].stype == STYPE


def test_legacy_opposite_sign_records_are_refused():
    """mucsc/1 records (base - new, earlier releases) are never taken for ours (mucsc.update's new - base)."""
    from mucsc.flower import FlowerIntegrationError

    rec = ArrayRecord({"mucsc": flwr.app.Array(dtype="uint8", shape=(3,), stype="mucsc/1", data=b"abc")})
    with pytest.raises(FlowerIntegrationError, match="mucsc/1 update"):
        is_compressed(rec)


@pytest.mark.slow
def test_sim_engine_flower_10_supernodes_3_rounds_agrees_with_builtin(tmp_path, caplog, recwarn):
    """`mucsc sim --engine flower`: a `flwr run` of 10 supernodes on Ray (num_cpus 1 each), 3 rounds; the
    same uplink bytes as the built-in engine (fixed-width messages, same inputs and seeds), accuracy within
    noise, the downlink counted from the real Messages (full models, then updates), and no Flower
    deprecation warning (in this process or in flwr's log)."""
    pytest.importorskip("ray", reason="Flower's simulation engine needs ray (pip install 'mucsc[flower]')")
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import csv

    from click.testing import CliRunner

    from mucsc.fedsim.cli import sim

    args = ["--model", "logreg", "-N", "10", "-K", "3", "-E", "2", "-B", "8", "--rounds", "3", "--target", "0",
            "--eval-every", "1", "--samples-per-client", "40", "--codecs", "mucsc", "--compress", "off"]
    caplog.set_level(logging.DEBUG, logger="mucsc.fedsim.flower")
    rows = {}
    for engine in ("builtin", "flower"):
        out = tmp_path / engine
        r = CliRunner().invoke(sim, args + ["--engine", engine, "-o", str(out)], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        rows[engine] = list(csv.DictReader((out / "mucsc" / "rounds.csv").read_text().splitlines()))
    b, f = rows["builtin"], rows["flower"]
    assert len(b) == len(f) == 3
    assert [r["bytes_up"] for r in b] == [r["bytes_up"] for r in f]
    for rb, rf in zip(b, f):
        assert abs(float(rb["accuracy"]) - float(rf["accuracy"])) < 0.1
        assert int(rf["down_recipients"]) == 3          # only the participants receive anything
    assert int(f[0]["bytes_down"]) > 3 * int(f[1]["down_msg_bytes"])  # round 1: 3 full models
    flwr_log = "\n".join(r.getMessage() for r in caplog.records if r.name == "mucsc.fedsim.flower")
    assert "(10 simulated SuperNodes)" in flwr_log, flwr_log[-4000:]
    assert "deprecat" not in flwr_log.lower(), flwr_log[-4000:]
    flower_warnings = [str(w.message) for w in recwarn
                       if issubclass(w.category, (DeprecationWarning, FutureWarning)) and "flwr" in w.filename]
    assert not flower_warnings, flower_warnings


def test_signed_uplinks_verify_and_forged_or_replayed_ones_are_rejected(caplog):
    if not hasattr(mucsc, "sign"):
        pytest.skip("this mucsc has no message authentication")
    nodes = [51, 52, 53]
    keys = {str(n): mucsc.generate_key() for n in nodes}
    model = _model(4)
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    strategy = MucscStrategy(FedAvg(fraction_evaluate=0.0, min_available_nodes=3), codec="mucsc", z=8,
                             keys={k: v for k, v in keys.items() if k != "53"})  # 53's key is unknown
    contexts = {n: _context(n) for n in nodes}
    apps = {n: _client_app(mod=make_mucsc_mod(key=keys[str(n)], key_id=str(n))) for n in nodes}
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    replies = [_wire(apps[m.metadata.dst_node_id](_wire(m), contexts[m.metadata.dst_node_id])) for m in msgs]
    kept = {r.metadata.src_node_id: _wire(r) for r in replies}
    arrays2, metrics1 = strategy.aggregate_train(1, replies)
    assert arrays2 is not None
    assert [(r, n) for r, n, _ in strategy.rejected] == [(1, 53)]
    assert "round 1: reply of node 53 rejected" in caplog.text and strategy.rejected[0][2] in caplog.text
    assert metrics1["mucsc-rejected"] == 1
    # round 2: node 52 replays its round-1 reply (a valid tag, but over round 1's context)
    msgs = list(strategy.configure_train(2, arrays2, ConfigRecord(), FakeGrid(nodes)))
    replies = [_wire(apps[m.metadata.dst_node_id](_wire(m), contexts[m.metadata.dst_node_id])) for m in msgs]
    replies = [kept[52] if r.metadata.src_node_id == 52 else r for r in replies]
    strategy.aggregate_train(2, replies)
    assert sorted((r, n) for r, n, _ in strategy.rejected if r == 2) == [(2, 52), (2, 53)]
    # an unsigned client is refused too when the server asks for signatures
    plain = _client_app()
    msgs = list(strategy.configure_train(3, arrays2, ConfigRecord(), FakeGrid(nodes)))
    strategy.aggregate_train(3, [_wire(plain(_wire(m), contexts[m.metadata.dst_node_id])) for m in msgs])
    assert sorted(n for r, n, _ in strategy.rejected if r == 3) == nodes


def test_example_app_round_trip_without_ray():
    """examples/flower's ClientApp (with mucsc_mod) and ServerApp strategy, one round called directly."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "flower"
    sys.path.insert(0, str(example))
    try:
        from mucsc_flower_app import task
        from mucsc_flower_app.client_app import app as client
    finally:
        sys.path.remove(str(example))
    nodes = [61, 62]
    contexts = {n: Context(run_id=7, node_id=n, node_config={"partition-id": i, "num-partitions": 2},
                           state=RecordDict(), run_config={}) for i, n in enumerate(nodes)}
    strategy = MucscStrategy(FedAvg(fraction_evaluate=0.0), codec="mucsc", z=16, downlink="mucsc",
                             downlink_params={"z": 64})
    arrays = ArrayRecord(task.model().state_dict())
    for rnd in (1, 2):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({"lr": 0.1}), FakeGrid(nodes)))
        replies = [_wire(client(_wire(m), contexts[m.metadata.dst_node_id])) for m in msgs]
        assert all(is_compressed(r.content["arrays"]) for r in replies)
        arrays, metrics = strategy.aggregate_train(rnd, replies)
        assert metrics["train_loss"] > 0
    net = task.model()
    net.load_state_dict(arrays.to_torch_state_dict())   # the aggregate is an ordinary model again
    down = [m for m in strategy.traffic.messages if m.direction == "down"]
    assert [m.compressed for m in down] == [False, False, True, True]


def _eval_app(mod=mucsc_mod):
    app = ClientApp(mods=[mod] if mod else [])

    @app.evaluate()
    def evaluate(msg, context):
        arrays = {k: a.numpy() for k, a in msg.content["arrays"].items()}   # crashes on a mucsc/2 Array
        return Message(RecordDict({"metrics": MetricRecord({"sum": float(sum(v.sum() for v in arrays.values())),
                                                            "num-examples": 1})}), reply_to=msg)

    return app


def test_round_metrics_and_compressed_evaluate_messages():
    """Each round's aggregated metrics carry the real bytes and ratios; evaluate messages carry the
    downlink update to nodes that hold the previous version, and the nodes evaluate the exact model."""
    nodes = [51, 52, 53, 54]
    model = _model(5)
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    inner = FedAvg(fraction_train=1.0, fraction_evaluate=1.0)
    strategy = MucscStrategy(inner, codec="mucsc", seed=3, z=16, downlink="mucsc", downlink_params={"z": 64})
    contexts = {n: _context(n) for n in nodes}
    train_app, eval_app = _client_app(), _eval_app()
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    arrays, metrics = strategy.aggregate_train(1, _deliver(msgs, contexts, train_app))
    up = [m for m in strategy.traffic.round(1) if m.direction == "up"]
    assert metrics["mucsc-bytes-up"] == sum(m.payload_bytes for m in up) > 0
    dense = sum(v.nbytes for v in model.values())
    assert metrics["mucsc-ratio-up"] == pytest.approx(4 * dense / metrics["mucsc-bytes-up"], rel=1e-3)
    assert 0.8 < metrics["mucsc-ratio-down"] <= 1.0  # first round: full models (plus .npy headers)
    assert metrics["mucsc-rejected"] == 0
    ev = list(strategy.configure_evaluate(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    assert len(ev) == 4 and all(is_compressed(m.content["arrays"]) for m in ev)
    replies = _deliver(ev, contexts, eval_app)
    want = float(sum(a.numpy().sum() for a in arrays.values()))
    assert all(r.content["metrics"]["sum"] == pytest.approx(want, rel=1e-6) for r in replies)
    emetrics = strategy.aggregate_evaluate(1, replies)
    assert emetrics["mucsc-ratio-down"] > 3 and "mucsc-bytes-up" not in emetrics
    # evaluating left the nodes' state alone: round 2's train messages carry the same update
    msgs = list(strategy.configure_train(2, arrays, ConfigRecord(), FakeGrid(nodes)))
    assert all(is_compressed(m.content["arrays"]) for m in msgs)
    arrays, metrics = strategy.aggregate_train(2, _deliver(msgs, contexts, train_app))
    assert metrics["mucsc-ratio-down"] > 3
    assert "evaluate downlink" in strategy.traffic.summary()


def test_client_without_the_mod_is_a_clear_error():
    nodes = [61, 62]
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in _model().items()})
    contexts = {n: _context(n) for n in nodes}
    strategy = MucscStrategy(FedAvg(fraction_evaluate=0.0), codec="mucsc", z=16)
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    no_mod = ClientApp()
    no_mod.train()(_plain_train)
    with pytest.raises(mucsc.InputError, match=r"without mucsc_mod.*ClientApp\(mods=\[mucsc_mod\]\)"):
        strategy.aggregate_train(1, _deliver(msgs, contexts, no_mod))
    # with a compressed downlink, a node without the mod fails on the mucsc/2 Array: named too
    strategy = MucscStrategy(FedAvg(fraction_train=1.0), codec="mucsc", z=16, downlink="mucsc")
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    arrays, _ = strategy.aggregate_train(1, _deliver(msgs, contexts, _client_app()))
    ev = list(strategy.configure_evaluate(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    replies = [_run_as_flower_does(_eval_app(mod=None), m, contexts[m.metadata.dst_node_id]) for m in ev]
    assert all(r.has_error() for r in replies)
    with pytest.raises(mucsc.InputError, match="without mucsc_mod.*mucsc/2"):
        strategy.aggregate_evaluate(1, replies)


def _run_as_flower_does(app, msg, context):
    """A ClientApp's exception becomes an error reply (as Flower's runtime makes it, reason with the text)."""
    try:
        return app(_wire(msg), context)
    except Exception as exc:  # noqa: BLE001
        return Message(flwr.app.Error(2, f"<class '{type(exc).__name__}'>:<'{exc}'>"), reply_to=msg)


def _plain_train(msg, context):
    return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=msg)


def test_per_node_keys_from_a_key_directory_in_the_run_config(tmp_path):
    """In a simulation every node has the same run config; each signs with DIR/<partition-id>.key and
    the server verifies with mucsc.load_keys(DIR); a node whose key is missing gets an error reply."""
    keydir = tmp_path / "keys"
    keydir.mkdir(mode=0o700)
    for pid in (0, 1):
        f = keydir / f"{pid}.key"
        f.write_bytes(mucsc.generate_key())
        f.chmod(0o600)
    nodes = [71, 72, 73]
    contexts = {n: Context(run_id=7, node_id=n, node_config={"partition-id": i}, state=RecordDict(),
                           run_config={"mucsc-key-dir": str(keydir)}) for i, n in enumerate(nodes)}
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in _model().items()})
    strategy = MucscStrategy(FedAvg(fraction_evaluate=0.0, min_available_nodes=3), codec="mucsc", z=8,
                             keys=mucsc.load_keys(keydir))
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
    replies = _deliver(msgs, contexts, _client_app())
    by_node = {r.metadata.src_node_id: r for r in replies}
    assert not by_node[71].has_error() and not by_node[72].has_error()
    assert by_node[73].has_error() and "no key for key id '2'" in by_node[73].error.reason
    for n in (71, 72):
        blob = by_node[n].content["arrays"]["mucsc"].data
        mucsc.decode(blob, keys=mucsc.load_keys(keydir), context=f"mucsc/flower/up/run=7/round=1/node={n}")
    agg, metrics = strategy.aggregate_train(1, replies)
    assert agg is not None and metrics["mucsc-rejected"] == 0 and strategy.rejected == []


def test_engine_job_directory_round_trips_config_setup_and_records(tmp_path):
    """What `mucsc sim --engine flower` hands its Flower app (job.json + .npy, no pickle) comes back
    equal in the app's process, and a round record survives rounds.jsonl."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from mucsc.fedsim import simulation
    from mucsc.fedsim.config import make_config
    from mucsc.fedsim.engines.flower_app import FlowerRoundRecord, load_job, write_job

    cfg = make_config(model="logreg", clients=6, per_round=2, samples_per_client=30, rounds=2,
                      params=(("mucsc", "up", "z", 8), ("stc", "both", "keep", 0.05)), z_up=(4, 16))
    setup = simulation.prepare(cfg)
    write_job(tmp_path, cfg, "mucsc", setup, "cpu")
    job = load_job(str(tmp_path))
    assert job.cfg == cfg and job.codec == "mucsc" and job.device == "cpu"
    assert (job.setup.groups, job.setup.model_name, job.setup.d) == (setup.groups, setup.model_name, setup.d)
    assert len(job.setup.parts) == 6 and all(np.array_equal(a, b) for a, b in zip(job.setup.parts, setup.parts))
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(job.setup.data, name), getattr(setup.data, name))
    assert job.setup.data.transform == setup.data.transform
    rec = FlowerRoundRecord(round=1, iteration=5, lr=0.5, participants=[0, 3], up_bytes=[10, 12],
                            down_msg_bytes=7, down_recipients=2, comm_up_s=0.1, comm_down_s=0.2, train_s=0.3,
                            encode_s=0.01, decode_s=0.02, comp_s=0.4, accuracy=0.5, loss=1.5)
    rec.down_total = 99
    back = FlowerRoundRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert back == rec and back.bytes_down == 99 and back.bytes_up == 22


def test_engine_raises_what_the_server_app_raised(tmp_path):
    """A ServerApp failure reaches the caller: a mucsc error as itself, anything else with its type,
    no result at all with the tail of flwr's log."""
    from mucsc.fedsim.engines.flower import _read_result

    with pytest.raises(RuntimeError, match="(?s)without a result.*boom in the log"):
        (tmp_path / "flwr.log").write_text("line\nboom in the log\n")
        _read_result(tmp_path)
    err = {"type": "ParameterError", "message": "z must be >= 2", "traceback": "..."}
    (tmp_path / "result.json").write_text(json.dumps({"reached": None, "error": err}))
    with pytest.raises(mucsc.ParameterError, match="z must be >= 2"):
        _read_result(tmp_path)
    err = {"type": "KeyError", "message": "'fc.weight'", "traceback": "..."}
    (tmp_path / "result.json").write_text(json.dumps({"reached": None, "error": err}))
    with pytest.raises(RuntimeError, match="Flower run failed: KeyError"):
        _read_result(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({"reached": 3, "error": None}))
    assert _read_result(tmp_path)["reached"] == 3


def test_superlink_that_exits_at_start_gets_a_new_port(tmp_path):
    """A free port taken by another process before the SuperLink binds it: the engine retries on a new
    port (a fake SuperLink that exits on its first start, then serves /health)."""
    import sys

    from mucsc.fedsim.engines.flower import _SuperLink

    fake = tmp_path / "fake-superlink"
    fake.write_text(f"""#!{sys.executable}
import http.server, pathlib, sys
args = sys.argv[1:]
assert "--control-api-address" not in args and "--fleet-api-address" not in args  # deprecated in flwr 1.42
marker = pathlib.Path({str(tmp_path / "started")!r})
with open(marker, "a") as f:
    f.write(args[args.index("--port") + 1] + "\\n")
if len(marker.read_text().split()) == 1:
    sys.exit(1)  # the port was taken
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), H).serve_forever()
""")
    fake.chmod(0o755)
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "home"))
    with _SuperLink(str(fake), tmp_path, env) as link:
        ports = (tmp_path / "started").read_text().split()
        assert len(ports) == 2 and link.address == f"127.0.0.1:{ports[1]}"
        assert link.address in (tmp_path / "home" / "config.toml").read_text()
    assert link.proc.poll() is not None  # stopped on exit


def test_superlink_that_cannot_start_names_the_cause(tmp_path):
    """A SuperLink that dies at start (here: the traceback Flower prints when ``flower-superexec`` is not
    on PATH): the error quotes the exception's line from its stderr, not only its log's tail."""
    import sys

    from mucsc.fedsim.engines.flower import _SuperLink

    fake = tmp_path / "fake-superlink"
    fake.write_text(f"""#!{sys.executable}
import sys
print("INFO flwr | Starting Flower SuperLink", file=sys.stderr)
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "flower_superlink.py", line 263, in _start_superexec_if_needed', file=sys.stderr)
print("FileNotFoundError: [Errno 2] No such file or directory: 'flower-superexec'", file=sys.stderr)
sys.exit(3)
""")
    fake.chmod(0o755)
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "home"))
    with pytest.raises(RuntimeError, match="did not start") as info:
        with _SuperLink(str(fake), tmp_path, env):
            pass
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'flower-superexec'" in str(info.value)
    assert "File \"flower_superlink.py\"" not in str(info.value)  # the cause, not the frames


@pytest.mark.slow
def test_sim_engine_flower_started_by_path_with_a_bare_PATH(tmp_path):
    """`/venv/bin/mucsc sim --engine flower` from a cron job or a service unit (PATH without the venv):
    Flower's processes find their commands beside this Python, and the run completes."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("ray", reason="Flower's simulation engine needs ray (pip install 'mucsc[flower]')")
    pytest.importorskip("torch")
    exe = Path(sys.executable).parent / "mucsc"
    if not exe.exists():
        pytest.skip("no mucsc console script beside this Python")
    root = str(Path(__file__).resolve().parents[1])
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)), "PYTHONPATH": root,
           "FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    args = [str(exe), "sim", "--engine", "flower", "--model", "logreg", "-N", "3", "-K", "2", "-E", "1",
            "--rounds", "1", "--target", "0", "--eval-every", "1", "--samples-per-client", "20",
            "--codecs", "mucsc", "-o", str(tmp_path / "out")]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert (tmp_path / "out" / "mucsc" / "rounds.csv").exists()


def test_a_strategy_with_its_own_aggregation_gets_the_decoded_models():
    """A FedAvg subclass that overrides aggregate_train (and any other strategy) is handed every reply
    decoded into ``global + update``: plain FedAvg on those replies gives the wrapper's arrays exactly;
    FedAvg itself (summing the updates) agrees up to float rounding."""

    class Recording(FedAvg):
        def aggregate_train(self, server_round, replies):
            self.seen = [{k: a.numpy() for k, a in r.content["arrays"].items()} for r in replies]
            return super().aggregate_train(server_round, replies)

    nodes = [11, 12, 13]
    model = _model()
    arrays = ArrayRecord({k: flwr.app.Array(v) for k, v in model.items()})
    results = {}
    for inner in (Recording(fraction_evaluate=0.0, min_available_nodes=3),
                  FedAvg(fraction_evaluate=0.0, min_available_nodes=3)):
        strategy = MucscStrategy(inner, codec="mucsc", seed=4, z=16)
        messages = list(strategy.configure_train(1, arrays, ConfigRecord(), FakeGrid(nodes)))
        replies = _deliver(messages, {n: _context(n) for n in nodes}, _client_app())
        got, _ = strategy.aggregate_train(1, replies)
        results[type(inner).__name__] = {k: a.numpy() for k, a in got.items()}
        if isinstance(inner, Recording):
            assert not strategy.sums_updates and len(inner.seen) == 3
            by_node = sorted(replies, key=lambda r: r.metadata.src_node_id)  # replies now hold decoded models
            plain, _ = FedAvg(fraction_evaluate=0.0).aggregate_train(1, by_node)
            for k in model:
                np.testing.assert_array_equal(plain[k].numpy(), results["Recording"][k])
    for k in model:
        np.testing.assert_allclose(results["FedAvg"][k], results["Recording"][k], rtol=1e-5, atol=1e-6)
