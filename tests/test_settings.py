"""mucsc.Settings: one frozen, validated settings type, one error type (SettingsError) for bad settings
whichever API or integration took them, and the same bytes as the keyword arguments it replaces."""

import dataclasses

import numpy as np
import pytest

import mucsc
from mucsc import Compressor, Settings, SettingsError

X = np.random.default_rng(0).normal(size=5000).astype(np.float32)


@pytest.mark.parametrize("bad,field", [
    ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"),
    ({"compress": 23}, "compress"), ({"compress": 0}, "compress"), ({"compress": "fast"}, "compress"),
    ({"compress": True}, "compress"), ({"threads": -1}, "threads"), ({"params": {"z": 1}}, "z"),
    ({"params": {"nope": 1}}, "nope"), ({"codec": "dgc", "params": {"momentum": 1.5}}, "momentum"),
    ({"codec": "topk", "params": {"momentum": 0.9}}, "momentum"), ({"shared": 1}, "shared"),
    ({"error_feedback": "yes"}, "error_feedback"), ({"key_id": "a"}, "key"),
    ({"key": b"k" * 32}, "key_id"), ({"max_elements": -1}, "max_elements"),
    ({"max_expansion": "big"}, "max_expansion"), ({"codec": 3}, "codec"), ({"params": 5}, "params"),
])
def test_every_bad_setting_raises_settings_error_naming_it(bad, field):
    with pytest.raises(SettingsError, match=field):
        Settings(**bad)


def test_unknown_codec_is_a_settings_error_and_still_an_unknown_codec_error():
    with pytest.raises(SettingsError, match="unknown codec 'nope'"):
        Settings("nope")
    with pytest.raises(mucsc.UnknownCodecError):
        Compressor("nope")
    assert issubclass(SettingsError, mucsc.ParameterError)  # callers catching ParameterError still do


def test_frozen_comparable_and_its_config_round_trips_without_the_key():
    key = mucsc.generate_key()
    s = Settings("mucsc", {"z": 8}, seed=3, compress=5, key=key, key_id="c1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 4
    assert s == Settings("mucsc", (("z", 8),), seed=3, compress=5, key=key, key_id="c1")
    assert hash(s) == hash(Settings("mucsc", {"z": 8}, seed=3, compress=5, key=key, key_id="c1"))
    cfg = s.get_config()
    assert "key" not in cfg and "key_id" not in cfg and cfg["params"] == {"z": 8}
    assert Settings.from_config(cfg) == s.replace(key=None, key_id=None)
    with pytest.raises(SettingsError, match="'colour'"):
        Settings.from_config({**cfg, "colour": "red"})
    with pytest.raises(SettingsError, match="seed"):
        s.replace(seed=-2)
    # a codec object: its name and every parameter
    obj = mucsc.get_codec("qsgd", s=4)
    assert Settings(obj).codec == "qsgd" and Settings(obj).codec_object() == obj
    with pytest.raises(SettingsError, match="codec object"):
        Settings(obj, {"s": 2})


def test_encode_and_compressor_take_it_with_the_same_bytes():
    s = Settings("mucsc", {"z": 8}, seed=5, compress="off")
    assert mucsc.encode(X, s) == mucsc.encode(X, "mucsc", z=8, seed=5, compress="off")
    assert mucsc.encode(X, s, seed=6) == mucsc.encode(X, "mucsc", z=8, seed=6, compress="off")
    with pytest.raises(SettingsError, match="come from the Settings"):
        mucsc.encode(X, s, z=16)
    with pytest.raises(SettingsError, match="come from the Settings"):
        mucsc.encode(X, s, compress=3)
    key = mucsc.generate_key()
    signed = mucsc.encode(X, s.replace(key=key, key_id="n1"), context="r1")
    mucsc.decode(signed, keys={"n1": key}, context="r1")
    dgc = Settings("dgc", {"momentum": 0.5, "keep": 0.05}, seed=2)
    a, b = Compressor(dgc), Compressor("dgc", momentum=0.5, keep=0.05, seed=2)
    assert a.error_feedback == b.error_feedback and a.settings == b.settings
    for r in range(3):
        g = np.random.default_rng(r).normal(size=5000).astype(np.float32)
        assert a.compress(g) == b.compress(g)
    with pytest.raises(SettingsError, match="seed"):
        Compressor("mucsc", seed=-1)
    with pytest.raises(SettingsError, match="compress"):
        Compressor("mucsc", compress=99)
    with pytest.raises(SettingsError, match="come from the Settings"):
        Compressor(dgc, seed=1)


def test_integrations_validate_through_it():
    from mucsc.fedsim.transport import LinkCodec, Sender

    with pytest.raises(SettingsError, match="z"):
        Sender(LinkCodec("mucsc", (("z", 1),)))
    assert LinkCodec("dgc", (("momentum", 0.5),)).settings().memory_options == {"momentum": 0.5}
    numcodecs_mucsc = pytest.importorskip("mucsc.numcodecs", exc_type=ImportError)
    with pytest.raises(SettingsError, match="compress"):
        numcodecs_mucsc.Mucsc(compress=23)
    with pytest.raises(SettingsError, match="seed"):
        numcodecs_mucsc.Mucsc(seed=-1)


def test_ddp_hook_checks_the_zstd_level_range():
    pytest.importorskip("torch")
    ddp = pytest.importorskip("mucsc.ddp", exc_type=ImportError)
    for bad in ({"compress": 30}, {"compress": True}, {"seed": -1}):
        with pytest.raises(SettingsError):
            ddp.MucscHookState(None, **bad)
    state = ddp.MucscHookState(None, codec=Settings("mucsc", {"z": 8}, compress=1, seed=4))
    assert state.settings.params == (("z", 8),) and state.compress == 1 and state.seed == 4


def test_flower_strategy_takes_it():
    pytest.importorskip("flwr")
    from flwr.serverapp.strategy import FedAvg

    from mucsc.flower import CodecSpec, MucscStrategy

    s = Settings("mucsc", {"z": 16}, seed=9, compress="off")
    strategy = MucscStrategy(FedAvg(), s)
    assert strategy.spec == CodecSpec("mucsc", (("z", 16),), None, "off", True) and strategy.seed == 9
    assert strategy.spec.settings() == s.replace(seed=0)
    with pytest.raises(SettingsError, match="z"):
        MucscStrategy(FedAvg(), "mucsc", z=1)
    from mucsc.flower import make_mucsc_mod

    key = mucsc.generate_key()
    assert make_mucsc_mod(Settings(key=key, key_id="n1")).__name__ == "mucsc_mod"
    with pytest.raises(SettingsError, match="key_id"):
        make_mucsc_mod(key=key)
