"""benchmarks/scale_sim.py on tiny shapes: FSDP shrinks per-device state ~1/N, the HLO collective
parser counts bytes of tuple results, and pure data parallelism all-reduces the gradients."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import scale_sim  # noqa: E402

SMALL = {"n_layer": 1, "vocab_size": 256, "valid_vocab_size": 256}


def test_collective_parser_counts_tuple_bytes():
  hlo = ("  %ar = (f32[4,8]{1,0}, /*index=1*/bf16[2]{0}) all-reduce(%a, %b), to_apply=%add\n"
         "  %ag = bf16[16,32]{1,0} all-gather-start(%x), dimensions={0}\n"
         "  %y = f32[3]{0} add(%a, %b)\n")
  assert scale_sim.collectives(hlo) == {"all-reduce": {"count": 1, "bytes": 4 * 32 + 2 * 2},
                                        "all-gather": {"count": 1, "bytes": 2 * 16 * 32}}


def test_fsdp_shrinks_state_and_data_parallel_reduces_grads():
  dp = scale_sim.compile_step("tiny", 8, 1, 1, 1, 32, SMALL)
  fs = scale_sim.compile_step("tiny", 1, 8, 1, 1, 32, SMALL)
  # The state (params, two Adam moments, EMA) dominates the arguments; FSDP splits it 8 ways
  # except the small replicated vectors.
  assert fs["argument_bytes"] < dp["argument_bytes"] / 4, (fs, dp)
  assert dp["collectives"]["all-reduce"]["bytes"] > dp["argument_bytes"] / 8
  assert "all-gather" in fs["collectives"]


def test_table_names_each_rows_settings():
  row = {"size": "small", "mesh": {"data": 1, "fsdp": 8, "tensor": 1},
         "overrides": {"attention_impl": "blockwise", "remat": True}, "argument_bytes": 2**30,
         "temp_bytes": 2**31, "peak_bytes": 3 * 2**30, "fits_h100_80gb": True,
         "fits_tpu_v5e_16gb": True, "compile_s": 1.5, "collectives": {}}
  line = scale_sim.table([row]).splitlines()[-1]
  assert line.startswith("| small | 1,8,1 | attention_impl=blockwise remat=True | 1.00 | 2.00 |")
