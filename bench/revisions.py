"""bench/throughput.py's same-run ratios for two checkouts, interleaved, on one machine.

A ratio (playline over the naive design, over the aiohttp roof) moves with the host,
so "no slower than before" is only meaningful with the before and after runs side by
side: this runs ``bench/throughput.py --json`` in each checkout in turn (A B, B A, ...),
each with its own code (the worker processes get their checkout on ``PYTHONPATH``), and
prints the medians and min-max of every ratio per checkout, and after / before.

    git worktree add /tmp/before <commit>
    python bench/revisions.py /tmp/before . --rounds 3 -- --rows 10000 --repeats 1 --scale ""

Arguments after ``--`` go to bench/throughput.py unchanged. With ``--script-of after``
both checkouts are measured by the after checkout's bench/throughput.py (its
``PLAYLINE_BENCH_CHECKOUT`` names whose playline runs), so designs the before checkout's
script lacks (``fixture-pg``, ``live-pg``) are measured for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

RATIOS = (
    "fixture_vs_naive",
    "live_vs_naive",
    "live_vs_aiohttp_roof",
    "live_none_vs_live",
    "fixture_pg_vs_fixture",
    "live_pg_vs_live",
)


def run_once(checkout: Path, bench_args: list[str], script: Path | None = None) -> dict[str, float]:
    """One ``throughput.py --json`` of ``checkout``'s playline: its ratios and designs'
    rows/s (measured by ``script``, default the checkout's own)."""
    done = subprocess.run(
        [
            sys.executable,
            str(script or checkout / "bench" / "throughput.py"),
            "--json",
            *bench_args,
        ],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout), "PLAYLINE_BENCH_CHECKOUT": str(checkout)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: bench/throughput.py failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    figures = {k: report[k] for k in RATIOS if report.get(k) is not None}
    for design, f in report["comparison"].items():
        figures[f"{design} rows/s"] = f["rows_per_s"]["median"]
    return figures


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the checkout to compare against")
    parser.add_argument("after", type=Path, help="the checkout under test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--script-of",
        choices=("each", "after"),
        default="each",
        help="whose bench/throughput.py measures both checkouts",
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.bench_args = argv[cut + 1 :]
    samples: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for round_no in range(args.rounds):
        order = ["before", "after"] if round_no % 2 == 0 else ["after", "before"]
        for name in order:
            script = (
                args.after.resolve() / "bench" / "throughput.py"
                if args.script_of == "after"
                else None
            )
            figures = run_once(getattr(args, name).resolve(), args.bench_args, script)
            samples[name].append(figures)
            shown = ", ".join(f"{k} {v:.3g}" for k, v in figures.items())
            print(f"round {round_no + 1} {name}: {shown}", file=sys.stderr)
    keys = sorted(
        {k for s in samples["after"] for k in s} | {k for s in samples["before"] for k in s}
    )
    print("| figure | before | after | after / before (medians) |")
    print("|---|---|---|---|")
    for key in keys:
        before = [s[key] for s in samples["before"] if key in s]
        after = [s[key] for s in samples["after"] if key in s]
        change = (
            f"{statistics.median(after) / statistics.median(before):.3f}"
            if before and after
            else "-"
        )
        print(
            f"| {key} | {spread(before) if before else '-'} | "
            f"{spread(after) if after else '-'} | {change} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
