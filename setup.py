"""Optional C kernels for mucsc (metadata lives in pyproject.toml).

The extension is ``optional=True``: without a C compiler the install still succeeds and
``mucsc.codec.kernels`` falls back to the bit-identical numpy path.  -ffp-contract=off keeps every
float operation the IEEE operation numpy performs (no fused multiply-add).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mucsc.codec._kernels",
            sources=["mucsc/codec/_kernels.c"],
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c99"],
            optional=True,
        )
    ]
)
