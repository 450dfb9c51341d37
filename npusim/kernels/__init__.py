"""Layer 3: each op -> its kernel's tiling on a chip -> a tile trace (npusim.kernels.trace)."""
