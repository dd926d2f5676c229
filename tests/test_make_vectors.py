"""spec/make_vectors.py --check inside the suite: the committed vectors and spec/example.md are
exactly what the code writes today, so neither can drift from the implementation."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backends  # the subprocess inherits MUCSC_BACKEND / MUCSC_PURE_NUMPY: vectors per backend

ROOT = Path(__file__).resolve().parent.parent


def test_spec_vectors_and_example_are_current():
    r = subprocess.run([sys.executable, "spec/make_vectors.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
