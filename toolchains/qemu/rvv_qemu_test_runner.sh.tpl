#!/bin/bash
# Runs one riscv64 binary under qemu-riscv64 once per VLEN; fails if any run fails.
set -u
QEMU="%QEMU%"
BINARY="%BINARY%"
CPU_BASE="%CPU_BASE%"
VLENS=(%VLENS%)
EXPECT_SIGILL_WITHOUT_VECTOR=%EXPECT_SIGILL%
PASS_WITHOUT_VECTOR=%PASS_WITHOUT_VECTOR%
%ENV%

origin=$(cat "%ORIGIN%")
echo "qemu: ${origin}"
"${QEMU}" --version | head -1

failures=0
for vlen in "${VLENS[@]}"; do
  cpu="${CPU_BASE},vlen=${vlen}"
  echo "=== VLEN ${vlen}: -cpu ${cpu}"
  "${QEMU}" -cpu "${cpu}" "${BINARY}" "$@"
  rc=$?
  if [[ ${rc} -ne 0 ]]; then
    echo "FAILED at VLEN ${vlen} (exit ${rc})"
    failures=$((failures + 1))
  fi
done

if [[ "${EXPECT_SIGILL_WITHOUT_VECTOR}" == "1" ]]; then
  # Proves the binary really executes vector instructions: without V it must trap.
  echo "=== vector extension off: expecting SIGILL"
  "${QEMU}" -cpu "rv64,v=false" "${BINARY}" "$@" >/dev/null 2>&1
  rc=$?
  if [[ ${rc} -ne 132 ]]; then
    echo "FAILED: expected SIGILL (exit 132) with v=false, got exit ${rc}"
    failures=$((failures + 1))
  else
    echo "ok: SIGILL without the vector extension"
  fi
fi

if [[ "${PASS_WITHOUT_VECTOR}" == "1" ]]; then
  # A CPU without V: the binary must choose its portable kernels and pass, never SIGILL.
  echo "=== vector extension off: expecting a pass on the portable kernels"
  "${QEMU}" -cpu "rv64,v=false" "${BINARY}" "$@"
  rc=$?
  if [[ ${rc} -ne 0 ]]; then
    echo "FAILED without the vector extension (exit ${rc})"
    failures=$((failures + 1))
  fi
fi

if [[ ${failures} -ne 0 ]]; then
  echo "${failures} run(s) failed"
  exit 1
fi
echo "all ${#VLENS[@]} VLEN runs passed"
