"""Build orchestration: set-up of a fresh Debian 12 machine and the project's entry points.

Owns everything `./dev` does: Debian packages, the pinned venv, pinned
artifacts from Debian 13 (QEMU), Bazel invocations, and installing the built
extension into the venv. Every step is idempotent and says what it installs.
"""
