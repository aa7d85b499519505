"""What several commands share: the one-line usage fault and the output options (common), the number and range
checks of every option (options), `--hw` with its loader and poor-fit warning (hw_option), the backend's settling
(backend_options), the options of every command that starts ranks (ranks_options), a training setup's flags
(setup_flags). A part of one command stays beside it, named after it (proxy_plan.py, sweep_letters.py)."""
