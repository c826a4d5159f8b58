#!/usr/bin/env python3
"""A/B several builds of the benchmark in one device call (docs/gpu-runs.md).

    scripts/bench_ab.py --variant v7 .ab/src-ca876a9 --variant v8 . \\
        --variant v8-mb1 . --env v8-mb1 SELKV_BENCH_MIN_BLOCKS=1 \\
        --flags v8-x " -DNAME=1" --variant v8-x . \\
        --rounds 3 --out $OUT -- --bench --quick --ops decode

Each variant is a source tree (this checkout, or an older commit exported with
`git archive <rev> | tar -x -C .ab/src-<rev>`: the device copy has no .git), or `exe:PATH`, a CLI
already built (e.g. the suite's build/selkv), with optional extra
CUDA flags (compile-time switches; start the string with a space, " -DX=1", or argparse takes
it for an option) and environment (run-time switches). Variants that share the
tree and the flags share one build. All builds run in parallel (the CLI only, no tests, no
torch); then the benchmark runs `--rounds` times, the variants alternating within each round
(in reverse order in odd rounds) so that clock, thermal and power-cap drift hit all of them alike. The per-case median over rounds of each
variant's median goes to `<out>/ab_summary.csv` and to stdout with its ratio to the first variant
(< 1: faster). The raw CSVs stay as `<out>/ab_<variant>_<round>.csv` unless --no-raw (the device
tool brings back at most 8 files).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse(argv: list[str]):
    if "--" in argv:
        i = argv.index("--")
        argv, bench_args = argv[:i], argv[i + 1 :]
    else:
        bench_args = ["--bench", "--quick", "--ops", "decode"]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", nargs=2, action="append", metavar=("NAME", "SRC"), required=True,
                    help="SRC: a source tree to build, or exe:PATH, an already built selkv CLI")
    ap.add_argument("--flags", nargs=2, action="append", default=[], metavar=("NAME", "CUDA_FLAGS"))
    ap.add_argument("--env", nargs=2, action="append", default=[], metavar=("NAME", "KEY=VALUE"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--build-root", default=str(ROOT / ".ab"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cutlass", default=str(ROOT / "third_party" / "cutlass"))
    ap.add_argument("--no-raw", action="store_true", help="delete the per-round CSVs after the summary")
    return ap.parse_args(argv), bench_args


def build_all(variants, flags, args) -> dict[str, Path]:
    """name -> selkv CLI path; one build per distinct (source, flags); exe:PATH is used as is."""
    keys: dict[tuple[str, str], str] = {}
    for name, src in variants:
        if not src.startswith("exe:"):
            keys.setdefault((str(Path(src).resolve()), flags.get(name, "")), name)
    if not keys:
        return {name: Path(src[4:]) for name, src in variants}
    per_job = max(1, args.jobs // len(keys))
    procs = []
    for (src, fl), first in keys.items():
        bdir = Path(args.build_root) / f"build-{first}"
        log = open(Path(args.build_root) / f"build-{first}.log", "w")
        cmd = (f"cmake -S '{src}' -B '{bdir}' -DCMAKE_BUILD_TYPE=Release -DSELKV_BUILD_TORCH=OFF "
               f"-DSELKV_BUILD_TESTS=OFF -DSELKV_CUTLASS_DIR='{args.cutlass}' -DCMAKE_CUDA_FLAGS='{fl}' "
               f"&& cmake --build '{bdir}' -j {per_job} --target selkv_cli")
        procs.append((first, bdir, log, subprocess.Popen(cmd, shell=True, stdout=log, stderr=subprocess.STDOUT)))
    built: dict[tuple[str, str], Path] = {}
    for first, bdir, log, p in procs:
        rc = p.wait()
        log.close()
        if rc != 0:
            sys.exit(f"[ab] build of {first} failed (rc {rc}): see {log.name}")
        exe = next((q for q in (bdir / "selkv", bdir / "tools" / "selkv") if q.is_file()), None)
        if exe is None:
            sys.exit(f"[ab] no selkv binary under {bdir}")
        built[next(k for k, v in keys.items() if v == first)] = exe
    return {name: Path(src[4:]) if src.startswith("exe:") else built[(str(Path(src).resolve()), flags.get(name, ""))]
            for name, src in variants}


def key_of(row: dict) -> tuple[str, str, str]:
    # The variant column carries "anchor_us=...;..." notes after the first ';'.
    return row["op"], row["shape"], row["variant"].split(";")[0]


def main() -> int:
    args, bench_args = parse(sys.argv[1:])
    variants = [tuple(v) for v in args.variant]
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        sys.exit("[ab] variant names must be distinct")
    flags = dict(args.flags)
    envs: dict[str, dict[str, str]] = {n: {} for n in names}
    for n, kv in args.env:
        k, _, v = kv.partition("=")
        envs.setdefault(n, {})[k] = v
    for n in list(flags) + list(envs):
        if n not in names:
            sys.exit(f"[ab] --flags/--env name {n!r} is not a variant")
    Path(args.build_root).mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exes = build_all(variants, flags, args)
    print(f"[ab] built: {', '.join(f'{n} -> {e}' for n, e in exes.items())}", flush=True)

    results: dict[str, dict[tuple, list[float]]] = {n: {} for n in names}
    order: list[tuple] = []
    raw = []
    gpu = ""
    for r in range(args.rounds):
        # Odd rounds run the variants in reverse: sustained runs sit at the board power cap, where
        # whichever runs second in a pair reads ~1 % slower; alternating cancels that bias.
        for n in (names if r % 2 == 0 else names[::-1]):
            csv_path = out / f"ab_{n}_{r}.csv"
            env = dict(os.environ, SELKV_GIT_HASH=os.environ.get("SELKV_GIT_HASH", n), **envs[n])
            p = subprocess.run([str(exes[n]), *bench_args, "--csv", str(csv_path)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode != 0:
                print(p.stdout[-4000:])
                sys.exit(f"[ab] {n} round {r} failed (rc {p.returncode})")
            if not csv_path.is_file():
                print(p.stdout[-4000:])
                sys.exit(f"[ab] {n} round {r} wrote no {csv_path} (the CSV needs a GPU run of --bench)")
            raw.append(csv_path)
            with open(csv_path) as f:
                for row in csv.DictReader(f):
                    gpu = gpu or row.get("gpu", "")
                    if row["op"].startswith("ceiling"):
                        continue
                    k = key_of(row)
                    if k not in order:
                        order.append(k)
                    results[n].setdefault(k, []).append(float(row["median_us"]))
            print(f"[ab] round {r} {n} done", flush=True)

    base = names[0]
    with open(out / "ab_summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "shape", "variant", *[f"{n}_us" for n in names], *[f"{n}/{base}" for n in names[1:]],
                    "rounds", "git_hash", "gpu"])
        run_hash = os.environ.get("SELKV_GIT_HASH", "")  # the tree under test; variants are named
        for k in order:
            meds = [statistics.median(results[n][k]) if k in results[n] else None for n in names]
            ratios = [m / meds[0] if m and meds[0] else None for m in meds[1:]]
            w.writerow([*k, *[f"{m:.2f}" if m else "" for m in meds], *[f"{x:.3f}" if x else "" for x in ratios],
                        args.rounds, run_hash, gpu])
            cells = "  ".join(f"{n} {m:9.2f}" if m else f"{n} {'-':>9}" for n, m in zip(names, meds))
            rs = "  ".join(f"{x:.3f}" if x else "-" for x in ratios)
            print(f"{k[0]:>8} {k[1]:<52.52} {k[2]:<22.22} {cells}  ratio {rs}")
    if args.no_raw:
        for pth in raw:
            pth.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
