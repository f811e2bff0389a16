"""benchmarks/gpu_suite.sh parses and refuses unknown arguments; gpu_suite_report.py turns the
suite's JSON files into one JSON and a Markdown table (the full --dry-run takes minutes on the
2-core box and is run by hand: `benchmarks/gpu_suite.sh --dry-run`)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SUITE = REPO / "benchmarks" / "gpu_suite.sh"
SESSION = REPO / "benchmarks" / "accel_session.sh"
sys.path.insert(0, str(REPO / "benchmarks" / "profile"))
import trace_summary  # noqa: E402


@pytest.mark.subprocess
def test_suite_script_parses_and_names_a_bad_argument():
  subprocess.run(["bash", "-n", str(SUITE)], check=True)
  p = subprocess.run(["bash", str(SUITE), "--fast"], capture_output=True, text=True)
  assert p.returncode == 2 and "unknown argument --fast" in p.stderr


@pytest.mark.subprocess
def test_accel_session_script_parses_and_names_a_bad_argument():
  subprocess.run(["bash", "-n", str(SESSION)], check=True)
  p = subprocess.run(["bash", str(SESSION), "--quick"], capture_output=True, text=True)
  assert p.returncode == 2 and "unknown argument --quick" in p.stderr
  p = subprocess.run(["bash", str(SESSION), "--help"], capture_output=True, text=True, check=True)
  assert "DEADLINE" in p.stdout and "RG_STEPS" in p.stdout and "PACK_CONFIG" in p.stdout


def test_trace_summary_groups_kernels_and_counts_overlap_once():
  for name, group in [("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
                      ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "matmul"),
                      ("triton_gemm_dot_1", "matmul"),
                      ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
                      ("Memcpy DtoD (Device -> Device)", "copy"),
                      ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
                      ("loop_multiply_fusion_3", "other"), ("input_reduce_fusion_7", "other")]:
    assert trace_summary.group_of(name) == group, name
  # [0, 10) and [5, 20) overlap: busy 20; [30, 40) after a gap of 10
  assert trace_summary._union_ns([(5, 20), (0, 10), (30, 40)]) == 30
  assert trace_summary._union_ns([(0, 10), (2, 3)]) == 10


def test_trace_summary_names_a_folder_without_a_trace(tmp_path):
  with pytest.raises(FileNotFoundError, match="no \\*.xplane.pb under"):
    trace_summary.summarize(tmp_path)


@pytest.mark.subprocess
def test_report_collects_every_number(tmp_path):
  train = {"batch_size": 16, "seq_len": 1024, "devices": 1, "step_s_median": 0.5,
           "tokens_per_s": 32768.0, "mfu": 0.41, "device_kind": "NVIDIA H100 80GB HBM3",
           "xla_memory": {"peak_bytes": 30 * 2**30}, "measured_peak_bytes": 28 * 2**30,
      "profile": {"busy_ms_per_step": 49.0, "idle_ms_per_step": 7.0, "kernels_per_step": 950.0,
                  "groups_ms_per_step": {"other": 20.0, "matmul": 19.5, "attention": 4.5}}}
  (tmp_path / "train_small_cudnn.json").write_text(json.dumps(train))
  (tmp_path / "scale_sim_small.json").write_text(json.dumps({"rows": [{"peak_bytes": 2**35}]}))
  (tmp_path / "sample_speed.json").write_text(json.dumps({
      "preset": "small", "length": 1024, "batch": 32, "rows": [
          {"method": "ar", "run_s": 2.0},
          {"method": "diffusion", "steps": 256, "run_s": 1.0, "tokens_per_s": 32768.0,
           "encoder_over_diffusion_speedup": 7.5, "vs_ar_time_ratio": 0.5}]}))
  (tmp_path / "eval_cost.json").write_text(json.dumps({
      "preset": "small", "n": 1024, "max_m": 8, "ranks_scored": 64,
      "fast": {"wall_s": 3.0}, "naive": {"wall_s": 30.0}, "speedup_wall": 10.0}))
  p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_suite_report.py"),
                      str(tmp_path)], capture_output=True, text=True, check=True)
  assert "Machine: NVIDIA H100 80GB HBM3" in p.stdout
  for part in ("MFU 41.0%", "measured peak 28.00 GiB; XLA estimate on this device 30.00 GiB; "
               "scale_sim (XLA:CPU, attention xla) 32.00 GiB", "encoder MDM / ours = 7.5x",
               "ours / AR = 0.5", "3.00 s (naive published-style 30.00 s, 10.0x)",
               "busy 49.0 ms, idle 7.0 ms per step; kernels (ms): other 20.0, matmul 19.5, "
               "attention 4.5; 950 kernels per step"):
    assert part in p.stdout, p.stdout
  assert len(json.loads((tmp_path / "gpu_suite.json").read_text())["results"]["rows"]) == 5


@pytest.mark.slow
@pytest.mark.subprocess
def test_train_step_benchmark_writes_a_profile(tmp_path):
  """`benchmarks/train_step.py --profile_dir` (the GPU suite's profile of the train step) runs on
  the quickstart config, leaves a jax.profiler trace beside its JSON and summarises it (a CPU
  trace has no device plane: the summary says so)."""
  out = tmp_path / "step.json"
  subprocess.run([sys.executable, str(REPO / "benchmarks" / "train_step.py"),
                  f"--config={REPO / 'configs' / 'quickstart.py'}", "--config.model.n_layer=1",
                  "--config.data.tokenizer=byte", "--steps=1", "--warmup=0",
                  f"--profile_dir={tmp_path / 'prof'}", f"--out={out}"],
                 check=True, capture_output=True, text=True, cwd=REPO,
                 env={**os.environ, "JAX_PLATFORMS": "cpu"})
  res = json.loads(out.read_text())["results"]
  assert res["step_s_median"] > 0
  assert list((tmp_path / "prof").rglob("*.xplane.pb"))
  assert res["profile"]["device_planes"] == 0 and res["profile"]["steps"] == 3
