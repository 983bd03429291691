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

// A core with `ub` bytes of UB and the 910B's queue limits (8 per TPosition, 64 per kernel).
twin::CoreLimits Core(uint32_t ub) { return twin::CoreLimits{ub, 8, 64}; }

void OneBlock(uint32_t ub, const std::function<void()>& body) {
  auto& rt = twin::Runtime::Get();
  rt.Reset(Core(ub));
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

// A TBuf's DMA in is visible to vector instructions after an MTE2 -> V event.
void WaitForDmaIn(AscendC::TPipe& pipe) {
  using namespace AscendC;
  event_t id = static_cast<event_t>(pipe.FetchEventID(HardEvent::MTE2_V));
  SetFlag<HardEvent::MTE2_V>(id);
  WaitFlag<HardEvent::MTE2_V>(id);
}

}  // namespace

int main() {
  using namespace AscendC;
  std::vector<half> gm(40, static_cast<half>(1.0f));  // 80 bytes: not a multiple of 32
  auto launch = [&](const std::function<void(GlobalTensor<half>&, TPipe&)>& body) {
    auto& rt = twin::Runtime::Get();
    rt.Reset(Core(4096));
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
      WaitForDmaIn(pipe);
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
      WaitForDmaIn(pipe);
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

  // --- probes of the rules added with the platform table and the asynchrony model ---
  // Two 64-element sums into a destination of `room` elements.
  auto reduce_two_rows = [](uint32_t room) {
    OneBlock(4096, [room] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 1024);
      auto src = buf.GetWithOffset<float>(128, 0);
      auto dst = buf.GetWithOffset<float>(room, 512);
      Duplicate(src, 1.0f, 128);
      WholeReduceSum(dst, src, 64, 2, 1, 1, 8);
    });
  };
  Expect("WholeReduceSum past its destination", true, "WholeReduceSum (destination)", [&] { reduce_two_rows(1); });
  Expect("WholeReduceSum within its destination", false, "", [&] { reduce_two_rows(2); });
  // A VECOUT tensor through its queue; `misuse` writes it at one step where it must not.
  enum class Misuse { kNone, kAfterEnQue, kAfterFree };
  auto vecout_round_trip = [](Misuse misuse) {
    OneBlock(4096, [misuse] {
      TPipe pipe;
      TQue<TPosition::VECOUT, 1> q;
      pipe.InitBuffer(q, 1, 64);
      auto t = q.AllocTensor<float>();
      Duplicate(t, 1.0f, 16);
      q.EnQue(t);
      if (misuse == Misuse::kAfterEnQue) Duplicate(t, 2.0f, 16);
      t = q.DeQue<float>();
      q.FreeTensor(t);
      if (misuse == Misuse::kAfterFree) Duplicate(t, 2.0f, 16);
    });
  };
  Expect("use after FreeTensor", true, "after its FreeTensor", [&] { vecout_round_trip(Misuse::kAfterFree); });
  Expect("write after EnQue", true, "between its EnQue and DeQue", [&] { vecout_round_trip(Misuse::kAfterEnQue); });
  Expect("VECOUT round trip (legal)", false, "", [&] { vecout_round_trip(Misuse::kNone); });
  // Four double-buffered VECIN queues (8 buffers), and a ninth buffer if asked.
  auto vecin_buffers = [](bool ninth) {
    OneBlock(8192, [ninth] {
      TPipe pipe;
      TQue<TPosition::VECIN, 2> a, b, c, d;
      TQue<TPosition::VECIN, 1> e;
      for (auto* q : {&a, &b, &c, &d}) pipe.InitBuffer(*q, 2, 64);
      if (ninth) pipe.InitBuffer(e, 1, 64);
    });
  };
  Expect("nine VECIN buffers", true, "9 queue buffers on TPosition VECIN", [&] { vecin_buffers(true); });
  Expect("eight VECIN buffers", false, "", [&] { vecin_buffers(false); });
  // Muls with its destination `shift` floats into its source.
  auto muls_shifted = [](uint32_t shift) {
    OneBlock(4096, [shift] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 512);
      auto t = buf.Get<float>();
      Duplicate(t, 1.0f, 64);
      Muls(t[shift], t, 2.0f, 32);
    });
  };
  Expect("partially overlapping operands", true, "partially overlap", [&] { muls_shifted(8); });
  Expect("identical operands (in place)", false, "", [&] { muls_shifted(0); });
  Expect("DMA data read before its DeQue", true, "has not landed", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TQue<TPosition::VECIN, 1> q;
      TBuf<TPosition::VECCALC> f32;
      pipe.InitBuffer(q, 1, 96);
      pipe.InitBuffer(f32, 192);
      auto h = q.AllocTensor<half>();
      DataCopyPad(h, x, DataCopyExtParams{1, 80, 0, 0, 0}, DataCopyPadExtParams<half>{true, 0, 8, half{}});
      auto f = f32.Get<float>();
      Cast(f, h, RoundMode::CAST_NONE, 48);  // before EnQue/DeQue: the DMA has not landed
      q.FreeTensor(h);
    });
  });
  Expect("DMA into a TBuf read after WaitFlag<MTE2_V>", false, "", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 320);
      auto h = buf.GetWithOffset<half>(48, 0);
      auto f = buf.GetWithOffset<float>(48, 128);
      DataCopyPad(h, x, DataCopyExtParams{1, 80, 0, 0, 0}, DataCopyPadExtParams<half>{true, 0, 8, half{}});
      WaitForDmaIn(pipe);
      Cast(f, h, RoundMode::CAST_NONE, 48);
    });
  });
  Expect("vector result DMA'd out without V->MTE3 sync", true, "V->MTE3", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 256);
      auto f = buf.GetWithOffset<float>(40, 0);
      auto h = buf.GetWithOffset<half>(48, 160);
      Duplicate(f, 2.0f, 40);
      Cast(h, f, RoundMode::CAST_RINT, 40);
      DataCopyPad(x, h, DataCopyExtParams{1, 80, 0, 0, 0});
    });
  });
  Expect("DMA-out source overwritten before FreeTensor", true, "still reading", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TQue<TPosition::VECOUT, 1> q;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(q, 1, 96);
      pipe.InitBuffer(buf, 192);
      auto f = buf.Get<float>();
      Duplicate(f, 2.0f, 48);
      auto h = q.AllocTensor<half>();
      Cast(h, f, RoundMode::CAST_RINT, 48);
      q.EnQue(h);
      h = q.DeQue<half>();
      DataCopyPad(x, h, DataCopyExtParams{1, 80, 0, 0, 0});
      Cast(h, f, RoundMode::CAST_RINT, 48);  // the DMA out may still be reading h
      q.FreeTensor(h);
    });
  });
  Expect("queue round trip (legal)", false, "", [&] {
    launch([](GlobalTensor<half>& x, TPipe& pipe) {
      TQue<TPosition::VECIN, 1> in;
      TQue<TPosition::VECOUT, 1> out;
      pipe.InitBuffer(in, 1, 96);
      pipe.InitBuffer(out, 1, 96);
      auto h = in.AllocTensor<half>();
      DataCopyPad(h, x, DataCopyExtParams{1, 80, 0, 0, 0}, DataCopyPadExtParams<half>{true, 0, 8, half{}});
      in.EnQue(h);
      h = in.DeQue<half>();
      auto o = out.AllocTensor<half>();
      Cast(o, h, RoundMode::CAST_NONE, 48);
      in.FreeTensor(h);
      out.EnQue(o);
      o = out.DeQue<half>();
      DataCopyPad(x, o, DataCopyExtParams{1, 80, 0, 0, 0});
      out.FreeTensor(o);
    });
  });
  Expect("repeat-strided Mul past its source", true, "exceed the tensor", [] {
    OneBlock(8192, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 4096);
      auto a = buf.GetWithOffset<float>(128, 0);    // 2 rows of 64
      auto k = buf.GetWithOffset<float>(64, 512);
      auto out = buf.GetWithOffset<float>(256, 1024);
      Duplicate(a, 1.0f, 128);
      Duplicate(k, 1.0f, 64);
      Mul(out, a, k, 64, 3, BinaryRepeatParams(1, 1, 1, 8, 8, 0));  // a third row that is not there
    });
  });
  Expect("Brcb + MulAddDst rank-1 update (legal)", false, "", [] {
    OneBlock(8192, [] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 4096);
      auto s = buf.GetWithOffset<float>(128, 0);   // 2 rows of 64
      auto k = buf.GetWithOffset<float>(64, 512);
      auto d = buf.GetWithOffset<float>(8, 768);
      auto db = buf.GetWithOffset<float>(64, 1024);
      Duplicate(s, 1.0f, 128);
      Duplicate(k, 0.5f, 64);
      Duplicate(d, 2.0f, 8);
      Brcb(db, d, 1, BrcbRepeatParams(1, 8));
      MulAddDst(s, k, db, 64, 2, BinaryRepeatParams(1, 1, 0, 8, 0, 1));
      event_t id = static_cast<event_t>(pipe.FetchEventID(HardEvent::V_S));
      SetFlag<HardEvent::V_S>(id);
      WaitFlag<HardEvent::V_S>(id);
      if (s.GetValue(70) != 2.0f) throw twin::TwinError("rank-1 update computed " + std::to_string(s.GetValue(70)));
    });
  });

  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
