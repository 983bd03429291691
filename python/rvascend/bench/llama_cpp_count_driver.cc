// A minimal driver of llama.cpp's C API for counting its decode steps under
// QEMU with the counting plugin (qemu_count_plugin.cc): it does what
// llama-bench's pp and tg tests do (a prompt as one llama_decode call, then
// one-token calls, each with the last token's logits), and executes the
// plugin's marker hint between calls, so every call is its own interval.
//
// Intervals, in order: start-up and loading; the prompt (omitted with
// --prompt=0); one per generated token; exit.
//
// Usage: llama_cpp_count_driver --model=F [--threads=N] [--prompt=P]
//        [--generate=G] [--no-repack] [--flash-attn]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

// addi x0, x0, 0x7a5: a no-op HINT the plugin ends an interval at.
inline void CountMarker() {
#if defined(__riscv)
  asm volatile(".insn i 0x13, 0, x0, x0, 0x7a5" ::: "memory");
#endif
}

struct Options {
  std::string model;
  int threads = 1;
  int prompt = 32;
  int generate = 8;
  bool repack = true;
  bool flash_attn = false;
};

bool ParseInt(const char* text, int lo, int hi, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--model=", 8) == 0) {
      o->model = a + 8;
    } else if (std::strncmp(a, "--threads=", 10) == 0) {
      if (!ParseInt(a + 10, 1, 256, &o->threads)) return false;
    } else if (std::strncmp(a, "--prompt=", 9) == 0) {
      if (!ParseInt(a + 9, 0, 65536, &o->prompt)) return false;
    } else if (std::strncmp(a, "--generate=", 11) == 0) {
      if (!ParseInt(a + 11, 0, 65536, &o->generate)) return false;
    } else if (std::strcmp(a, "--no-repack") == 0) {
      o->repack = false;
    } else if (std::strcmp(a, "--flash-attn") == 0) {
      o->flash_attn = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a);
      return false;
    }
  }
  if (o->model.empty()) std::fprintf(stderr, "--model=FILE is required\n");
  return !o->model.empty() && o->prompt + o->generate > 0;
}

void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

bool NoProgress(float, void*) { return true; }

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr, "usage: %s --model=F [--threads=N] [--prompt=P] [--generate=G] [--no-repack] "
                 "[--flash-attn]\n", argv[0]);
    return 2;
  }
  llama_log_set(QuietLog, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.use_extra_bufts = o.repack;
  mp.progress_callback = NoProgress;
  llama_model* model = llama_model_load_from_file(o.model.c_str(), mp);
  if (model == nullptr) {
    std::fprintf(stderr, "could not load %s\n", o.model.c_str());
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(o.prompt + o.generate + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(o.prompt > 0 ? o.prompt : 1);
  cp.n_threads = cp.n_threads_batch = o.threads;
  cp.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "could not create a context\n");
    return 1;
  }
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  // Token ids do not change the work; any valid ids will do (llama-bench draws random ones).
  std::vector<llama_token> tokens(static_cast<size_t>(o.prompt + o.generate));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<llama_token>((i * 7919 + 13) % vocab);
  CountMarker();
  if (o.prompt > 0 && llama_decode(ctx, llama_batch_get_one(tokens.data(), o.prompt)) != 0) {
    std::fprintf(stderr, "prompt decode failed\n");
    return 1;
  }
  if (o.prompt > 0) CountMarker();
  for (int i = 0; i < o.generate; ++i) {
    if (llama_decode(ctx, llama_batch_get_one(&tokens[static_cast<size_t>(o.prompt + i)], 1)) != 0) {
      std::fprintf(stderr, "decode of token %d failed\n", i);
      return 1;
    }
    CountMarker();
  }
  std::printf("DONE prompt=%d generate=%d threads=%d repack=%d\n", o.prompt, o.generate, o.threads, o.repack);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
