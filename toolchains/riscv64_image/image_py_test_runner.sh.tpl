#!/bin/bash
# Runs a Python program (or pytest file) of the rvascend package with the
# riscv64 image's own python3.13 and torch 2.6 under qemu-riscv64, once per VLEN.
set -u
QEMU="%QEMU%"
IMAGE="%IMAGE%"
EXTENSION="%EXTENSION%"
MAIN="%MAIN%"
PYTEST=%PYTEST%
VLENS=(%VLENS%)
%ENV%

cat "%IMAGE_READY%" >/dev/null || exit 1
echo "image tree sha256: $(cat "%IMAGE_READY%")"
STAGE="${TEST_TMPDIR}/stage"
rm -rf "${STAGE}" && mkdir -p "${STAGE}"
# The package's Python sources from the runfiles, with the riscv64 extension
# in place of the host's.
cp -rL python/rvascend "${STAGE}/"
find "${STAGE}" -name '*.so' -delete
rm -rf "${STAGE}/rvascend/_native"
cp "${EXTENSION}" "${STAGE}/rvascend/ops/_rvv_kernels.so"
for extra in %EXTRA_EXTENSIONS%; do
  cp "${extra}" "${STAGE}/rvascend/ops/"
done
cp "${MAIN}" "${STAGE}/main.py"

failures=0
for vlen in "${VLENS[@]}"; do
  cpu="rv64,v=true,vext_spec=v1.0,vlen=${vlen}"
  echo "=== image python3.13 under qemu -cpu ${cpu}"
  if [[ "${PYTEST}" == "1" ]]; then
    cmd=(-m pytest -q -p no:cacheprovider "${STAGE}/main.py" "$@")
  else
    cmd=("${STAGE}/main.py" "$@")
  fi
  PYTHONPATH="${STAGE}" QEMU_LD_PREFIX="${IMAGE}" "${QEMU}" -L "${IMAGE}" -cpu "${cpu}" \
    "${IMAGE}/usr/bin/python3.13" -B "${cmd[@]}"
  rc=$?
  if [[ ${rc} -ne 0 ]]; then
    echo "FAILED at VLEN ${vlen} (exit ${rc})"
    failures=$((failures + 1))
  fi
done
[[ ${failures} -eq 0 ]] || exit 1
