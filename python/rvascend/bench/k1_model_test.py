"""The K1 time model's region rules."""

from rvascend.bench import k1_model
from rvascend.bench.riscv64_step import LINEARS


def test_every_projection_the_step_profile_marks_runs_on_every_core():
    # A projection left out ran on one thread at one thread's bandwidth: Qwen3.5's in_proj
    # (303 MB of BF16 weights over 18 layers) was projected at 2.6 instead of 7 GB/s.
    for name in LINEARS:
        r = k1_model.Region(name, instructions=1e6, vector_instructions=0, bytes=7e9)
        assert k1_model.region_seconds(r, k1_model.CORES) == 1.0, name


def test_the_deltanet_op_runs_on_every_core_and_the_elementwise_kernels_on_a_row_each():
    # The DeltaNet op splits its (sequence, value head) units over the pool: projected on one
    # thread, its 37.7 MB of state per Qwen3.5 token took 14.5 ms at 2.6 GB/s instead of 5.4 at 7.
    r = k1_model.Region("deltanet", instructions=0, vector_instructions=0, bytes=7e9)
    assert k1_model.region_seconds(r, k1_model.CORES) == 1.0
    # RMSNorm splits rows: a decoding sequence's one row runs on one thread, a prompt's on all.
    norm = k1_model.Region("rms_norm", instructions=1.6e9, vector_instructions=0, bytes=0)
    assert k1_model.region_seconds(norm, k1_model.CORES) == 1.0
    assert k1_model.region_seconds(norm, k1_model.CORES, rows=3) == 1.0 / 3
    assert k1_model.region_seconds(norm, k1_model.CORES, rows=64) == 1.0 / k1_model.CORES


def test_serial_regions_take_one_thread_and_its_bandwidth():
    r = k1_model.Region("deltanet_norm", instructions=1.6e9, vector_instructions=0, bytes=0)
    assert k1_model.region_seconds(r, k1_model.CORES) == 1.0
    r = k1_model.Region("engine", instructions=0, vector_instructions=0, bytes=2.6e9)
    assert k1_model.region_seconds(r, k1_model.CORES) == 1.0


def test_hybrid_bytes_count_the_deltanet_state_and_projections():
    config = {"hidden_size": 1024, "intermediate_size": 3584, "vocab_size": 248320, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 256, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
              "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128}
    # 24 layers: 18 DeltaNet, 6 full attention.
    assert k1_model.unavoidable_bytes("deltanet", config, 512, 24) == 2 * 4 * 16 * 128 * 128 * 18
    assert k1_model.unavoidable_bytes("in_proj", config, 512, 24) == 2 * 1024 * (4096 + 4096 + 32) * 18
    assert k1_model.unavoidable_bytes("attention", config, 512, 24) == 2 * 2 * 512 * 2 * 256 * 6
