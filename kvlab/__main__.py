"""``python -m kvlab env | bench | record OUT.json``: the instrument from the command line."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="device, versions and calibrated ceilings")
    bench = sub.add_parser("bench", help="every measurement of the book, as a table")
    record = sub.add_parser("record", help="the bench table with its stamp, as JSON")
    record.add_argument("out", help="path of the JSON file to write")
    for p in (bench, record):
        p.add_argument("--only", action="append", metavar="NAME", help="run only this benchmark (repeatable)")
    args = parser.parse_args(argv)

    import kvlab
    from kvlab import bench as benchmarks

    if args.command == "env":
        print(kvlab.env())
        return 0
    results = benchmarks.run(args.only)
    print(kvlab.hardware.stamp_line())
    print(benchmarks.table(results))
    if args.command == "record":
        with open(args.out, "w") as f:
            json.dump(benchmarks.to_json(results), f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
