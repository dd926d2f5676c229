"""The test files .ci/run runs again under MUCSC_BACKEND=torch and MUCSC_PURE_NUMPY=1 (those marked
``backends``, ``python -m pytest -m backends``) stay complete: every test file that touches the codec
layers (imports ``mucsc.codec``, calls ``mucsc.encode`` / ``mucsc.decode``, or uses tests/msgtools.py,
which builds messages with the wire layer) is either marked or listed below with the reason it runs
once, with the compiled kernels.  A new file that is neither fails here; so does a stale entry.  The
marked passes stay at most 45% of the suite's tests (what keeps .ci/run near 20 minutes at rest)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Test files that touch the codec layers but do not depend on which backend encodes: they run once.
RUN_ONCE = {
    "test_device_ops.py": "selects the torch path itself per test (kernels.TORCH) and counts its aten ops; the "
                          "host bytes it compares with are the marked test_vectors' in every pass",
    "test_torch_backend.py": "selects the torch backend itself per test and compares it with the host path "
                             "(compiled kernels or numpy, both run by test_kernels/test_vectors per backend)",
    "test_triton_kernel.py": "the Triton kernel in Triton's CPU interpreter against the torch reference; "
                             "the environment's backend is not used",
    "test_bitpack.py": "mucsc/codec/wire/bitpack.py is numpy only (no compiled or torch path)",
    "test_sparse.py": "mucsc/codec/wire/sparse.py is numpy only (no compiled or torch path)",
    "test_parallel.py": "thread pools and shard layout; the per-shard coders are the marked test_lanes/test_kernels'",
    "test_layers.py": "static checks of the import graph; nothing is encoded",
    "test_rate_control.py": "rate control chooses parameters above the codecs; test_goal_digests (marked) "
                            "pins the goals' bytes under every backend",
    "test_rate_control_bmucsc.py": "as test_rate_control.py",
    "test_goal_search.py": "as test_rate_control.py",
    "test_policy.py": "the per-tensor Policy chooses codecs above the codecs; test_goal_digests pins its bytes",
    "test_rates.py": "the documented size formulas; message sizes per backend: test_codecs_common (marked)",
    "test_codec_objects.py": "Codec objects' parameters and their CLI; encodes are the marked files'",
    "test_hostile_encode.py": "input limits checked before any backend runs; the one rule shared by the "
                              "backends is compared within its test, with both",
    "test_hostile_round3.py": "hostile files and messages through the CLI and decoders; per-backend "
                              "decoding of hostile messages: test_hostile (marked)",
    "test_mutations.py": "mutated messages: the decoders' checks are the marked test_hostile's",
    "test_fuzz.py": "fuzzing the decoders; long, run once",
    "test_fuzz_campaign.py": "fuzzing the decoders; long, run once",
    "test_auth.py": "MAC / signature trailers over the message bytes, whichever backend wrote them",
    "test_ddp.py": "the DDP integration calls the public API",
    "test_without_torch.py": "runs in a subprocess without torch, on the default backend",
    "test_cli.py": "the CLI calls the public API",
    "test_cli_auth.py": "the CLI calls the public API",
    "test_cli_messages.py": "the CLI calls the public API",
    "test_cli_checkpoint.py": "the CLI calls the public API",
    "test_fedsim_cli.py": "the simulator calls the public API",
    "test_fedsim_sim.py": "the simulator calls the public API",
    "test_fedsim_auth.py": "the simulator calls the public API",
    "test_fedsim_workers.py": "the simulator calls the public API",
    "test_flower.py": "the Flower integration calls the public API",
    "test_plugins.py": "plugin registration; its codec is numpy only",
    "test_settings.py": "validation of mucsc.Settings above the codecs; the bytes it gives equal the keyword "
                        "arguments' on the default backend, and every backend's bytes are the marked files'",
}
MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.backends\b|^\s*@pytest\.mark\.backends\b", re.M)
TOUCHES = re.compile(
    r"\bmucsc\.codec\b"                                           # import mucsc.codec... / from mucsc.codec...
    r"|\bmucsc\.(?:encode|decode)\w*\s*\("                        # mucsc.encode(...), mucsc.decode_...(...)
    r"|^from mucsc import [^\n]*\b(?:encode|decode|Compressor)\b"  # from mucsc import encode, ...
    r"|^(?:from msgtools import|import msgtools)", re.M)
MAX_SHARE = 0.45


def marked(text: str) -> bool:
    return bool(MARK.search(text))


def touches_codec(text: str) -> bool:
    return bool(TOUCHES.search(text))


def test_finders():
    assert marked("import pytest\n\npytestmark = pytest.mark.backends\n")
    assert marked("@pytest.mark.backends\ndef test_x(): pass\n")
    assert not marked("# pytestmark = pytest.mark.backends\n") and not marked("pytestmark = pytest.mark.slow\n")
    for text in ("from mucsc.codec.wire import bitpack\n", "import mucsc.codec.kernels as k\n",
                 "y = mucsc.decode(b)\n", "b = mucsc.encode(x, 'stc')\n", "from mucsc import Compressor, encode\n",
                 "from msgtools import build\n"):
        assert touches_codec(text), text
    for text in ("from mucsc import tensorfiles as tf\n", "from mucsc.fedsim.cli import sim\n", "mucsc.rates.H\n"):
        assert not touches_codec(text), text


def test_every_file_touching_the_codec_is_marked_or_run_once_for_a_reason():
    files = {p.name: p.read_text() for p in sorted(TESTS.glob("test_*.py")) if p.name != Path(__file__).name}
    unlisted = [n for n, t in files.items() if touches_codec(t) and not marked(t) and n not in RUN_ONCE]
    assert not unlisted, (f"{unlisted}: mark the file `pytestmark = pytest.mark.backends` (it runs backend-specific "
                          "code) or add it to RUN_ONCE in tests/test_ci_selection.py with the reason it does not")
    stale = [n for n in RUN_ONCE if n not in files or marked(files[n])]
    assert not stale, f"{stale}: RUN_ONCE lists a file that is gone or marked"
    assert all(len(why) > 10 for why in RUN_ONCE.values())


def test_the_backend_passes_select_at_most_45_percent_of_the_suite():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-o", "addopts=", "-q", "-m", "backends",
                        "-p", "no:cacheprovider", str(TESTS)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"(\d+)/(\d+) tests collected", r.stdout)
    assert m, r.stdout[-2000:]
    selected, total = int(m.group(1)), int(m.group(2))
    assert 0 < selected <= MAX_SHARE * total, f"{selected} of {total} tests marked backends ({selected / total:.0%})"
