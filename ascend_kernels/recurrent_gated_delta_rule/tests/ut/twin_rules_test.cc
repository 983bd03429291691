// The CPU twin rejects what the hardware would: each rule is broken once on
// purpose and must throw, and the legal version of the same code must not.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernel_operator.h"

namespace {

int g_passed = 0, g_failed = 0;

void Expect(const char* name, bool throws, const std::string& fragment, const std::function<void()>& body) {
  std::string what;
  bool threw = false;
  try {
    body();
  } catch (const twin::TwinError& e) {
    threw = true;
    what = e.what();
  }
  const bool ok = threw == throws && (!throws || what.find(fragment) != std::string::npos);
  (ok ? g_passed : g_failed)++;
  if (!ok) std::printf("FAIL %s: threw=%d what='%s'\n", name, threw, what.c_str());
}

void OneBlock(uint32_t ub, const std::function<void()>& body) {
  auto& rt = twin::Runtime::Get();
  rt.Reset(ub);
  rt.Launch(1, body);
}

// A vector instruction writes a tensor, `sync` runs, then the scalar unit reads it.
void VectorWriteThenScalarRead(const std::function<void(AscendC::TPipe&)>& sync) {
  using namespace AscendC;
  OneBlock(4096, [&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 64);
    auto t = buf.Get<float>();
    Duplicate(t, 1.0f, 16);
    sync(pipe);
    (void)t.GetValue(3);
  });
}

}  // namespace

int main() {
  using namespace AscendC;
  std::vector<half> gm(40, static_cast<half>(1.0f));  // 80 bytes: not a multiple of 32
  auto launch = [&](const std::function<void(GlobalTensor<half>&, TPipe&)>& body) {
    auto& rt = twin::Runtime::Get();
    rt.Reset(4096);
    rt.RegisterGm(gm.data(), gm.size() * sizeof(half), "x");
    rt.Launch(1, [&] {
      TPipe pipe;
      GlobalTensor<half> x;
      x.SetGlobalBuffer(gm.data(), gm.size());
      body(x, pipe);
    });
  };

  Expect("UB overflow", true, "UB overflow", [] {
    OneBlock(1024, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> a, b;
      pipe.InitBuffer(a, 768);
      pipe.InitBuffer(b, 512);
    });
  });

  // The seed's tail write: 40 halves rounded up to 48 (96 bytes) runs 16 bytes past the tensor.
  Expect("rounded-up tail write", true, "past its end", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 128);
      LocalTensor<half> t = buf.Get<half>();
      for (int i = 0; i < 48; ++i) t.SetValue(i, static_cast<half>(2.0f));
      DataCopyPad(x, t, DataCopyExtParams{1, 96, 0, 0, 0});
    });
  });
  Expect("exact tail write", false, "", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 128);
      LocalTensor<half> t = buf.Get<half>();
      for (int i = 0; i < 40; ++i) t.SetValue(i, static_cast<half>(2.0f));
      DataCopyPad(x, t, DataCopyExtParams{1, 80, 0, 0, 0});
    });
  });

  Expect("uninitialised UB read", true, "uninitialised UB", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 320);
      LocalTensor<half> h = buf.GetWithOffset<half>(48, 0);
      LocalTensor<float> f = buf.GetWithOffset<float>(48, 128);
      DataCopyPad(h, x, DataCopyExtParams{1, 80, 0, 0, 0}, DataCopyPadExtParams<half>{});  // no padding
      Cast(f, h, RoundMode::CAST_NONE, 48);  // reads the 8 unpadded halves
    });
  });
  Expect("padded read", false, "", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 320);
      LocalTensor<half> h = buf.GetWithOffset<half>(48, 0);
      LocalTensor<float> f = buf.GetWithOffset<float>(48, 128);
      DataCopyPad(h, x, DataCopyExtParams{1, 80, 0, 0, 0}, DataCopyPadExtParams<half>{true, 0, 8, half{}});
      Cast(f, h, RoundMode::CAST_NONE, 48);
    });
  });

  Expect("queue depth", true, "all 1 buffers in use", [] {
    OneBlock(4096, [] {
      TPipe pipe;
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 1, 64);
      auto a = q.AllocTensor<float>();
      auto b = q.AllocTensor<float>();
      (void)a;
      (void)b;
    });
  });
  Expect("buffer leaked at block end", true, "still held", [] {
    OneBlock(4096, [] {
      TPipe pipe;
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 1, 64);
      q.AllocTensor<float>();
    });
  });
  Expect("DeQue of nothing", true, "nothing enqueued", [] {
    OneBlock(4096, [] {
      TPipe pipe;
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 1, 64);
      q.DeQue<float>();
    });
  });

  Expect("scalar read without V_S", true, "V_S", [] { VectorWriteThenScalarRead([](TPipe&) {}); });
  Expect("scalar read after V_S", false, "", [] {
    VectorWriteThenScalarRead([](TPipe& pipe) {
      event_t id = static_cast<event_t>(pipe.FetchEventID(HardEvent::V_S));
      SetFlag<HardEvent::V_S>(id);
      WaitFlag<HardEvent::V_S>(id);
    });
  });
  Expect("PipeBarrier<PIPE_V> is no V->S sync", true, "V_S", [] {
    VectorWriteThenScalarRead([](TPipe&) { PipeBarrier<PIPE_V>(); });
  });
  Expect("unaligned vector operand", true, "32-byte aligned", [] {
    OneBlock(4096, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 256);
      auto t = buf.Get<float>();
      Duplicate(t[1], 1.0f, 8);
    });
  });
  Expect("SetFlag never waited", true, "never waited", [] {
    OneBlock(4096, [] {
      TPipe pipe;
      SetFlag<HardEvent::MTE2_V>(pipe.FetchEventID(HardEvent::MTE2_V));
    });
  });

  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
