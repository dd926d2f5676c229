"""Results: per-round CSV/JSON written as the run goes, the paper-style summary table, plots.

Table columns follow Tables III-VIII: rounds to the target (R, and T = R * E global iterations), total
traffic and its % of the uncompressed run (NC), communication time, computation time, total time.
Next to them: the compression rate measured from the real message lengths, in the paper's own
accounting (per client and round: 2hd / (uplink * K/N + downlink)), and the paper's formula
(MUCSC's and B-MUCSC's compression rates, section IV-D) for the same settings where the paper gives one.
Files hold every measured value to SIGNIFICANT digits (no float noise such as 99.99999999999999);
byte counts are exact integers.  Traffic is in MiB everywhere (table, CSV/JSON, plots).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import mucsc
from mucsc.fedsim.config import SimConfig, folder_name
from mucsc.fedsim.simulation import RoundRecord, RunResult
from mucsc.texttable import text_table

H = mucsc.rates.H  # bytes per float32 value: the paper's h
MB = 2 ** 20  # the paper's traffic figures are in MiB (2090.05 MB = 2 * 4 * 1,369,738 B * 200 rounds)
SIGNIFICANT = 8  # digits kept of every float written to CSV/JSON
LEGEND_DOC = "docs/fedsim.md, section \"Reading the table\""

# rounds.csv holds what the seed determines (byte-identical across runs with the same seed);
# timing.csv holds the measured wall times of the same rounds.
CSV_FIELDS = ("round", "iteration", "lr", "accuracy", "loss", "bytes_up", "bytes_down", "down_msg_bytes",
              "down_recipients", "cum_bytes", "comm_up_s", "comm_down_s", "comm_s")
TIMING_FIELDS = ("round", "train_s", "encode_s", "decode_s", "comp_s")


class RunWriter:
    """Appends one CSV row per round (flushed, so a crash keeps what was measured) and, at the end,
    the run's JSON with every message length per client, in ``out/<folder_name(codec)>/``."""

    def __init__(self, out: Path, codec: str, cfg: SimConfig) -> None:
        self.dir = out / folder_name(codec)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.codec, self.cfg = codec, cfg
        self._f = open(self.dir / "rounds.csv", "w", newline="")
        self._csv = csv.DictWriter(self._f, CSV_FIELDS, extrasaction="ignore")
        self._csv.writeheader()
        self._tf = open(self.dir / "timing.csv", "w", newline="")
        self._tcsv = csv.DictWriter(self._tf, TIMING_FIELDS, extrasaction="ignore")
        self._tcsv.writeheader()
        self._cum = 0
        self.records: list[RoundRecord] = []

    def add(self, rec: RoundRecord) -> None:
        self._cum += rec.bytes_up + rec.bytes_down
        self.records.append(rec)
        row = _row(rec, self._cum)
        self._csv.writerow(row)
        self._tcsv.writerow(row)
        self._f.flush()
        self._tf.flush()

    def close(self, result: RunResult | None = None, error: str | None = None) -> None:
        self._f.close()
        self._tf.close()
        doc = {"codec": self.codec, "config": self.cfg.to_dict(), "error": error,
               "uplink": result.uplinks if result else None, "downlink": result.downlink if result else None,
               "d": result.d if result else None,
               "reached_round": result.reached_round if result else None,
               "rounds": [_json_round(r) for r in self.records]}
        (self.dir / "rounds.json").write_text(json.dumps(doc, indent=1, allow_nan=False, default=_nan_none))


def _nan_none(o: Any) -> Any:
    raise TypeError(f"not JSON serialisable: {o!r}")


def rounded(x: Any, digits: int = SIGNIFICANT) -> Any:
    """A float to ``digits`` significant digits (0.1 + 0.2 -> 0.3, 99.99999999999999 -> 100.0); other
    values (ints, strings, None, NaN, infinities) as they are."""
    if isinstance(x, float) and math.isfinite(x):
        return float(f"{x:.{digits}g}")
    return x


def _fmt(x: float | None) -> Any:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else rounded(x)


