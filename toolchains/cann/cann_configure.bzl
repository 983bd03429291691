"""Repository rule that finds an installed CANN toolkit.

Looks at ASCEND_TOOLKIT_HOME, then ASCEND_HOME_PATH (what CANN's set_env.sh
exports). The generated `@local_cann//:defs.bzl` tells BUILD files whether
CANN is there: `CANN_COMPATIBLE_WITH` is empty when it is, and names a
constraint no platform has when it is not, so NPU targets are skipped as
incompatible (neither failed nor faked) on machines without CANN.
"""

def _cann_configure_impl(ctx):
    home = ""
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        value = ctx.os.environ.get(var, "")
        if value and ctx.path(value).exists:
            home = value
            break
    found = home != "" and ctx.path(home + "/compiler").exists
    compatible = "[]" if found else '["@rvascend//toolchains/cann:cann_not_installed"]'
    ctx.file("defs.bzl", """CANN_FOUND = {found}
CANN_HOME = "{home}"
CANN_COMPATIBLE_WITH = {compatible}
""".format(found = found, home = home, compatible = compatible))
    ctx.file("BUILD.bazel", 'exports_files(["defs.bzl"])\n')

cann_configure = repository_rule(
    implementation = _cann_configure_impl,
    environ = ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"],
    local = True,
)
