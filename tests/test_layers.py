"""The codec's layers (docs/architecture.md): no import cycle in mucsc/ (function-level imports count),
each layer imports only the layers below it, and the old flat module paths still import for one release."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mucsc
import mucsc.codec

PACKAGE = Path(mucsc.__file__).parent
# each codec layer and the ones it may import (the leaf modules kernels / parallel / meter and mucsc.errors,
# mucsc.optional are open to all)
LAYERS = ["wire", "numerics", "backends", "codecs", "ratecontrol", "api"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the mucsc modules it imports anywhere in its source (type-checking blocks too)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in paths}
    for m, p in paths.items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in paths:
                    t = t.rpartition(".")[0]
                if t and t != m and not m.startswith(t + "."):  # a package's own parents run anyway
                    edges[m].add(t)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for w in sorted(edges[m]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["mucsc", "codec"] and parts[2] in LAYERS else None


def test_no_import_cycle():
    assert _cycle(import_graph()) is None, " -> ".join(_cycle(import_graph()) or [])


def test_layers_import_only_downwards():
    wrong = []
    for m, targets in import_graph().items():
        if (lm := _layer(m)) is None:
            continue
        for t in targets:
            lt = _layer(t)
            if t.startswith("mucsc.codec.") and lt is None and t not in ("mucsc.codec.kernels", "mucsc.codec.parallel", "mucsc.codec.meter",
                                                                          "mucsc.codec._kernels"):
                wrong.append(f"{m} -> {t}")
            elif lt is not None and LAYERS.index(lt) > LAYERS.index(lm):
                wrong.append(f"{m} -> {t}")
            elif t.startswith("mucsc.") and not t.startswith("mucsc.codec") and t not in ("mucsc.errors", "mucsc.optional"):
                wrong.append(f"{m} -> {t}")
    assert not wrong, wrong


def test_codecs_never_import_the_container_or_the_api():
    bad = [f"{m} -> {t}" for m, ts in import_graph().items() if _layer(m) == "codecs"
           for t in ts if t == "mucsc.codec.wire.container" or t.startswith("mucsc.codec.api")]
    assert not bad, bad


def test_resolved_levels_are_explicit_parameters():
    """A planned codec's levels are parameters: in ==, hash and get_config, and from_config round-trips."""
    x = np.random.default_rng(3).normal(size=4000).astype(np.float32)
    from mucsc.codec.ratecontrol import PlanContext, plan

    codec = mucsc.get_codec("mucsc", bits=3.0, id_coding="rans")
    (fixed,) = plan(codec, [x], PlanContext(3, x.size, 0, lambda i: np.random.default_rng(0), lambda params: 0))
    config = fixed.get_config()
    assert config["bits"] is None and fixed.params.target == "z"
    assert mucsc.get_codec(config.pop("codec"), **config) == fixed
    if fixed.params.levels is not None:
        other = fixed.replace(levels=tuple(v * 2 for v in fixed.params.levels))
        assert other != fixed and hash(other) != hash(fixed)


