"""Reproducibility manifests (P6): what pins a result, and whether it still holds here.

A run is pinned by its source (commit, dirty flag, tree hash), its image
(toolchain, QEMU and runtime versions with binary hashes; the Debian locks),
its checkpoint (sha256 of every file that defines the model) and its compile
cache state (cold or warm, hit/miss counts). Every benchmark record embeds
one; `python -m rvascend.repro verify FILE` compares it with this machine.
"""