def _row(rec: RoundRecord, cum: int) -> dict[str, Any]:
    return {"round": rec.round, "iteration": rec.iteration, "lr": _fmt(rec.lr), "accuracy": _fmt(rec.accuracy),
            "loss": _fmt(rec.loss), "bytes_up": rec.bytes_up, "bytes_down": rec.bytes_down,
            "down_msg_bytes": rec.down_msg_bytes, "down_recipients": rec.down_recipients, "cum_bytes": cum,
            "comm_up_s": _fmt(rec.comm_up_s), "comm_down_s": _fmt(rec.comm_down_s), "comm_s": _fmt(rec.comm_s),
            "train_s": _fmt(rec.train_s), "encode_s": _fmt(rec.encode_s),
            "decode_s": _fmt(rec.decode_s), "comp_s": _fmt(rec.comp_s)}


def _json_round(rec: RoundRecord) -> dict[str, Any]:
    d = _row(rec, 0)
    del d["cum_bytes"]
    d = {k: (None if v == "" else v) for k, v in d.items()}
    d["uplink"] = [{"client": c, "bytes": b} for c, b in zip(rec.participants, rec.up_bytes)]
    return d


# ---- the paper's formulas ---------------------------------------------------------------------------

def paper_formula(result: RunResult, cfg: SimConfig) -> float | None:
    """The paper's rate for this run's codecs (each codec states its formula, ``Codec.paper_bytes``;
    uplink bytes averaged over every client's codec), or None where the paper gives no formula."""
    if result.down_link is None or not result.up_links:
        return None
    ups = [link.codec_object() for link in result.up_links]
    return mucsc.rates.paper_rate(result.d, ups, result.down_link.codec_object(), cfg.per_round / cfg.clients, H)


# ---- summary -------------------------------------------------------------------------------------------

@dataclasses.dataclass
class SummaryRow:
    """One row of the summary table (until the target was reached, else over every round run); the
    fields in the order of summary.csv / summary.json.  The last three are filled by :func:`add_relative`."""

    codec: str
    uplink: str
    downlink: str
    rounds: int
    reached: bool
    T: int
    traffic_MB: float
    up_MB: float
    down_MB: float
    comm_min: float
    comp_min: float
    train_s: float
    encode_s: float
    decode_s: float
    codec_share: float
    final_acc: float
    best_acc: float
    ratio: float
    rate_measured: float
    rate_paper: float | None
    mean_up_bytes: float
    mean_down_bytes: float
    d: int
    auth_MB: float
    auth_bytes_per_msg: int
    auth_up_bytes_per_msg: float
    total_min: float = math.nan
    pct_nc_traffic: float | None = None
    pct_nc_time: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(result: RunResult, cfg: SimConfig) -> SummaryRow:
    """The run's row of the summary table (until the target was reached, else over every round run)."""
    recs = result.records
    n = len(recs)
    up = sum(r.bytes_up for r in recs)
    down = sum(r.bytes_down for r in recs)
    n_up = sum(len(r.up_bytes) for r in recs)
    train, enc, dec = (sum(getattr(r, k) for r in recs) for k in ("train_s", "encode_s", "decode_s"))
    accs = [r.accuracy for r in recs if r.accuracy is not None]
    mean_up = up / n_up if n_up else 0.0
    mean_down = sum(r.down_msg_bytes for r in recs) / n if n else 0.0
    f32 = H * result.d * (n_up + sum(r.down_recipients for r in recs))  # the same messages as float32
    return SummaryRow(
        codec=result.codec, uplink=";".join(result.uplinks), downlink=result.downlink,
        rounds=n, reached=result.reached_round is not None,
        T=n * cfg.local_iters, traffic_MB=(up + down) / MB, up_MB=up / MB, down_MB=down / MB,
        comm_min=sum(r.comm_s for r in recs) / 60, comp_min=sum(r.comp_s for r in recs) / 60,
        train_s=train, encode_s=enc, decode_s=dec,
        codec_share=(enc + dec) / (train + enc + dec) if n else math.nan,
        final_acc=accs[-1] if accs else math.nan, best_acc=max(accs) if accs else math.nan,
        ratio=f32 / (up + down) if n else math.nan,
        rate_measured=_measured_rate(result.d, mean_up, mean_down, cfg) if n else math.nan,
        rate_paper=paper_formula(result, cfg), mean_up_bytes=mean_up, mean_down_bytes=mean_down, d=result.d,
        **_auth_columns(recs, n_up))