@pytest.mark.parametrize("old", sorted(mucsc.codec.MOVED))
def test_old_module_paths_import_with_a_deprecation_warning(old):
    new = importlib.import_module(f"mucsc.codec.{mucsc.codec.MOVED[old]}")
    sys.modules.pop(f"mucsc.codec.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"mucsc.codec.{old} moved to {new.__name__}"):
        alias = importlib.import_module(f"mucsc.codec.{old}")
    assert alias is new


@pytest.mark.parametrize("name", ["EncodedGroup", "Memory", "PaperSetup", "ResidualMemory", "Section", "ceil_log2"])
def test_plugin_types_moved_to_mucsc_plugin_with_an_alias(name):
    with pytest.warns(DeprecationWarning, match=f"mucsc.{name} moved to mucsc.plugin.{name}"):
        old = getattr(mucsc, name)
    assert old is getattr(mucsc.plugin, name) and name not in mucsc.__all__


def test_import_mucsc_warns_nothing():
    code = "import warnings; warnings.simplefilter('error'); import mucsc, mucsc.cli.main, mucsc.fedsim.cli"
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


# what a codec module may not name: the torch backend's modules and helpers, torch itself, and the
# compiled kernels' switches (a codec calls its steps through backends.dispatch, chosen once per array)
CODEC_BANNED = {"torch", "torch_backend", "torch_lanes", "device_rounding", "triton_round", "triton_lanes",
                "_torch", "is_torch", "is_torch_tensor", "applies", "as_tensor", "use_c", "c_module", "BACKEND",
                "TORCH", "_c", "_kernels"}  # kernels' numerics (kernels.dot) are no switch: allowed


def codec_backend_references(source: str) -> list[tuple[int, str]]:
    """(line, name) of every banned name a codec module's source uses: a name, an attribute, an
    imported module or name, or an identifier containing "torch" (a twin method such as decode_torch)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Import):
            names = [p for a in node.names for p in a.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")
            allowed = mod[:3] == ["mucsc", "codec", "backends"] and mod[3:] == ["dispatch"]
            if mod[:3] == ["mucsc", "codec", "backends"] and not allowed:
                names = [".".join(mod)]
            names += [p for p in mod if p in CODEC_BANNED] + [a.name for a in node.names]
        found += [(node.lineno, n) for n in names if n in CODEC_BANNED or "torch" in n.lower()
                  or n.startswith("mucsc.codec.backends")]
    return found


def test_no_codec_module_branches_on_torch_or_the_compiled_kernels():
    """Issue 36: the codecs reach a backend only through ``backends.dispatch`` (backend_for / backend_of /
    backend_on), never naming torch, the torch backend's modules, or the C kernels' switches."""
    found = {p.name: refs for p in sorted((PACKAGE / "codec" / "codecs").glob("*.py"))
             if (refs := codec_backend_references(p.read_text()))}
    assert not found, found


def test_the_checker_finds_what_it_bans():
    src = ("from mucsc.codec.backends import torch_backend\nfrom mucsc.codec import kernels\n"
           "def decode_torch(x):\n    if kernels.use_c():\n        return torch_backend._torch()\n"
           "    import torch\n    return isinstance(x, torch.Tensor)\n")
    names = {n for _, n in codec_backend_references(src)}
    assert {"mucsc.codec.backends", "torch_backend", "use_c", "_torch", "decode_torch", "torch"} <= names
    assert not codec_backend_references("from mucsc.codec.backends.dispatch import backend_for\n"
                                        "def f(x):\n    return backend_for(x).sum64(x)\n")


# the C-or-numpy switches: only kernels.compiled(name) makes that choice (the compiled kernel or None);
# use_c / c_module / BACKEND and the extension itself stay inside mucsc/codec/kernels.py
KERNEL_SWITCHES = {"use_c", "c_module", "BACKEND", "_c", "_kernels"}  # _c: as kernels' attribute; _kernels: imported
# module (relative to mucsc/) -> why it may name a switch
SWITCH_ALLOWED = {"codec/kernels.py": "defines the switches and compiled(), the one place the choice is made"}


def kernel_switch_references(source: str) -> list[tuple[int, str]]:
    """(line, name) of every use of a C-kernel switch in ``source``: a name or attribute ``use_c``,
    ``c_module``, ``BACKEND``, the attribute ``_c`` (kernels' handle on the extension), or an import of
    the compiled extension ``mucsc.codec._kernels`` (strings, docstrings and local names such as the
    Triton modules' ``_kernels`` caches are not uses)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id] if node.id not in ("_c", "_kernels") else []
        elif isinstance(node, ast.Attribute):
            names = [node.attr] if node.attr != "_kernels" else []
        elif isinstance(node, ast.Import):
            names = [p for a in node.names for p in a.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            names = (node.module or "").split(".") + [a.name for a in node.names]
        found += [(node.lineno, n) for n in names if n in KERNEL_SWITCHES]
    return found


def test_only_kernels_chooses_between_c_and_numpy():
    """Issue 36: every module but kernels.py asks ``kernels.compiled(name)`` once per call and runs its
    numpy twin on None; none calls ``use_c()`` / ``c_module()``, reads ``BACKEND`` or imports the
    extension (46 calls of use_c() / c_module() in numerics/centroids, numerics/dither, wire/lanes,
    wire/rans and wire/container before)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in SWITCH_ALLOWED and (refs := kernel_switch_references(path.read_text())):
            found[rel] = refs
    assert not found, found
    assert all((PACKAGE / rel).is_file() for rel in SWITCH_ALLOWED)  # no stale exemption


def test_the_switch_checker_finds_what_it_bans():
    src = ("from mucsc.codec import kernels, _kernels\nfrom mucsc.codec._kernels import dot\n"
           "def f(x):\n    if kernels.use_c() and kernels.BACKEND == 'c':\n        return kernels.c_module().dot(x, x)\n"
           "    return kernels._c\n")
    assert {n for _, n in kernel_switch_references(src)} == KERNEL_SWITCHES
    assert not kernel_switch_references('"""use_c() and c_module() are gone."""\nfrom mucsc.codec import kernels\n'
                                        '_kernels, _c = {}, None\ndef f(x):\n    kernel = kernels.compiled("dot")\n'
                                        '    return kernel(x, x) if kernel is not None else 0.0\n')


def test_every_backend_step_has_the_same_name_and_parameters_in_every_form():
    """Each step module's Host and Torch forms define the same steps with the same parameters, so a
    codec's call works on whichever backend_for picked (adding a step is one module: STEPS)."""
    import inspect

    from mucsc.codec.backends import dispatch

    for module in dispatch.STEPS:
        forms = {kind: getattr(module, kind) for kind in dispatch.KINDS}
        steps = {kind: {n: inspect.signature(getattr(f, n)).parameters.keys() for n in vars(f) if not n.startswith("_")}
                 for kind, f in forms.items()}
        host = steps["Host"]
        assert host, module.__name__
        for kind, got in steps.items():
            assert got.keys() == host.keys(), (module.__name__, kind, got.keys() ^ host.keys())
            for n in host:
                assert list(got[n]) == list(host[n]), (module.__name__, kind, n)
    assert set(vars(dispatch.HOST)) == set(vars(dispatch.TORCH))
