// Reads a QEMU `-d in_asm,exec,nochain` log from stdin and prints, one per
// line, the number of guest instructions executed between successive
// executions of the block at the marker address (argv[1], hex): regions
// alternate start/end. Written in C++ because the logs run to billions of
// lines (a Python reader was the bottleneck).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: exec_log_counter MARKER_PC < log\n");
    return 2;
  }
  const uint64_t marker = std::strtoull(argv[1], nullptr, 16);
  std::unordered_map<uint64_t, uint32_t> sizes;
  static char line[1 << 16];
  uint64_t current_tb = 0, n = 0, total = 0;
  bool in_block = false, inside = false;
  while (std::fgets(line, sizeof(line), stdin)) {
    if (std::strncmp(line, "Trace ", 6) == 0) {
      // Trace 0: 0xHOST [CSBASE/PC/FLAGS/CFLAGS] symbol
      const char* bracket = std::strchr(line, '[');
      const char* slash = bracket ? std::strchr(bracket, '/') : nullptr;
      if (!slash) continue;
      const uint64_t pc = std::strtoull(slash + 1, nullptr, 16);
      if (pc == marker) {
        if (inside) std::printf("%llu\n", static_cast<unsigned long long>(total));
        inside = !inside;
        total = 0;
      } else if (inside) {
        auto it = sizes.find(pc);
        if (it != sizes.end()) total += it->second;
      }
    } else if (std::strncmp(line, "IN:", 3) == 0) {
      if (in_block) sizes[current_tb] = n;
      in_block = true;
      current_tb = 0;
      n = 0;
    } else if (in_block && std::strncmp(line, "0x", 2) == 0) {
      if (n == 0) current_tb = std::strtoull(line, nullptr, 16);
      ++n;
    } else if (in_block && (line[0] == '\n' || line[0] == '-')) {
      if (n) sizes[current_tb] = n;
      in_block = false;
    }
  }
  if (in_block && n) sizes[current_tb] = n;
  std::fflush(stdout);
  return 0;
}
