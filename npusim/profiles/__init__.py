"""A user's msprof profile against npusim: read it, map each op onto a kernel, compare, and calibrate the chip.

    msprof.read_profile(path)       op_summary / kernel_details / OpBasicInfo rows -> Launch (device time, shapes)
    compare.group(profile)          launches -> Op groups (one kernel and shape each) and Skipped (with the reason)
    compare.predict(ops, chip)      each group's kernel simulated on the chip, launch mode device (Task Duration's kind)
    fit.calibrate(hw, ops, ...)     the chip's efficiency / overhead parameters fitted, written as an overlay chip

The command is `npusim profile FILE [--fit --out CHIP.yaml]` (npusim/cli/profile.py).
"""
