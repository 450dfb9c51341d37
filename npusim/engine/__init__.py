"""Layer 4a: the discrete-event engine that times tile traces on a chip (method in npusim.engine.sim)."""

from npusim.engine.chrome import chrome_events, write_chrome_trace
from npusim.engine.result import (KernelResult, Timeline, clear_memo, completions, content_key, roofline, simulate,
                                  simulate_timeline)

__all__ = ["KernelResult", "Timeline", "chrome_events", "clear_memo", "completions", "content_key", "roofline",
           "simulate", "simulate_timeline", "write_chrome_trace"]
