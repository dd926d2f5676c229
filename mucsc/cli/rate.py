"""``mucsc rate``: the paper's compression-rate formulas next to the real codecs' measured bytes.

Loaded lazily by the CLI group as "mucsc.cli.rate:rate".  The measured rows encode a Gaussian vector
of size d with the real codecs (mucsc.codec.rates.paper_check); ``--baselines`` adds one row per
baseline codec (bytes of one transfer, formula payload vs measured message).
"""

from __future__ import annotations

import json
import math

import click

from mucsc.codec import rates, sparse

BASELINES = [("none", {}), ("fp16", {}), ("signsgd", {}), ("qsgd", {"s": 15}), ("qsgd", {"s": 255}),
             ("terngrad", {}), ("stc", {}), ("dgc", {}), ("dgc", {"positions": "paper"}), ("topk", {})]


def model_dimension() -> tuple[int, str]:
    """ALL-CNN's parameter count: from the simulator's model when torch is available, else the
    architecture's count (both 1,369,738 for CIFAR-10)."""
    try:
        from mucsc.fedsim.models import all_cnn  # torch: optional, imported only here
        return sum(p.numel() for p in all_cnn().parameters()), "mucsc.fedsim.models.all_cnn()"
    except ImportError:
        return rates.allcnn_parameter_count(), "ALL-CNN-C architecture (Springenberg et al. 2015)"


def baseline_rows(d: int, seed: int) -> list[dict]:
    """Formula payload vs measured message bytes of one transfer for each baseline codec."""
    import numpy as np

    from mucsc.codec.api import encode
    x = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
    out = []
    for codec, params in BASELINES:
        try:
            formula = sum(rates.section_sizes(codec, d, params).values())
            note = "exact payload"
        except ValueError:  # data-dependent positions: the expected Rice size of random positions
            p = dict(params)
            keep = {"stc": 0.03}.get(codec, 0.01)
            k = sparse.keep_count(keep, d)
            pos_bytes = sparse.expected_rice_bytes(d, k)
            formula = sum(rates.section_sizes(codec, d, p, positions_bytes=pos_bytes).values())
            note = "payload, expected Rice positions"
        measured = len(encode(x, codec, seed=seed, compress="off", **params))
        compact = len(encode(x, codec, seed=seed, **params))
        label = codec + "".join(f" {k}={v}" for k, v in params.items())
        out.append({"codec": label, "formula_payload": formula, "formula_note": note,
                    "measured_off": measured, "measured_auto": compact, "ratio_vs_float32": 4 * d / compact})
    return out


@click.command("rate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-d", "--dim", "d", type=click.IntRange(1, 1 << 31), default=None,
              help="Model dimension d (default: ALL-CNN for CIFAR-10, 1,369,738).")
@click.option("--zu", "z_u", type=click.IntRange(2, 65536), multiple=True,
              help="Uplink Z_U; repeat for client sets of equal size (default: 4, 8, 16 as in the paper).")
@click.option("--zd", "z_d", type=click.IntRange(2, 65536), default=16, show_default=True, help="Downlink Z_D.")
@click.option("--kn", type=click.FloatRange(0, 1, min_open=True), default=0.1, show_default=True,
              help="K/N, the fraction of clients uploading per round.")
@click.option("--keep", type=click.FloatRange(0, 1, min_open=True), default=0.01, show_default=True,
              help="B-MUCSC kept fraction d0/d.")
@click.option("--zb", "z_b", type=click.IntRange(2, 65536), default=256, show_default=True,
              help="B-MUCSC Z (both directions).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Seed of the Gaussian vector.")
@click.option("--baselines", is_flag=True, help="Also list the baseline codecs' bytes per transfer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def rate(d, z_u, z_d, kn, keep, z_b, seed, baselines, as_json):
    """Print eq. CompressionRateofMUCSC and eq. CompressRateB next to measured message bytes.

    Rate = 2 h d / (K/N * uplink bytes + downlink bytes), h = 4, per client and round (paper IV-D).
    Measured rows encode a Gaussian vector of size d; fixed-width modes include the message framing
    (a few hundred bytes), compact modes are the library's defaults.
    """
    source = "--dim"
    if d is None:
        d, source = model_dimension()
    z_u = list(z_u) or [4, 8, 16]
    rows = rates.paper_check(d, z_u, z_d, kn, keep, z_b, seed)
    extra = baseline_rows(d, seed) if baselines else []
    if as_json:
        click.echo(json.dumps({"d": d, "d_source": source, "z_u": z_u, "z_d": z_d, "kn": kn, "keep": keep,
                               "z_b": z_b, "rows": [r.__dict__ for r in rows], "baselines": extra}, indent=1))
        return
    d0 = sparse.keep_count(keep, d)
    click.echo(f"d = {d:,} ({source}); K/N = {kn}; Z_U = {', '.join(map(str, z_u))} (equal client sets); "
               f"Z_D = {z_d}; B-MUCSC: d0 = {d0:,}, Z = {z_b}; h = 4")
    w = max(len(r.label) for r in rows)
    click.echo(f"{'':{w}}  {'uplink B':>12}  {'downlink B':>12}  {'rate':>8}  vs formula")
    formula = None
    for r in rows:
        if r.kind == "formula":
            formula = r.rate
        diff = "" if r.kind == "formula" else f"{100 * (r.rate / formula - 1):+.2f}%"
        click.echo(f"{r.label:{w}}  {r.uplink:>12,.0f}  {r.downlink:>12,.0f}  {r.rate:>8.2f}  {diff}")
    if extra:
        click.echo("\nbaselines, one transfer of d float32 values "
                   "(formula = payload bytes; measured = whole message):")
        w2 = max(len(b["codec"]) for b in extra)
        click.echo(f"{'codec':{w2}}  {'formula B':>12}  {'off B':>12}  {'auto B':>12}  {'x vs f32':>9}")
        for b in extra:
            click.echo(f"{b['codec']:{w2}}  {b['formula_payload']:>12,}  {b['measured_off']:>12,}  "
                       f"{b['measured_auto']:>12,}  {b['ratio_vs_float32']:>9.2f}")
    if not math.isfinite(rows[0].rate):
        raise click.ClickException("the rate is undefined for these inputs")
