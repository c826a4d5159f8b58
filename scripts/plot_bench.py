#!/usr/bin/env python3
"""Turn benchmark CSVs (bench/results/) into PNG plots.

    python3 scripts/plot_bench.py <csv>... [--out docs/plots] [--dpi 100]

One PNG per (file, op) group, named ``<csv stem>_<op>.png``. Layouts recognised (by the header):

- C++ harness (``selkv --bench``): op, shape, variant, median_us, min_us, max_us, TFLOPS, GB/s,
  pct_of_ceiling, git_hash, gpu. Per op: median time per case (min-max whiskers), the % of the
  run's ceiling annotated, the roofline time (median_us * pct_of_ceiling / 100: the op's bytes at
  the copy ceiling, or its flops at the matmul ceiling) as a marker, and the anchor when the
  variant text carries one (``;anchor_us=..;anchor/ours=..`` drawn as a bar, ``;vs_<key>=ratio``
  annotated).
- side by side (``bench/compare_flash_mla.py``): op, shape, variant, selkv_us, flash_mla_us,
  flash_mla/selkv, ..., pct_of_matmul, ... Per op: selkv and FlashMLA time per case, the ratio
  annotated, the roofline time (selkv_us * pct_of_matmul / 100) as a marker. The ``packed`` op
  (``--ops packed``) gets a speedup chart instead: native / packed, FlashMLA / packed and
  native / (pack + packed) per case, H = 64 and H = 128, with the 1.10 and 1.15 targets.
- A/B (``scripts/bench_ab.py``): op, shape, variant, <name>_us..., <a>/<b>..., rounds. Per op:
  each variant's time per case, the ratios annotated.
- dsa decode step (``bench/dsa_step.py``): B, S_q, H, K, s_kv, mode, step_us, <kernel>_us...,
  sum_us, ratio. One chart: the step beside the sum of its kernels (stacked), per case and mode.

Rows ``ceiling_*`` and ``summary`` are not cases (the summary lines go under the packed chart).
Titles carry the commit and GPU from the CSV. Output is deterministic (Agg backend, no software
or date metadata). Needs matplotlib only for plotting; ``--help`` works without it.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys

HARNESS = {"op", "shape", "variant", "median_us", "min_us", "max_us", "pct_of_ceiling"}
COMPARE = {"op", "shape", "variant", "selkv_us", "flash_mla_us", "flash_mla/selkv", "pct_of_matmul"}
AB = {"op", "shape", "variant", "rounds"}
DSA = {"B", "S_q", "H", "K", "s_kv", "mode", "step_us", "sum_us", "ratio"}

SELKV_C = "#1f77b4"
ANCHOR_C = "#ff7f0e"
EXTRA_C = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#d62728"]

plt = None  # set by _mpl()


class LayoutError(Exception):
    pass


def _mpl():
    global plt
    if plt is None:
        try:
            import matplotlib
        except ImportError:
            sys.exit("plot_bench.py: matplotlib is not installed; pip install matplotlib")
        matplotlib.use("Agg")
        import matplotlib.pyplot as _plt
        _plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "svg.hashsalt": "selkv",
                              "path.simplify": True})
        plt = _plt
    return plt


# ---------------------------------------------------------------- reading

def _num(s):
    if s is None:
        return None
    s = s.strip()
    if not s:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
        header = set(rows[0].keys()) if rows else set()
    if not rows:
        raise LayoutError(f"{path}: no rows")
    if COMPARE <= header:
        kind = "compare"
    elif HARNESS <= header:
        kind = "harness"
    elif DSA <= header:
        kind = "dsa"
    elif AB <= header and any(h.endswith("_us") for h in header):
        kind = "ab"
    else:
        raise LayoutError(
            f"{path}: unknown CSV layout (header: {', '.join(sorted(header))}); known: C++ harness "
            f"({', '.join(sorted(HARNESS))}), compare_flash_mla.py ({', '.join(sorted(COMPARE))}), "
            f"bench_ab.py (op, shape, variant, <name>_us..., rounds), dsa_step.py "
            f"({', '.join(sorted(DSA))})")
    return kind, rows


def provenance(rows):
    def uniq(key):
        vals = []
        for r in rows:
            v = (r.get(key) or "").strip()
            if v and v not in vals:
                vals.append(v)
        return "/".join(vals) if vals else "?"
    return f"commit {uniq('git_hash')}, {uniq('gpu')}"


def by_op(rows):
    groups = {}
    for r in rows:
        op = r["op"]
        if op.startswith("ceiling_") or op == "summary":
            continue
        groups.setdefault(op, []).append(r)
    return groups


# ---------------------------------------------------------------- labels

def _k(m):
    n = int(m.group(2))
    if n >= 1024 and n % 1024 == 0:
        n //= 1024
        if n >= 1024 and n % 1024 == 0:
            return f"{m.group(1)}{n // 1024}M"
        return f"{m.group(1)}{n}K"
    return m.group(0)


def short_shape(shape):
    return re.sub(r"(=)(\d+)\b", _k, shape)


def case_labels(shapes):
    """Short labels: numbers as K, tokens shared by every case dropped (returned apart)."""
    toks = [short_shape(s).split() for s in shapes]
    common = set(toks[0]).intersection(*toks[1:]) if len(toks) > 1 else set()
    labels = [" ".join(t for t in ts if t not in common) or " ".join(ts) for ts in toks]
    common_txt = " ".join(t for t in toks[0] if t in common)
    return labels, common_txt


def clip(s, n=34):
    return s if len(s) <= n else s[: n - 1] + "…"


def _logscale(ax, vals):
    vals = [v for v in vals if v and v > 0]
    if vals and max(vals) / min(vals) > 25:
        ax.set_xscale("log")
        return True
    return False


def _save(fig, out_dir, stem, op, dpi):
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{stem}_{op}") + ".png"
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=dpi, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path


def _legend_below(ax):
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.75 / ax.figure.get_figheight()),
              ncol=3, fontsize=7, frameon=False)


def _title(fig, stem, op, rows, extra=""):
    fig.suptitle(f"{op} — {stem}\n{provenance(rows)}{extra}", fontsize=9)


def _hbar_figure(ncases, nbars):
    height = max(2.6, 0.9 + ncases * (0.16 * nbars + 0.12))
    return plt.subplots(figsize=(10, height))


# ---------------------------------------------------------------- compare (side by side)

def plot_compare_op(op, rows, stem, out, dpi):
    labels, common = case_labels([r["shape"] for r in rows])
    variants = [r["variant"] for r in rows]
    if len(set(variants)) > 1:
        labels = [f"{l}  [{clip(v, 30)}]" for l, v in zip(labels, variants)]
    sel = [_num(r["selkv_us"]) for r in rows]
    fm = [_num(r["flash_mla_us"]) for r in rows]
    ratio = [_num(r["flash_mla/selkv"]) for r in rows]
    pct = [_num(r["pct_of_matmul"]) for r in rows]
    anchor_name = "FlashMLA"
    if all("anchor:" in v for v in variants):
        anchor_name = variants[0].split("anchor:", 1)[1].strip(" )")
    n = len(rows)
    fig, ax = _hbar_figure(n, 2)
    h = 0.38
    ys = list(range(n))[::-1]
    has_fm = any(v is not None for v in fm)
    ax.barh([y + h / 2 for y in ys], [v or 0 for v in sel], h, color=SELKV_C, label="selkv")
    if has_fm:
        ax.barh([y - h / 2 for y in ys], [v or 0 for v in fm], h, color=ANCHOR_C, label=anchor_name)
    roof = [(y + h / 2, s * p / 100) for y, s, p in zip(ys, sel, pct) if s and p]
    if roof:
        ax.scatter([r[1] for r in roof], [r[0] for r in roof], marker="|", s=160, color="k",
                   linewidths=2, zorder=3, label="roofline (selkv flops at the matmul ceiling)")
    log = _logscale(ax, sel + fm + [r[1] for r in roof])
    xmax = max(v for v in sel + fm if v)
    for y, s, f, q, p in zip(ys, sel, fm, ratio, pct):
        parts = []
        if q is not None:
            parts.append(f"{anchor_name}/selkv {q:.2f}")
        if p:
            parts.append(f"{p:.0f} % roofline")
        top = max(v for v in (s, f) if v)
        ax.text(top * (1.08 if log else 1.0) + (0 if log else xmax * 0.01), y, "  ".join(parts),
                va="center", fontsize=7)
    ax.set_xlim(right=xmax * (25 if log else 1.45))
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)
    ax.set_xlabel("time (us, median)" + (", log scale" if log else ""))
    _legend_below(ax)
    ax.grid(axis="x", alpha=0.3)
    _title(fig, stem, op, rows, f"\n{common}" if common else "")
    fig.tight_layout()
    return _save(fig, out, stem, op, dpi)


PACKED_VARIANTS = {
    "native": "native",
    "packed": "packed",
    "packed, packed after the flush": "packed_seed",
    "pack+packed": "pack_packed",
    "pack (anchor: device copy)": "pack",
}


def plot_packed(rows, summary, stem, out, dpi):
    cases = {}  # (H, short case) -> {key: row}
    order = []
    for r in rows:
        key = PACKED_VARIANTS.get(r["variant"])
        if key is None:
            raise LayoutError(f"{stem}: packed row with unknown variant {r['variant']!r} "
                              f"(known: {', '.join(PACKED_VARIANTS)})")
        m = re.search(r"\bH=(\d+)", r["shape"])
        hh = int(m.group(1)) if m else 0
        bm, sm = re.search(r"\bB=(\d+)", r["shape"]), re.search(r"\bS_q=(\d+)", r["shape"])
        lab = f"{bm.group(1) if bm else '?'}/{sm.group(1) if sm else '?'}"
        ck = (hh, lab)
        if ck not in cases:
            cases[ck] = {}
            order.append(ck)
        cases[ck][key] = r
    heads = sorted({h for h, _ in order})
    fig, axes = plt.subplots(len(heads), 1, figsize=(10, 3.3 * len(heads) + 1.2), squeeze=False)
    series = [
        ("native / packed (buffer cold)", lambda c: _ratio(c, "native", "packed", "selkv_us"),
         dict(color=SELKV_C, marker="o")),
        ("native / packed (packed after the flush, seed 000 method)",
         lambda c: _ratio(c, "native", "packed_seed", "selkv_us"), dict(color=SELKV_C, marker="s", ls="--")),
        ("FlashMLA / packed (buffer cold)", lambda c: _fm_ratio(c, "packed"),
         dict(color=ANCHOR_C, marker="o")),
        ("FlashMLA / packed (after the flush)", lambda c: _fm_ratio(c, "packed_seed"),
         dict(color=ANCHOR_C, marker="s", ls="--")),
        ("native / (pack + packed)", lambda c: _ratio(c, "native", "pack_packed", "selkv_us"),
         dict(color="#7f7f7f", marker="^", ls=":")),
    ]
    for ax, hh in zip(axes[:, 0], heads):
        keys = [ck for ck in order if ck[0] == hh]
        xs = list(range(len(keys)))
        for name, fn, style in series:
            ys = [fn(cases[k]) for k in keys]
            ax.plot(xs, [math.nan if v is None else v for v in ys], label=name, ms=3.5, lw=1.2, **style)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.10, color="#d62728", lw=1, ls="-.", label="target: packed >= 1.10x native")
        ax.axhline(1.15, color="#9467bd", lw=1, ls="-.", label="target: packed >= 1.15x FlashMLA")
        prev_b = None
        for x, k in zip(xs, keys):
            b = k[1].split("/")[0]
            if prev_b is not None and b != prev_b:
                ax.axvline(x - 0.5, color="k", alpha=0.15, lw=0.8)
            prev_b = b
        ax.set_xticks(xs)
        ax.set_xticklabels([k[1] for k in keys], rotation=90, fontsize=7)
        ax.set_xlim(-0.5, len(keys) - 0.5)
        ax.set_ylabel("speedup (x)")
        ax.set_title(f"H = {hh}   (x axis: B / S_q)")
        ax.grid(axis="y", alpha=0.3)
    hs, ls = axes[0, 0].get_legend_handles_labels()
    fig.legend(hs, ls, loc="upper center", bbox_to_anchor=(0.5, 0.935), ncol=4, fontsize=7, frameon=False)
    common = case_labels([r["shape"] for r in rows])[1]
    _title(fig, stem, "packed decode", rows, f"; {common}" if common else "")
    if summary:
        fig.text(0.01, 0.005, "\n".join(f"summary: {s}" for s in summary), fontsize=6.5, va="bottom")
    fig.tight_layout(rect=(0, 0.012 * (len(summary) + 1), 1, 0.905))
    return _save(fig, out, stem, "packed", dpi)


def _ratio(c, num, den, col):
    a, b = c.get(num), c.get(den)
    if not a or not b:
        return None
    x, y = _num(a[col]), _num(b[col])
    return x / y if x and y else None


def _fm_ratio(c, den):
    a, b = c.get("native"), c.get(den)
    if not a or not b:
        return None
    x, y = _num(a["flash_mla_us"]), _num(b["selkv_us"])
    return x / y if x and y else None


def plot_compare(path, rows, stem, out, dpi):
    outs = []
    summary = [r["shape"] for r in rows if r["op"] == "summary"]
    for op, rs in by_op(rows).items():
        if op == "packed":
            outs.append(plot_packed(rs, summary, stem, out, dpi))
        else:
            outs.append(plot_compare_op(op, rs, stem, out, dpi))
    return outs


# ---------------------------------------------------------------- C++ harness

def parse_variant(v):
    parts = v.split(";")
    base, anchor_us, anchor_ratio, vs = parts[0], None, None, []
    for p in parts[1:]:
        if p.startswith("anchor_us="):
            anchor_us = _num(p.split("=", 1)[1])
        elif p.startswith("anchor/ours="):
            anchor_ratio = _num(p.split("=", 1)[1])
        elif p.startswith("vs_") and "=" in p:
            key, val = p[3:].rsplit("=", 1)
            vs.append((key, val))
        else:
            vs.append((p, ""))
    if base.endswith("/eager"):
        base = base[: -len("/eager")]
    return base, anchor_us, anchor_ratio, vs


def plot_harness_op(op, rows, stem, out, dpi):
    shapes = []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    labels, common = case_labels(shapes)
    variants = []
    for r in rows:
        b = parse_variant(r["variant"])[0]
        if b not in variants:
            variants.append(b)
    colors = {v: ([SELKV_C] + EXTRA_C)[i % (1 + len(EXTRA_C))] for i, v in enumerate(variants)}
    bars = []  # (shape index, label, value, color, row or None, kind)
    for si, s in enumerate(shapes):
        for r in rows:
            if r["shape"] != s:
                continue
            base, a_us, a_ratio, vs = parse_variant(r["variant"])
            bars.append((si, base, _num(r["median_us"]), colors[base], r, (a_ratio, vs)))
            if a_us:
                bars.append((si, "anchor", a_us, ANCHOR_C, None, None))
    per_shape = {}
    for b in bars:
        per_shape.setdefault(b[0], []).append(b)
    nmax = max(len(v) for v in per_shape.values())
    fig, ax = _hbar_figure(len(shapes), nmax)
    h = 0.8 / nmax
    ytick, ylab = [], []
    seen = set()
    allv = []
    texts = []
    roof_pts = {"copy": [], "matmul": []}
    for si in range(len(shapes)):
        y0 = len(shapes) - 1 - si
        ytick.append(y0)
        ylab.append(labels[si])
        bs = per_shape[si]
        for j, (_, name, val, col, r, extra) in enumerate(bs):
            y = y0 + (len(bs) - 1) / 2 * h - j * h
            lab = None if name in seen else ("anchor (FlashMLA)" if name == "anchor" else name)
            seen.add(name)
            if r is not None:
                lo, hi = _num(r["min_us"]), _num(r["max_us"])
                xerr = [[val - lo], [hi - val]] if lo is not None and hi is not None else None
                ax.barh(y, val, h * 0.92, color=col, label=lab, xerr=xerr,
                        error_kw=dict(lw=0.7, capsize=1.5))
                pct = _num(r["pct_of_ceiling"])
                tf = _num(r.get("TFLOPS"))
                t = [f"{val:.4g} us"]
                if pct:
                    t.append(f"{pct:.0f} % of {'matmul' if tf else 'copy'} ceiling")
                    roof_pts["matmul" if tf else "copy"].append((val * pct / 100, y))
                a_ratio, vs = extra
                if a_ratio:
                    t.append(f"anchor/selkv {a_ratio:.2f}")
                for k, v in vs:
                    if k.endswith("/" + r["shape"]):  # "vs_pack-copy/<shape>=r": the key names the case
                        k = k[: -len(r["shape"]) - 1]
                    t.append(f"vs {clip(k, 24)}: {v}" if v else clip(k, 30))
                texts.append((y, val, ", ".join(t)))
            else:
                ax.barh(y, val, h * 0.92, color=col, label=lab, hatch="//", alpha=0.8)
                texts.append((y, val, f"{val:.4g} us"))
            allv.append(val)
    for kind, marker in (("copy", "|"), ("matmul", "|")):
        pts = roof_pts[kind]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=110,
                       color="k" if kind == "matmul" else "#555555", linewidths=2, zorder=3,
                       label=f"roofline (time at the {kind} ceiling)")
            allv += [p[0] for p in pts]
    log = _logscale(ax, allv)
    xmax = max(allv)
    for y, val, t in texts:
        ax.text(val * 1.08 if log else val + xmax * 0.01, y, t, va="center", fontsize=6.5)
    ax.set_xlim(right=xmax * (60 if log else 1.75))
    ax.set_yticks(ytick)
    ax.set_yticklabels(ylab)
    ax.set_xlabel("time (us, median; whiskers min-max)" + (", log scale" if log else ""))
    _legend_below(ax)
    ax.grid(axis="x", alpha=0.3)
    _title(fig, stem, op, rows, f"\n{common}" if common else "")
    fig.tight_layout()
    return _save(fig, out, stem, op, dpi)


def plot_harness(path, rows, stem, out, dpi):
    return [plot_harness_op(op, rs, stem, out, dpi) for op, rs in by_op(rows).items()]


# ---------------------------------------------------------------- A/B

def plot_ab(path, rows, stem, out, dpi):
    header = list(rows[0].keys())
    tcols = [c for c in header if c.endswith("_us")]
    rcols = [c for c in header if "/" in c]
    outs = []
    for op, rs in by_op(rows).items():
        labels, common = case_labels([r["shape"] for r in rs])
        if len({r["variant"] for r in rs}) > 1:
            labels = [f"{l}  [{clip(r['variant'], 24)}]" for l, r in zip(labels, rs)]
        n, k = len(rs), len(tcols)
        fig, ax = _hbar_figure(n, k)
        h = 0.8 / k
        allv = []
        for j, c in enumerate(tcols):
            vals = [_num(r[c]) or 0 for r in rs]
            allv += vals
            ax.barh([n - 1 - i + (k - 1) / 2 * h - j * h for i in range(n)], vals, h * 0.92,
                    color=([SELKV_C, ANCHOR_C] + EXTRA_C)[j % (2 + len(EXTRA_C))], label=c[:-3])
        log = _logscale(ax, allv)
        xmax = max(allv)
        for i, r in enumerate(rs):
            top = max(_num(r[c]) or 0 for c in tcols)
            t = "  ".join(f"{c} {r[c]}" for c in rcols if r.get(c))
            ax.text(top * 1.08 if log else top + xmax * 0.01, n - 1 - i, t, va="center", fontsize=6.5)
        ax.set_xlim(right=xmax * (25 if log else 1.6))
        ax.set_yticks(range(n))
        ax.set_yticklabels(labels[::-1])
        ax.set_xlabel("time (us)" + (", log scale" if log else ""))
        _legend_below(ax)
        ax.grid(axis="x", alpha=0.3)
        _title(fig, stem, op, rs, f"\n{common}" if common else "")
        fig.tight_layout()
        outs.append(_save(fig, out, stem, op, dpi))
    return outs


# ---------------------------------------------------------------- dsa step

def plot_dsa(path, rows, stem, out, dpi):
    header = list(rows[0].keys())
    kcols = [c for c in header[header.index("step_us") + 1: header.index("sum_us")] if c.endswith("_us")]
    n = len(rows)
    fig, ax = _hbar_figure(n, 2)
    h = 0.38
    ys = list(range(n))[::-1]
    labels = [f"B={r['B']} S_q={r['S_q']} H={r['H']} K={short_shape('=' + r['K'])[1:]} "
              f"s_kv={short_shape('=' + r['s_kv'])[1:]}  {r['mode']}" for r in rows]
    step = [_num(r["step_us"]) for r in rows]
    ax.barh([y + h / 2 for y in ys], step, h, color=SELKV_C, label="step (DsaAttention.run)")
    left = [0.0] * n
    for j, c in enumerate(kcols):
        vals = [_num(r[c]) or 0 for r in rows]
        ax.barh([y - h / 2 for y in ys], vals, h, left=left, color=EXTRA_C[j % len(EXTRA_C)],
                label=f"{c[:-3]} alone")
        left = [a + b for a, b in zip(left, vals)]
    xmax = max(max(step), max(left))
    for y, r, s, t in zip(ys, rows, step, left):
        ax.text(max(s, t) + xmax * 0.01, y, f"step / sum {_num(r['ratio']):.2f}", va="center", fontsize=7)
    ax.set_xlim(right=xmax * 1.3)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)
    ax.set_xlabel("time (us, median of CUDA graph replays); target: step <= 1.05 x sum of its kernels")
    _legend_below(ax)
    ax.grid(axis="x", alpha=0.3)
    _title(fig, stem, "dsa decode step", rows)
    fig.tight_layout()
    return [_save(fig, out, stem, "step", dpi)]


# ---------------------------------------------------------------- main

PLOTTERS = {"compare": plot_compare, "harness": plot_harness, "ab": plot_ab, "dsa": plot_dsa}


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Plot benchmark CSVs (C++ harness, compare_flash_mla.py, bench_ab.py, dsa_step.py) "
                    "as PNGs, one per (file, op).")
    ap.add_argument("csv", nargs="+", help="CSV files (bench/results/*.csv)")
    ap.add_argument("--out", default="docs/plots", help="output directory (default docs/plots)")
    ap.add_argument("--dpi", type=int, default=100, help="PNG resolution (default 100)")
    args = ap.parse_args(argv)
    parsed = []
    for p in args.csv:
        try:
            parsed.append((p,) + read_csv(p))
        except (OSError, LayoutError) as e:
            sys.exit(f"plot_bench.py: {e}")
    _mpl()
    os.makedirs(args.out, exist_ok=True)
    for p, kind, rows in parsed:
        stem = os.path.splitext(os.path.basename(p))[0]
        try:
            for o in PLOTTERS[kind](p, rows, stem, args.out, args.dpi):
                print(o)
        except LayoutError as e:
            sys.exit(f"plot_bench.py: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
