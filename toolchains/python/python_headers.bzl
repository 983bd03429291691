"""BUILD text shared by the repository rules that expose Python and pybind11
headers (the host venv's and the riscv64 image's)."""

PYTHON_HEADERS_BUILD = """
cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "pybind11",
    hdrs = glob(["pybind11_include/**/*.h"]),
    includes = ["pybind11_include"],
    deps = [":python_headers"],
)
"""
