"""The command line of the benchmarks that compile on a CPU and time on a GPU (for example
``benchmarks/fa4_cost_parts.py``): ``build`` compiles into a folder, ``run`` times that folder and
may write a result file. One parser, so the scripts take the same words for the same things."""

from __future__ import annotations

import argparse


def build_run_parser(doc: str, default_out: str, *, build_help: str, run_help: str):
    """(parser, its build subparser, its run subparser). build: ``-o/--out`` (default
    ``default_out``) and ``--force`` (replace a build folder); run: the build folder and ``--json``
    (the result file). Each script adds its own options to either subparser."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help=build_help)
    b.add_argument("-o", "--out", default=default_out)
    b.add_argument("--force", action="store_true", help="replace an existing build folder")
    r = sub.add_parser("run", help=run_help)
    r.add_argument("build")
    r.add_argument("--json", help="write the result file here")
    return ap, b, r
