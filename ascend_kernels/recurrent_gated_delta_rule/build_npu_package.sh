#!/usr/bin/env bash
# Builds recurrent_gated_delta_rule as a CANN custom operator package (the
# flow aclnn and torch_npu users consume): msOpGen generates the project from
# op.json, this folder's op_host/ and op_kernel/ replace its stubs, and the
# project's build.sh compiles kernel, tiling, shape inference and the aclnn
# API (aclnnRecurrentGatedDeltaRule) into one custom_opp_*.run installer.
#
#   ./build_npu_package.sh OUT_RUN_FILE [SOC_VERSION]   (default SOC: Ascend910B3)
#
# Needs CANN (ASCEND_HOME_PATH set by `source set_env.sh`); never run on this
# project's machines (no CANN): the same sources run on the CPU twin instead.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_file="$1"
soc="${2:-Ascend910B3}"
if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
  echo "ASCEND_HOME_PATH is not set: source CANN's set_env.sh first" >&2
  exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
msopgen gen -i "${here}/op.json" -c "ai_core-${soc}" -lan cpp -out "${work}/project"
# The generated stubs give way to the real sources (same file names where they overlap).
rm -f "${work}/project/op_host/"*.cpp "${work}/project/op_host/"*.h "${work}/project/op_kernel/"*.cpp \
  "${work}/project/op_kernel/"*.h
cp "${here}/op_host/"*.cpp "${here}/op_host/"*.h "${work}/project/op_host/"
cp "${here}/op_kernel/"*.cpp "${here}/op_kernel/"*.h "${work}/project/op_kernel/"
(cd "${work}/project" && bash build.sh)
packages=("${work}/project/build_out/"custom_opp_*.run)
cp "${packages[0]}" "${out_file}"
echo "wrote ${out_file} (install it with: bash ${out_file})"
