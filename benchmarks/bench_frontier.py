#!/usr/bin/env python3
"""Rate-distortion frontier: J / ||x||^2 against message bits per element, every codec.

    python benchmarks/bench_frontier.py [--d 200000] [--fl-rounds 20 | --updates DIR] [--out docs] [--quick]
                                        [--inputs NAME,...] [--check-only]

Inputs: Gaussian, Laplace, Student-t(3) and an 80%-near-zero mixture (d elements, float32), and real
FL updates saved by ``mucsc sim --save-updates``: the first participant's update U_i (all LeNet
tensors flattened, raw, before compression) in round 1 and in round ``--fl-rounds`` of FedAvg
without compression (codec ``none``) on the shared FEMNIST sample (20 clients, 5 per round, E = 5,
B = 8, the femnist learning-rate preset, seed 0).  The benchmark runs that ``mucsc sim`` command
itself (printed) into a temporary directory, or reads a directory it wrote (``--updates DIR``:
every saved update there becomes an input).

Codecs: mucsc (z sweep, the bits= goal, and the bits= goal with rounding="dithered"), bmucsc (keep/z sweep, and the bits= goal), qsgd (every s in 1..127, buckets 128 / 512 / d,
fixed and Elias coding), terngrad, signsgd, topk, stc.  Sizes are whole messages
(``mucsc.encode_with_stats``, default container: zstd where smaller); J is the exact expected
squared error the encoder reports (for biased codecs the squared error).

Prints, per input, the budget checks (mucsc bits=b, and mucsc bits=b rounding=dithered with a margin
of at least 1.6x, vs the best QSGD / TernGrad message that fits in b bits per element; the dithered
row's distance to D(R) = 2^(-2R), the Gaussian rate-distortion function relative to the variance, an
upper bound of D(R) for any other input of that variance) and writes ``rate-distortion.png`` and
``frontier.json`` to ``--out``.

``--check-only`` encodes only the messages those checks read (mucsc bits=b stochastic and dithered,
TernGrad, and per QSGD bucket and coding the largest s that fits each budget, by bisection) and
writes no plot or JSON: minutes per input instead of hours for the whole run on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import mucsc

BUDGETS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
TOLERANCE = 1.02  # "sends <= b bits per element (+2%)"
QSGD_BUCKETS = (128, 512)  # and d: one bucket
DITHER_MARGIN = 1.6  # issue 24: the dithered codec's J at most 1/1.6 of every QSGD/TernGrad configuration


def synthetic(d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"gaussian": rng.normal(size=d), "laplace": rng.laplace(size=d),
            "student_t3": rng.standard_t(3, d),
            "near_zero_80": np.where(rng.random(d) < 0.8, rng.normal(size=d) * 0.01, rng.normal(size=d))}


def sim_command(rounds: int, data_dir: str, save_dir: str, seed: int = 0) -> list[str]:
    """The ``mucsc sim`` run whose saved updates are the real-update inputs."""
    return [sys.executable, "-m", "mucsc.cli", "sim", "--dataset", "femnist", "--data-dir", data_dir,
            "--model", "lenet", "-N", "20", "-K", "5", "--codecs", "none", "--rounds", str(rounds),
            "--target", "0", "--seed", str(seed), "--save-updates", save_dir,
            "--save-rounds", ",".join(map(str, sorted({1, rounds}))), "--save-clients", "1", "-q"]


def fl_updates(rounds: int, data_dir: str, updates_dir: str | None = None) -> dict[str, np.ndarray]:
    """Real FL updates saved by ``mucsc sim --save-updates``: read from ``updates_dir``, or produced
    by running :func:`sim_command` into a temporary directory first."""
    from mucsc.fedsim.updates import read_updates

    with tempfile.TemporaryDirectory(prefix="mucsc-frontier-") as tmp:
        if updates_dir is None:
            cmd = sim_command(rounds, data_dir, tmp)
            print("$ " + " ".join(["mucsc"] + cmd[3:]), file=sys.stderr)
            subprocess.run(cmd, check=True)
            updates_dir = tmp
        out = {}
        for u in read_updates(updates_dir):
            e = u.entry
            out[f"{e['dataset']}_{e['model']}_{e['codec']}_round{e['round']}_client{e['client']}"] = u.flat()
        return out


def measure(x: np.ndarray, codec: str, **params) -> tuple[float, float]:
    blob, st = mucsc.encode_with_stats(x, codec, **params)
    return 8 * len(blob) / x.size, float(st.J)


def point(x: np.ndarray, n2: float, family: str, codec: str, label: str, **params) -> dict | None:
    """One message's bits per element and J / ||x||^2; None (said on stderr) where the codec refuses."""
    try:
        bits, J = measure(x, codec, **params)
    except mucsc.MucscError as exc:  # e.g. a bits= goal below the smallest message
        print(f"    {family} {label}: {exc}", file=sys.stderr)
        return None
    return {"family": family, "label": label, "bits": bits, "rel_J": J / n2}


