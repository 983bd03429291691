"""Repository rule exposing one pinned file that `./dev setup` downloads into
`.deps/<deps_dir>` (named by a field of its lock file) as `@<name>//:<target>`.

Serves the default model's wheel (python/rvascend/models/default_model.lock.json)
and the llama.cpp peer's source distribution (python/rvascend/setup/llama_cpp.lock.json).
If the file is missing, building the target fails with the set-up command to run.
"""

def _pinned_file_repository_impl(ctx):
    lock = json.decode(ctx.read(ctx.attr.lock))
    directory = "%s/.deps/%s" % (ctx.path(Label("@//:WORKSPACE")).dirname, ctx.attr.deps_dir)
    file_name = lock[ctx.attr.file_field]
    path = ctx.path("%s/%s" % (directory, file_name))
    if path.exists:
        ctx.symlink(path, file_name)
        rule = 'filegroup(name = "%s", srcs = ["%s"])' % (ctx.attr.target, file_name)
    else:
        rule = """genrule(
    name = "%s",
    outs = ["%s"],
    cmd = "echo '%s is not set up: run ./dev setup' >&2; exit 1",
)""" % (ctx.attr.target, file_name, file_name)
    ctx.file("BUILD.bazel", 'package(default_visibility = ["//visibility:public"])\n\n' + rule + "\n")

pinned_file_repository = repository_rule(
    implementation = _pinned_file_repository_impl,
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True),
        "deps_dir": attr.string(mandatory = True),
        "file_field": attr.string(mandatory = True),
        "target": attr.string(mandatory = True),
    },
    local = True,
)
