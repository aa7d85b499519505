"""commbench.analysis (the folder analysis/): fitting the cost model to measured results, predicting with it
(sweeps, scaling curves, parallel layouts, traces, a proxy's step), checking predictions against runs and
published results, and reading result files (report, compare). Floors 2 to 4: pure models, the proxy's
prediction, and the readers. It imports proxies/ and the rest of commbench/; neither imports it, and only
commands/ sits above it. The cost model itself lives in commbench/, below both, because the sim backend times
its calls with it (docs/architecture.md, "Folders" and "Where a new piece goes")."""