def frontier_points(x: np.ndarray, quick: bool) -> list[dict]:
    d = x.size
    n2 = float(np.dot(x, x.astype(np.float64)))
    pts = []

    def add(family: str, codec: str, label: str, **params) -> None:
        p = point(x, n2, family, codec, label, **params)
        if p is not None:
            pts.append(p)

    for z in (2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256):
        add("mucsc z", "mucsc", f"z={z}", z=z)
    for b in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0):
        add("mucsc bits", "mucsc", f"bits={b:g}", bits=b)
        add("mucsc dithered", "mucsc", f"bits={b:g}", bits=b, rounding="dithered")
    for keep in (0.001, 0.01, 0.05, 0.2):
        for z in (16, 256):
            add("bmucsc", "bmucsc", f"keep={keep:g},z={z}", keep=keep, z=z)
    for b in (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0):  # keep and the kept set's coding chosen
        add("bmucsc bits", "bmucsc", f"bits={b:g}", bits=b)
    svals = (1, 2, 3, 4, 6, 8, 15, 31, 63, 127) if quick else range(1, 128)
    for bucket in (*QSGD_BUCKETS, d):
        for coding in ("fixed", "elias"):
            for s in svals:
                add("qsgd", "qsgd", f"s={s},bucket={bucket},{coding}", s=s, bucket=bucket, coding=coding)
    for clip in (2.5, 0.0):
        for packing in ("2bit", "base3"):
            add("terngrad", "terngrad", f"clip={clip:g},{packing}", clip=clip, packing=packing)
    add("signsgd", "signsgd", "l1")
    for keep in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3):
        add("topk", "topk", f"keep={keep:g}", keep=keep)
        add("stc", "stc", f"keep={keep:g}", keep=keep)
    return pts


def qsgd_within_budgets(x: np.ndarray, n2: float, bucket: int, coding: str) -> list[dict]:
    """QSGD messages of one bucket and coding: for every budget the largest s in 1..127 whose message
    fits it, found by bisection (its bits rise and its J falls with s), plus s + 1 .. s + 4 in case
    the bits are not monotone; every message evaluated on the way is returned."""
    seen: dict[int, dict | None] = {}

    def at(s: int) -> dict | None:
        if s not in seen:
            seen[s] = point(x, n2, "qsgd", "qsgd", f"s={s},bucket={bucket},{coding}", s=s, bucket=bucket,
                            coding=coding)
        return seen[s]

    def fits(s: int, b: float) -> bool:
        p = at(s)
        return p is not None and p["bits"] <= b

    for b in BUDGETS:
        if not fits(1, b):
            continue
        lo, hi = 1, 127  # fits(lo); the largest fitting s is in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid, b) else (lo, mid - 1)
        for s in range(lo + 1, min(lo + 4, 127) + 1):
            at(s)
    return [p for p in seen.values() if p is not None]


