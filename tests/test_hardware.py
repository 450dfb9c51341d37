"""The shipped hardware files: they load, their derived peaks reproduce the published figures, sources are kept."""

import pytest

from npusim.spec.chip import CHIPS, load_chip
from npusim.spec.schema import leaves
from npusim.spec.system import SYSTEMS, load_system


@pytest.mark.parametrize("name", CHIPS.names())
def test_every_chip_loads_with_a_source_for_every_number(name):
    chip = load_chip(name)
    for path, value, meta in leaves(chip):
        if meta.get("kind") in ("quantity", "count", "ratio", "shape"):
            assert chip.provenance.sources.get(path), f"{name}: {path} has no source"


@pytest.mark.parametrize("name", SYSTEMS.names())
def test_every_system_loads(name):
    system = load_system(name)
    assert system.ranks == system.chips * system.chip_spec.dies
    assert list(system.tiers)  # innermost first, validated by check()


def test_required_names_exist():
    assert {"910b1", "910b2", "910b3", "910b4", "910c-die", "910c", "950pr", "950dt", "950dt-28", "950dt-36"} <= set(
        CHIPS.names())
    assert {"atlas-800-a2", "atlas-800-a3", "cloudmatrix384", "atlas-950-superpod"} <= set(SYSTEMS.names())


@pytest.mark.parametrize("name,dtype,tflops", [
    ("910b2", "fp16", 353.9),  # hardware.md §1.2, "pure cube" [S5]
    ("910b3", "fp16", 294.9),
    ("910b1", "fp16", 363.7),
    ("910b4", "fp16", 245.8),
    ("950pr", "bf16", 432.0),  # whitepaper Server tier [S5]
    ("950pr", "fp8", 865.0),
    ("950pr", "mxfp4", 1730.0),
    ("950dt-28", "bf16", 378.0),  # PCIe tier [S5]
    ("950dt-28", "mxfp4", 1513.0),
])
def test_derived_cube_peaks_match_published(name, dtype, tflops):
    assert load_chip(name).peak_cube_flops(dtype) / 1e12 == pytest.approx(tflops, rel=2e-3)


def test_marketing_total_is_cube_plus_vector():
    b2 = load_chip("910b2")
    assert b2.peak_vector_flops("fp16") / 1e12 == pytest.approx(22.1, rel=2e-3)
    assert b2.marketing_flops() / 1e12 == pytest.approx(376.0, rel=1e-3)
    assert load_chip("910b3").marketing_flops() / 1e12 == pytest.approx(313.3, rel=1e-3)
    assert load_chip("950pr").peak_vector_flops("fp16") / 1e12 == pytest.approx(54.0, rel=1e-2)


def test_910c_package_is_two_dies():
    die, pkg = load_chip("910c-die"), load_chip("910c")
    assert pkg.dies == 2
    assert pkg.package_hbm_bandwidth == pytest.approx(3.2e12)
    assert pkg.package_hbm_capacity == 2 * die.hbm.capacity
    assert pkg.package_peak_cube_flops("int8") / 1e12 == pytest.approx(1455, rel=1e-3)  # hardware.md §2.1


def test_variants_inherit_instead_of_copying():
    b2, b3 = load_chip("910b2"), load_chip("910b3")
    assert b3.aic.buffers == b2.aic.buffers and b3.aic.cube == b2.aic.cube
    assert b3.aic.count == 20 and b3.clock == b2.clock
    dt, pr = load_chip("950dt"), load_chip("950pr")
    assert dt.hbm.bandwidth == 4e12 and pr.hbm.bandwidth == 1.6e12 and dt.aic == pr.aic
    assert dt.provenance.files["hbm.bandwidth"].endswith("950dt.yaml")
    assert dt.provenance.files["aic.buffers.l1"].endswith("950pr.yaml")


def test_override_by_dotted_path_changes_the_value_and_its_source():
    chip = load_chip("910c-die", {"hbm.bandwidth": "4TB/s", "aic.count": "20"})
    assert chip.hbm.bandwidth == 4e12 and chip.aic.count == 20
    assert chip.provenance.sources["hbm.bandwidth"].startswith("override")
    system = load_system("cloudmatrix384", {"hbm.bandwidth": "2 TB/s", "tiers.ub.bandwidth": "300 GB/s"})
    assert system.chip_spec.hbm.bandwidth == 2e12 and system.tiers["ub"].bandwidth == 3e11


def test_collective_tier_selection():
    cm = load_system("cloudmatrix384")
    assert cm.tier_for(2)[0] == "sio"
    assert cm.tier_for(128)[0] == "ub"
    assert cm.tier_for(1536)[0] == "rdma"
