"""Every notebook, from the command line: ``python -m kvlab env | bench | record OUT.json |
diagnose``."""

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
        p.add_argument(
            "--only", action="append", metavar="NAME", help="run only this benchmark (repeatable)"
        )
    bench.add_argument(
        "--quick",
        action="store_true",
        help=(
            "a smaller table in under a minute on a 2-core CPU: the decode loops at 32 new tokens, "
            "once, and the sections that take seconds (kvlab.lab.bench.QUICK)"
        ),
    )
    diag = sub.add_parser(
        "diagnose", help="walk the five steps of section 9.8 and print the verdict"
    )
    diag.add_argument(
        "--arch", default="llama", help="model architecture (kvlab.lab.models.ARCHITECTURES)"
    )
    diag.add_argument(
        "--size",
        default=None,
        choices=("cpu", "real"),
        help="'cpu': the tiny model; 'real': a published shape (default: real on a GPU)",
    )
    diag.add_argument(
        "--shape", default=None, help="a kvlab.theory.shapes.SHAPES key for --size real"
    )
    diag.add_argument("--context", type=int, default=128, help="prompt tokens per sequence")
    diag.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    diag.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sequence")
    diag.add_argument("--method", default="cached", help="naive, cached, static or paged")
    diag.add_argument(
        "--tpot-ms", type=float, default=None, help="time-per-output-token target (ms)"
    )
    diag.add_argument("--ttft-ms", type=float, default=None, help="time-to-first-token target (ms)")
    diag.add_argument(
        "--memory-gb", type=float, default=None, help="memory for weights plus cache (GB)"
    )
    diag.add_argument(
        "--threads",
        type=int,
        default=None,
        help=(
            "CPU threads to measure on (default: kvlab.lab.repeatable_step.CPU_THREADS, 1, as make"
            " sets)"
        ),
    )
    diag.add_argument(
        "--save-traces",
        metavar="OUT.json",
        default=None,
        help=(
            "also write the cached and static step traces, with their stamp, to this JSON file "
            "(name it *diagnose-traces*.json in book/data/measurements/ for notebook 09)"
        ),
    )
    args = parser.parse_args(argv)
    if args.command != "env" and _below_floor():
        return 1
    if (
        args.command != "env"
    ):  # without CUDA the kernels run in Triton's interpreter: on before they load
        from kvlab.kernels import use_interpreter

        use_interpreter()
    if args.command == "diagnose":
        return _diagnose(args)

    import kvlab
    from kvlab.lab import bench as benchmarks

    if args.command == "env":
        print(kvlab.env())
        return 0
    results = benchmarks.run(args.only, quick=getattr(args, "quick", False))
    print(kvlab.lab.hardware.stamp_line())
    print(benchmarks.table(results))
    if args.command == "record":
        with open(args.out, "w") as f:
            json.dump(benchmarks.to_json(results), f, indent=1)
        print(f"wrote {args.out}")
    return 0


def _below_floor() -> bool:
    """Below a floor kvlab would fail somewhere inside transformers: say so once, with the
    command."""
    from kvlab.versions import FLOORS, below_floor, upgrade_command

    low = below_floor()
    if low:
        have = " and ".join(
            f"{name} {v} (kvlab needs >= {FLOORS[name]})" for name, v in low.items()
        )
        print(f"this Python has {have}: run `{upgrade_command(low)}`", file=sys.stderr)
    return bool(low)


def _diagnose(args) -> int:
    import torch

    import kvlab
    from kvlab.lab.diagnose import diagnose
    from kvlab.lab.hardware import cpu_threads
    from kvlab.lab.repeatable_step import CPU_THREADS, measurement_threads
    from kvlab.theory.verdict import Target
    from kvlab.theory.work import STEP_METHODS

    if args.method not in STEP_METHODS:
        print(f"--method must be one of {STEP_METHODS}, got {args.method!r}", file=sys.stderr)
        return 2
    try:
        if args.batch < 1 or args.context < 1 or args.new_tokens < 1:
            raise ValueError(
                f"--batch, --context and --new-tokens must be >= 1, got {args.batch}, "
                f"{args.context} and {args.new_tokens}"
            )
        ms = lambda v: None if v is None else v / 1e3  # noqa: E731
        target = Target(
            tpot=ms(args.tpot_ms),
            ttft=ms(args.ttft_ms),
            memory=None if args.memory_gb is None else args.memory_gb * 1e9,
        )
        size = args.size or ("real" if kvlab.on_gpu() else "cpu")
        model = kvlab.tiny_model(
            args.arch,
            size=size,
            shape=args.shape,
            max_positions=max(4096, args.context + args.new_tokens + 1),
        )
        prompt = torch.randint(
            0,
            model.config.vocab_size,
            (args.batch, args.context),
            generator=torch.Generator().manual_seed(0),
        ).to(model.device)
        threads = measurement_threads(model, CPU_THREADS if args.threads is None else args.threads)
        with cpu_threads(threads):  # the stamp names the threads the measurements run on
            print(kvlab.lab.hardware.stamp_line())
            print(f"model: {model.shape.name}, {model.dtype}")
            print(
                diagnose(
                    model,
                    prompt,
                    args.new_tokens,
                    method=args.method,
                    target=target,
                    progress=True,
                    threads=threads,
                )
            )
            if args.save_traces:
                from kvlab.lab.step_trace import trace_step

                traces = {
                    m: trace_step(model, prompt, method=m, threads=threads).to_json()
                    for m in ("cached", "static")
                }
                with open(args.save_traces, "w") as f:
                    json.dump({"stamp": kvlab.stamp(), "traces": traces}, f)
                print(f"wrote {args.save_traces}")
    except (ValueError, TypeError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
