"""The torch forms' former module, kept for callers of its old path (``mucsc.codec.torch_backend`` and
``mucsc.codec.backends.torch_backend``): its public names, re-exported from the modules that now hold
them, one per step of the format (see :mod:`mucsc.codec.backends.dispatch`).  Nothing in mucsc imports
it; new code imports the step module.  torch is imported only when a torch form runs."""

from __future__ import annotations

from mucsc.codec.backends.crc import CRC_BATCH, CRC_BLOCK, crc32, crc32_finish, crc32_register  # noqa: F401
from mucsc.codec.backends.elementwise import to_float16  # noqa: F401
from mucsc.codec.backends.ordered_sum import PW_BLOCK, host_sums, pairwise_sum64, sum64_like_numpy  # noqa: F401
from mucsc.codec.backends.random_stream import (GAMMA, GAMMA_INV, UNIFORM_BITS, splitmix64,  # noqa: F401
                                                uniform_ints, uniforms, uniforms_at)
from mucsc.codec.backends.tensors import CHUNK, is_torch_tensor as is_torch  # noqa: F401
from mucsc.codec.backends.torch_lanes import histogram  # noqa: F401
from mucsc.codec.backends.torch_packing import gather, pack, pack_tensor, pack_words, unpack, unpack_bits  # noqa: F401
from mucsc.codec.backends.torch_rounding import (Levels, round_at, round_ids, round_supported,  # noqa: F401
                                                 stochastic_round, variance_J, work_float32, working_levels)
from mucsc.codec.backends.torch_selection import (RADIX_BITS, kth_largest_abs, rest_sq_bias, scatter,  # noqa: F401
                                                  select_top_k, top_k_positions)
from mucsc.codec.backends.torch_summary import (TAIL_ROOM, TAIL_SLACK, DeviceSummary, TorchSource,  # noqa: F401
                                                solver_source)
from mucsc.codec.backends.torch_transfer import (STAGE, DeviceBytes, as_tensor, bytes_to_host, copy_out,  # noqa: F401
                                                 device, fetch, fetch_list, group_vector, to_dev, to_device, to_host)
