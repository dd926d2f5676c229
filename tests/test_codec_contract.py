"""The codec contract (mucsc.testing) for every registered codec, generated from the registry: a new
codec module (or an installed plugin) is tested without editing a list."""

from pathlib import Path

import pytest

import mucsc
import mucsc.codec.codecs
import mucsc.testing

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too


@pytest.mark.parametrize("name", mucsc.available_codecs())
def test_codec_contract(name):
    mucsc.testing.check_codec(mucsc.get_codec(name))


def test_every_builtin_module_is_imported():
    """Built-ins are imported explicitly (no package scanning at run time): none may be forgotten."""
    package = Path(mucsc.codec.codecs.__file__).parent
    contract = {"base", "memory", "clusters"}  # the Codec contract and registry, memories, shared clustering
    modules = {f"mucsc.codec.codecs.{p.stem}" for p in package.glob("*.py")
               if not p.stem.startswith("_") and p.stem not in contract}
    registered = {mucsc.codec_class(n).__module__ for n in mucsc.available_codecs()}
    assert modules <= registered, f"codec modules not imported by mucsc/codec/codecs/__init__.py: {modules - registered}"


def test_contract_catches_a_biased_codec_claiming_unbiasedness():
    """The contract is not vacuous: topk (biased) declared unbiased fails the unbiasedness check."""
    cls = type("ClaimsUnbiased", (mucsc.codec_class("topk"),), {"unbiased": True, "name": "topk"})
    with pytest.raises(AssertionError, match="unbiased"):
        mucsc.testing.check_unbiased(cls(keep=0.1))


def test_contract_catches_a_lenient_decoder(monkeypatch):
    """... and a decoder that accepts a short section fails the hostile-section check."""
    import mucsc.codec.codecs.base

    class Lenient(mucsc.codec_class("none")):
        name = "lenient"

        @classmethod
        def decode_array(cls, n, params, sections, dtype):
            import numpy as np
            v = np.frombuffer((bytes(sections["VALS"]) + bytes(4 * n))[: 4 * n], "<f4")  # pads short data
            return v.astype(dtype)

    monkeypatch.setitem(mucsc.codec.codecs.base._REGISTRY, "lenient", Lenient)
    with pytest.raises(AssertionError, match="one byte short"):
        mucsc.testing.check_hostile_sections(Lenient())
