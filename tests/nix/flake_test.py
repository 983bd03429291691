"""flake.nix evaluated offline against the stub nixpkgs: its outputs, its checks,
and `nix run .#bench` running the project's benchmark entry.

What this cannot cover here: building against the real nixpkgs (no network to
fetch it); the real derivations are only evaluated for structure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
NIX = ["nix", "--extra-experimental-features", "nix-command", "--extra-experimental-features", "flakes",
       # No substituters or build users on these machines: build locally as this user.
       "--option", "substituters", "", "--option", "build-users-group", "", "--option", "sandbox", "false"]
STUB = ["--no-write-lock-file", "--override-input", "nixpkgs", "path:" + os.path.join(ROOT, "toolchains/nix/stub-nixpkgs")]


def nix(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(NIX + list(args), cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


@unittest.skipIf(shutil.which("nix") is None, "nix is installed by ./dev setup (nix-bin)")
class FlakeTest(unittest.TestCase):
    def test_outputs(self):
        out = nix("flake", "show", "--json", *STUB)
        self.assertEqual(out.returncode, 0, out.stderr)
        shown = json.loads(out.stdout)
        system = "x86_64-linux"
        self.assertEqual(shown["apps"][system]["bench"]["type"], "app")
        self.assertEqual(set(shown["packages"][system]), {"default", "kernels", "qemu-user", "riscv64-image"})
        self.assertIn("default", shown["devShells"][system])
        self.assertEqual(set(shown["checks"][system]), {"locks", "bench-app"})

    def test_nix_run_bench_runs_the_project_bench_entry(self):
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        out = nix("run", *STUB, ".#bench", "--", "--helpfull", env=env)
        self.assertIn("--parts: Which benchmarks to run", out.stdout + out.stderr)

    def test_checks_build(self):
        out = nix("flake", "check", *STUB)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])

    def test_lock_pins_nixpkgs(self):
        with open(os.path.join(ROOT, "flake.lock")) as f:
            locked = json.load(f)["nodes"]["nixpkgs"]["locked"]
        self.assertRegex(locked["rev"], r"^[0-9a-f]{40}$")
        self.assertTrue(locked["narHash"].startswith("sha256-"))

    def test_every_locked_deb_is_a_fixed_output_of_the_flake(self):
        out = nix("eval", "--json", *STUB, ".#checks.x86_64-linux.locks.debs")
        self.assertEqual(out.returncode, 0, out.stderr)
        debs = json.loads(out.stdout)
        counts = 0
        for lock in ("toolchains/riscv64_image/image.lock.json", "toolchains/qemu/qemu.lock.json"):
            with open(os.path.join(ROOT, lock)) as f:
                counts += len(json.load(f)["packages"])
        self.assertEqual(len(debs), counts)


if __name__ == "__main__":
    unittest.main()
