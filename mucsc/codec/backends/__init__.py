"""The backends: where the encoder's steps run when the data is not a host numpy array.

``tensors`` (tensor records from numpy arrays and torch tensors, without importing torch),
``torch_backend`` (eq. 7's rounding, packing, CRC, summaries on torch tensors, byte-identical to the
compiled kernels), ``triton_round`` + ``_triton_kernel`` (the fused rounding + packing kernel),
``device_rounding`` (the lazy rounding stage choosing between the two).  The host path (numpy and
the compiled kernels) is :mod:`mucsc.codec.kernels` with the numerics.

May import: :mod:`mucsc.codec.numerics`, :mod:`mucsc.codec.wire`, the leaf modules, :mod:`mucsc.errors`,
:mod:`mucsc.optional`; nothing above (no codec, rate control or API)."""
