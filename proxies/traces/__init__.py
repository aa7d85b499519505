"""A user's trace read into calls, one wing: the formats told apart and read into one JobTrace (`files`) from
PyTorch's profiler (`torch_profiler`, over the bounded Chrome-JSON reader `chrome_json`), its execution trace
(`execution_trace`) or NCCL's debug log (`nccl_log`); the calls and groups they hold (`calls`); a profile made
from a trace (`extracted_profile`, `profiles extract --from-trace`); and the replay on real ranks (`replay`,
`commbench replay`; docs/replay.md)."""
