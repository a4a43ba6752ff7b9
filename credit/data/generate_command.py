"""``credit data generate --out DIR [--grid 32x64] [--years 2000 2001] [--format netcdf|zarr]
[--layout native|credit-gen1|credit-gen2] ...`` or ``--like CREDIT.yml --out DIR [--grid HxW]``: the command over :mod:`credit.data.generate`
(this project's layout) and the CREDIT-layout writers built on it, kept apart from them so
that the writers import the generator and nothing imports back."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .generate import FORMATS, GenerateError, generate_dataset


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message, surfaced by main()
        raise GenerateError(message)


def _parse_grid(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"--grid must look like NLATxNLON (e.g. 32x64), got {text!r}")
    return int(parts[0]), int(parts[1])


LAYOUTS = ["native", "credit-gen1", "credit-gen2"]  # --layout


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (``credit data generate``). Returns the exit status; errors print one line."""
    parser = _ArgumentParser(prog="credit data generate",
                             description="Generate a synthetic ERA5-layout dataset from a deterministic toy atmosphere.")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--grid", type=_parse_grid, default=None,
                        help="NLATxNLON (default 32x64; with --like, the file's model grid)")
    parser.add_argument("--like", type=Path, default=None,
                        help="a CREDIT gen2 config file: data in its layout, and a copy of it pointing at the data")
    parser.add_argument("--days", type=int, default=2,
                        help="with --like: the days of the training and validation periods written (default 2)")
    parser.add_argument("--years", type=int, nargs="+", default=[2000, 2001], help="years, one file each")
    parser.add_argument("--levels", type=float, nargs="+", default=[300, 500, 700, 850], help="pressure levels, hPa")
    parser.add_argument("--train-years", type=int, nargs="+", default=None,
                        help="years for mean/std (default: all but the last)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days-per-year", type=int, default=None, help="keep only the first N days of each year")
    parser.add_argument("--time-range", nargs=2, metavar=("START", "END"), default=None,
                        help="keep only times in this inclusive ISO range")
    parser.add_argument("--format", choices=list(FORMATS), default="netcdf",
                        help="data files as netCDF (default) or zarr stores; statistics are netCDF")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset already in --out")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--layout", choices=LAYOUTS, default="native",
                        help="native (this project's files, default), credit-gen1 or credit-gen2 (CREDIT's "
                             "files and a CREDIT config of that schema, credit.yml)")
    try:
        args = parser.parse_args(argv)
        if args.like is not None:
            from credit.interop.generate_like import generate_like

            if args.layout != "native" or args.time_range or args.days_per_year or args.train_years:
                raise GenerateError("--like takes its layout, years and levels from the file: give only --out, "
                                    "--grid, --days, --seed and --overwrite")
            path = generate_like(args.like, args.out, grid=args.grid, days=args.days, seed=args.seed,
                                 overwrite=args.overwrite)
            print(f"wrote data in the layout of {args.like} and its copy {path}; train on it with: credit train "
                  f"--credit-config {path}")
            return 0
        args.grid = args.grid or (32, 64)
        if args.layout == "credit-gen2":
            from credit.interop.generate_gen2 import generate_credit_gen2

            if args.time_range:
                raise GenerateError("--layout credit-gen2 writes whole days: leave out --time-range")
            path = generate_credit_gen2(args.out, grid=args.grid, years=args.years, levels=args.levels,
                                        train_years=args.train_years, seed=args.seed, days_per_year=args.days_per_year,
                                        progress=not args.no_progress, overwrite=args.overwrite,
                                        file_format=args.format)
            print(f"wrote CREDIT's gen2 layout to {path}; train on it with: credit train --credit-config "
                  f"{path / 'credit.yml'}")
            return 0
        if args.layout == "credit-gen1":
            from credit.interop.generate_gen1 import generate_credit_gen1

            if args.format != "netcdf" or args.time_range:
                raise GenerateError("--layout credit-gen1 writes netCDF files of whole days: leave out --format "
                                    "and --time-range")
            path = generate_credit_gen1(args.out, grid=args.grid, years=args.years, levels=args.levels,
                                        train_years=args.train_years, seed=args.seed, days_per_year=args.days_per_year,
                                        progress=not args.no_progress, overwrite=args.overwrite)
            print(f"wrote CREDIT's gen1 layout to {path}; train on it with: credit train --credit-config "
                  f"{path / 'credit.yml'}")
            return 0
        path = generate_dataset(args.out, grid=args.grid, years=args.years, levels=args.levels,
                                train_years=args.train_years, seed=args.seed, progress=not args.no_progress,
                                days_per_year=args.days_per_year,
                                time_range=args.time_range, overwrite=args.overwrite,
                                file_format=args.format)
    except GenerateError as err:
        print(f"credit data generate: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    print(f"wrote dataset to {path}")
    if args.format == "zarr":
        print(f"train on it with: data.root={path} data.files.upper_air='era5_*.zarr' "
              "data.files.surface='era5_*.zarr' data.files.diagnostic='era5_*.zarr' "
              "data.files.forcing='forcing_*.zarr' data.files.static=static.zarr")
    return 0



if __name__ == "__main__":
    sys.exit(main())
