"""Repository rule for the pinned QEMU 10 that `./dev setup` unpacks into `.deps/qemu/`.

QEMU 10 is needed for the BF16 vector extensions (Debian 12's QEMU 7.2 raises
SIGILL on `vfwmaccbf16`). If the pinned copy is missing, the system
`qemu-riscv64` is used and every test run says so; tests that need BF16 vector
extensions then fail instead of passing vacuously.
"""

def _qemu_repository_impl(ctx):
    root = ctx.path(Label("@//:WORKSPACE")).dirname
    lock = json.decode(ctx.read(Label("@//toolchains/qemu:qemu.lock.json")))
    version = lock["packages"][0]["version"]
    stamp = ctx.path("%s/.deps/qemu/INSTALLED" % root)
    pinned = ctx.path("%s/.deps/qemu/usr/bin/qemu-riscv64" % root)
    if stamp.exists and pinned.exists and ctx.read(stamp).strip() == lock["packages"][0]["sha256"]:
        binary, origin = pinned, "pinned qemu-user %s" % version
    else:
        system = ctx.which("qemu-riscv64")
        if system == None:
            fail("No qemu-riscv64: run `./dev setup` (it unpacks the pinned QEMU %s into .deps/qemu)." % version)
        binary, origin = system, "FALLBACK system qemu-riscv64 (the pinned QEMU %s is not unpacked: run `./dev setup`)" % version
    ctx.symlink(binary, "qemu-riscv64")
    ctx.file("origin.txt", origin + "\n")
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

exports_files(["qemu-riscv64", "origin.txt"])
""")

qemu_repository = repository_rule(
    implementation = _qemu_repository_impl,
    local = True,
)
