"""``mucsc rate``: the paper's compression-rate formulas next to the real codecs' measured bytes.

Loaded lazily by the CLI group as "mucsc.cli.rate:rate".  The measured rows encode a Gaussian vector
of size d with the real codecs (``mucsc.rates.paper_check``); ``--baselines`` adds one row per
baseline codec (bytes of one transfer, the codec's stated payload vs the measured message).
"""

from __future__ import annotations

import json
import math

import click

import mucsc

Z = click.IntRange(*mucsc.Z_RANGE)


@click.command("rate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-d", "--dim", "d", type=click.IntRange(1, 1 << 31), default=None,
              help="Model dimension d (default: ALL-CNN for CIFAR-10, 1,369,738).")
@click.option("--zu", "z_u", type=Z, multiple=True,
              help="Uplink Z_U; repeat for client sets of equal size (default: 4, 8, 16 as in the paper).")
@click.option("--zd", "z_d", type=Z, default=16, show_default=True, help="Downlink Z_D.")
@click.option("--kn", type=click.FloatRange(0, 1, min_open=True), default=0.1, show_default=True,
              help="K/N, the fraction of clients uploading per round.")
@click.option("--keep", type=click.FloatRange(0, 1, min_open=True), default=0.01, show_default=True,
              help="B-MUCSC kept fraction d0/d.")
@click.option("--zb", "z_b", type=Z, default=256, show_default=True,
              help="B-MUCSC Z (both directions).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Seed of the Gaussian vector.")
@click.option("--baselines", is_flag=True, help="Also list the baseline codecs' bytes per transfer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def rate(d, z_u, z_d, kn, keep, z_b, seed, baselines, as_json):
    """Print the paper's compression-rate formulas for MUCSC and B-MUCSC next to measured message bytes.

    Rate = 2 h d / (K/N * uplink bytes + downlink bytes), h = 4, per client and round (paper IV-D).
    The formulas' bytes per transfer: MUCSC ceil(log2 Z) d / 8 + h Z; B-MUCSC (ceil(log2 Z) + ceil(log2 d))
    d0 / 8 + h Z + h.  "vs formula" is each measured row's rate against its formula's.
    Measured rows encode a Gaussian vector of size d; fixed-width modes include the message framing
    (a few hundred bytes), compact modes are the library's defaults.
    """
    source = "--dim"
    if d is None:  # the simulator's all_cnn() has the same count (tests/test_rates.py)
        d, source = mucsc.rates.allcnn_parameter_count(), "ALL-CNN-C for CIFAR-10 (Springenberg et al. 2015)"
    z_u = list(z_u) or [4, 8, 16]
    rows = mucsc.rates.paper_check(d, z_u, z_d, kn, keep, z_b, seed)
    extra = mucsc.rates.baseline_rows(d, seed) if baselines else []
    if as_json:
        click.echo(json.dumps({"d": d, "d_source": source, "z_u": z_u, "z_d": z_d, "kn": kn, "keep": keep,
                               "z_b": z_b, "rows": [r.__dict__ for r in rows], "baselines": extra}, indent=1))
        return
    d0 = mucsc.rates.keep_count(keep, d)
    click.echo(f"d = {d:,} parameters ({source}); K/N = {kn} (the fraction of clients uploading per round); "
               f"uplink Z_U = {', '.join(map(str, z_u))} (equal client sets); downlink Z_D = {z_d}; "
               f"B-MUCSC keeps d0 = {d0:,} values, Z = {z_b}; h = 4 bytes per float32")
    click.echo("rate = 2 h d / (K/N x uplink bytes + downlink bytes), per client and round (the paper's "
               "accounting, section IV-D)\n")
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
            formula = "-" if b["formula_payload"] is None else f"{b['formula_payload']:,}"
            click.echo(f"{b['codec']:{w2}}  {formula:>12}  {b['measured_off']:>12,}  "
                       f"{b['measured_auto']:>12,}  {b['ratio_vs_float32']:>9.2f}")
    if not math.isfinite(rows[0].rate):
        raise click.ClickException("the rate is undefined for these inputs")
