"""Forwards rules_cc's public macros to Bazel's native C++ rules.

Bazel 4.2.3 (Debian's bazel-bootstrap) cannot download rules_cc, and Debian's
packaged rules_cc 0.0.4 does not load on it, so BUILD files load this file
under the same label a bzlmod build resolves to the real rules_cc.
"""

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)
