"""`./dev COMMAND`: set-up and entry points of the project.

  setup   install everything a fresh Debian 12 machine needs (idempotent)
  test    setup, then `bazel test //...` (extra args go to bazel)
  serve   setup, then `bazel run //python:serve -- ARGS`; with --riscv64 the riscv64
          wheel's server inside the riscv64 image under QEMU; with --workers N, N servers
          on loopback ports and sglang-router in front on --host/--port
  bench   setup, then the benchmark suite
  lock    regenerate a Debian lock file on purpose (--lock=qemu)
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from rvascend.setup import steps
from rvascend.setup.debian import SetupError

FLAGS = flags.FLAGS
flags.DEFINE_bool("dry_run", False, "Print the steps instead of running them.")
flags.DEFINE_enum("lock", "qemu", list(steps.LOCKS), "Which lock `lock` regenerates.")

_COMMANDS = ("setup", "test", "serve", "bench", "lock")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in _COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[1], argv[2:]
    try:
        if command == "lock":
            # `./dev lock --lock=NAME` (the form docs/build.md gives) as well as `./dev --lock=NAME lock`.
            unknown = [a for a in rest if not a.startswith("--lock=")]
            if unknown:
                logging.error("lock takes only --lock=NAME (one of %s), got %s", ", ".join(steps.LOCKS), unknown)
                return 2
            name = rest[-1].split("=", 1)[1] if rest else FLAGS.lock
            if name not in steps.LOCKS:
                logging.error("unknown lock %r; known: %s", name, ", ".join(steps.LOCKS))
                return 2
            steps.regenerate_lock(name, dry_run=FLAGS.dry_run)
            return 0
        steps.setup(dry_run=FLAGS.dry_run)
        if command == "setup":
            return 0
        if command == "test":
            targets = [a for a in rest if not a.startswith("-")] or ["//..."]
            options = [a for a in rest if a.startswith("-")]
            return steps.bazel_test([*options, *targets], dry_run=FLAGS.dry_run)
        if command == "serve":
            workers, rest = _take_workers(rest)
            if workers:
                return steps.serve_workers(workers, [a for a in rest if a != "--riscv64"], "--riscv64" in rest,
                                           dry_run=FLAGS.dry_run)
            if "--riscv64" in rest:
                return steps.serve_riscv64([a for a in rest if a != "--riscv64"], dry_run=FLAGS.dry_run)
            return steps.bazel(["run", "//python:serve", "--", *rest], dry_run=FLAGS.dry_run)
        return steps.bench(rest, dry_run=FLAGS.dry_run)
    except SetupError as e:
        logging.error("%s", e)
        return 1


def _take_workers(args: list[str]) -> tuple[int, list[str]]:
    """(N of --workers N or --workers=N, or 0; the other args)."""
    out, workers, it = [], 0, iter(args)
    for arg in it:
        if arg == "--workers" or arg.startswith("--workers="):
            value = arg.partition("=")[2] if "=" in arg else next(it, "")
            if not value.isdigit() or int(value) < 1:
                raise SetupError(f"--workers needs a positive number, got {value!r}")
            workers = int(value)
        else:
            out.append(arg)
    return workers, out


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses this CLI's flags before the command; everything after the command
    (e.g. `./dev serve --model-path DIR`) passes through untouched."""
    command_at = next((i for i, a in enumerate(argv[1:], 1) if a in _COMMANDS), len(argv))
    rest = FLAGS(argv[:command_at])
    return rest + argv[command_at:]


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
