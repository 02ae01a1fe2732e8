"""CLI subcommands; see sdq.cli for the contract each module follows."""
