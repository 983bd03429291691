// A QEMU TCG plugin (user mode) that counts every guest instruction executed,
// split into intervals at marker instructions, binned by 4 KiB code page and
// by guest thread.
//
// Each translated block gets inline counters (QEMU adds the block's
// instruction count on every execution, no callback): one per block and
// guest thread (vCPU), so threads never race on a counter. A block that
// contains the marker hint `addi x0, x0, 0x7a5` (encoding 0x7a500013, a no-op
// HINT the guest executes in rvascend_count_marker) also gets an execution
// callback: at every marker, the counters' growth since the previous marker is
// folded into per-page and per-thread totals and written out as one interval.
// The host side maps pages to libraries with the guest's /proc/self/maps.
//
// Vector instructions (RVV: OP-V, and loads/stores with a vector width) are
// also counted on their own, for the time model's vector/scalar split, and by
// kind (kKindNames): an in-order core's vector unit takes very different times
// for a reduction, a memory access or a multiply-accumulate, so one cost per
// vector instruction cannot fit both of llama.cpp's Q2_K paths on the board.
//
// Output (file given as out=PATH): "I <n>" starts interval n, then lines
// "<page> <instructions> <vector instructions>" (page = guest address >> 12,
// hex), "T <thread> <instructions> <vector instructions>" (thread = vCPU
// index in the order the guest's threads started) and "K <kind> <vector
// instructions>" (over all threads; kinds with none are left out).
//
// The plugin API is QEMU's C ABI (include/qemu/qemu-plugin.h, version 3 and
// later: QEMU 9.1 and 10, per-vCPU scoreboards and a copying
// qemu_plugin_insn_data): only the entry points used here are declared, with
// their documented signatures.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
struct qemu_plugin_scoreboard;
typedef struct {
  struct qemu_plugin_scoreboard* score;
  size_t offset;
} qemu_plugin_u64;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS = 0 };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 = 0 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb* tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void* userdata);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void* userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb* tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void* userdata);
void qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(struct qemu_plugin_tb* tb, enum qemu_plugin_op op,
                                                       qemu_plugin_u64 entry, uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void* userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb* tb);
struct qemu_plugin_insn* qemu_plugin_tb_get_insn(const struct qemu_plugin_tb* tb, size_t idx);
size_t qemu_plugin_insn_data(const struct qemu_plugin_insn* insn, void* dest, size_t len);
int qemu_plugin_num_vcpus(void);
struct qemu_plugin_scoreboard* qemu_plugin_scoreboard_new(size_t element_size);
void* qemu_plugin_scoreboard_find(struct qemu_plugin_scoreboard* score, unsigned int vcpu_index);

__attribute__((visibility("default"))) int qemu_plugin_version = 3;
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const void* info, int argc,
                                                               char** argv);
}

