"""The invalid-message cases of spec/vector_cases_codecs.py (make_vectors.py also writes them to
spec/vectors/invalid/): each is a valid container whose codec payload is rejected with the error it names."""

import importlib.util
from pathlib import Path

import pytest

import mucsc
import mucsc.errors

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

_PATH = Path(__file__).resolve().parent.parent / "spec" / "vector_cases_codecs.py"
_spec = importlib.util.spec_from_file_location("vector_cases_codecs", _PATH)
cases_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases_mod)
INVALID = cases_mod.invalid_cases()
CODECS = ("bmucsc", "qsgd", "signsgd", "stc", "dgc", "terngrad", "topk", "fp16", "none")


def test_every_codec_has_valid_and_invalid_cases():
    for codec in CODECS:
        assert any(kw["codec"] == codec for _, _, kw in cases_mod.CASES.values()), codec
    for codec in ("bmucsc", "qsgd", "signsgd", "stc", "dgc", "terngrad", "fp16", "none"):
        assert any(name.startswith(codec) for name in INVALID), codec


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_case(name):
    blob, err, _ = INVALID[name]
    mucsc.inspect(blob)  # the container is valid (checksum, header): only the codec's decoder objects
    with pytest.raises(getattr(mucsc.errors, err)):
        mucsc.decode(blob)
