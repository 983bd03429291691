"""python -m rvascend.repro {capture,verify}

  capture [--checkpoint DIR] [--output FILE]   write this environment's manifest
  verify FILE [--checkpoint DIR]               compare FILE's manifest (or a bench
                                               jsonl's) with this environment;
                                               exit 1 on any difference
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from rvascend.repro import manifest

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "Checkpoint directory (verify: default the recorded one).")
flags.DEFINE_string("output", None, "capture: write here instead of stdout.")
flags.DEFINE_string("qemu_cpu", None, "QEMU -cpu string of the run, if emulated.")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("capture", "verify"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "capture":
        text = json.dumps(manifest.capture(FLAGS.checkpoint, FLAGS.qemu_cpu), indent=2, sort_keys=True)
        if FLAGS.output:
            with open(FLAGS.output, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        else:
            print(text)
        return 0
    if len(argv) < 3:
        print("verify needs a manifest or benchmark jsonl file", file=sys.stderr)
        return 2
    saved = manifest.load(argv[2])
    recorded_ckpt = (saved.get("checkpoint") or {}).get("path")
    present = manifest.capture(FLAGS.checkpoint or recorded_ckpt, saved.get("qemu_cpu"))
    diffs = manifest.differences(saved, present)
    for d in diffs:
        print("DIFFERS", d)
    print(f"{len(diffs)} difference(s)" if diffs else "manifest matches this environment")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(app.run(main))
