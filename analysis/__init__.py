"""commbench.analysis: the analytic model (cost model, fitting, prediction). Imports only the
core's schedule, topology and results modules; the core imports it only from backends/sim.py."""