def check_points(x: np.ndarray) -> list[dict]:
    """Only the points the budget checks read (minutes, not hours): mucsc ``bits=b`` stochastic and
    dithered at every budget, TernGrad's 4 configurations, and QSGD's best within each budget for
    every bucket and coding (:func:`qsgd_within_budgets`)."""
    n2 = float(np.dot(x, x.astype(np.float64)))
    cand = [point(x, n2, fam, "mucsc", f"bits={b:g}", bits=b, **kw) for b in BUDGETS
            for fam, kw in (("mucsc bits", {}), ("mucsc dithered", {"rounding": "dithered"}))]
    cand += [point(x, n2, "terngrad", "terngrad", f"clip={clip:g},{packing}", clip=clip, packing=packing)
             for clip in (2.5, 0.0) for packing in ("2bit", "base3")]
    pts = [p for p in cand if p is not None]
    for bucket in (*QSGD_BUCKETS, x.size):
        for coding in ("fixed", "elias"):
            pts += qsgd_within_budgets(x, n2, bucket, coding)
    return pts


def budget_rows(pts: list[dict], family: str = "mucsc bits", margin: float = 1.0) -> list[dict]:
    """Per budget b: ``family``'s bits=b point against the best QSGD/TernGrad point within b bits;
    it passes when it fits b (+2%) and its J is at most 1/``margin`` of that rival's."""
    rows = []
    for b in BUDGETS:
        mine = next((p for p in pts if p["family"] == family and p["label"] == f"bits={b:g}"), None)
        rivals = [p for p in pts if p["family"] in ("qsgd", "terngrad") and p["bits"] <= b]
        best = min(rivals, key=lambda p: p["rel_J"]) if rivals else None
        ok = (mine is not None and mine["bits"] <= b * TOLERANCE
              and (best is None or mine["rel_J"] * margin <= best["rel_J"]))
        rows.append({"budget": b, "mucsc": mine, "best_rival": best, "pass": ok})
    return rows


def db_above_gaussian_rd(p: dict, n2: float, d: int, var: float) -> float:
    """How far (dB) a point's error is above D(R) = var 2^(-2R) at its own rate R (bits per element)."""
    return 10 * np.log10(p["rel_J"] * n2 / d / (var * 2.0 ** (-2 * p["bits"])))


def pareto(ps: list[dict]) -> list[dict]:
    out, best = [], np.inf
    for p in sorted(ps, key=lambda p: (p["bits"], p["rel_J"])):
        if p["rel_J"] < best:
            out.append(p)
            best = p["rel_J"]
    return out


