"""The backends: one interface per step of the format, chosen once per array.

:mod:`dispatch` gives a codec, for each array, the object whose attributes are the steps in that
array's form (``backend_for`` / ``backend_of`` / ``backend_on``).  The steps, one module each, each
holding a ``Host`` form (numpy arrays: numpy or the compiled kernels, as :mod:`mucsc.codec.kernels`
chose) and a ``Torch`` form (torch tensors on any device) under the same names: ``transfer`` (where the
values live), ``elementwise`` (casts, sign masks, squared errors), ``packing`` (IDs and bits to bytes),
``ordered_sum`` (float64 sums in numpy's order), ``selection`` (the top-k family's kept set),
``rounding`` (the levels and eq. 7), ``lane_coding`` (IDSL).  The torch forms' work, one module per
step: ``torch_transfer`` (copies, ``DeviceBytes``), ``crc`` (CRC-32 on the device), ``random_stream``
(SplitMix64), ``torch_rounding`` (eq. 7), ``torch_packing``, ``torch_selection``, ``torch_summary``
(the solver's view), ``torch_lanes``; the Triton forms: ``triton_round`` + ``_triton_kernel`` (fused
rounding + packing), ``triton_lanes`` + ``_triton_lanes_kernel``, ``device_rounding`` (the lazy
rounding choosing between them).  ``tensors``: records from numpy arrays and torch tensors, without
importing torch.  ``torch_backend``: the torch forms' former module, re-exporting them for the old path.

May import: :mod:`mucsc.codec.numerics`, :mod:`mucsc.codec.wire`, the leaf modules, :mod:`mucsc.errors`,
:mod:`mucsc.optional`; nothing above (no codec, rate control or API)."""
