// Stand-in for what CANN's device compiler (bisheng) provides to AscendC
// headers, so the public asc-devkit headers parse with clang -fsyntax-only in
// device mode for the 910B vector core (__NPU_ARCH__ 2201). Written for the
// header check only: names, no behaviour. Included before anything else.
#ifndef RGDR_CANN_STANDIN_H_
#define RGDR_CANN_STANDIN_H_

#include <cstddef>
#include <cstdint>

// Function and address-space qualifiers: attributes of bisheng, empty here.
#define __aicore__
#define __global__
#define __simd_callee__
#define __gm__
#define __ubuf__
#define __cbuf__
#define __ca__
#define __cb__
#define __cc__
#define __fbuf__
#define __biasbuf__
#define __ssbuf__
#define __sync_alias__
#define __check_sync_alias__
#define __in_pipe__(...)
#define __out_pipe__(...)
#define __inout_pipe__(...)

// Device scalar types clang has natively.
using half = _Float16;
using bfloat16_t = __bf16;

// Enums of the instruction set: pipes and event ids (used unscoped), and the
// scoped ones with the members the headers name.
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX };
enum event_t { EVENT_ID0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
enum class cache_line_t { ENTIRE_DATA_CACHE, SINGLE_CACHE_LINE };
enum class dcci_dst_t { CACHELINE_OUT };
enum class QuantMode_t { NoQuant, F322F16, F322BF16, DEQF16, VDEQF16, QF322B8_PRE, VQF322B8_PRE, REQ8, VREQ8 };
enum class pad_t { PAD_NONE };
enum class Order_t { VALUE_INDEX, INDEX_VALUE, ONLY_VALUE, ONLY_INDEX };
enum class mem_dsb_t {};
enum class mem_t {};
enum class addr_cal_mode_t {};
enum class atomic_type_t {};
enum class atomic_op_t {};

// Register types of the newer vector ISA, named in declarations only.
enum class vector_bool {};
enum class vector_align {};
enum class vector_address {};
enum class AddrReg {};
enum class MaskReg {};
enum class UnalignRegForLoad {};
enum class UnalignRegForStore {};

// Operand constants of a few instructions (address registers, halves, steps).
constexpr int VA0 = 0, VA1 = 1, VA2 = 2, VA3 = 3, L128 = 0, H128 = 1, inc = 1, dec = 0;

// Compiler builtins: any arguments; the result converts to what callers store.
#define B(name) template <class... Args> int64_t name(Args&&...);
// Vector conversions (vconv_SRC2DST and a rounding mode) and multiply-convert.
B(vconv_bf162f32) B(vconv_bf162s32a) B(vconv_bf162s32c) B(vconv_bf162s32f) B(vconv_bf162s32r) B(vconv_bf162s32z)
B(vconv_deq) B(vconv_f162f32) B(vconv_f162s16a) B(vconv_f162s16c) B(vconv_f162s16f) B(vconv_f162s16r)
B(vconv_f162s16z) B(vconv_f162s32a) B(vconv_f162s32c) B(vconv_f162s32f) B(vconv_f162s32r) B(vconv_f162s32z)
B(vconv_f162s4) B(vconv_f162s4a) B(vconv_f162s4c) B(vconv_f162s4f) B(vconv_f162s4r) B(vconv_f162s4z) B(vconv_f162s8)
B(vconv_f162s8a) B(vconv_f162s8c) B(vconv_f162s8f) B(vconv_f162s8r) B(vconv_f162s8z) B(vconv_f162u8)
B(vconv_f162u8a) B(vconv_f162u8c) B(vconv_f162u8f) B(vconv_f162u8r) B(vconv_f162u8z) B(vconv_f322bf16a)
B(vconv_f322bf16c) B(vconv_f322bf16f) B(vconv_f322bf16r) B(vconv_f322bf16z) B(vconv_f322f16) B(vconv_f322f16a)
B(vconv_f322f16c) B(vconv_f322f16f) B(vconv_f322f16o) B(vconv_f322f16r) B(vconv_f322f16z) B(vconv_f322f32a)
B(vconv_f322f32c) B(vconv_f322f32f) B(vconv_f322f32r) B(vconv_f322f32z) B(vconv_f322s16a) B(vconv_f322s16c)
B(vconv_f322s16f) B(vconv_f322s16r) B(vconv_f322s16z) B(vconv_f322s32a) B(vconv_f322s32c) B(vconv_f322s32f)
B(vconv_f322s32r) B(vconv_f322s32z) B(vconv_f322s64a) B(vconv_f322s64c) B(vconv_f322s64f) B(vconv_f322s64r)
B(vconv_f322s64z) B(vconv_s162f16) B(vconv_s162f16a) B(vconv_s162f16c) B(vconv_s162f16f) B(vconv_s162f16r)
B(vconv_s162f16z) B(vconv_s162f32) B(vconv_s322f32) B(vconv_s322f32a) B(vconv_s322f32c) B(vconv_s322f32f)
B(vconv_s322f32r) B(vconv_s322f32z) B(vconv_s322s16) B(vconv_s322s64) B(vconv_s42f16) B(vconv_s642f32a)
B(vconv_s642f32c) B(vconv_s642f32f) B(vconv_s642f32r) B(vconv_s642f32z) B(vconv_s642s32) B(vconv_s82f16)
B(vconv_u82f16) B(vmulconv_f162s8) B(vmulconv_f162u8)
// Vector compares and selects.
B(vcmpv_eq) B(vcmpv_ge) B(vcmpv_gt) B(vcmpv_le) B(vcmpv_lt) B(vcmpv_ne) B(vcmpvs_eq) B(vcmpvs_ge) B(vcmpvs_gt)
B(vcmpvs_le) B(vcmpvs_lt) B(vcmpvs_ne) B(vsel)
// Other vector instructions: arithmetic, reductions, broadcasts, moves.
B(vabs) B(vadd) B(vadds) B(vand) B(vbrcb) B(vcadd) B(vcgadd) B(vcgmax) B(vcmax) B(vcopy) B(vdiv) B(vector_dup)
B(vexp) B(vgather) B(vld_va_reg) B(vln) B(vmax) B(vmaxs) B(vmin) B(vmins) B(vmla) B(vmul) B(vmuls) B(vnot) B(vor)
B(vrec) B(vreducev2) B(vshr) B(vsqrt) B(vsub) B(vtranspose)
// DMA between GM, UB, L1 and the cube buffers; matrix and image-to-column loads.
B(copy_cbuf_to_bt) B(copy_cbuf_to_fbuf) B(copy_cbuf_to_gm) B(copy_data_align64) B(copy_gm_to_cbuf)
B(copy_gm_to_cbuf_multi_nd2nz_b16) B(copy_gm_to_cbuf_multi_nd2nz_b32s) B(copy_gm_to_cbuf_multi_nd2nz_b8)
B(copy_gm_to_ubuf) B(copy_gm_to_ubuf_align_b16) B(copy_gm_to_ubuf_align_b32) B(copy_matrix_cc_to_gm)
B(copy_ubuf_to_gm) B(copy_ubuf_to_gm_align_b16) B(copy_ubuf_to_gm_align_b32)
B(copy_ubuf_to_gm_align_v2) B(copy_ubuf_to_ubuf) B(create_cbuf_matrix) B(dc_preload)
B(img2colv2_cbuf_to_ca) B(img2colv2_cbuf_to_ca_s4) B(img2colv2_cbuf_to_cb) B(load_cbuf_to_ca_s4)
B(load_cbuf_to_cb_s4) B(load_cbuf_to_cb_sp) B(load_cbuf_to_cb_transpose_s4) B(mad_sp) B(preload)
B(scatter_vnchwconv_b16) B(scatter_vnchwconv_b32) B(scatter_vnchwconv_b8)
// Pipeline flags, barriers and cache maintenance.
B(__ib_set_stub) B(__ib_wait_stub) B(__sync_all_stub) B(dcci) B(dsb) B(ffts_cross_core_sync) B(hset_flag)
B(hwait_flag) B(pipe_barrier) B(set_flag) B(wait_flag) B(wait_flag_dev)
// Special registers: masks, atomics, modes, AIPP, padding, core ids, counters.
B(__get_entry_sys_cnt) B(get_acc_val) B(get_arch_ver) B(get_block_idx) B(get_block_num) B(get_coreid) B(get_ctrl) B(get_icache_prl_st)
B(get_imm) B(get_max_min_cnt) B(get_pc) B(get_rsvd_cnt) B(get_st_atomic_cfg) B(get_subblockdim) B(get_subblockid)
B(get_sys_cnt) B(get_vms4_sr) B(set_aipp_spr_0) B(set_aipp_spr_1) B(set_aipp_spr_18) B(set_aipp_spr_19)
B(set_aipp_spr_2) B(set_aipp_spr_20) B(set_aipp_spr_21) B(set_aipp_spr_3) B(set_aipp_spr_4) B(set_aipp_spr_5)
B(set_aipp_spr_6) B(set_aipp_spr_7) B(set_aipp_spr_8) B(set_aipp_spr_9) B(set_atomic_add) B(set_atomic_bf16)
B(set_atomic_f16) B(set_atomic_f32) B(set_atomic_max) B(set_atomic_min) B(set_atomic_none) B(set_atomic_s16)
B(set_atomic_s32) B(set_atomic_s8) B(set_cmpmask) B(set_ctrl) B(set_data_exp_0) B(set_data_exp_1) B(set_data_exp_2)
B(set_data_exp_3) B(set_deqscale) B(set_ffts_base_addr) B(set_fmatrix) B(set_fmatrix_b) B(set_fpc) B(set_l1_3d_size)
B(set_l3d_rpt) B(set_mask_count) B(set_mask_norm) B(set_mov_pad_val) B(set_nd_para) B(set_padding) B(set_quant_pre)
B(set_st_atomic_cfg) B(set_va_reg_sb) B(set_vector_mask)
// Scalar bit operations, conversions, math and device memory access.
B(abs) B(bcnt0) B(bcnt1) B(clz) B(conv_f322f16o) B(conv_f322s32a) B(conv_f322s32c) B(conv_f322s32f) B(conv_f322s32r)
B(ld_dev) B(sbitset0) B(sbitset1) B(sff0) B(sff1) B(sflbits) B(sqrt) B(st_dev)
// Profiling and traps.
B(asc_prof_start) B(asc_prof_stop) B(trap)
#undef B
namespace bisheng {
namespace cce {
template <class... Args> void metrics_prof_start(Args&&...);
template <class... Args> void metrics_prof_stop(Args&&...);
}  // namespace cce
}  // namespace bisheng

#endif  // RGDR_CANN_STANDIN_H_