def plot(results: dict[str, list[dict]], rd_scale: dict[str, float], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    cols = 3
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    styles = {"mucsc bits": ("C3", "-", "o"), "mucsc dithered": ("k", "-", "*"), "mucsc z": ("C1", "--", "s"),
              "bmucsc": ("C5", ":", "v"),
              "bmucsc bits": ("C6", "-.", "<"),
              "qsgd": ("C0", "-", "."), "terngrad": ("C2", "", "^"), "signsgd": ("C4", "", "x"),
              "topk": ("C7", ":", "d"), "stc": ("C8", ":", "+")}
    for ax, name in zip(axes.flat, names):
        pts = results[name]
        for fam, (c, ls, mk) in styles.items():
            f = pareto([p for p in pts if p["family"] == fam])
            if f:
                ax.plot([p["bits"] for p in f], [p["rel_J"] for p in f], color=c, linestyle=ls or "none",
                        marker=mk, ms=4, label=fam)
        r = np.linspace(0.05, 8.5, 100)  # D(R) of a Gaussian of the input's variance, relative to ||x||^2
        ax.plot(r, rd_scale[name] * 2.0 ** (-2 * r), color="0.5", linewidth=0.8, label="D(R) = var 2^(-2R)")
        ax.set_yscale("log")
        ax.set_xlim(0, 8.5)
        ax.set_ylim(1e-4, 1e3)
        ax.set_title(name)
        ax.set_xlabel("message bits per element")
        ax.set_ylabel("J / ||x||^2")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=200_000)
    ap.add_argument("--fl-rounds", type=int, default=20, help="0: no FL updates")
    ap.add_argument("--updates", metavar="DIR", help="read the real updates from a directory written by "
                    "mucsc sim --save-updates instead of running it")
    ap.add_argument("--data-dir", default="/work/shared/data/femnist-sample")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--quick", action="store_true", help="10 QSGD levels s instead of all 127")
    ap.add_argument("--inputs", help="only the inputs whose names contain one of these (comma-separated), "
                    "e.g. near_zero,femnist: the whole run takes hours on a shared 2-core machine")
    ap.add_argument("--check-only", action="store_true", help="only the messages the budget checks read "
                    "(QSGD's best s per budget by bisection); writes no plot or frontier.json")
    a = ap.parse_args()
    inputs = {k: v.astype(np.float32) for k, v in synthetic(a.d).items()}
    if a.updates or a.fl_rounds:
        inputs.update(fl_updates(a.fl_rounds, a.data_dir, a.updates))
    if a.inputs:
        inputs = {k: v for k, v in inputs.items() if any(w in k for w in a.inputs.split(","))}
    results, checks, rd_scale = {}, {}, {}
    for name, x in inputs.items():
        t = time.perf_counter()
        results[name] = check_points(x) if a.check_only else frontier_points(x, a.quick)
        checks[name] = budget_rows(results[name])
        checks[name + " (dithered)"] = budget_rows(results[name], "mucsc dithered", DITHER_MARGIN)
        n2 = float(np.dot(x, x.astype(np.float64)))
        var = float(np.var(x, dtype=np.float64))
        rd_scale[name] = var * x.size / n2
        print(f"\n### {name} (d = {x.size}, {time.perf_counter() - t:.0f} s)\n")
        print("| budget b | mucsc bits=b: bits/elem | J/||x||^2 | best QSGD/TernGrad within b | its bits | its J/||x||^2 | mucsc J / best |")
        print("|---|---|---|---|---|---|---|")
        for r in checks[name]:
            m, bst = r["mucsc"], r["best_rival"]
            mb = f"{m['bits']:.3f} | {m['rel_J']:.4g}" if m else "- | -"
            bb = f"{bst['family']} {bst['label']} | {bst['bits']:.3f} | {bst['rel_J']:.4g}" if bst else "none fits | - | -"
            ratio = f"{m['rel_J'] / bst['rel_J']:.3f}" if m and bst else "-"
            print(f"| {r['budget']:g} | {mb} | {bb} | {ratio}{'' if r['pass'] else ' FAIL'} |")
        print(f"\n| budget b | dithered bits=b: bits/elem | J/||x||^2 | best QSGD/TernGrad within b | its bits "
              f"| its J/||x||^2 | best / dithered J (pass: >= {DITHER_MARGIN}) | stochastic bits=b J / dithered J "
              f"| dB above D(R) = var 2^(-2R) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r, rs in zip(checks[name + " (dithered)"], checks[name]):
            m, bst, st = r["mucsc"], r["best_rival"], rs["mucsc"]
            if m is None:
                print(f"| {r['budget']:g} | - | - | - | - | - | - FAIL | - | - |")
                continue
            bb = f"{bst['family']} {bst['label']} | {bst['bits']:.3f} | {bst['rel_J']:.4g}" if bst else "none fits | - | -"
            margin = f"{bst['rel_J'] / m['rel_J']:.2f}" if bst else "-"
            vs = f"{st['rel_J'] / m['rel_J']:.2f}" if st else "-"
            print(f"| {r['budget']:g} | {m['bits']:.3f} | {m['rel_J']:.4g} | {bb} | {margin}{'' if r['pass'] else ' FAIL'} "
                  f"| {vs} | {db_above_gaussian_rd(m, n2, x.size, var):.2f} |")
        if not a.check_only:
            bm = [p for p in results[name] if p["family"] == "bmucsc bits"]
            print("\nbmucsc bits=b: " + "; ".join(f"{p['label']}: {p['bits']:.3f} bits, J/||x||^2 {p['rel_J']:.4g}"
                                                 for p in bm))
        sys.stdout.flush()
    if a.check_only:
        return report_checks(checks)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(results, rd_scale, out / "rate-distortion.png")
    (out / "frontier.json").write_text(json.dumps({"results": results, "checks": checks}, indent=1))
    return report_checks(checks)


def report_checks(checks: dict[str, list[dict]]) -> int:
    """Print how many budget checks pass; the exit status: 1 when one fails."""
    failed = [(n, r["budget"]) for n, rows in checks.items() for r in rows if not r["pass"]]
    print(f"\nbudget checks: {sum(len(r) for r in checks.values()) - len(failed)} pass, {len(failed)} fail {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
