"""mucsc.heap: glibc's malloc thresholds for a process that encodes in a loop."""

import platform
import subprocess
import sys

import pytest

from mucsc import heap


def test_rejects_thresholds_glibc_would_refuse():
    with pytest.raises(ValueError, match="mmap_bytes"):
        heap.keep_freed_memory(mmap_bytes=heap.MAX_MMAP_THRESHOLD + 1)
    with pytest.raises(ValueError, match="trim_bytes"):
        heap.keep_freed_memory(trim_bytes=0)


def test_glibc_takes_the_settings_in_a_fresh_process():
    """Run where it changes a whole process: a child, so the test run's own heap keeps its defaults."""
    code = "from mucsc import heap; print(heap.keep_freed_memory(), heap._mallopt() is not None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    glibc = platform.libc_ver()[0] == "glibc"
    assert out == [str(glibc), str(glibc)]
