#!/bin/sh
echo "bazel coverage is not supported by the offline build (remote_coverage_tools is a stand-in)" >&2
exit 1