def _measured_rate(d: int, mean_up: float, mean_down: float, cfg: SimConfig) -> float:
    """The paper's compression rate (Table II accounting) from measured sizes: 2hd / (up x K/N + down)."""
    kn = cfg.per_round / cfg.clients
    return 2 * H * d / (mean_up * kn + mean_down)


def _auth_columns(recs: list[RoundRecord], n_up: int) -> dict[str, Any]:
    """What authentication tags added: total MB, bytes per downlink and per uplink message."""
    n = len(recs)
    return {"auth_MB": sum(r.auth_up_bytes + r.auth_down_msg_bytes * r.down_recipients for r in recs) / MB,
            "auth_bytes_per_msg": recs[-1].auth_down_msg_bytes if n else 0,
            "auth_up_bytes_per_msg": sum(r.auth_up_bytes for r in recs) / n_up if n_up else 0.0}


def add_relative(rows: list[SummaryRow]) -> None:
    """Fill '% of NC' for traffic and total time when the sweep has the uncompressed run."""
    nc = next((r for r in rows if r.codec == "none"), None)
    for r in rows:
        r.total_min = r.comm_min + r.comp_min
        r.pct_nc_traffic = 100 * r.traffic_MB / nc.traffic_MB if nc else None
        r.pct_nc_time = 100 * r.total_min / (nc.comm_min + nc.comp_min) if nc else None


def format_table(rows: list[SummaryRow], cfg: SimConfig) -> str:
    """The paper-style table as aligned text."""
    target = cfg.resolved("target")
    head = ("codec", "R", "T", "traffic MiB", "% NC", "comm min", "comp min", "total min", "% NC time",
            "acc", "codec %", "ratio", "rate", "paper rate")
    lines = []
    for r in rows:
        rr = f"{r.rounds}" if r.reached else f">{r.rounds}"
        lines.append((
            r.codec, rr, f"{r.T}", f"{r.traffic_MB:.3f}", _pct(r.pct_nc_traffic),
            f"{r.comm_min:.2f}", f"{r.comp_min:.3f}", f"{r.total_min:.2f}", _pct(r.pct_nc_time),
            f"{r.final_acc:.3f}", f"{100 * r.codec_share:.0f}%", f"{r.ratio:.2f}x", f"{r.rate_measured:.2f}x",
            "-" if r.rate_paper is None else f"{r.rate_paper:.2f}x"))
    goal = f"target accuracy {target:.2f}" if target else "no target accuracy"
    out = [f"{goal}; N = {cfg.clients} clients, K = {cfg.per_round} per round, E = {cfg.local_iters} local "
           f"SGD iterations per round, B = {cfg.batch_size}"]
    out += text_table(head, lines, [False] + [True] * (len(head) - 1), rule=True)
    out += legend(rows, cfg)
    return "\n".join(out)


def legend(rows: list[SummaryRow], cfg: SimConfig) -> list[str]:
    """A short legend (the full one: :data:`LEGEND_DOC`), a sentence where NC's own ratio is below 1,
    and one for every run that cost more traffic than NC."""
    recipients = "all N clients" if cfg.downlink == "all" else "the next round's participants"
    text = [
        "R = rounds run (>R: target not reached); T = R*E. % NC = share of the uncompressed run (codec none). "
        f"traffic = uplinks + downlink to {recipients}, in MiB; comm (simulated links) + comp (measured here) "
        "= total, in minutes. acc = last test accuracy; codec % = encode + decode share of compute. "
        "ratio = float32 bytes / message bytes; rate = the paper's compression rate from the measured bytes "
        "(it counts only K/N of the uploads, so rate > ratio); paper rate = the paper's formula. "
        f"Full legend: {LEGEND_DOC}.",
    ]
    for r in rows:
        if r.codec == "none" and r.ratio < 1:
            framing = r.mean_up_bytes - H * r.d
            text.append(f"none's ratio {r.ratio:.3g}x is below 1 because every message adds the container's "
                        f"framing (header, section table, checksum: {framing:.0f} B here) to the d = {r.d:,} "
                        "raw float32 values; the smaller the model, the more it shows.")
    if cfg.auth != "off":
        tag = {"blake2b": 32, "ed25519": 64}[cfg.auth]
        text.append(f"authentication ({cfg.auth}, {tag} B tag + 4 B header + key id per message; included "
                    "in traffic): " + "; ".join(
                        f"{r.codec} +{r.auth_up_bytes_per_msg:.0f} B/uplink msg, "
                        f"+{r.auth_bytes_per_msg} B/downlink msg, {r.auth_MB:.4f} MiB = "
                        f"{100 * r.auth_MB / r.traffic_MB:.3f} % of its traffic" for r in rows) + ".")
    nc = next((r for r in rows if r.codec == "none"), None)
    for r in rows:
        if nc is None or r is nc or r.pct_nc_traffic is None or r.pct_nc_traffic <= 100:
            continue
        why = []
        if r.downlink == "none":
            why.append("it compresses only the uplink, so the full-size downlink to "
                       f"{recipients}, which is {100 * r.down_MB / r.traffic_MB:.0f} % of its traffic, "
                       "stays as large as NC's every round")
        if r.rounds > nc.rounds:
            why.append(f"it ran {r.rounds} rounds to NC's {nc.rounds}")
        reason = " and ".join(why) if why else "its messages are larger than NC's"
        text.append(f"{r.codec} used {r.pct_nc_traffic:.0f} % of NC's traffic: {reason}.")
    return _wrap(text)