namespace {

constexpr uint32_t kMarkerHint = 0x7a500013u;  // addi x0, x0, 0x7a5

// Vector instruction kinds, by their RVV 1.0 encoding (Kind()).
enum VectorKind : size_t { kConfig, kMemory, kReduction, kMultiply, kFloat, kPermute, kInteger, kKinds };
constexpr const char* kKindNames[kKinds] = {"config", "memory", "reduction", "multiply", "float", "permute",
                                            "integer"};

// Blocks' counters live in chunks: one scoreboard holds kChunk blocks'
// counters (instructions, vector instructions, those by kind) for every vCPU,
// so a run of a million translated blocks needs a few hundred scoreboards,
// not a million.
constexpr size_t kChunk = 4096;
struct Counters {
  uint64_t count;
  uint64_t vcount;
  uint64_t kinds[kKinds];
};

struct Chunk {
  struct qemu_plugin_scoreboard* score;
  std::vector<uint64_t> pages;                 // page of each block in the chunk
  std::vector<std::vector<Counters>> seen;     // per vCPU: the counters at the last marker
};

// RVV 1.0 encodings: OP-V (0x57) and LOAD-FP/STORE-FP (0x07/0x27) whose width
// field is 0, 5, 6 or 7 (the scalar FP loads use 1..4).
bool IsVector(uint32_t word) {
  const uint32_t opcode = word & 0x7f, width = (word >> 12) & 7;
  return opcode == 0x57 || ((opcode == 0x07 || opcode == 0x27) && (width == 0 || width >= 5));
}

// The kind of a vector instruction (IsVector). OP-V's funct3 (bits 14:12) names
// the operand class: 0 OPIVV, 1 OPFVV, 2 OPMVV, 3 OPIVI, 4 OPIVX, 5 OPFVF,
// 6 OPMVX, 7 vset{i}vl{i}; funct6 (bits 31:26) the operation (the RVV 1.0
// specification's opcode tables).
bool IsMultiply(uint32_t funct6) {  // OPMVV / OPMVX: vmulhu .. vnmsac, vwmulu .. vwmaccsu
  return (funct6 >= 0x24 && funct6 <= 0x2f) || funct6 >= 0x38;
}

VectorKind Kind(uint32_t word) {
  const uint32_t opcode = word & 0x7f;
  if (opcode != 0x57) return kMemory;
  const uint32_t funct3 = (word >> 12) & 7, funct6 = word >> 26;
  switch (funct3) {
    case 7:
      return kConfig;
    case 2:  // OPMVV
      if (funct6 <= 0x07) return kReduction;     // vredsum .. vredmax
      if (funct6 == 0x17) return kPermute;       // vcompress
      if (IsMultiply(funct6)) return kMultiply;
      return kInteger;
    case 6:  // OPMVX
      if (funct6 == 0x0e || funct6 == 0x0f) return kPermute;  // vslide1up / vslide1down
      if (IsMultiply(funct6)) return kMultiply;
      return kInteger;
    case 0:  // OPIVV
      if (funct6 == 0x30 || funct6 == 0x31) return kReduction;  // vwredsumu / vwredsum
      if (funct6 == 0x0c || funct6 == 0x0e) return kPermute;    // vrgather / vrgatherei16
      return kInteger;
    case 3:  // OPIVI
    case 4:  // OPIVX
      if (funct6 == 0x0c || funct6 == 0x0e || funct6 == 0x0f) return kPermute;  // vrgather, vslideup/down
      return kInteger;
    case 1:  // OPFVV
      if (funct6 == 0x01 || funct6 == 0x03 || funct6 == 0x05 || funct6 == 0x07 || funct6 == 0x31 ||
          funct6 == 0x33) {
        return kReduction;  // vfredusum, vfredosum, vfredmin, vfredmax, vfwredusum, vfwredosum
      }
      return kFloat;
    default:  // 5, OPFVF
      if (funct6 == 0x0e || funct6 == 0x0f) return kPermute;  // vfslide1up / vfslide1down
      return kFloat;
  }
}

std::mutex g_mutex;
std::vector<Chunk*> g_chunks;  // never freed: QEMU keeps pointers into their scoreboards
FILE* g_out = nullptr;
uint64_t g_interval = 0;

void Flush() {
  std::map<uint64_t, Counters> pages;
  std::map<unsigned, Counters> threads;
  uint64_t kinds[kKinds] = {};
  const unsigned vcpus = static_cast<unsigned>(qemu_plugin_num_vcpus());
  for (Chunk* c : g_chunks) {
    if (c->seen.size() < vcpus) c->seen.resize(vcpus);
    for (unsigned v = 0; v < vcpus; ++v) {
      const auto* now = static_cast<const Counters*>(qemu_plugin_scoreboard_find(c->score, v));
      std::vector<Counters>& seen = c->seen[v];
      seen.resize(c->pages.size(), Counters{});
      for (size_t b = 0; b < c->pages.size(); ++b) {
        const Counters n = now[b];
        if (n.count == seen[b].count) continue;
        const Counters d{n.count - seen[b].count, n.vcount - seen[b].vcount, {}};
        for (size_t k = 0; k < kKinds; ++k) kinds[k] += n.kinds[k] - seen[b].kinds[k];
        seen[b] = n;
        Counters& p = pages[c->pages[b]];
        p.count += d.count;
        p.vcount += d.vcount;
        Counters& t = threads[v];
        t.count += d.count;
        t.vcount += d.vcount;
      }
    }
  }
  std::fprintf(g_out, "I %llu\n", static_cast<unsigned long long>(g_interval++));
  for (const auto& [page, n] : pages) {
    std::fprintf(g_out, "%llx %llu %llu\n", static_cast<unsigned long long>(page),
                 static_cast<unsigned long long>(n.count), static_cast<unsigned long long>(n.vcount));
  }
  for (const auto& [thread, n] : threads) {
    std::fprintf(g_out, "T %u %llu %llu\n", thread, static_cast<unsigned long long>(n.count),
                 static_cast<unsigned long long>(n.vcount));
  }
  for (size_t k = 0; k < kKinds; ++k) {
    if (kinds[k]) std::fprintf(g_out, "K %s %llu\n", kKindNames[k], static_cast<unsigned long long>(kinds[k]));
  }
}

void OnMarker(unsigned int, void*) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Flush();
}

void OnTranslate(qemu_plugin_id_t, struct qemu_plugin_tb* tb) {
  const size_t n = qemu_plugin_tb_n_insns(tb);
  size_t vector = 0, kinds[kKinds] = {};
  bool marker = false;
  for (size_t i = 0; i < n; ++i) {
    const struct qemu_plugin_insn* insn = qemu_plugin_tb_get_insn(tb, i);
    uint32_t word = 0;
    if (qemu_plugin_insn_data(insn, &word, sizeof(word)) != sizeof(word)) word = 0;  // compressed: scalar
    marker |= word == kMarkerHint;
    if (IsVector(word)) {
      ++vector;
      ++kinds[Kind(word)];
    }
  }
  qemu_plugin_u64 count, vcount, kind[kKinds];
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_chunks.empty() || g_chunks.back()->pages.size() == kChunk) {
      Chunk* c = new Chunk;
      c->score = qemu_plugin_scoreboard_new(kChunk * sizeof(Counters));
      g_chunks.push_back(c);
    }
    Chunk* c = g_chunks.back();
    const size_t slot = c->pages.size();
    c->pages.push_back(qemu_plugin_tb_vaddr(tb) >> 12);
    count = {c->score, slot * sizeof(Counters) + offsetof(Counters, count)};
    vcount = {c->score, slot * sizeof(Counters) + offsetof(Counters, vcount)};
    for (size_t k = 0; k < kKinds; ++k) {
      kind[k] = {c->score, slot * sizeof(Counters) + offsetof(Counters, kinds) + k * sizeof(uint64_t)};
    }
  }
  qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, count, n);
  if (vector) qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, vcount, vector);
  for (size_t k = 0; k < kKinds; ++k) {
    if (kinds[k]) qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, kind[k], kinds[k]);
  }
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
