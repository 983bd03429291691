"""`./dev COMMAND`: set-up and entry points of the project.

  setup   install everything a fresh Debian 12 machine needs (idempotent)
  test    setup, then `bazel test //...` (extra args go to bazel)
  serve   setup, then `bazel run //python:serve -- ARGS`
  bench   setup, then the benchmark suite
  lock    regenerate a Debian lock file on purpose (--lock=qemu)
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from rvascend.build import steps
from rvascend.build.debian import SetupError

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
            steps.regenerate_lock(FLAGS.lock, dry_run=FLAGS.dry_run)
            return 0
        steps.setup(dry_run=FLAGS.dry_run)
        if command == "setup":
            return 0
        if command == "test":
            return steps.bazel_test(["//...", *rest], dry_run=FLAGS.dry_run)
        if command == "serve":
            return steps.bazel(["run", "//python:serve", "--", *rest], dry_run=FLAGS.dry_run)
        return steps.bench(rest, dry_run=FLAGS.dry_run)
    except SetupError as e:
        logging.error("%s", e)
        return 1


if __name__ == "__main__":
    app.run(main)