def _wrap(paragraphs: list[str], width: int = 110) -> list[str]:
    import textwrap

    return [line for p in paragraphs for line in textwrap.wrap(p, width)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}%"


def write_summary(out: Path, rows: list[SummaryRow], cfg: SimConfig, table: str,
                  machine: dict[str, Any] | None = None, data: dict[str, Any] | None = None) -> None:
    """summary.txt (the table), summary.json (settings, the data loaded, machine and device, rows, and
    each codec spec's run folder), .csv."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text(table + "\n")
    dicts = [{k: rounded(v) for k, v in r.as_dict().items()} for r in rows]
    doc = {"config": cfg.to_dict(), "data": data, "machine": machine, "runs": dicts,
           "folders": {spec: folder_name(spec) for spec in cfg.codecs}}
    (out / "summary.json").write_text(json.dumps(doc, indent=1, default=str))
    if rows:
        with open(out / "summary.csv", "w", newline="") as f:
            w = csv.DictWriter(f, list(dicts[0]))
            w.writeheader()
            w.writerows(dicts)


def plot_title(cfg: SimConfig) -> str:
    """What a figure shows: data set, N, K and seed (the figure alone must say which run it is)."""
    return f"{cfg.dataset}, N = {cfg.clients} clients, K = {cfg.per_round} per round, seed {cfg.seed}"


def plot(out: Path, results: list[RunResult], cfg: SimConfig) -> list[Path]:
    """accuracy_vs_rounds.png and accuracy_vs_traffic.png (cumulative MiB), one line per codec, titled
    (:func:`plot_title`, also the PNG's Title metadata), with the target accuracy as a dashed line and
    a marker where each run stopped: a star where it reached the target, a cross at the round limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, target = plot_title(cfg), cfg.resolved("target")
    paths = []
    for name, xlabel in (("rounds", "round"), ("traffic", "cumulative traffic (MiB)")):
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for res in results:
            xs, ys, cum = [], [], 0
            for r in res.records:
                cum += r.bytes_up + r.bytes_down
                if r.accuracy is not None:
                    xs.append(r.round if name == "rounds" else cum / MB)
                    ys.append(r.accuracy)
            line, = ax.plot(xs, ys, marker=".", label=res.codec)
            if xs:  # where the run stopped
                ax.plot(xs[-1], ys[-1], linestyle="none", color=line.get_color(), markersize=11,
                        marker="*" if res.reached_round is not None else "X")
        if target:
            ax.axhline(target, color="0.4", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.plot([], [], linestyle="none", marker="*", color="0.3", label="stopped: target reached")
        ax.plot([], [], linestyle="none", marker="X", color="0.3", label="stopped: round limit")
        if name == "traffic":
            ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = out / f"accuracy_vs_{name}.png"
        fig.savefig(p, metadata={"Title": title, "Description": f"test accuracy vs {xlabel}"})
        plt.close(fig)
        paths.append(p)
    return paths
