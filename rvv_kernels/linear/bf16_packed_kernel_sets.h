// The registry of BF16 packed-linear kernel sets and the run-time choice among them.
#ifndef RVV_KERNELS_LINEAR_BF16_PACKED_KERNEL_SETS_H_
#define RVV_KERNELS_LINEAR_BF16_PACKED_KERNEL_SETS_H_

#include <string>
#include <vector>

#include "rvv_kernels/linear/microkernel.h"

namespace rvascend {

// Sets compiled into this build whose ISA the CPU reports, best first (chosen once).
const std::vector<const Bf16PackedKernelSet*>& AvailableKernelSets();

// Every set compiled into this build, usable or not.
std::vector<const Bf16PackedKernelSet*> CompiledKernelSets();

// The best available set: the first of AvailableKernelSets().
const Bf16PackedKernelSet& DefaultKernelSet();

// The available set called `name`, or nullptr if it is not compiled in or
// the CPU does not report its ISA.
const Bf16PackedKernelSet* FindKernelSet(const std::string& name);

// The packed block_n a set reads (resolves block_n = 0: VLEN/2 of this machine).
size_t KernelSetBlockN(const Bf16PackedKernelSet& set);

// The best available set that reads `block_n`, or nullptr.
const Bf16PackedKernelSet* BestKernelSetFor(size_t block_n);

// The available set called `name`, or (name "") the best one reading `block_n`;
// std::invalid_argument when there is none, or when the named set reads another
// block_n than the weights were packed with (block_n 0: any).
const Bf16PackedKernelSet& ChooseKernelSet(const std::string& name, size_t block_n);

// Layout version 2's block on this machine (VLEN/2): the block of the best
// available set that reads version 2, or 0 where none does.
size_t WideKernelSetBlockN();

}  // namespace rvascend

#endif  // RVV_KERNELS_LINEAR_BF16_PACKED_KERNEL_SETS_H_
