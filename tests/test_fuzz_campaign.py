"""The mutation campaign of issue 26 (fuzz/mutate.py), bounded for CI by the seeds in fuzz/seeds.txt:
mutants of a corpus built from every codec raise only MucscError and stay within a memory bound."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import mucsc

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mutate", ROOT / "fuzz" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutate)


@pytest.fixture(scope="module")
def corpus():
    return mutate.corpus()


def test_corpus_covers_every_codec_and_decodes(corpus):
    for codec in mucsc.available_codecs():
        assert f"{codec}-shared" in corpus and f"{codec}-per-tensor" in corpus
    for name, blob in corpus.items():
        keys = {"keys": {"client-1": mutate.KEY}, "context": b"r1"} if name == "authenticated" else {}
        mucsc.decode(blob, **keys)
    assert mucsc.inspect(corpus["mucsc-rans"]).version == "1.1"


def test_seed_list_mutants_raise_only_mucsc_errors(corpus):
    seeds = mutate.read_seeds(str(ROOT / "fuzz" / "seeds.txt"))
    assert len(seeds) >= 8
    escapes = mutate.run(seeds, 40, corpus)
    assert not escapes, "\n".join(f"{e.source} seed {e.seed} #{e.index}: {e.problem}" for e in escapes)


def test_the_oracle_reports_an_escape(corpus, monkeypatch):
    def broken(blob, **kw):
        raise KeyError("planted")

    monkeypatch.setattr(mucsc, "decode", broken)
    escapes = mutate.run([0], 3, {"x": corpus["raw-shared"]})
    assert len(escapes) == 3 and "KeyError" in escapes[0].problem


def test_mutants_are_deterministic(corpus):
    import numpy as np

    blob = corpus["mucsc-shared"]
    a = [mutate.mutate(blob, np.random.default_rng([5, 26])) for _ in range(3)]
    b = [mutate.mutate(blob, np.random.default_rng([5, 26])) for _ in range(3)]
    assert a == b and any(m != blob for m in a)
