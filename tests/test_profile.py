"""`npusim profile`: reading msprof files as the tools write them, mapping ops onto kernels, measured vs predicted,
and --fit writing an overlay chip that `kernel sim --hw` then uses -- on the real files of tests/data/msprof."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.cli.main import main
from npusim.profiles import compare, fit
from npusim.profiles.mapping import COMMUNICATION, Mapping, Unmapped, map_launch
from npusim.profiles.msprof import Launch, Tensor, op_type_of, read_profile
from npusim.spec.chip import load_chip

DATA = Path(__file__).parent / "data" / "msprof"
KERNEL_DETAILS = DATA / "mstt-kernel-details" / "kernel_details.csv"
OP_SUMMARY = DATA / "cann-doc-op-summary" / "op_summary_20260101000000.csv"
LI_BSND = DATA / "cy-lightning-indexer" / "BSND_BSND"
LI_SHAPE = "batch=16,tokens=5,keys=3072,heads=64,dim=128,topk=2048,dtype=fp16"
GEMM = "m=4096,n=4608,k=12288,dtype=fp16,out_dtype=fp16"


def by_type(profile):
    out = {}
    for launch in profile.launches:
        out.setdefault(launch.op_type, []).append(launch)
    return out


# ------------------------------------------------------------------------------------------------------ reading
def test_kernel_details_as_torch_npu_writes_it():
    p = read_profile(KERNEL_DETAILS)
    assert p.kind == "kernel_details" and len(p.launches) == 591
    mm = by_type(p)["MatMul"][0]
    assert mm.name == "MatMul91" and mm.task_type == "AI_CORE" and mm.block_dim == 24
    assert mm.duration == pytest.approx(1478.18e-6)
    assert [t.shape for t in mm.inputs] == [(4096, 12288), (4608, 12288)] and mm.inputs[0].dtype == "FLOAT16"
    assert mm.outputs[0].shape == (4096, 4608)
    hccl = by_type(p)["hcom_allReduce_"][0]
    assert hccl.task_type == "HCCL" and hccl.inputs is None


def test_op_summary_with_documented_columns_and_pipe_ratios():
    p = read_profile(OP_SUMMARY)
    assert p.kind == "op_summary" and len(p.launches) == 16
    li = by_type(p)["LightningIndexer"][0]
    assert li.mix_block_dim == 48 and li.inputs[5] is None  # the absent block_table is an empty entry
    assert dict(li.ratios)["aic.cube"] == pytest.approx(0.10) and dict(li.ratios)["aiv.vector"] == pytest.approx(0.2)


def test_opbasicinfo_directory_reads_every_launch():
    p = read_profile(LI_BSND)
    assert p.kind == "OpBasicInfo" and len(p.files) == 6
    assert {x.op_type for x in p.launches} == {"LightningIndexer"}
    assert all(x.inputs is None and x.block_dim == 20 and x.mix_block_dim == 40 and x.freq_mhz == 1800
               for x in p.launches)
    assert sorted(round(x.duration * 1e6, 2) for x in p.launches) == [72.5, 72.74, 72.8, 72.92, 72.98, 73.26]


def test_column_aliases_of_other_versions(tmp_path):
    f = tmp_path / "kernel_details.csv"
    f.write_text('Step Id,Device_id,Name,Type,Accelerator Core,Start Time(us),Duration(us),block num,Mix Block Num,'
                 'Input Shapes,Input Data Types,Output Shapes,Output Data Types\n'
                 '1,0,aclnnMatmul_MatMulCommon_MatMulV2,N/A,AI_CORE,1.0\t,12.5,20,0,"""64,1024;1024,256""",'
                 'DT_BF16;DT_BF16,"""64,256""",DT_BF16\n')
    launch = read_profile(f).launches[0]
    assert launch.op_type == "MatMulV2" and launch.block_dim == 20 and launch.duration == pytest.approx(12.5e-6)
    assert map_launch(launch) == Mapping("gemm", (("m", 64), ("n", 256), ("k", 1024), ("batch", 1),
                                                  ("dtype", "bf16"), ("out_dtype", "bf16")))


@pytest.mark.parametrize("name,op_type", [
    ("LightningIndexer_468c104183baa47aac33ce774c8668e0_196865_mix_aic", "LightningIndexer"),
    ("aclnnMatmul_MatMulCommon_MatMulV2", "MatMulV2"), ("main_kernel_mix_aic", "main_kernel")])
def test_op_type_from_kernel_name(name, op_type):
    assert op_type_of(name) == op_type


# ------------------------------------------------------------------------------------------------------ mapping
def test_mapping_of_every_documented_op_type():
    ops = {k: map_launch(v[0]) for k, v in by_type(read_profile(OP_SUMMARY)).items()}
    shape = {k: dict(m.shape) for k, m in ops.items() if isinstance(m, Mapping)}
    assert shape["MatMulV2"] == {"m": 128, "n": 1536, "k": 7168, "batch": 1, "dtype": "bf16", "out_dtype": "bf16"}
    assert shape["QuantBatchMatmulV3"]["dtype"] == "int8" and shape["QuantBatchMatmulV3"]["n"] == 2048
    assert shape["GroupedMatmul"] == {"rows": 2048, "k": 7168, "n": 4096, "experts": 16, "dtype": "bf16",
                                      "out_dtype": "bf16"}
    assert shape["RmsNorm"] == {"rows": 128, "dim": 7168, "op": "rmsnorm", "dtype": "bf16"}
    assert shape["SwiGlu"] == {"rows": 2048, "width": 2048}
    assert shape["DynamicQuant"] == {"rows": 128, "elements": 7168, "dtype": "int8", "block": 0}
    assert shape["RotaryPositionEmbedding"]["layout"] == "half" and shape["InterleaveRope"]["layout"] == "interleaved"
    assert shape["LightningIndexer"] == {"batch": 4, "tokens": 1, "keys": 8192, "heads": 64, "dim": 128,
                                         "topk": 2048, "dtype": "bf16"}
    assert shape["SparseFlashAttention"] == {"batch": 4, "tokens": 1, "keys": 8192, "heads": 128, "d_qk": 576,
                                             "d_v": 512, "topk": 2048, "dtype": "bf16"}
    reasons = {k: m.reason for k, m in ops.items() if isinstance(m, Unmapped)}
    assert set(reasons) == {"AddRmsNorm", "FusedInferAttentionScore", "WeightQuantBatchMatmulV2", "hcom_allReduce_",
                            "Cast"}
    assert reasons["hcom_allReduce_"] == COMMUNICATION and "residual add" in reasons["AddRmsNorm"]
    assert "layout" in reasons["FusedInferAttentionScore"] and "weight-only" in reasons["WeightQuantBatchMatmulV2"]


def test_batch_matmul_and_transposed_operands():
    mm = {m.mapping.shape_text for m in compare.group(read_profile(KERNEL_DETAILS))[0]}
    assert "m=1024,n=1024,k=512,batch=12,dtype=fp16,out_dtype=fp16" in mm  # [12,1024,512] @ [12,512,1024]
    assert "m=4096,n=4608,k=12288,batch=1,dtype=fp16,out_dtype=fp16" in mm  # [4096,12288] @ [4608,12288]^T


def launch(op_type, inputs, outputs):
    tensors = [tuple(Tensor(s, d) if s is not None else None for s, d in group) for group in (inputs, outputs)]
    return Launch("x", op_type, "MIX_AIC", 1e-5, 24, 48, tensors[0], tensors[1], (), None, "f.csv", 2)


@pytest.mark.parametrize("op,expect", [
    (launch("BatchMatMulV3", [((4, 1024, 4096), "DT_BF16"), ((4096, 512), "DT_BF16")], [((4, 1024, 512), "DT_BF16")]),
     {"m": 4096, "n": 512, "k": 4096, "batch": 1}),  # a 2-D weight under batched rows: one GEMM of all the rows
    (launch("MatMulV2", [((7168, 128), "DT_BF16"), ((7168, 1536), "DT_BF16")], [((128, 1536), "FLOAT")]),
     {"m": 128, "n": 1536, "k": 7168, "out_dtype": "fp32"}),  # x1 transposed
    (launch("LightningIndexer", [((256, 64, 128), "DT_BF16"), ((8192, 1, 128), "DT_BF16"), ((256, 64), "DT_BF16"),
                                 ((4,), "INT32"), ((4,), "INT32")], [((256, 1, 2048), "INT32")]),
     {"batch": 4, "tokens": 64, "keys": 2048, "topk": 2048}),  # TND with its sequence-length tensors
    (launch("LightningIndexer", [((4, 1, 64, 128), "DT_BF16"), ((64, 128, 1, 128), "DT_BF16"), ((4, 1, 64), "DT_BF16"),
                                 ((4,), "INT32"), ((4,), "INT32"), ((4, 16), "INT32")], [((4, 1, 1, 2048), "INT32")]),
     "paged key cache"),
    (launch("SparseFlashAttention", [((4, 1, 128, 512), "DT_BF16"), ((64, 128, 1, 512), "DT_BF16"),
                                     ((64, 128, 1, 512), "DT_BF16"), ((4, 1, 1, 2048), "INT32"), ((4, 16), "INT32")],
            [((4, 1, 128, 512), "DT_BF16")]), "paged KV cache"),
    (launch("MatMul", [((128, 7168), "FLOAT"), ((7168, 1536), "FLOAT")], [((128, 1536), "FLOAT")]), "fp32 x fp32"),
    (launch("MatMul", [((128, 7168), "DT_BF16"), ((7000, 1536), "DT_BF16")], [((128, 1536), "DT_BF16")]),
     "not a (batched) matrix product"),
])
def test_mapping_rules(op, expect):
    m = map_launch(op)
    if isinstance(expect, str):
        assert isinstance(m, Unmapped) and expect in m.reason, m
    else:
        assert isinstance(m, Mapping) and expect.items() <= dict(m.shape).items(), m


def test_identical_launches_are_one_op_with_their_median():
    ops, skipped = compare.group(read_profile(KERNEL_DETAILS))
    ln = next(op for op in ops if op.op_type == "LayerNormV3")
    assert len(ln.times) == 5 and ln.measured == pytest.approx(320.62e-6)
    comm = [s for s in skipped if s.reason == COMMUNICATION]
    assert sum(len(s.times) for s in comm) == 19


# ------------------------------------------------------------------------------------------------------ CLI
def test_profile_prints_measured_vs_predicted(cli, tmp_path):
    r = cli("profile", KERNEL_DETAILS, "--hw", "910b2", "--save", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MatMul" in r.stdout and "1474.54" in r.stdout and "not mapped" in r.stdout
    assert "hcom_allReduce_" in r.stdout and "Task Duration" in r.stdout
    assert {"profile_ops.csv", "profile_unmapped.csv", "profile_ops.png"} <= {p.name for p in tmp_path.iterdir()}


def run_json(capsys, *argv):
    assert main(["profile", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predicted_is_the_kernels_device_time(capsys):
    out = run_json(capsys, KERNEL_DETAILS)
    rows = {(x["op"], x["shape"]): x for x in out["rows"]}
    gemm = rows[("MatMul", "m=4096,n=4608,k=12288,batch=1,dtype=fp16,out_dtype=fp16")]
    device = compare.simulate_op(Mapping("gemm", (("m", 4096), ("n", 4608), ("k", 12288), ("dtype", "fp16"),
                                                   ("out_dtype", "fp16"))), load_chip("910b2"))
    o = load_chip("910b2").overheads
    assert device.launch > 0 and device.launch == pytest.approx(o.task_dispatch + o.core_start)  # as Task Duration
    assert gemm["predicted_us"] == pytest.approx(device.time * 1e6)
    assert gemm["launches"] == 2 and gemm["measured_us"] == pytest.approx(1474.54)
    assert gemm["error_pct"] == pytest.approx(100 * (device.time * 1e6 / 1474.54 - 1))
    assert any(u["op"] == "ApplyAdamW" for u in out["unmapped"])


def test_opbasicinfo_takes_the_shape_from_the_command_line(capsys):
    (row,) = run_json(capsys, LI_BSND, "--hw", "910b3", "--shape", LI_SHAPE)["rows"]
    assert row["kernel"] == "lightning_indexer" and row["launches"] == 6
    assert row["measured_us"] == pytest.approx(72.86, abs=0.01)


def test_fit_then_kernel_sim_moves_towards_the_profile(cli, tmp_path):
    """The done-when of issue 14 item 4: fit the chip to the real kernel_details.csv, then time one of its GEMMs
    with `kernel sim --hw` on the overlay (Task Duration's kind of time: --launch device) against the shipped chip's
    prediction."""
    chip = tmp_path / "my-chip.yaml"
    r = cli("profile", KERNEL_DETAILS, "--hw", "910b2", "--fit", "--params", "efficiency.cube", "--out", chip,
            "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    row = next(x for x in out["rows"] if x["shape"] == "m=4096,n=4608,k=12288,batch=1,dtype=fp16,out_dtype=fp16")
    overlay = yaml.safe_load(chip.read_text())
    assert overlay["inherits"] == "910b2" and list(overlay) == ["inherits", "description", "efficiency"]
    source = overlay["efficiency"]["cube"]["source"]
    assert source.startswith("fitted to ") and "mstt-kernel-details/kernel_details.csv, 18 ops" in source
    sim = json.loads(cli("kernel", "sim", "gemm", "--hw", chip, "--shape", GEMM, "--launch", "device",
                         "--format", "json").stdout)
    after = sim["time_ms"] * 1e3  # us
    assert after == pytest.approx(row["fitted_us"], rel=1e-3)
    assert abs(after - row["measured_us"]) < abs(row["predicted_us"] - row["measured_us"])


def test_fit_chooses_few_influential_parameters_and_improves():
    """The GEMM rows constrain the cube's efficiency alone; the fit says which rows it rests on. The two
    BatchMatMul shapes alone constrain nothing (each parameter binds at most one of them): refused."""
    gemms = [op for op in compare.group(read_profile(KERNEL_DETAILS))[0] if op.mapping.kernel == "gemm"]
    labels = [f"{op.op_type} {op.mapping.shape_text}" for op in gemms]
    result = fit.fit(fit.Problem("910b2", gemms), load_chip("910b2"), labels=labels)
    assert [p.path for p, _ in result.params] == ["efficiency.cube"] and result.loss_after <= result.loss_before
    for (p, v), rows in zip(result.params, result.rests_on):
        assert p.low <= v <= p.high and len(rows) >= 5 and set(rows) <= set(labels)
    bmm = [op for op in gemms if op.op_type == "BatchMatMul"]
    with pytest.raises(fit.NpusimError, match="constrain no parameter, so there is nothing to fit"):
        fit.fit(fit.Problem("910b2", bmm), load_chip("910b2"))


class Quadratic(fit.Problem):
    """Times that depend on one parameter as measured x (value / 0.62): the fit must land on 0.62."""

    def __init__(self):
        super().__init__("910b2", [])
        self.measured = np.array([1e-4, 2e-4])

    def times(self, values):
        v = next((x for p, x in values.items() if p.path == "efficiency.vector"), 0.8)
        return self.measured * (v / 0.62)


def test_bounded_search_finds_the_minimum():
    problem = Quadratic()
    vector = next(p for p in fit.candidates(load_chip("910b2")) if p.path == "efficiency.vector")
    result = fit.fit(problem, load_chip("910b2"), only=["efficiency.vector"])
    ((p, v),) = result.params
    assert p.path == "efficiency.vector" and v == pytest.approx(0.62, abs=2e-3) and vector.low <= v <= vector.high


# ------------------------------------------------------------------------------------------------------ bad input
def run_main(capsys, *argv):
    code = main(["profile", *map(str, argv)])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("content,needles", [
    ("a,b\n1,2\n", ["bad.csv", "'Op Name'", "not an msprof op summary"]),
    ("", ["bad.csv", "is empty"]),
    ("Op Name,OP Type,Task Type,Block Dim\nx,MatMul,AI_CORE,24\n", ["bad.csv", "'Task Duration(us)'"]),
    ("Op Name,OP Type,Task Type,Task Duration(us)\nx,MatMul,AI_CORE,fast\n",
     ["bad.csv", "'Task Duration(us)'", "line 2", "'fast'"]),
    ("Op Name,OP Type,Task Type,Task Duration(us)\n", ["bad.csv", "no rows"]),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", ["bad.csv", "not a text CSV"]),
])
def test_bad_profile_is_one_sentence(capsys, tmp_path, content, needles):
    f = tmp_path / "bad.csv"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, err = run_main(capsys, f)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert all(n in err for n in needles), err


@pytest.mark.parametrize("argv,needles", [
    (["nosuch.csv"], ["nosuch.csv", "no such profile"]),
    ([DATA / "cy-lightning-indexer" / "no-such-case"], ["no such profile"]),
    ([KERNEL_DETAILS, "--shape", "m=1"], ["--shape", "OpBasicInfo"]),
    ([LI_BSND, "--hw", "910b3", "--shape", "batchh=16"], ["'batchh'", "did you mean 'batch'"]),
    ([KERNEL_DETAILS, "--fit", "--set", "hbm.bandwidth=2TB/s"], ["--set"]),
    ([KERNEL_DETAILS, "--fit", "--params", "efficiency.cubes"], ["efficiency.cubes", "allowed"]),
    ([LI_BSND, "--fit", "--hw", "910b3"], ["nothing to fit"]),
])
def test_bad_arguments_are_one_sentence(capsys, tmp_path, argv, needles):
    code, err = run_main(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert all(n in err for n in needles), err


def test_directory_without_profiles(capsys, tmp_path):
    code, err = run_main(capsys, tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "holds no kernel_details.csv" in err, err


def test_fit_needs_a_shipped_chip_to_inherit(capsys, bad_chip):
    code, err = run_main(capsys, KERNEL_DETAILS, "--fit", "--hw", bad_chip("inherits: 910b2\n", "mine"))
    assert code == 2 and "--hw" in err and "inherits a shipped chip" in err


def test_unknown_chip_through_the_cli(cli):
    r = cli("profile", KERNEL_DETAILS, "--hw", "910x")
    assert r.returncode == 2 and "unknown chip '910x'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_fit_refuses_a_parameter_the_rows_do_not_constrain():
    """Issue 29 item 5: in kernel_details.csv only the LayerNorm shape is bound by HBM (the GEMMs by the cube), so
    the rows do not constrain efficiency.hbm (the fit used to set it 0.85 -> 0.65 from that one shape): named, it is
    refused with the row it would rest on; L2 efficiency moves the same GEMMs as the cube's and is not separable."""
    ops = compare.group(read_profile(KERNEL_DETAILS))[0]
    labels = [f"{op.op_type} {op.mapping.shape_text}" for op in ops]
    problem = fit.Problem("910b2", ops)
    with pytest.raises(fit.NpusimError, match=r"efficiency\.hbm: binds 1 row\(s\) of the profile \(LayerNormV3 "
                                              r"rows=4096,dim=12288"):
        fit.fit(problem, load_chip("910b2"), only=["efficiency.hbm"], labels=labels)
    chosen = fit.influential(problem, fit.candidates(load_chip("910b2")))
    kept, refused = fit.constrained(chosen, labels)
    assert [p.path for p in kept] == ["efficiency.cube"]
    assert any(r.startswith("efficiency.hbm: binds 1 row(s)") for r in refused)
    assert any(r.startswith("efficiency.l2: moves the same rows") for r in refused)
    cube = kept[0]
    assert len(cube.rows()) >= 5 and all(labels[i].startswith(("MatMul", "BatchMatMul")) for i in cube.rows())


def test_constraint_rule_on_synthetic_shares():
    """A parameter binding one row, or moving the rows as one already kept does, is not fitted."""
    p = lambda path, *shares: fit.Parameter(path, "number", 0.9, 0.05, 1.0, sum(shares), shares)  # noqa: E731
    kept, refused = fit.constrained([p("efficiency.cube", 1, 1, 0.9, 0), p("efficiency.l2", 0.6, 0.6, 0.55, 0),
                                     p("efficiency.hbm", 0, 0, 0.1, 1), p("efficiency.vector", 0, 0, 0.6, 0.9)],
                                    ["a", "b", "c", "d"])
    assert [k.path for k in kept] == ["efficiency.cube", "efficiency.vector"]
    assert refused[0].startswith("efficiency.l2: moves the same rows in the same proportions as efficiency.cube")
    assert refused[1] == ("efficiency.hbm: binds 1 row(s) of the profile (d), fewer than the 2 a fit needs to tell "
                          "an efficiency from a mechanism npusim lacks")
