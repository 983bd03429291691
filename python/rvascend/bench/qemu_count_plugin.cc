// A QEMU TCG plugin (user mode) that counts every guest instruction executed,
// split into intervals at marker instructions and binned by 4 KiB code page.
//
// Each translated block gets an inline counter (QEMU adds the block's
// instruction count on every execution, no callback). A block that contains
// the marker hint `addi x0, x0, 0x7a5` (encoding 0x7a500013, a no-op HINT the
// guest executes in rvascend_count_marker) also gets an execution callback:
// at every marker, the counters' growth since the previous marker is folded
// into per-page totals and written out as one interval. The host side maps
// pages to libraries with the guest's /proc/self/maps.
//
// Vector instructions (RVV: OP-V, and loads/stores with a vector width) are
// also counted on their own, for the time model's vector/scalar split.
//
// Output (file given as out=PATH): "I <n>" starts interval n, then lines
// "<page> <instructions> <vector instructions>" (page = guest address >> 12, hex).
//
// The plugin API is QEMU's C ABI (include/qemu/qemu-plugin.h, version 1 as in
// QEMU 7.2, Debian 12's qemu-user): only the few entry points used here are
// declared, with their documented signatures.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" {
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS = 0 };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 = 0 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb* tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void* userdata);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void* userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb* tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void* userdata);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb* tb, enum qemu_plugin_op op, void* ptr,
                                              uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void* userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb* tb);
struct qemu_plugin_insn* qemu_plugin_tb_get_insn(const struct qemu_plugin_tb* tb, size_t idx);
const void* qemu_plugin_insn_data(const struct qemu_plugin_insn* insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn* insn);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const void* info, int argc,
                                                               char** argv);
}

namespace {

constexpr uint32_t kMarkerHint = 0x7a500013u;  // addi x0, x0, 0x7a5

struct Block {
  uint64_t page;
  uint64_t count = 0;   // instructions executed in this block (inline add)
  uint64_t vcount = 0;  // of which vector instructions (inline add)
  uint64_t seen = 0;    // count at the last marker
  uint64_t vseen = 0;
};

// RVV 1.0 encodings: OP-V (0x57) and LOAD-FP/STORE-FP (0x07/0x27) whose width
// field is 0, 5, 6 or 7 (the scalar FP loads use 1..4).
bool IsVector(uint32_t word) {
  const uint32_t opcode = word & 0x7f, width = (word >> 12) & 7;
  return opcode == 0x57 || ((opcode == 0x07 || opcode == 0x27) && (width == 0 || width >= 5));
}

std::mutex g_mutex;
std::vector<Block*> g_blocks;  // never freed: QEMU keeps pointers into them
FILE* g_out = nullptr;
uint64_t g_interval = 0;

void Flush() {
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> pages;
  for (Block* b : g_blocks) {
    if (b->count != b->seen) {
      auto& p = pages[b->page];
      p.first += b->count - b->seen;
      p.second += b->vcount - b->vseen;
      b->seen = b->count;
      b->vseen = b->vcount;
    }
  }
  std::fprintf(g_out, "I %llu\n", static_cast<unsigned long long>(g_interval++));
  for (const auto& [page, n] : pages) {
    std::fprintf(g_out, "%llx %llu %llu\n", static_cast<unsigned long long>(page),
                 static_cast<unsigned long long>(n.first), static_cast<unsigned long long>(n.second));
  }
}

void OnMarker(unsigned int, void*) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Flush();
}

void OnTranslate(qemu_plugin_id_t, struct qemu_plugin_tb* tb) {
  const size_t n = qemu_plugin_tb_n_insns(tb);
  Block* block = new Block;
  block->page = qemu_plugin_tb_vaddr(tb) >> 12;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_blocks.push_back(block);
  }
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &block->count, n);
  size_t vector = 0;
  bool marker = false;
  for (size_t i = 0; i < n; ++i) {
    const struct qemu_plugin_insn* insn = qemu_plugin_tb_get_insn(tb, i);
    uint32_t word = 0;
    if (qemu_plugin_insn_size(insn) == 4) std::memcpy(&word, qemu_plugin_insn_data(insn), 4);
    marker |= word == kMarkerHint;
    vector += IsVector(word);
  }
  if (vector) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &block->vcount, vector);
  if (marker) qemu_plugin_register_vcpu_tb_exec_cb(tb, OnMarker, QEMU_PLUGIN_CB_NO_REGS, nullptr);
}

void OnExit(qemu_plugin_id_t, void*) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Flush();
  std::fclose(g_out);
}

}  // namespace

int qemu_plugin_install(qemu_plugin_id_t id, const void*, int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "out=", 4) == 0) out = argv[i] + 4;
  }
  if (out.empty() || (g_out = std::fopen(out.c_str(), "w")) == nullptr) {
    std::fprintf(stderr, "qemu_count_plugin: needs out=PATH (a writable file)\n");
    return -1;
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, OnTranslate);
  qemu_plugin_register_atexit_cb(id, OnExit, nullptr);
  return 0;
}
