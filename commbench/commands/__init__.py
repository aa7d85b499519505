"""The subcommands of `commbench`, one module per family; commbench/cli.py assembles them."""
